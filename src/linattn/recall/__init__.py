"""Multi-query associative recall (MQAR, Zoology's synthetic recall benchmark) on CPU.

* :func:`mqar` (:mod:`linattn.recall.data`): the seeded generator, Zoology's layout;
* :class:`RecallConfig`, :data:`MIXER_PRESETS` (:mod:`linattn.recall.options`, torch-free);
* :func:`run_cell`, :func:`train_one`, :func:`accuracy`, :func:`state_bytes`
  (:mod:`linattn.recall.harness`): training with a learning-rate sweep, test accuracy, decoding
  state size; :func:`run_grid`, :func:`format_table` (:mod:`linattn.recall.table`).

Names are loaded on first use, so ``linattn recall --help`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "mqar": "data", "gap_distribution": "data", "IGNORE_INDEX": "data",
    "RecallConfig": "options", "MIXER_PRESETS": "options", "DEFAULT_LRS": "options",
    "TABLE_MIX": "options",
    "check_mqar": "options",
    "run_cell": "harness", "train_one": "harness", "accuracy": "harness",
    "state_bytes": "harness", "build_model": "harness", "query_logits": "harness",
    "run_grid": "table", "format_table": "table",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'linattn.recall' has no attribute {name!r}")
    return getattr(importlib.import_module(f"linattn.recall.{module}"), name)
