"""linattn models in ONNX: the standard ``LinearAttention`` / ``CausalConvWithState`` ops.

``linattn.onnx.export(model, example, path)`` writes an opset-27 ONNX file through PyTorch's
exporter (docs/onnx.md). Needs the ``onnx`` extra (onnx, onnxruntime, onnxscript); this
module imports without them, and :func:`export` names what is missing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["export", "LMSession"]


def __getattr__(name: str) -> Any:
    if name == "export":
        _require("onnx", "onnxscript")
        from linattn.onnx.exporter import export

        return export
    if name == "LMSession":
        _require("onnxruntime")
        from linattn.onnx.runtime import LMSession

        return LMSession
    raise AttributeError(name)


def _require(*modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"linattn.onnx needs {', '.join(missing)}: "
                          "pip install 'linattn[onnx]'")
