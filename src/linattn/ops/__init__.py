"""Pure tensor functions, no module state: one folder per op.

Each folder holds the op's public functions (``op.py``), its ground truth (``reference.py``,
re-exported by :mod:`linattn.reference`), and where it has them its compiled glue
(``native.py`` and C kernels), its other torch forms and flash-linear-attention's names for it
(``fla.py``, re-exported by :mod:`linattn.fla`). :data:`OPS` is the one list of them: adding an
op is a folder and one line here.

Names are imported on first use (PEP 562), like ``linattn``'s own, so that reading :data:`OPS`
does not import torch.
"""

from __future__ import annotations

import importlib

#: op folder -> the public names it exports (re-exported by ``linattn`` and ``linattn.ops``).
OPS: dict[str, tuple[str, ...]] = {
    "linear": ("linear_attention", "LinearAttentionState", "linear_attention_step"),
    "relative": ("relative_linear_attention",),
    "cosformer": ("cosformer_attention",),
    "decay": ("decay_linear_attention", "decay_linear_attention_step"),
    "decay_softmax": ("decay_softmax_attention",),
    "flowformer": ("flowformer_attention",),
    "window": ("window_linear_attention", "window_linear_attention_step",
               "WindowLinearAttentionState"),
    "gated": ("gated_linear_attention", "gated_linear_attention_step"),
    "delta": ("delta_rule", "delta_rule_step"),
    "conv": ("causal_conv1d", "causal_conv1d_step"),
    "norm": ("rms_norm_gated",),
}

#: public name -> the op folder that exports it
EXPORTS: dict[str, str] = {name: op for op, names in OPS.items() for name in names}

__all__ = ["OPS", "EXPORTS", "reference", "register_custom_ops", *EXPORTS]


def register_custom_ops() -> list[str]:
    """Import every op folder's compiled glue, which registers its ``linattn::`` custom ops
    with PyTorch, and return their names: what a process that runs an exported program (e.g.
    an AOTInductor package) calls before loading it."""
    import importlib.util

    import torch

    for op in OPS:
        if importlib.util.find_spec(f"linattn.ops.{op}.native") is not None:
            importlib.import_module(f"linattn.ops.{op}.native")
    return sorted(name for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("linattn::"))


def __getattr__(name: str):
    if name == "reference":
        value = importlib.import_module("linattn.ops.reference")
    elif name in EXPORTS:
        value = getattr(importlib.import_module(f"linattn.ops.{EXPORTS[name]}"), name)
    else:
        raise AttributeError(f"module 'linattn.ops' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
