"""Saving and loading :class:`~linattn.tsc.ConvAttentionClassifier`: ``config.json`` (the
parameters, classes, the ridges' alphas) and ``model.safetensors`` (the fitted transforms'
thresholds and kernels, the scalings, the ridge head, the nets' weights, each member's behind
``members.M.``); no pickle. Loading checks every file, parameter and tensor and refuses a
damaged or edited one in one line (:class:`~linattn.train_loop.CheckpointError`)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from linattn._config import Check, Range
from linattn._io import write_atomic, write_json
from linattn.train_loop import CheckpointError, first_non_finite
from linattn.tsc.competing import CompetingKernels
from linattn.tsc.conv_tokens import ConvTokens, TokenNet, check_param
from linattn.tsc.heads import RidgeHead
from linattn.tsc.nets import loaded_net, net_state
from linattn.tsc.shared import open_saved_model, plain, read_classes, seed_of
from linattn.tsc.stem import StemNet

__all__ = ["CONV_FORMAT", "save", "load", "tensors"]

#: The ``format`` field of a saved ConvAttentionClassifier's config.json.
CONV_FORMAT = "linattn.tsc.ConvAttentionClassifier/1"
#: A saved ridge's alpha: a finite number > 0.
POSITIVE = (Check(float, Range(0.0, math.inf, False)), "a finite number > 0")


def save(est, path: str | os.PathLike) -> Path:
    """Write ``config.json`` (parameters, classes) and ``model.safetensors`` (the fitted
    tokens' thresholds, the scalings, the ridge head, the nets' weights, the stem net's,
    each member's behind ``members.M.``) into folder
    ``path`` (created); each file is written atomically."""
    from safetensors.torch import save

    check_is_fitted(est, "nets_")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    t = tensors(est)
    for m, member in enumerate(est.members_, 1):
        t.update(tensors(member, f"members.{m}."))
    write_atomic(path / "model.safetensors", save(t))
    write_json(path / "config.json", {
        "format": CONV_FORMAT,
        "params": {k: plain(v) for k, v in est.get_params().items()},
        "classes": est.classes_.tolist(), "classes_dtype": est.classes_.dtype.str,
        "n_features_in": int(est.n_features_in_),
        "ridge_alpha": None if est.ridge_ is None else est.ridge_.alpha_,
        **({"member_ridge_alphas": [None if m.ridge_ is None else m.ridge_.alpha_
                                    for m in est.members_]} if est.members_ else {}),
    })
    return path


def tensors(est, prefix: str = "") -> dict:
    """This model's fitted tensors (not its members'), each name behind ``prefix``."""
    t = {**est.tokens_.state("tokens."), "tokens.mean": torch.from_numpy(est.mean_),
         "tokens.scale": torch.from_numpy(est.scale_)}
    if est.global_tokens_ is not None:
        t.update({**est.global_tokens_.state("global_tokens."),
                  "global_tokens.mean": torch.from_numpy(est.global_mean_),
                  "global_tokens.scale": torch.from_numpy(est.global_scale_)})
    if est.competing_ is not None:
        t.update({**est.competing_.state("competing."),
                  "competing.mean": torch.from_numpy(est.competing_mean_),
                  "competing.scale": torch.from_numpy(est.competing_scale_)})
    if est.difference_tokens_ is not None:
        t.update({**est.difference_tokens_.state("difference_tokens."),
                  "difference_tokens.mean": torch.from_numpy(est.difference_mean_),
                  "difference_tokens.scale": torch.from_numpy(est.difference_scale_)})
    if est.ridge_ is not None:
        t.update({"ridge.coef": torch.from_numpy(np.ascontiguousarray(est.ridge_.coef)),
                  "ridge.intercept": torch.from_numpy(est.ridge_.intercept),
                  "ridge.classes": torch.from_numpy(est.ridge_.classes_.astype(np.int64))})
    for i, net in enumerate(est.nets_):
        t.update(net_state(net, f"nets.{i}."))
    if est.stem_net_ is not None:
        t.update(net_state(est.stem_net_, "stem."))
    return {prefix + k: v for k, v in t.items()}


def load(cls, path: str | os.PathLike):
    """Restore an estimator written by :meth:`save`. A missing folder or file, a corrupt
    file, a parameter out of range or a tensor that is missing or does not fit raise
    :class:`~linattn.train_loop.CheckpointError` (a ValueError) in one line naming the
    file and what is wrong."""
    cfg, cfg_path, w_path = open_saved_model(path, CONV_FORMAT, cls.__name__)
    try:
        est, alphas = from_config(cls, cfg, cfg_path)
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        msg = f"missing key {err}" if isinstance(err, KeyError) else str(err)
        raise CheckpointError(msg if msg.startswith(str(cfg_path))
                              else f"{cfg_path}: {msg}") from None
    try:
        restore(est, _read_tensors(w_path), alphas)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise CheckpointError(f"{w_path}: {str(err).splitlines()[0]}") from None
    return est


def from_config(cls, cfg: dict, cfg_path: Path) -> tuple:
    """The estimator (parameters, classes, n_features_in_) and the ridge's alpha of each
    member, its own first."""
    params = cfg["params"]
    if not isinstance(params, dict):
        raise ValueError(f"{cfg_path}: params: expected an object")
    # files saved before competing_groups (n_members, stem, difference_features,
    # net_weight) existed had no competing-kernel counts (one model, no stem net, no
    # differences, an even join): 0 (1, False, 0, 0.5) is what they mean
    params = {"competing_groups": 0, "n_members": 1, "stem": False,
              "difference_features": 0, "net_weight": 0.5, **params}
    names = set(cls().get_params())
    for what, keys in (("unknown", set(params) - names), ("missing", names - set(params))):
        if keys:  # a missing key would silently take its default: another model
            raise ValueError(f"{cfg_path}: params: {what} keys {sorted(keys)}")
    est = cls(**params)
    est._checked_params(f"{cfg_path}: params")
    n = cfg["n_features_in"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{cfg_path}: n_features_in must be an integer >= 1, got {n!r}")
    if est._uses_difference and n < 2:
        raise ValueError(f"{cfg_path}: n_features_in must be >= 2 with difference_features "
                         f"> 0, got {n}")
    classes = cfg["classes"]
    if not isinstance(classes, list) or len(classes) < 2:
        raise ValueError(f"{cfg_path}: classes must be a list of at least 2 labels, got "
                         f"{classes!r}")
    est.classes_ = read_classes(cfg, len(classes), cfg_path)
    alphas = [cfg["ridge_alpha"]]
    if est.n_members > 1:
        more = cfg["member_ridge_alphas"]
        if not isinstance(more, list) or len(more) != est.n_members - 1:
            raise ValueError(f"{cfg_path}: member_ridge_alphas must be a list of "
                             f"{est.n_members - 1} (n_members - 1), got {more!r}")
        alphas += more
    elif "member_ridge_alphas" in cfg:  # another model's file, or an edited one
        raise ValueError(f"{cfg_path}: member_ridge_alphas given but n_members is 1")
    for m, alpha in enumerate(alphas):
        key = "ridge_alpha" if m == 0 else f"member_ridge_alphas[{m - 1}]"
        if est.ridge:  # a number > 0
            check_param(str(cfg_path), key, alpha, POSITIVE)
        elif alpha is not None:
            raise ValueError(f"{cfg_path}: {key} must be null without a ridge head, got "
                             f"{alpha!r}")
    est.n_features_in_ = n
    return est, alphas


def restore(est, t: dict, alphas: list[float | None]) -> None:
    """The fitted state, members too, from the weights file's tensors (``load``);
    ValueError or RuntimeError naming what does not fit."""
    bad = first_non_finite(t)
    if bad is not None:  # a damaged model would predict one class, silently
        raise ValueError(f"{bad} holds non-finite values (NaN or infinity)")
    restore_one(est, {k: v for k, v in t.items() if not k.startswith("members.")},
                      alphas[0])
    seed = seed_of(est.random_state, "ConvAttentionClassifier.load")
    est.members_ = []
    for m in range(1, est.n_members):
        prefix = f"members.{m}."
        member = est._member(seed + m)
        try:
            restore_one(member, {k[len(prefix):]: v for k, v in t.items()
                                 if k.startswith(prefix)}, alphas[m])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            # the member's own tensor names, behind its prefix
            raise ValueError(f"member {m} (tensors {prefix}*): "
                             f"{str(err).splitlines()[0]}") from None
        est.members_.append(member)
    known = {f"members.{m}." for m in range(1, est.n_members)}
    extra = sorted(k for k in t if k.startswith("members.")
                   and not any(k.startswith(p) for p in known))
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]} (not of a model with these params)")


def restore_one(est, t: dict, alpha: float | None) -> None:
    """One model's fitted state (not its members') from its tensors."""
    n_cls, L = len(est.classes_), est.n_features_in_
    est.tokens_ = ConvTokens(est.segments, est.features, est.quantiles).load_state(
        t, "tokens.", L)
    est.mean_, est.scale_ = _scaling(t, "tokens.", est.tokens_.n_features)
    est.global_tokens_ = est.global_mean_ = est.global_scale_ = est.ridge_ = None
    if est._uses_global:
        est.global_tokens_ = ConvTokens(1, est.global_features, est.quantiles).load_state(
            t, "global_tokens.", L)
        est.global_mean_, est.global_scale_ = _scaling(t, "global_tokens.",
                                                       est.global_tokens_.n_features)
    est.competing_ = est.competing_mean_ = est.competing_scale_ = None
    if est._uses_competing:
        est.competing_ = CompetingKernels(est.competing_groups).load_state(
            t, "competing.", L)
        est.competing_mean_, est.competing_scale_ = _scaling(t, "competing.",
                                                             est.competing_.n_features)
    est.difference_tokens_ = est.difference_mean_ = est.difference_scale_ = None
    if est._uses_difference:
        est.difference_tokens_ = ConvTokens(1, est.difference_features, 0).load_state(
            t, "difference_tokens.", L - 1)
        est.difference_mean_, est.difference_scale_ = _scaling(
            t, "difference_tokens.", est.difference_tokens_.n_features)
    if est.ridge:
        n_in = (est.tokens_ if est.global_tokens_ is None else est.global_tokens_).n_features
        n_in += sum(0 if f is None else f.n_features
                    for f in (est.competing_, est.difference_tokens_))
        rows = 1 if n_cls == 2 else n_cls  # fit sees every class: two make one column
        coef, icpt, seen = (t.get(f"ridge.{k}") for k in ("coef", "intercept", "classes"))
        if coef is None or icpt is None or seen is None:
            raise ValueError("missing tensor ridge.coef, ridge.intercept or ridge.classes")
        if coef.dtype != torch.float32 or coef.shape != (rows, n_in) \
                or icpt.dtype != torch.float32 or icpt.shape != (rows,) \
                or seen.dtype != torch.int64 or seen.shape != (n_cls,) \
                or not bool((seen == torch.arange(n_cls)).all()):
            raise ValueError(f"ridge.*: expected float32 coef ({rows}, {n_in}) and "
                             f"intercept ({rows},), and classes 0..{n_cls - 1} (int64)")
        est.ridge_ = RidgeHead(coef.numpy(), icpt.numpy(), seen.numpy(), float(alpha))
    est.nets_ = []
    for i in range(est.n_nets):
        prefix = f"nets.{i}."
        embed = t.get(prefix + "embed.1.weight")  # checked before a net is built: a
        if embed is None or embed.shape != (est.d_model, est.tokens_.n_features):
            raise ValueError(f"{prefix}embed.1.weight: expected shape "  # tampered d_model
                             f"({est.d_model}, {est.tokens_.n_features})")  # allocates
        net = TokenNet(est.tokens_.n_features, len(est.tokens_.edges_) - 1, n_cls,
                       d_model=est.d_model, num_layers=est.num_layers,
                       num_heads=est.num_heads, dropout=est.dropout,
                       global_features=(est.global_tokens_.n_features
                                        if est.global_token else 0))
        est.nets_.append(loaded_net(net, t, prefix))
    est.stem_net_ = None
    if est.stem:
        est.stem_net_ = loaded_net(StemNet(L, n_cls, d_model=est.d_model,
                                         num_layers=est.num_layers,
                                         num_heads=est.num_heads, dropout=est.dropout),
                                 t, "stem.")
    # every tensor a saved model of these parameters has is one that _tensors writes
    extra = sorted(set(t) - set(tensors(est)))
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]} (not of a model with these params)")


def _read_tensors(w_path: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(w_path))
    except (OSError, SafetensorError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{w_path}: corrupt weights file ({err})") from None


def _scaling(t: dict, prefix: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of one token transform, each (n,) float32 with the scale positive."""
    mean, scale = t.get(prefix + "mean"), t.get(prefix + "scale")
    if mean is None or scale is None or mean.shape != (n,) or scale.shape != (n,) \
            or mean.dtype != torch.float32 or scale.dtype != torch.float32 \
            or not bool((scale > 0).all()):
        raise ValueError(f"{prefix}mean, {prefix}scale: expected float32 ({n},), scale > 0")
    return mean.numpy(), scale.numpy()
