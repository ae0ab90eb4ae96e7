"""The token mixers of :class:`~linattn.nn.lm.LinearTransformerLM`: one registry entry per
``attention=`` kind.

A *mixer* is the module of a decoder layer that mixes tokens: ``mixer(x, state, position) ->
(out, new_state)`` with x and out (B, T, E), ``state`` None (nothing seen yet) or what the
previous call returned after ``position`` tokens. Every mixer is built as
``Module(d_model, num_heads, chunk_size=..., dropout=..., **options)`` and returns a state of
one type: a dataclass of tensors (and int counters), which :func:`state_to_dict` /
:func:`state_from_dict` save as a flat dict of tensors.

:data:`MIXERS` is the one list of kinds: the model builds its layers from it
(:func:`build_mixer`), :class:`~linattn.nn.lm.LMConfig` checks options against it (an option a
kind does not take is a ValueError naming it), ``linattn lm train --attention`` takes its
choices from it, :class:`~linattn.nn.lm.LMState` saves and restores the state types it names,
and those types are registered as pytrees for ``torch.export``. Adding a mixer is its module,
its state dataclass and one line, as gated linear attention was added::

    "gla": MixerSpec("linattn.nn.gla:GLAAttention", "linattn.nn.gla:GLAState", {},
                     "gated linear attention (GLA), learned per-key decays"),

(tests and docs aside). A state whose fields are another kind's (e.g. a lone ``S``) needs
``LMState.from_dict(d, attention=...)`` to be told apart. A kind needing an option that no
kind takes yet also adds it to :data:`OPTION_DEFAULTS`, to the :class:`~linattn.nn.lm.LMConfig`
fields and to the command's flags.

The model's configuration is checked here too, torch-free (:data:`CONFIG_CHECKS`,
:func:`check_config`): :class:`~linattn.nn.lm.LMConfig` calls it when it is made, and
``linattn lm train`` parses its flags with the same declarations and checks the whole
configuration before torch is imported.

This module does not import torch (the command line reads :data:`MIXERS` to build its parser):
classes are named ``"module:attribute"`` and imported on first use (a class itself works too,
e.g. for a mixer registered at run time).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from linattn._config import FEATURE_MAP, POSITIVE_INT, Check, Range

__all__ = ["MixerSpec", "MIXERS", "OPTION_DEFAULTS", "DEFAULT_WINDOW", "CONFIG_CHECKS",
           "COSFORMER_HORIZON", "check_positions", "check_config", "get_mixer",
           "is_unset", "mixer_options", "build_mixer", "state_types", "state_fields",
           "state_to_dict", "state_from_dict", "StateDict", "batch_size_of"]

#: The hybrid's window when none is given.
DEFAULT_WINDOW = 64

#: The mixer options the model passes on (:class:`~linattn.nn.lm.LMConfig` fields) and their
#: *unset* value: a kind that does not take an option accepts it only at this value.
#: None for ``decay`` and ``window`` means "the kind's default".
OPTION_DEFAULTS: dict[str, Any] = {"feature_map": "elu", "decay": None, "window": None}


def _resolve(path: str | type) -> Any:
    if not isinstance(path, str):
        return path
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class MixerSpec:
    """One ``attention=`` kind.

    Attributes:
        module: the mixer class or its ``"module:Class"`` (see the module docstring for its
            contract).
        state: the state dataclass its forward returns, or its ``"module:Class"``.
        options: the options of :data:`OPTION_DEFAULTS` the kind takes → its default for each
            (None: the module's own default, e.g. :func:`~linattn.nn.lm.default_decays`).
            Any other option must stay unset.
        summary: one line for ``--help`` and the docs.
        kwargs: fixed keywords for the constructor (a module that computes several kinds is
            told which one).
        max_positions: the most positions the kind's weights hold in a sequence (cosFormer's
            horizon; a ValueError past it), None for any (:func:`check_positions`).
    """

    module: str | type
    state: str | type
    options: Mapping[str, Any]
    summary: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_positions: int | None = None

    def module_class(self) -> type:
        return _resolve(self.module)

    def state_class(self) -> type:
        return _resolve(self.state)


_DECAYED = "linattn.nn.lm:DecayedMultiheadAttention"
#: cosFormer's horizon: the positions its re-weighting holds for (linattn.nn.cosformer).
COSFORMER_HORIZON = 1024

#: ``attention=`` kind → its mixer. The first is the default.
MIXERS: dict[str, MixerSpec] = {
    "linear": MixerSpec(
        _DECAYED, "linattn.ops.linear.recurrent:LinearAttentionState",
        {"feature_map": "elu", "decay": None},
        "decayed linear attention (recurrent state)", {"attention": "linear"}),
    "softmax": MixerSpec(
        _DECAYED, "linattn.nn.lm:KVCache", {"decay": None},
        "softmax with the decays as an ALiBi bias (SDPA baseline, KV cache)",
        {"attention": "softmax"}),
    "hybrid": MixerSpec(
        _DECAYED, "linattn.ops.window.op:WindowLinearAttentionState",
        {"feature_map": "elu", "decay": None, "window": DEFAULT_WINDOW},
        "exact softmax over the last `window` tokens, linear attention before them",
        {"attention": "hybrid"}),
    "gated_delta": MixerSpec(
        "linattn.nn.gated_delta:GatedDeltaAttention", "linattn.nn.gated_delta:DeltaRuleState",
        {}, "Gated DeltaNet: the gated delta rule, learned decays"),
    "gla": MixerSpec("linattn.nn.gla:GLAAttention", "linattn.nn.gla:GLAState", {},
                     "gated linear attention (GLA), learned per-key decays"),
    "deltanet": MixerSpec(
        "linattn.nn.gated_delta:GatedDeltaAttention", "linattn.nn.gated_delta:DeltaRuleState",
        {}, "DeltaNet: the delta rule without decays", {"gated": False}),
    "cosformer": MixerSpec(
        "linattn.nn.cosformer:CosFormerAttention", "linattn.nn.cosformer:CosFormerState", {},
        f"causal cosFormer: relu features re-weighted by cos of the lag (up to "
        f"{COSFORMER_HORIZON} tokens)", max_positions=COSFORMER_HORIZON),
    "flowformer": MixerSpec(
        "linattn.nn.flowformer:FlowformerAttention", "linattn.nn.flowformer:FlowState", {},
        "causal Flowformer: sigmoid features normalised by conserved flows"),
}


def get_mixer(attention: object) -> MixerSpec:
    """The entry of ``attention``; ValueError naming ``attention`` for an unknown kind."""
    spec = MIXERS.get(attention) if isinstance(attention, str) else None
    if spec is None:
        raise ValueError(f"attention: expected one of {', '.join(MIXERS)}, got {attention!r}")
    return spec


def is_unset(value: Any, unset: Any) -> bool:
    """Whether an option's ``value`` is its unset value ``unset`` (of :data:`OPTION_DEFAULTS`)."""
    if unset is None:
        return value is None
    return type(value) is type(unset) and value == unset


def mixer_options(attention: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor keywords of ``attention``'s mixer for the model-level ``options``
    (names of :data:`OPTION_DEFAULTS`): the options it takes, unset ones replaced by its
    defaults, plus its fixed keywords. ValueError naming the option when one it does not take
    is set."""
    spec = get_mixer(attention)
    out = {}
    for name, value in options.items():
        if name not in OPTION_DEFAULTS:
            raise TypeError(f"{name}: not a mixer option (expected one of "
                            f"{', '.join(OPTION_DEFAULTS)})")
        unset = is_unset(value, OPTION_DEFAULTS[name])
        if name in spec.options:
            out[name] = spec.options[name] if unset else value
        elif not unset:
            users = " or ".join(repr(k) for k, s in MIXERS.items() if name in s.options)
            raise ValueError(f"{name}: not used with attention={attention!r} (only with "
                             f"{users}), got {value!r}")
    return {**out, **spec.kwargs}


#: The type and range of the fields of :class:`~linattn.nn.lm.LMConfig` (and of the
#: ``linattn lm train`` flags that set them): declared once, torch-free. ``chunk_size`` None is
#: the default chunk; ``feature_map`` is checked when it is a name (an instance or a factory
#: is the module's to check); ``attention`` and ``decay`` are checked by :func:`check_config`.
CONFIG_CHECKS: dict[str, Check] = {
    "vocab_size": POSITIVE_INT,
    "d_model": POSITIVE_INT,
    "num_layers": POSITIVE_INT,
    "num_heads": POSITIVE_INT,
    "mlp_dim": Check(int, Range(0, math.inf), optional=True),  # 0: no MLP
    "chunk_size": Check(int, Range(1, math.inf), optional=True),
    # a state keeps the last `window` keys: at most 2**31 − 1 (linattn.ops.window.check_window)
    "window": Check(int, Range(1, 2**31 - 1, True, True), optional=True),
    "short_conv": Check(int, Range(0, math.inf)),
    "dropout": Check(float, Range(0.0, 1.0, True, False)),
    "feature_map": FEATURE_MAP,
}


def check_config(values: Mapping[str, Any]) -> None:
    """Check a language model's configuration (the fields of
    :class:`~linattn.nn.lm.LMConfig`; the sizes are required, the rest optional): ValueError
    naming the field for a value of the wrong type or range (:data:`CONFIG_CHECKS`), an option
    the ``attention`` kind does not take (:func:`mixer_options`), or ``d_model`` not divisible
    by ``num_heads``."""
    for name in ("vocab_size", "d_model", "num_layers", "num_heads"):
        CONFIG_CHECKS[name].check(name, values[name])
    mixer_options(values.get("attention", next(iter(MIXERS))),
                  {name: values.get(name, unset) for name, unset in OPTION_DEFAULTS.items()})
    for name in ("window", "chunk_size", "mlp_dim", "dropout", "short_conv"):
        if name in values:
            CONFIG_CHECKS[name].check(name, values[name])
    fmap = values.get("feature_map")
    if isinstance(fmap, str) and fmap.lower() not in FEATURE_MAP.choices:
        raise ValueError(f"feature_map: unknown name {fmap!r}; choose from "
                         f"{', '.join(sorted(FEATURE_MAP.choices))}")
    d_model, num_heads = values["d_model"], values["num_heads"]
    if d_model % num_heads:
        raise ValueError(f"num_heads: d_model {d_model} is not divisible by {num_heads}")


def check_positions(attention: str, positions: int, name: str) -> None:
    """ValueError naming ``name`` when a sequence of ``positions`` tokens is longer than the
    kind ``attention``'s weights hold (:attr:`MixerSpec.max_positions`)."""
    most = MIXERS[attention].max_positions if attention in MIXERS else None
    if most is not None and positions > most:
        raise ValueError(f"{name}: {attention}'s weights hold for {most} positions, "
                         f"{positions} asked for")


def build_mixer(attention: str, d_model: int, num_heads: int, *, chunk_size: int,
                dropout: float = 0.0, **options: Any) -> Any:
    """The mixer module of kind ``attention`` (see :func:`mixer_options` for ``options``)."""
    kwargs = mixer_options(attention, options)
    return MIXERS[attention].module_class()(d_model, num_heads, chunk_size=chunk_size,
                                            dropout=dropout, **kwargs)


def state_types() -> dict[str, type]:
    """``attention`` kind → its state class (imports the classes)."""
    return {name: spec.state_class() for name, spec in MIXERS.items()}


def batch_size_of(states: list[Any]) -> int | None:
    """The batch size of the first tensor (its first dimension) among mixer states (state
    dataclasses, tuples or lists of tensors, tensors), None when none holds one."""
    import torch  # this module is read without torch (the commands' options)

    for st in states:
        parts = ([getattr(st, f.name) for f in dataclasses.fields(st)]
                 if dataclasses.is_dataclass(st) else st if isinstance(st, (tuple, list))
                 else [st])
        for t in parts:
            if isinstance(t, torch.Tensor) and t.dim() >= 1:
                return t.shape[0]
    return None


# -- states as flat dicts of tensors ---------------------------------------------------------


def _int_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.type in (int, "int")}


def state_to_dict(state: Any, prefix: str = "") -> dict[str, Any]:
    """A state dataclass as ``{prefix + field: tensor}`` in field order: tensors detached and
    cloned, int fields (counters) as int64 scalars."""
    import torch

    ints = _int_fields(type(state))
    out = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        out[prefix + f.name] = (torch.tensor(value, dtype=torch.int64) if f.name in ints
                                else value.detach().clone())
    return out


def state_from_dict(cls: type, d: Mapping[str, Any], prefix: str = "") -> Any:
    """The ``cls`` state stored by :func:`state_to_dict`; KeyError for a missing entry."""
    ints = _int_fields(cls)
    return cls(**{f.name: int(d[prefix + f.name]) if f.name in ints else d[prefix + f.name]
                  for f in dataclasses.fields(cls)})


def state_fields(cls: type) -> tuple[str, ...]:
    """The entries a ``cls`` state is saved as (its dataclass fields)."""
    return tuple(f.name for f in dataclasses.fields(cls))


class StateDict:
    """Mixin of a state dataclass: :meth:`to_dict` / :meth:`from_dict` as a flat dict of
    tensors (:func:`state_to_dict`, :func:`state_from_dict`)."""

    def to_dict(self) -> dict[str, Any]:
        return state_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Any:
        try:
            return state_from_dict(cls, d)
        except KeyError as err:
            raise ValueError(f"state dict: missing entry {err}") from None
