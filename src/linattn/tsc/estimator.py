"""A scikit-learn classifier around :class:`~linattn.tsc.model.FordATransformer`.

``LinearAttentionClassifier`` takes ``X`` of shape (n_series, length) (any length: the series is
zero padded to whole patches) and labels of any type and number of classes; ``predict`` returns
labels in their original encoding. Variable-length series in the UCR archive's convention (each
row NaN padded after its last sample to the longest length) are accepted: the trailing NaN
become zeros, the padding the model gives short series anyway (the circular-shift augmentation
then also rotates that padding, as for any series). NaN inside a series (missing values) is
refused in one line naming the row, the sample and what to do, unless ``missing="interpolate"``
(linear interpolation along time); infinities are refused. ``save(dir)`` writes
``model.safetensors`` (weights) and ``config.json`` (hyper-parameters, architecture, classes) —
no pickle — and ``LinearAttentionClassifier.load(dir)`` restores an estimator with identical
predictions.

The estimator's parameters are not declared here: they are the fields of
:class:`~linattn.tsc.model.ModelConfig` (less ``length`` and ``n_classes``, which come from the
data) and of :class:`~linattn.tsc.training.TrainConfig` (less ``seed``, which is
``random_state``), with their defaults, plus ``random_state``, ``n_threads``, ``device``,
``missing`` and ``verbose``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from linattn._config import check_field_types, rename_deprecated
from linattn._io import write_atomic
from linattn._memory import TRAINING_BYTES_PER_PARAMETER, check_fits, transformer_parameters
from linattn.train_loop import first_non_finite
from linattn.tsc.data import MISSING, encode_labels, fill_nan_padding, real_series
from linattn.tsc.model import (
    REMOVED_OPTIONS,
    RENAMED,
    FordATransformer,
    ModelConfig,
    upgrade_saved,
)
from linattn.tsc.shared import (
    ThreadLimit,
    check_threads,
    open_saved_model,
    plain,
    read_classes,
    seed_of,
)
from linattn.tsc.training import (
    DEFAULT_MIN_BATCHES,
    DEFAULT_MIN_STEPS,
    REMOVED_TRAIN_OPTIONS,
    CheckpointError,
    TrainConfig,
    Trainer,
    predict_logits,
    write_json,
)

__all__ = ["LinearAttentionClassifier", "FORMAT", "MODEL_PARAMS", "TRAIN_PARAMS", "REMOVED_PARAMS",
           "upgrade_saved_params", "check_device", "seed_of", "open_saved_model"]

#: The ``format`` field of a saved model's config.json.
FORMAT = "linattn.tsc.LinearAttentionClassifier/1"

#: Estimator parameters that are ModelConfig fields (length and n_classes come from the data).
MODEL_PARAMS = tuple(f.name for f in fields(ModelConfig) if f.name not in ("length", "n_classes"))
#: Estimator parameters that are TrainConfig fields (its seed is ``random_state``).
TRAIN_PARAMS = tuple(f.name for f in fields(TrainConfig) if f.name != "seed")
_DEFAULTS: dict[str, Any] = {
    **{f.name: f.default for f in fields(ModelConfig) if f.name in MODEL_PARAMS},
    **{f.name: f.default for f in fields(TrainConfig) if f.name in TRAIN_PARAMS},
    # defaults that may differ from their TrainConfig fields' (0 there: old configs)
    "min_steps": DEFAULT_MIN_STEPS, "min_batches": DEFAULT_MIN_BATCHES,
    "random_state": 0, "n_threads": None, "device": "cpu", "missing": "error", "verbose": False,
}

#: Options removed after linattn 0.1.0 that old saved ``params`` may name at their neutral value.
REMOVED_PARAMS = {
    **REMOVED_OPTIONS,
    **REMOVED_TRAIN_OPTIONS,
    "tta": (lambda v, d: v == 1, "test-time augmentation"),
}


def upgrade_saved_params(params: dict, where: str) -> dict:
    """Saved estimator ``params`` (a model's config.json, a run's run.json) in today's
    spelling: deprecated names renamed, removed options dropped where neutral
    (:data:`REMOVED_PARAMS`), and ``min_steps`` / ``min_batches`` 0 when they predate them
    (exactly the saved epochs and batch size)."""
    params = upgrade_saved(params, where, REMOVED_PARAMS)
    for name in ("min_steps", "min_batches"):
        params.setdefault(name, 0)
    return params


def _parse_device(value: Any, where: str) -> torch.device:
    """``torch.device(value)`` for a string or device; a one-line ValueError otherwise."""
    if not isinstance(value, (str, torch.device)):
        raise ValueError(f"{where}: device must be a string such as 'cpu' or 'cuda', "
                         f"got {value!r}")
    try:
        return torch.device(value)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"{where}: device: not a torch device: {value!r} "
                         f"({str(err).splitlines()[0] if str(err) else 'invalid'})") from None


def check_device(value: Any, where: str) -> torch.device:
    """The torch device named by ``value`` (a string such as "cpu", "cuda", "cuda:1", or a
    :class:`torch.device`), checked to exist on this machine; a one-line ValueError naming
    ``device`` otherwise."""
    dev = _parse_device(value, where)
    if dev.type == "cpu":
        return dev
    if dev.type == "meta":
        raise ValueError(f"{where}: device: 'meta' holds no data; use 'cpu' or 'cuda'")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"{where}: device {value!r}: CUDA is not available to torch here "
                             f"(torch {torch.__version__}); use device='cpu'")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"{where}: device {value!r}: torch sees {n} CUDA device(s) "
                             f"(cuda:0 … cuda:{n - 1})")
        return dev
    try:  # mps, xpu, …: can a tensor live there?
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError, ValueError) as err:
        raise ValueError(f"{where}: device {value!r} is not available here "
                         f"({str(err).splitlines()[0] if str(err) else 'unavailable'}); "
                         f"use device='cpu'") from None
    return dev


#: The architecture's sizes its memory grows with (:func:`_training_bytes`).
_SIZES = ("d_model", "num_layers", "num_heads", "head_dim", "mlp_dim", "patch", "window")


def _training_bytes(model: dict) -> int:
    """A lower bound of the bytes training the architecture ``model`` (ModelConfig fields)
    needs: its token embedding and blocks' parameters with their gradients and Adam's
    moments, and where ``tokens`` (per series) and ``batch_size`` are given one batch's
    activations (per token and layer q, k, v, the output and the MLP's hidden layer:
    ``num_heads=10**6`` fits as parameters, but its activations ran for minutes)."""
    embed = (model["window"] or model["patch"]) + (model["patch"] + 1 if model["spectral"]
                                                   else 0)
    inner = model["num_heads"] * model["head_dim"]
    params = transformer_parameters(model["d_model"], model["num_layers"], model["mlp_dim"],
                                    embed, inner)
    activations = (4 * model.get("batch_size", 0) * model.get("tokens", 0)
                   * model["num_layers"] * (4 * inner + model["mlp_dim"]))
    return TRAINING_BYTES_PER_PARAMETER * params + activations


class LinearAttentionClassifier(ClassifierMixin, BaseEstimator):
    """Linear-attention transformer for time-series classification (scikit-learn API).

    The defaults are the FordA reference recipe: patches of 10 samples → d_model 64, 3 pre-norm
    blocks of 4-head linear attention (d = 16, 1+elu, relative positions, no input positions),
    MLP 128, dropout 0.1, mean pooling; AdamW (wd 0.05), one-cycle LR to 1e-3, batch 64, label
    smoothing 0.05, clipping at 1, 80 epochs, random circular shifts and amplitude scaling
    U(0.8, 1.2). On small datasets the epochs are raised so that a fit makes at least
    ``min_steps`` optimiser steps (default :data:`~linattn.tsc.training.DEFAULT_MIN_STEPS`,
    1000; 0: exactly ``epochs``; :meth:`~linattn.tsc.training.TrainConfig.epochs_for`): data of
    ``min_steps / epochs`` batches or more (FordA: 57) train exactly as before. ``min_batches``
    (default 0, off) would shrink the batch of a small set instead
    (:meth:`~linattn.tsc.training.TrainConfig.batch_for`).
    ``window`` (overlapping patch embedding), ``spectral`` (per-token spectra) and
    ``global_spectrum`` (the whole series' spectrum added to every token) are off by default;
    the ``final`` recipe (:mod:`linattn.tsc.recipes`) turns them on, and the circular shifts
    off.

    Parameters (keyword only): the architecture, as documented on
    :class:`~linattn.tsc.model.ModelConfig`; the training recipe, as documented on
    :class:`~linattn.tsc.training.TrainConfig`; ``random_state``: seeds initialisation,
    shuffling, augmentation and dropout; ``n_threads``: torch and BLAS threads during
    fit/predict (None: the libraries' settings); ``device``: where fit and predict run ("cpu",
    "cuda", "cuda:1", …; checked to exist; saved models and checkpoints hold CPU tensors
    whatever it is); ``verbose``: progress bars; ``missing``: NaN inside a series (a missing
    value) is refused ("error", the default, as scikit-learn does) or interpolated linearly
    along time ("interpolate").
    ``depth`` and ``heads`` are deprecated spellings of ``num_layers`` and ``num_heads``. The
    names and defaults:

    """

    def __init__(self, **params) -> None:
        params = rename_deprecated(params, RENAMED, type(self).__name__)
        unknown = sorted(set(params) - set(_DEFAULTS))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown parameter(s) {', '.join(unknown)}")
        for name, default in _DEFAULTS.items():
            setattr(self, name, params.get(name, default))

    # scikit-learn reads the parameter names from the signature: keyword-only, with defaults
    __init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
           for name, default in _DEFAULTS.items()])
    if __doc__:  # None under python -OO
        __doc__ += "".join(f"    ``{k}={v!r}``\n" for k, v in _DEFAULTS.items())

    def set_params(self, **params):
        """scikit-learn's ``set_params``; the deprecated names are accepted as in the
        constructor."""
        return super().set_params(**rename_deprecated(params, RENAMED,
                                                     f"{type(self).__name__}.set_params"))

    # -- configuration --------
    def check_params(self, where: str | None = None) -> tuple[dict, TrainConfig]:
        """Check every parameter's type and range (ValueError naming it, prefixed by
        ``where``): the one check behind :meth:`fit`, :meth:`load` and ``linattn forda train``.
        Returns the architecture parameters (plain Python values) and the training
        configuration."""
        where = where or type(self).__name__
        params = self.get_params()
        model = {k: params[k] for k in MODEL_PARAMS}
        check_field_types(model, ModelConfig, where)
        model = {k: plain(v) for k, v in model.items()}
        ModelConfig(**model).validate(where)
        train = {k: params[k] for k in TRAIN_PARAMS}
        TrainConfig(**train).validate(where)
        seed = seed_of(self.random_state, where)
        check_threads(self.n_threads, where)
        check_device(self.device, where)
        if not isinstance(self.missing, str) or self.missing not in MISSING:
            raise ValueError(f"{where}: missing must be one of {', '.join(map(repr, MISSING))}, "
                             f"got {self.missing!r}")
        if not isinstance(self.verbose, (bool, np.bool_, numbers.Integral)):
            raise ValueError(f"{where}: verbose must be a bool, got {self.verbose!r}")
        tcfg = TrainConfig(seed=seed, **{k: plain(v) for k, v in train.items()})
        return model, tcfg

    def overflowing_row(self, X, *, fitted: bool = False) -> int | None:
        """The row of the series X (n, length) that overflows this architecture's float32
        arithmetic before any training (a model as initialised gives non-finite outputs for
        it, scaled by the augmentation's largest amplitude), or with ``fitted`` the fitted
        model's, or None. Asked of the few series of largest magnitude, where the overflow
        starts: finite values near float32's largest (3e38) made training diverge at its first
        step, blamed on the learning rate, and a command's scoring raise."""
        model_params, tcfg = self.check_params()
        X = np.nan_to_num(np.asarray(X, dtype=np.float32), nan=0.0)
        if X.ndim != 2 or not X.size:
            return None
        with np.errstate(over="ignore"):
            rows = np.argsort(-np.abs(X).max(1), kind="stable")[:4]
            top = X[rows] * np.float32(1.0 if fitted else max(tcfg.scale_high, 1.0))
        with torch.random.fork_rng(devices=[]), ThreadLimit(self.n_threads):
            torch.manual_seed(0)
            if fitted:
                check_is_fitted(self, "model_")
                model = self.model_
            else:
                model = FordATransformer(self._model_config(model_params, X.shape[1], 2))
            logits = predict_logits(model, top, device="cpu")
        bad = np.flatnonzero(~torch.isfinite(logits).all(-1).numpy())
        return int(rows[bad[0]]) if len(bad) else None

    def check_memory(self, where: str | None = None, length: int | None = None,
                     n: int | None = None) -> None:
        """ValueError naming the parameter (prefixed by ``where``) when training this
        architecture (on ``n`` series of ``length`` samples, where given: then one batch's
        activations count too) cannot fit in the memory available (:func:`_training_bytes`):
        absurd sizes refused before anything is allocated (``d_model=10**9`` was an OOM kill).
        :meth:`fit` and ``linattn forda train`` ask; loading a saved model checks the sizes
        against its weights instead."""
        where = where or type(self).__name__
        params, tcfg = self.check_params(where)
        model = {k: plain(v) for k, v in params.items()}
        if length is not None:
            model.update(batch_size=min(tcfg.batch_size, n or tcfg.batch_size),
                         tokens=-(-int(length) // model["patch"]))
        try:
            check_fits(_training_bytes, model, {k: _DEFAULTS[k] for k in _SIZES},
                       "training this model")
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None

    def model_config(self, length: int, n_classes: int) -> ModelConfig:
        """The architecture for series of ``length`` samples and ``n_classes`` classes."""
        return self._model_config(self.check_params()[0], length, n_classes)

    def _model_config(self, model_params: dict, length: int, n_classes: int) -> ModelConfig:
        cfg = ModelConfig(length=int(length), n_classes=int(n_classes), **model_params)
        cfg.validate(type(self).__name__)
        return cfg

    def train_config(self) -> TrainConfig:
        """The training configuration (``seed`` = ``random_state``, None meaning 0)."""
        return self.check_params()[1]

    # -- scikit-learn API --------
    def fit(self, X, y, **trainer_kwargs):
        """Train on X: (n, length), y: (n,). Extra keyword arguments go to
        :class:`~linattn.tsc.training.Trainer` (``X_val``, ``checkpoint_dir``, ``progress`` …)."""
        model_params, tcfg = self.check_params()
        self.check_memory()
        X = real_series(X, type(self).__name__)  # sklearn's own refusal runs to 15 lines
        with np.errstate(over="ignore", invalid="ignore"):  # its check sums X: ±3e38 overflow
            X, y = validate_data(self, X, y, dtype=np.float32, ensure_min_samples=2,
                                 ensure_all_finite="allow-nan")
        X = fill_nan_padding(X, "X", self.missing)
        check_classification_targets(y)
        classes, codes = encode_labels(y)
        if len(classes) < 2:
            raise ValueError(f"y: needs samples of at least 2 classes, got 1 class ({classes[0]})")
        self.classes_ = classes
        config = self._model_config(model_params, X.shape[1], len(classes))
        self.check_memory(length=X.shape[1], n=len(X))
        row = self.overflowing_row(X)
        if row is not None:
            raise ValueError(f"X: row {row}: values up to {float(np.nanmax(np.abs(X[row]))):.3g} "
                             "overflow the model's float32 arithmetic before any training; "
                             "scale the series (FordA's are z-normalised)")
        resume = trainer_kwargs.pop("resume", False)
        if trainer_kwargs.get("X_val") is not None:
            trainer_kwargs["X_val"] = fill_nan_padding(
                np.asarray(trainer_kwargs["X_val"], dtype=np.float32), "X_val", self.missing)
        if trainer_kwargs.get("y_val") is not None:
            yv = np.asarray(trainer_kwargs["y_val"])
            unseen = np.setdiff1d(yv, classes)
            if len(unseen):
                raise ValueError(f"y_val: labels not in y: {unseen[:5].tolist()}")
            trainer_kwargs["y_val"] = np.searchsorted(classes, yv)
        with ThreadLimit(self.n_threads):
            torch.manual_seed(tcfg.seed)
            self.model_ = FordATransformer(config)  # initialised on the CPU on every device
            trainer = Trainer(self.model_, X, codes, tcfg, progress=bool(self.verbose),
                              device=check_device(self.device, type(self).__name__),
                              **trainer_kwargs)
            if resume:
                trainer.load_checkpoint()
            # run() rewrites metrics.jsonl to the history: empty on a fresh start
            self.history_ = trainer.run()
        self.model_.eval()
        return self

    def _logits(self, X) -> torch.Tensor:
        check_is_fitted(self, "model_")
        X = real_series(X, type(self).__name__)
        with np.errstate(over="ignore", invalid="ignore"):  # its check sums X: ±3e38 overflow
            X = validate_data(self, X, dtype=np.float32, reset=False,
                              ensure_all_finite="allow-nan")
        X = fill_nan_padding(X, "X", self.missing)
        device = check_device(self.device, type(self).__name__)
        with ThreadLimit(self.n_threads):
            self.model_.to(device)  # a set_params(device=…) after fit takes effect here
            logits = predict_logits(self.model_, X, device=device)
        bad = ~torch.isfinite(logits).all(-1)
        if bad.any():  # finite series far beyond the scale it was fitted on overflow inside
            raise ValueError(f"X: the model's outputs are not finite for {int(bad.sum())} "
                             f"series (|X| up to {float(np.nanmax(np.abs(X))):.3g}); scale "
                             "the series as those it was fitted on")
        return logits

    def predict_proba(self, X) -> np.ndarray:
        """(n, n_classes) class probabilities, columns in the order of ``classes_``."""
        return torch.softmax(self._logits(X), -1).double().numpy()

    def predict_log_proba(self, X) -> np.ndarray:
        return torch.log_softmax(self._logits(X), -1).double().numpy()

    def predict(self, X) -> np.ndarray:
        """Predicted labels, in the encoding of the ``y`` given to :meth:`fit`."""
        codes = self._logits(X).argmax(-1).numpy()
        return self.classes_[codes]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags

    # -- persistence --------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into folder ``path`` (created)."""
        from safetensors.torch import save

        check_is_fitted(self, "model_")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = {k: v.detach().cpu().contiguous() for k, v in self.model_.state_dict().items()}
        # serialised in memory, written by Python: a full disk is an OSError naming the file
        write_atomic(path / "model.safetensors", save(weights))
        write_json(path / "config.json", {
            "format": FORMAT,
            "params": {k: str(v) if k == "device" else plain(v)
                       for k, v in self.get_params().items()},
            "model": self.model_.config.to_dict(),
            "classes": self.classes_.tolist(),
            "classes_dtype": self.classes_.dtype.str,
            "n_features_in": int(self.n_features_in_),
        })
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: str | torch.device = "cpu"
             ) -> LinearAttentionClassifier:
        """Restore an estimator written by :meth:`save`, on ``device`` (default the CPU,
        whatever device it was trained on: the saved ``device`` is replaced by this one).

        Everything in config.json is validated, and the weights file's tensor shapes are
        compared with it, before any model is built: a missing folder or file, a corrupt file,
        a value of the wrong type or range, or weights that do not fit raise
        :class:`~linattn.tsc.training.CheckpointError` (a ValueError) in one line naming the file
        and the key. Configurations saved with the deprecated names (``depth``, ``heads``) or
        naming removed options at their neutral value load (DeprecationWarning)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        dev = check_device(device, f"{cls.__name__}.load")
        cfg, cfg_path, w_path = open_saved_model(path, FORMAT, cls.__name__)
        try:
            est, model_cfg, classes, n_features = cls._read_config(cfg, cfg_path)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            msg = f"missing key {err}" if isinstance(err, KeyError) else str(err)
            if not msg.startswith(str(cfg_path)):
                msg = f"{cfg_path}: {msg}"
            raise CheckpointError(msg) from None
        corrupt = (OSError, SafetensorError, ValueError, RuntimeError)
        try:
            shapes = _header_shapes(w_path)
        except corrupt as err:
            raise CheckpointError(f"{w_path}: corrupt weights file ({err})") from None
        _check_weight_shapes(w_path, cfg_path.name, model_cfg, shapes)
        try:
            weights = load_file(str(w_path))
        except corrupt as err:
            raise CheckpointError(f"{w_path}: corrupt weights file ({err})") from None
        model = FordATransformer(model_cfg)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        _compare_shapes(w_path, cfg_path.name,
                        {k: tuple(v.shape) for k, v in weights.items()}, expected)
        bad = first_non_finite({k: weights[k] for k in expected})
        if bad is not None:  # a diverged or damaged model would predict one class, silently
            raise CheckpointError(f"{w_path}: {bad} holds non-finite values (NaN or infinity); "
                                  "the model is unusable")
        model.load_state_dict(weights)
        model.to(dev)
        model.eval()
        est.model_, est.classes_, est.n_features_in_ = model, classes, n_features
        est.device = device
        return est

    @classmethod
    def _read_config(cls, cfg: dict, cfg_path: Path):
        """(estimator, ModelConfig, classes, n_features_in) from a saved config, all checked;
        raises ValueError / TypeError / KeyError for the caller to report."""
        where = f"{cfg_path}: params"
        if not isinstance(cfg["params"], dict):
            raise ValueError(f"{where}: expected an object")
        params = upgrade_saved_params(cfg["params"], where)
        unknown = sorted(set(params) - set(_DEFAULTS))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}")
        est = cls(**params)
        _parse_device(est.device, where)  # well formed, but need not exist here:
        est.device = "cpu"  # load() puts the model on its own device
        est.check_params(where)
        model_cfg = ModelConfig.from_dict(cfg["model"], f"{cfg_path}: model")
        for k in MODEL_PARAMS:
            if getattr(model_cfg, k) != getattr(est, k):
                raise ValueError(f"{cfg_path}: params and model disagree on {k} "
                                 f"({getattr(est, k)!r} and {getattr(model_cfg, k)!r})")
        classes = read_classes(cfg, model_cfg.n_classes, cfg_path)
        n_features = cfg["n_features_in"]
        if isinstance(n_features, bool) or not isinstance(n_features, int) or \
                not 1 <= n_features <= model_cfg.length:
            raise ValueError(f"{cfg_path}: n_features_in must be an integer in [1, "
                             f"{model_cfg.length}] (the model's length), got {n_features!r}")
        return est, model_cfg, classes, n_features


def _header_shapes(w_path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape from a safetensors header, without reading the data."""
    from safetensors import safe_open

    with safe_open(str(w_path), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def _check_weight_shapes(w_path: Path, cfg_name: str, c: ModelConfig,
                         shapes: dict[str, tuple[int, ...]]) -> None:
    """Compare the weights file's tensor shapes with the config before a model is built: the
    block count, the layers this module owns, and a lower bound on the values the blocks need,
    so that absurd sizes in a tampered config fail here instead of being allocated."""
    blocks = {k.split(".")[1] for k in shapes if k.startswith("blocks.")}
    if blocks != {str(i) for i in range(len(blocks))} or len(blocks) != c.num_layers:
        raise CheckpointError(f"{w_path}: holds {len(blocks)} encoder blocks (blocks.*) where "
                              f"{cfg_name} has num_layers={c.num_layers}")
    own = {"embed.weight": (c.d_model, c.embed_features), "norm.weight": (c.d_model,),
           "head.weight": (c.n_classes, c.d_model)}
    _compare_shapes(w_path, cfg_name, {k: shapes.get(k) for k in own}, own)
    # per block at least the MLP's two weights, the q/k/v/out projections and the relative
    # vectors (H, 2T - 1, d)
    need = c.num_layers * (2 * c.mlp_dim * c.d_model
                           + c.num_heads * c.head_dim * (4 * c.d_model + 2 * c.tokens - 1))
    have = sum(math.prod(s) for s in shapes.values())
    if need > have:
        raise CheckpointError(
            f"{w_path}: holds {have} values, fewer than the {need} that {cfg_name}'s sizes "
            f"need (mlp_dim={c.mlp_dim}, num_heads={c.num_heads}, head_dim={c.head_dim}, "
            f"length={c.length})")


def _compare_shapes(w_path: Path, cfg_name: str, got: dict, expected: dict) -> None:
    """CheckpointError naming the first tensor that is missing, unexpected or of another
    shape than ``expected``."""
    for key, shape in expected.items():
        if got.get(key) is None:
            raise CheckpointError(f"{w_path}: no tensor {key} (the model of {cfg_name} has one)")
        if tuple(got[key]) != tuple(shape):
            raise CheckpointError(f"{w_path}: {key} has shape {tuple(got[key])} where "
                                  f"{cfg_name} implies {tuple(shape)}")
    extra = sorted(set(got) - set(expected))
    if extra:
        raise CheckpointError(f"{w_path}: unexpected tensor {extra[0]} (not in the model of "
                              f"{cfg_name})")
