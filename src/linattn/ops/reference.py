"""References: the ground truth that every fast path is tested against (``linattn.reference``).

Each op's reference lives beside it (``linattn/ops/<op>/reference.py``) and is re-exported here.
The attention references build the explicit T×T similarity matrix; the gated and delta-rule
recurrences, whose weights are not a fixed matrix of the scores, are walked token by token in
float64. They cost O(T²) time and memory or a Python loop over T by design: never call them on
a fast path. Each is standalone: it shares no code with the op it checks, only the feature map
(an input of both) and the argument checks of :mod:`linattn.ops._reference_checks`, which no op
uses.
"""

from __future__ import annotations

import importlib

from linattn.ops import OPS

__all__: list[str] = []
for _op in OPS:
    _module = importlib.import_module(f"linattn.ops.{_op}.reference")
    for _name in _module.__all__:
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)
del _op, _module, _name
