"""transformers' linear-attention models on CPU through linattn: one call per model.

transformers builds Qwen3.5, Qwen3-Next, OLMo-hybrid, Kimi-Linear and their relatives on
flash-linear-attention's functions (``chunk_gated_delta_rule``, ``chunk_kda``, ...) and on
causal-conv1d's (``causal_conv1d_fn``, ``causal_conv1d_update``). Both are GPU libraries: on a
CPU transformers runs a slow torch reference instead, or, with fla installed, crashes in
Triton. One call routes every CPU call of those functions, and of the family's gated RMSNorm,
to linattn::

    import torch, linattn.hf
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3.5-0.8B", dtype=torch.bfloat16)
    linattn.hf.apply_linattn(model)            # the family from model.config.model_type
    model.generate(...)                         # the same tokens, faster

or, before loading, ``linattn.hf.apply_linattn_to_qwen3_5()`` (one such function per family,
:data:`FAMILIES`). ``revert_linattn()`` undoes it.

Why Liger Kernel's convention (``apply_liger_kernel_to_<model>()``), not the ``kernels``
library's ``kernelize``: kernelize maps layer names to kernel *repositories* on the Hugging Face
hub (a download, and an extra package), and transformers resolves these module-level functions
once, when the modeling file is imported; the patch needs neither, works on a model that is
already loaded (the layers look the functions up when they run), and is one line that
users of Liger already know.

What the patch does: it replaces the family's module-level functions and its gated norm's
``forward`` by routers. A router sends a call to linattn when its tensors are on the CPU and
the call is not being traced by ``torch.export`` or ``torch.compile``; everything else (GPU
runs, where fla's kernels stay in charge; exports; compiled graphs) goes to what was there
before, unchanged. So fla's Triton functions are never reached on a CPU, whether or not fla
is installed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FAMILIES", "Family", "apply_linattn", "revert_linattn", "patched",
           "apply_linattn_to_qwen3_5", "apply_linattn_to_qwen3_5_moe",
           "apply_linattn_to_qwen3_next", "apply_linattn_to_olmo_hybrid",
           "apply_linattn_to_qwen4_exp", "apply_linattn_to_kimi_linear",
           "apply_linattn_to_bailing_hybrid", "apply_linattn_to_lfm2"]

#: What each kind of transformers function becomes: (linattn.fla's name, the part it belongs to
#: for :func:`apply_linattn`'s switches, transformers' argument names -> linattn.fla's).
_KINDS: dict[str, tuple[str, str, dict[str, str]]] = {
    "chunk_gdn": ("chunk_gated_delta_rule", "recurrence", {"query": "q", "key": "k",
                                                            "value": "v"}),
    "recurrent_gdn": ("fused_recurrent_gated_delta_rule", "recurrence",
                      {"query": "q", "key": "k", "value": "v"}),
    "chunk_kda": ("chunk_kda", "recurrence", {"query": "q", "key": "k", "value": "v"}),
    "recurrent_kda": ("fused_recurrent_kda", "recurrence", {"query": "q", "key": "k",
                                                            "value": "v"}),
    "conv": ("causal_conv1d_fn", "conv", {"hidden_states": "x"}),
    "conv_update": ("causal_conv1d_update", "conv", {"hidden_states": "x"}),
}

_GDN = {"torch_chunk_gated_delta_rule": "chunk_gdn",
        "torch_recurrent_gated_delta_rule": "recurrent_gdn",
        "causal_conv1d_fn": "conv", "causal_conv1d_update": "conv_update"}
_KDA = {"chunk_kimi_delta_attention": "chunk_kda",
        "recurrent_kimi_delta_attention": "recurrent_kda",
        "causal_conv1d_fn": "conv", "causal_conv1d_update": "conv_update"}
_CONV = {"causal_conv1d_fn": "conv", "causal_conv1d_update": "conv_update"}


@dataclass(frozen=True)
class Family:
    """One transformers model family: its modeling module (``transformers.models.<name>.
    modeling_<name>``), its module-level functions and their kinds, its gated-norm classes and
    the ``model_type`` strings of its configs."""

    name: str
    functions: dict[str, str]
    norms: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return f"transformers.models.{self.name}.modeling_{self.name}"


#: family -> what the patch replaces. Gated DeltaNet: qwen3_5, qwen3_5_moe, qwen3_next,
#: olmo_hybrid, qwen4_exp; KDA: kimi_linear, bailing_hybrid; lfm2 has only the short
#: convolution (and softmax attention).
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen3_5", _GDN, ("Qwen3_5RMSNormGated",), ("qwen3_5", "qwen3_5_text")),
    Family("qwen3_5_moe", _GDN, ("Qwen3_5MoeRMSNormGated",),
           ("qwen3_5_moe", "qwen3_5_moe_text")),
    Family("qwen3_next", _GDN, ("Qwen3NextRMSNormGated",), ("qwen3_next",)),
    Family("olmo_hybrid", _GDN, ("OlmoHybridRMSNormGated",), ("olmo_hybrid",)),
    Family("qwen4_exp", _GDN, ("Qwen4ExpTextRMSNormGated",), ("qwen4_exp", "qwen4_exp_text")),
    Family("kimi_linear", _KDA, ("KimiLinearRMSNormGated",), ("kimi_linear",)),
    Family("bailing_hybrid", _KDA, ("BailingHybridRMSNormGated",), ("bailing_hybrid",)),
    Family("lfm2", _CONV, (), ("lfm2",)),
)}

#: (module name, attribute) -> what was there before the patch (for revert_linattn)
_ORIGINALS: dict[tuple[str, str], object] = {}


def _module(family: Family):
    try:
        return importlib.import_module(family.module)
    except ImportError as e:
        raise ImportError(f"linattn.hf: transformers' {family.name} model is not importable "
                          f"here ({e}); it needs transformers >= 5.23") from None


def _route_here(x: object) -> bool:
    """Whether a call whose first tensor is ``x`` goes to linattn: a CPU tensor, outside
    torch.export and torch.compile tracing (there the original keeps the graph as it was)."""
    import torch

    return (isinstance(x, torch.Tensor) and x.device.type == "cpu"
            and not torch.compiler.is_exporting() and not torch.compiler.is_compiling())


def _router(original: Callable, target: Callable, rename: dict[str, str]) -> Callable:
    """``original``'s stand-in: CPU calls go to ``target`` with transformers' arguments renamed
    to fla's, by name (transformers' reference functions and fla's order their parameters
    differently), everything else to ``original``."""
    params = list(inspect.signature(original).parameters.values())
    positional = [rename.get(p.name, p.name) for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    first = params[0].name if params else None

    @functools.wraps(original)
    def routed(*args, **kwargs):
        if not _route_here(args[0] if args else kwargs.get(first)):
            return original(*args, **kwargs)
        # by hand, not Signature.bind: a few µs, and this runs per layer and token
        named = dict(zip(positional, args, strict=False))
        for name, value in kwargs.items():
            named[rename.get(name, name)] = value
        return target(**named)

    routed._linattn_original = original
    return routed


def _norm_forward(original: Callable) -> Callable:
    """A gated norm's ``forward`` (``self.weight``, ``self.variance_epsilon``,
    ``self.activation``; norm before gate) on :func:`linattn.rms_norm_gated` for CPU calls."""

    @functools.wraps(original)
    def forward(self, hidden_states, gate=None):
        if gate is None or not _route_here(hidden_states):
            return original(self, hidden_states, gate)
        from linattn.ops.norm import rms_norm_gated

        return rms_norm_gated(hidden_states, gate, self.weight, eps=self.variance_epsilon,
                              activation=self.activation)

    forward._linattn_original = original
    return forward


def _set(module, name: str, value: object) -> None:
    _ORIGINALS.setdefault((module.__name__, name), getattr(module, name))
    setattr(module, name, value)


def _patch(family: Family, *, recurrence: bool, conv: bool, norm: bool) -> list[str]:
    from linattn import fla

    module = _module(family)
    wanted = {"recurrence": recurrence, "conv": conv}
    done = []
    for name, kind in family.functions.items():
        fla_name, part, rename = _KINDS[kind]
        current = getattr(module, name, None)
        if current is None or not wanted[part]:
            continue
        original = getattr(current, "_linattn_original", current)  # never wrap twice
        _set(module, name, _router(original, getattr(fla, fla_name), rename))
        done.append(f"{family.name}.{name}")
    for cls_name in family.norms if norm else ():
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue
        original = getattr(cls.forward, "_linattn_original", cls.forward)
        _ORIGINALS.setdefault((module.__name__, f"{cls_name}.forward"), original)
        cls.forward = _norm_forward(original)
        done.append(f"{family.name}.{cls_name}.forward")
    return done


def _family_of(model: object) -> Family:
    """The family of a transformers model (or config, or model_type string)."""
    config = getattr(model, "config", model)
    types = [config] if isinstance(config, str) else [
        getattr(c, "model_type", None)
        for c in (config, getattr(config, "text_config", None)) if c is not None]
    for family in FAMILIES.values():
        if any(t in family.model_types for t in types):
            return family
    known = ", ".join(sorted(t for f in FAMILIES.values() for t in f.model_types))
    raise ValueError(f"model: linattn.hf has no patch for model_type "
                     f"{', '.join(str(t) for t in types if t) or '(none)'}; it covers {known}")


def apply_linattn(model: object, *, recurrence: bool = True, conv: bool = True,
                  norm: bool = True) -> list[str]:
    """Route a transformers model's linear-attention functions to linattn on CPU.

    Args:
        model: a transformers model, its config, or a ``model_type`` string (e.g.
            ``"qwen3_5"``): the whole family is patched, every model of it in this process.
        recurrence, conv, norm: which parts (the gated delta rule / KDA recurrences, the short
            causal convolution, the gated RMSNorm); all by default.

    Returns the names replaced (``"qwen3_5.torch_chunk_gated_delta_rule"``, ...). Raises
    ValueError for a model linattn has no patch for, ImportError where the transformers
    installed lacks the family. Calling it again is harmless (nothing is wrapped twice).
    """
    return _patch(_family_of(model), recurrence=recurrence, conv=conv, norm=norm)


def revert_linattn(model: object | None = None) -> list[str]:
    """Undo :func:`apply_linattn` for ``model``'s family (any form apply_linattn takes), or for
    every family when None. Returns the names restored."""
    import sys

    family = None if model is None else _family_of(model)
    restored = []
    for (module_name, name), original in list(_ORIGINALS.items()):
        if family is not None and module_name != family.module:
            continue
        module = sys.modules[module_name]
        if name.endswith(".forward"):
            getattr(module, name.split(".")[0]).forward = original
        else:
            setattr(module, name, original)
        del _ORIGINALS[(module_name, name)]
        restored.append(f"{module_name.split('.')[-2]}.{name}")
    return restored


def patched(model: object) -> bool:
    """Whether ``model``'s family is routed to linattn now (any part)."""
    family = _family_of(model)
    return any(module_name == family.module for module_name, _ in _ORIGINALS)


def _apply_to(family: str) -> Callable[..., list[str]]:
    def apply(model: object | None = None, *, recurrence: bool = True, conv: bool = True,
              norm: bool = True) -> list[str]:
        return _patch(FAMILIES[family], recurrence=recurrence, conv=conv, norm=norm)

    apply.__name__ = apply.__qualname__ = f"apply_linattn_to_{family}"
    apply.__doc__ = (f"Route transformers' {family} models to linattn on CPU (see "
                     f":func:`apply_linattn`; ``model`` is accepted, as in Liger Kernel, and "
                     f"changes nothing: the patch is per family). Returns the names replaced.")
    return apply


apply_linattn_to_qwen3_5 = _apply_to("qwen3_5")
apply_linattn_to_qwen3_5_moe = _apply_to("qwen3_5_moe")
apply_linattn_to_qwen3_next = _apply_to("qwen3_next")
apply_linattn_to_olmo_hybrid = _apply_to("olmo_hybrid")
apply_linattn_to_qwen4_exp = _apply_to("qwen4_exp")
apply_linattn_to_kimi_linear = _apply_to("kimi_linear")
apply_linattn_to_bailing_hybrid = _apply_to("bailing_hybrid")
apply_linattn_to_lfm2 = _apply_to("lfm2")
