"""The MQAR harness's configuration, torch-free: the command line parses and checks it before
torch is imported.

:data:`MIXER_PRESETS` names the models the harness trains: every ``attention=`` kind of
:data:`linattn.nn.mixers.MIXERS` under its own name, plus combinations of a kind and its options
that the literature names (``based``: Taylor features of 16-dimensional heads with a sliding
softmax window;
``linear_plain``: linear attention without the LM's per-head decays, γ = 1; ``taylor``: the
same with Based's Taylor features alone; ``hedgehog`` and ``favor``: the same with the learnable
Hedgehog map or Performer's FAVOR+ random features, which have no name in the LM's
configuration and are passed as template instances).
:class:`RecallConfig` is one training cell; :data:`DEFAULT_LRS` is the learning-rate sweep.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from linattn._config import FEATURE_MAP, POSITIVE_INT, SEED, Check, Range
from linattn._memory import TRAINING_BYTES_PER_PARAMETER, check_fits, lm_parameters
from linattn.nn.mixers import CONFIG_CHECKS, MIXERS, check_config, check_positions

__all__ = ["MIXER_PRESETS", "DEFAULT_LRS", "TABLE_MIX", "RecallConfig", "RECALL_CHECKS",
           "model_kwargs", "check_mqar", "cell_bytes", "check_cell_memory"]

#: Zoology sweeps 4 learning rates from 1e-4 to 1e-2 (np.logspace(-4, -2, 4)); these are the
#: issue's round values of the same span.
DEFAULT_LRS: tuple[float, ...] = (1e-4, 5e-4, 1e-3, 5e-3)

#: The training mixture of docs/recall.md's table, (seq_len, pairs, examples) beside the cell's
#: own 20,000: Zoology's figure-2 mixture of short and long sequences (100k of (64, 4), 20k each
#: of (128, 8), (256, 16), (256, 32), (256, 64)), scaled to a CPU.
TABLE_MIX: tuple[tuple[int, int, int], ...] = ((64, 4, 40_000), (128, 8, 20_000),
                                               (256, 64, 10_000))

#: preset name → the LM options it sets (``decay: 1.0`` means γ = 1 for every head).
MIXER_PRESETS: dict[str, dict[str, Any]] = {
    **{kind: {"attention": kind} for kind in MIXERS},
    # Based's Taylor features act on 16-dimensional q, k (273 features a head, not the 1057 of
    # 32 dimensions): ``head_dim`` sets the number of heads to d_model / 16
    "based": {"attention": "hybrid", "feature_map": "taylor", "head_dim": 16},
    "linear_plain": {"attention": "linear", "decay": 1.0},
    # the feature maps as published: plain linear attention (γ = 1), no decays
    "taylor": {"attention": "linear", "feature_map": "taylor", "decay": 1.0, "head_dim": 16},
    "hedgehog": {"attention": "linear", "feature_map": "hedgehog", "decay": 1.0},
    "favor": {"attention": "linear", "feature_map": "favor", "decay": 1.0},
}

#: Feature maps the presets name that the LM's configuration does not: name → a function of
#: the head dimension building the template (imported when the model is built, not before).
_MAP_BUILDERS = {"hedgehog": ("Hedgehog", lambda d: {"head_dim": d}),
                 # m = 2d random features: the state of Hedgehog's 2m = 2d features
                 "favor": ("FavorPlus", lambda d: {"head_dim": d, "num_features": 2 * d})}

_POS_FLOAT = Check(float, Range(0.0, math.inf, False))

#: Each field's type and range (the same declarations parse the command's flags).
RECALL_CHECKS: dict[str, Check] = {
    "mixer": Check(str, choices=tuple(MIXER_PRESETS)),
    "feature_map": Check(str, choices=FEATURE_MAP.choices, optional=True),
    "window": CONFIG_CHECKS["window"],  # the LM's own declaration
    "decay": Check(float, Range(0.0, 1.0, False, True)),  # each value (checked by the LM)
    "d_model": POSITIVE_INT,
    "num_layers": POSITIVE_INT,
    "num_heads": POSITIVE_INT,
    "seq_len": Check(int, Range(4, math.inf)),
    "num_kv_pairs": POSITIVE_INT,
    "vocab_size": Check(int, Range(4, math.inf)),
    "power_a": _POS_FLOAT,
    "train_examples": POSITIVE_INT,
    "val_examples": POSITIVE_INT,
    "test_examples": POSITIVE_INT,
    "epochs": POSITIVE_INT,
    "batch_size": POSITIVE_INT,
    "lr": Check(float, Range(0.0, math.inf, False), optional=True, float32=True),
    "weight_decay": Check(float, Range(0.0, math.inf), float32=True),
    "stop_at": Check(float, Range(0.0, 1.0, False, True)),
    "seed": SEED,
    "threads": POSITIVE_INT,
    "short_conv": CONFIG_CHECKS["short_conv"],
    "mlp_dim": Check(int, Range(0, math.inf)),
}


@dataclass(frozen=True)
class RecallConfig:
    """One MQAR cell: the data, the model and its training. ``decay``: the per-head decays of
    the kinds that take them (default: the LM's, 1 − 2^−(2…9)). ``lr`` None sweeps ``lrs`` and keeps
    the rate with the best validation accuracy. ``stop_at``: a run stops at the end of the
    first epoch whose validation accuracy reaches it (Zoology stops at 0.99). Checked when made:
    ValueError naming the field.

    ``train_mix``: more training sets of other shapes, each ``(seq_len, num_kv_pairs,
    examples)``, trained on beside the cell's own ``train_examples`` (Zoology's figure-2 runs
    train on (64, 4), (128, 8) and (256, 16 … 64) at once: the short sequences teach the recall
    circuit cheaply and the long ones extend it). Each batch holds one shape; the batches of
    all the sets are shuffled together every epoch. Validation and test stay at the cell's
    ``seq_len`` and ``num_kv_pairs``.

    ``eval_at``: more ``(seq_len, num_kv_pairs)`` settings the trained model is also tested on
    (``test_examples`` sequences each), as Zoology scores one trained model at several
    settings, longer ones included; the learning rate is still chosen at the cell's own."""

    mixer: str = "gated_delta"
    feature_map: str | None = None
    window: int | None = None
    decay: tuple[float, ...] | None = None
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 2
    seq_len: int = 256
    num_kv_pairs: int = 16
    vocab_size: int = 8192
    power_a: float = 0.01
    train_examples: int = 20_000
    val_examples: int = 500
    test_examples: int = 1_000
    epochs: int = 2
    batch_size: int = 32
    lr: float | None = None
    lrs: tuple[float, ...] = DEFAULT_LRS
    weight_decay: float = 0.1
    stop_at: float = 0.99
    seed: int = 0
    threads: int = 1
    short_conv: int = 4
    mlp_dim: int = 0
    train_mix: tuple[tuple[int, int, int], ...] = TABLE_MIX
    eval_at: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for name, check in RECALL_CHECKS.items():
            if name != "decay":  # a list: each value below
                object.__setattr__(self, name, check.check(name, getattr(self, name)))
        lrs = tuple(self.lrs) if isinstance(self.lrs, (tuple, list)) else None
        if not lrs:
            raise ValueError(f"lrs: expected a non-empty list of numbers > 0, got {self.lrs!r}")
        for lr in lrs:
            RECALL_CHECKS["lr"].check("lrs", lr)
        object.__setattr__(self, "lrs", lrs)
        if self.decay is not None:
            decay = tuple(self.decay) if isinstance(self.decay, (tuple, list)) else ()
            if len(decay) != self.num_heads:
                raise ValueError(f"decay: expected {self.num_heads} values (one per head), "
                                 f"got {self.decay!r}")
            for g in decay:
                RECALL_CHECKS["decay"].check("decay", g)
            object.__setattr__(self, "decay", decay)
        check_mqar(self.train_examples, self.seq_len, self.num_kv_pairs, self.vocab_size,
                   self.power_a)
        object.__setattr__(self, "train_mix", _check_shapes(
            "train_mix", self.train_mix, 3, self.vocab_size, self.power_a))
        object.__setattr__(self, "eval_at", _check_shapes(
            "eval_at", self.eval_at, 2, self.vocab_size, self.power_a))
        kwargs = model_kwargs(self, build_maps=False)
        check_config({"vocab_size": self.vocab_size, **kwargs})
        # the sequences the kind's weights must hold (cosFormer's horizon)
        for name, lengths in (("seq_len", [self.seq_len]),
                              ("train_mix", [T for T, _, _ in self.train_mix]),
                              ("eval_at", [T for T, _ in self.eval_at])):
            check_positions(kwargs["attention"], max(lengths, default=0), name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lrs"] = list(self.lrs)
        d["decay"] = None if self.decay is None else list(self.decay)
        d["train_mix"] = [list(m) for m in self.train_mix]
        d["eval_at"] = [list(m) for m in self.eval_at]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecallConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"recall config: unknown keys {unknown}")
        return cls(**d)


def _check_shapes(name: str, items: object, size: int, vocab_size: int,
                  power_a: float) -> tuple[tuple[int, ...], ...]:
    """``train_mix`` ((seq_len, num_kv_pairs, examples) triples, ``size`` 3) or ``eval_at``
    ((seq_len, num_kv_pairs) pairs, ``size`` 2) as a tuple of int tuples, each a valid MQAR
    shape (:func:`check_mqar`); ValueError naming ``name`` otherwise."""
    what = "(seq_len, pairs, examples)" if size == 3 else "(seq_len, pairs)"
    if not isinstance(items, (tuple, list)):
        raise ValueError(f"{name}: expected a list of {what}, got {items!r}")
    out = []
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != size:
            raise ValueError(f"{name}: expected {what} items, got {item!r}")
        n = item[2] if size == 3 else 1
        try:
            n, T, P, _, _ = check_mqar(n, item[0], item[1], vocab_size, power_a)
        except ValueError as err:
            raise ValueError(f"{name}: {tuple(item)!r}: {err}") from None
        if n < 1:
            raise ValueError(f"{name}: {tuple(item)!r}: expected at least 1 example")
        out.append((T, P, n) if size == 3 else (T, P))
    return tuple(out)


def model_kwargs(cfg: RecallConfig, build_maps: bool = True) -> dict[str, Any]:
    """The :class:`~linattn.nn.lm.LinearTransformerLM` keywords of ``cfg`` (its preset, then the
    explicit ``feature_map`` / ``window``), without ``vocab_size``. A preset's map that has no
    name in the LM (:data:`_MAP_BUILDERS`) is built as a template instance, or left None (the
    kind's default) with ``build_maps=False``, which keeps this function torch-free for the
    configuration's check."""
    kw: dict[str, Any] = dict(MIXER_PRESETS[cfg.mixer])
    head_dim = kw.pop("head_dim", None)
    heads = cfg.num_heads if head_dim is None else max(1, cfg.d_model // head_dim)
    if kw.get("feature_map") in _MAP_BUILDERS and cfg.feature_map is None:
        if build_maps:
            from linattn import feature_maps

            cls, args = _MAP_BUILDERS[kw["feature_map"]]
            kw["feature_map"] = getattr(feature_maps, cls)(**args(cfg.d_model // heads))
        else:
            kw["feature_map"] = None
    if kw.get("decay") is not None:
        kw["decay"] = (float(kw["decay"]),) * heads
    if cfg.feature_map is not None:
        kw["feature_map"] = cfg.feature_map
    if cfg.window is not None:
        kw["window"] = cfg.window
    if cfg.decay is not None:  # per-head decays of linear, softmax, hybrid (the LM's option)
        kw["decay"] = cfg.decay
    return {"d_model": cfg.d_model, "num_layers": cfg.num_layers, "num_heads": heads,
            "short_conv": cfg.short_conv, "mlp_dim": cfg.mlp_dim, **kw}


def _int(name: str, value: object, low: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return int(value)


def check_mqar(num_examples: object, seq_len: object, num_kv_pairs: object,
               vocab_size: object, power_a: object) -> tuple[int, int, int, int, float]:
    """The arguments of :func:`mqar` checked (one-line ValueError naming the argument) and
    returned as Python numbers. The constraints are Zoology's: T even, 4P ≤ T (the query
    region has a slot for every key), and enough distinct keys and values in each half of the
    vocabulary."""
    n = _int("num_examples", num_examples, 0)
    T = _int("seq_len", seq_len, 4)
    P = _int("num_kv_pairs", num_kv_pairs, 1)
    V = _int("vocab_size", vocab_size, 4)
    if T % 2:
        raise ValueError(f"seq_len: expected an even length (pairs and query slots are two "
                         f"tokens each), got {T}")
    if 4 * P > T:
        raise ValueError(f"seq_len: {T} is too short for {P} key-value pairs (need at least "
                         f"4 * num_kv_pairs = {4 * P})")
    if V // 2 - 1 < P:
        raise ValueError(f"vocab_size: {V} gives {V // 2 - 1} distinct keys, fewer than "
                         f"num_kv_pairs = {P}")
    if (not isinstance(power_a, numbers.Real) or isinstance(power_a, bool)
            or not math.isfinite(power_a) or power_a <= 0):
        raise ValueError(f"power_a: expected a finite number > 0, got {power_a!r}")
    return n, T, P, V, float(power_a)


#: The fields a cell's memory grows with (:func:`cell_bytes`).
_SIZES = ("d_model", "num_layers", "vocab_size", "mlp_dim", "short_conv", "seq_len",
          "num_kv_pairs", "train_examples", "val_examples", "test_examples", "batch_size",
          "train_mix", "eval_at", "window")


def cell_bytes(values: Mapping[str, Any]) -> int:
    """A lower bound of the bytes a cell needs (``values``: :class:`RecallConfig` fields):
    every data set's inputs and targets (int64), the largest ``eval_at`` set (made one at a
    time), the model's parameters with their gradients and Adam's moments, and the largest
    batch's activations (per token and layer q, k, v, the output and the MLP's hidden layer,
    the token shift's padded copies; the logits at the queries and their gradient), and a
    hybrid's ring buffers of the last ``window`` keys and values per layer, whatever the
    sequence length (``--window 10**9`` was an allocation of 954 GiB)."""
    E, L, V = values["d_model"], values["num_layers"], values["vocab_size"]
    mlp, k = values["mlp_dim"], values["short_conv"]
    own = (values["seq_len"], values["num_kv_pairs"])
    sets = [(*own, values["train_examples"]), (*own, values["val_examples"]),
            (*own, values["test_examples"]), *values["train_mix"]]
    data = sum(16 * n * T for T, _, n in sets)
    evals = max((16 * values["test_examples"] * T for T, _ in values["eval_at"]), default=0)
    params = lm_parameters(values)

    def batch(T: int, P: int, n: int) -> int:
        b = min(values["batch_size"], n)
        return 4 * b * T * L * (4 * E + mlp) + 8 * b * (T + k) * E + 8 * b * P * V

    largest = max(batch(*s) for s in sets[:1] + sets[3:])
    ring = 0
    if MIXER_PRESETS.get(values.get("mixer"), {}).get("attention") == "hybrid":
        from linattn.nn.mixers import DEFAULT_WINDOW  # torch-free

        b = min(values["batch_size"], max(n for _, _, n in sets))
        ring = 8 * b * E * L * (values.get("window") or DEFAULT_WINDOW)
    return data + evals + TRAINING_BYTES_PER_PARAMETER * params + largest + ring


def check_cell_memory(cfg: RecallConfig, available: int | None = None) -> None:
    """ValueError naming the field (the one whose default shrinks the estimate most) when the
    cell ``cfg`` cannot fit in the memory available (:func:`cell_bytes`)."""
    defaults = {f.name: f.default for f in fields(RecallConfig) if f.name in _SIZES}
    values = {"mixer": cfg.mixer, **{name: getattr(cfg, name) for name in _SIZES}}
    check_fits(cell_bytes, values, defaults, "this cell", available)
