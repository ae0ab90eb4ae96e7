"""Checks shared by the dataclass configurations (FordA model and training, streaming).

* Deprecated spellings: the library spells each concept one way (``d_model``, ``num_heads``,
  ``num_layers``). Where a user could already depend on an older spelling — a constructor
  keyword, a saved configuration, a command-line key — the old name keeps working with a
  :class:`DeprecationWarning` and gives the same result; both spellings with different values
  is a :class:`TypeError` (:func:`rename_deprecated`, :func:`renamed_keywords`).
* Removed options: a saved configuration may still name an option that was removed, at the
  value that meant "off"; any other value cannot be honoured (:func:`drop_removed`).
* Types and ranges of the fields (:func:`check_field_types`, :func:`check_ranges`).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

__all__ = ["rename_deprecated", "renamed_keywords", "Removed", "drop_removed",
           "check_field_types", "check_ranges"]

F = TypeVar("F", bound=Callable[..., Any])

#: Removed options: name → (is this saved value neutral, given the whole saved dict?, what the
#: option was, for the message).
Removed = Mapping[str, tuple[Callable[[Any, Mapping[str, Any]], bool], str]]


def rename_deprecated(d: Mapping[str, Any], aliases: Mapping[str, str], where: str,
                      stacklevel: int = 3) -> dict[str, Any]:
    """``d`` with each old name of ``aliases`` (old → new) replaced by its new one: one
    DeprecationWarning per old name found (``where`` opens the message); both spellings with
    different values is a TypeError."""
    out = dict(d)
    for old, new in aliases.items():
        if old not in out:
            continue
        value = out.pop(old)
        warnings.warn(f"{where}: {old!r} is deprecated, use {new!r}", DeprecationWarning,
                      stacklevel=stacklevel)
        if new in out and out[new] != value:
            raise TypeError(f"{where}: both {old!r} (deprecated) and {new!r} given, with "
                            f"different values {value!r} and {out[new]!r}")
        out[new] = value
    return out


def renamed_keywords(aliases: Mapping[str, str], where: str | None = None) -> Callable[[F], F]:
    """Decorate a function (or ``__init__``) so that it also accepts the old keyword names of
    ``aliases``; ``inspect.signature`` still shows the new ones. A new name given positionally
    and its old name as a keyword must agree."""

    def decorate(func: F) -> F:
        positional = [p.name for p in inspect.signature(func).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        label = where or func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not aliases.keys() & kwargs.keys():
                return func(*args, **kwargs)
            by_position = dict(zip(positional, args, strict=False))  # args may be fewer
            merged = rename_deprecated({**by_position, **kwargs}, aliases, label, stacklevel=3)
            return func(*args, **{k: v for k, v in merged.items() if k not in by_position})

        return wrapper  # type: ignore[return-value]

    return decorate


def drop_removed(d: Mapping[str, Any], removed: Removed, where: str,
                 error: type[Exception] = ValueError) -> dict[str, Any]:
    """``d`` without the removed options it names at their neutral value; one in use raises
    ``error`` naming it (``where`` names the file or object)."""
    out = {}
    for key, value in d.items():
        if key not in removed:
            out[key] = value
        elif not removed[key][0](value, d):
            raise error(f"{where}: uses the removed {removed[key][1]} ({key}={value!r}); load "
                        "it with linattn <= 0.1 (git history)")
    return out


def _type_ok(value: Any, kind: Any) -> bool:
    if kind is bool:
        return isinstance(value, (bool, np.bool_))
    if isinstance(value, (bool, np.bool_)):  # True is an int to Python, not to a config
        return False
    if kind is int:
        return isinstance(value, numbers.Integral)
    if kind is float:
        return isinstance(value, numbers.Real) and math.isfinite(value)
    return isinstance(value, kind)


def check_field_types(values: Mapping[str, Any], cls: type, where: str) -> None:
    """ValueError unless each value has the type its field of dataclass ``cls`` declares: an
    ``int`` field takes integers (not floats or bools), a ``float`` field finite numbers, a
    ``bool`` field bools, a ``str`` field strings. Unknown names are a ValueError too."""
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if name not in hints:
            raise ValueError(f"{where}: unknown key {name!r}")
        kind = hints[name]
        if not _type_ok(value, kind):
            raise ValueError(f"{where}: {name} must be {'an' if kind is int else 'a'} "
                             f"{kind.__name__}, got {value!r}")


#: An allowed range: (low, high, low inclusive, high inclusive).
Range = tuple[float, float, bool, bool]


def check_ranges(values: Mapping[str, Any], ranges: Mapping[str, Range], where: str) -> None:
    """ValueError naming the first value of ``values`` outside its range in ``ranges``."""
    for name, (lo, hi, lo_in, hi_in) in ranges.items():
        if name not in values:
            continue
        v = values[name]
        if not ((v >= lo if lo_in else v > lo) and (v <= hi if hi_in else v < hi)):
            interval = f"{'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"
            raise ValueError(f"{where}: {name} must be in {interval}, got {v!r}")
