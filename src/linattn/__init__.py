"""linattn: linear attention for PyTorch.

Names are imported on first use (PEP 562), so ``import linattn`` and the light commands
(``linattn solve``, ``linattn --help``) do not pay for importing torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from linattn.ops import EXPORTS as _OP_EXPORTS  # torch-free: the table of op folders

#: public name -> (module, attribute or None for the module itself). The ops come from the one
#: table of op folders, :data:`linattn.ops.OPS`.
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "feature_maps": ("linattn.feature_maps", None),
    "nn": ("linattn.nn", None),
    "fla": ("linattn.fla", None),
    "lm": ("linattn.lm", None),
    "reference": ("linattn.ops.reference", None),
    **{name: (f"linattn.ops.{op}", name) for name, op in _OP_EXPORTS.items()},
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'linattn' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
