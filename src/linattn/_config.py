"""Checks shared by the dataclass configurations (FordA model and training, streaming).

* Deprecated spellings: the library spells each concept one way (``d_model``, ``num_heads``,
  ``num_layers``). Where a user could already depend on an older spelling — a constructor
  keyword, a saved configuration, a command-line key — the old name keeps working with a
  :class:`DeprecationWarning` and gives the same result; both spellings with different values
  is a :class:`TypeError` (:func:`rename_deprecated`, :func:`renamed_keywords`).
* Removed options: a saved configuration may still name an option that was removed, at the
  value that meant "off"; any other value cannot be honoured (:func:`drop_removed`).
* Types and ranges of the fields (:func:`check_field_types`, :func:`check_ranges`).
* Options declared once (:class:`Check`): the type and allowed values of a value that both a
  library configuration and a command-line flag take. The library checks values with
  :meth:`Check.check` (a one-line ValueError naming the field), the commands parse their flags
  with :meth:`Check.parse` (argparse's ``type=``: a bad flag is a one-line error before anything
  is loaded). Shared declarations live here (:data:`THREADS`, :data:`POSITIVE_INT`,
  :data:`FEATURE_MAP_NAMES`); those of one configuration beside it, torch-free
  (:data:`linattn.nn.mixers.CONFIG_CHECKS`, :mod:`linattn.lm.options`).
* Environment settings (:func:`env_setting`): the one rule of every ``LINATTN_*`` variable.
* Thread counts (:func:`capped_threads`, :func:`set_threads`, :func:`torch_threads`): checked,
  and capped at the CPUs this process may run on with one warning (torch and OpenMP crash on
  absurd counts). Every place that takes a user's count goes through them.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import numbers
import os
import sys
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

__all__ = ["rename_deprecated", "renamed_keywords", "Removed", "drop_removed",
           "check_field_types", "check_ranges", "Range", "Check", "THREADS", "POSITIVE_INT",
           "INTEGER", "SEED", "FEATURE_MAP_NAMES", "available_cpus", "capped_threads",
           "set_threads", "torch_threads", "shown", "env_setting"]

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


def _is_bool(value: Any) -> bool:
    """A Python or NumPy bool (NumPy is not imported for this: the commands' parsers use these
    checks, and a NumPy bool exists only once NumPy is loaded)."""
    if isinstance(value, bool):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.bool_)


def _type_ok(value: Any, kind: Any) -> bool:
    if kind is bool:
        return _is_bool(value)
    if _is_bool(value):  # True is an int to Python, not to a config
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


#: float32's largest finite number and its smallest positive (subnormal) one. A number that
#: reaches torch as a float32 scalar (a learning rate, a weight decay, a temperature) must lie
#: between them, or be 0 (:attr:`Check.float32`): 1e300 as a learning rate was a traceback
#: from inside the optimiser ("value cannot be converted to type float without overflow").
F32_MAX = 3.4028234663852886e38
F32_TINY = 2.0 ** -149


def float32_holds(v: float) -> bool:
    """Whether the finite number ``v`` is 0 or has a magnitude float32 can hold (a number
    that rounds to 0 or overflows in float32 is not held)."""
    return v == 0 or F32_TINY <= abs(v) <= F32_MAX


class Range(NamedTuple):
    """An allowed interval of numbers: (low, high, low inclusive, high inclusive)."""

    low: float
    high: float
    low_inclusive: bool = True
    high_inclusive: bool = False

    def holds(self, v: Any) -> bool:
        """Whether the number ``v`` lies in the interval (NaN never does)."""
        lo, hi, lo_in, hi_in = self
        return bool((v >= lo if lo_in else v > lo) and (v <= hi if hi_in else v < hi))

    def interval(self) -> str:
        lo, hi, lo_in, hi_in = self
        return f"{'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"


def check_ranges(values: Mapping[str, Any], ranges: Mapping[str, tuple], where: str) -> None:
    """ValueError naming the first value of ``values`` outside its range in ``ranges``
    (:class:`Range`, or plain tuples of its four fields)."""
    for name, r in ranges.items():
        if name not in values:
            continue
        v, r = values[name], Range(*r)
        if not r.holds(v):
            raise ValueError(f"{where}: {name} must be in {r.interval()}, got {v!r}")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def shown(value: Any) -> str:
    """``repr(value)`` for a one-line message; an integer of 60 digits or more by its size
    (Python refuses to print one of more than 4,300 digits, and a 4 KB line says nothing)."""
    if isinstance(value, numbers.Integral) and not _is_bool(value) \
            and abs(int(value)) >= 10 ** 60:
        return f"{'-' if value < 0 else ''}an integer of {abs(int(value)).bit_length()} bits"
    return repr(value)


@dataclass(frozen=True)
class Check:
    """The type and allowed values of one option, declared once for the library and the
    command line (module docstring).

    ``kind``: int (integers, not bools), float (finite real numbers) or str; ``range``: the
    allowed interval of a number; ``choices``: the allowed strings (compared in lower case);
    ``optional``: None is allowed too; ``float32``: a number that reaches torch as a float32
    scalar, whose magnitude float32 must hold (:func:`float32_holds`)."""

    kind: type
    range: Range | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False
    float32: bool = False

    def _beyond_float32(self, value: Any) -> bool:
        return (self.float32 and isinstance(value, numbers.Real) and not _is_bool(value)
                and math.isfinite(value) and not float32_holds(value))

    def expected(self, value: Any = None) -> str:
        """What a value must be, as error messages say it: 'a positive integer', 'a finite
        number > 0', 'a number in [0, 1)', 'one of elu, relu'; for a ``value`` that float32
        cannot hold, that too."""
        text = self._expected()
        if self._beyond_float32(value):
            zero = self.range is None or self.range.holds(0)
            text += (f" that float32 holds (a magnitude in [{F32_TINY:.2g}, {F32_MAX:.8g}]"
                     f"{', or 0' if zero else ''})")
        return text

    def _expected(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)
        if self.kind is str:
            return "a string"
        noun = "integer" if self.kind is int else "number"
        r = self.range
        if r is None:
            return "an integer" if self.kind is int else "a finite number"
        lo, hi, lo_in, hi_in = r
        if math.isinf(hi) and not hi_in:
            if self.kind is int and lo_in and lo in (0, 1):
                return "a positive integer" if lo == 1 else "a non-negative integer"
            if math.isinf(lo):
                return f"an {noun}" if self.kind is int else "a finite number"
            first = "an integer" if self.kind is int else "a finite number"
            return f"{first} {'>=' if lo_in else '>'} {_number(lo)}"
        return (f"{'an' if self.kind is int else 'a'} {noun} in {'[' if lo_in else '('}"
                f"{_number(lo)}, {_number(hi)}{']' if hi_in else ')'}")

    def check(self, name: str, value: Any) -> Any:
        """``value`` if it is allowed (a str choice in its canonical lower case), else a
        ValueError ``"{name}: expected ..., got ..."``."""
        if value is None and self.optional:
            return None
        if self.kind is str:
            ok = isinstance(value, str) and (self.choices is None
                                             or value.lower() in self.choices)
            if not ok:
                raise ValueError(f"{name}: expected {self.expected()}, got {shown(value)}")
            return value if self.choices is None else value.lower()
        if self.kind is int:
            ok = isinstance(value, numbers.Integral) and not _is_bool(value)
        else:
            ok = (isinstance(value, numbers.Real) and not _is_bool(value)
                  and math.isfinite(value))
        if not ok or (self.range is not None and not self.range.holds(value)) \
                or self._beyond_float32(value):
            raise ValueError(f"{name}: expected {self.expected(value)}, got {shown(value)}")
        return value

    def parse(self, text: str) -> Any:
        """The value of a command-line flag (argparse's ``type=``): argparse reports an
        ``ArgumentTypeError`` as ``argument --flag: expected ..., got ...``."""
        said = repr(text)
        if self.kind is str:
            value: Any = text
        else:
            try:
                value = int(text) if self.kind is int else float(text)
                said = text if len(text) < 60 else shown(value)
            except ValueError:  # not a number, or more digits than int() reads
                value = None
                digits = text.strip().lstrip("+-")
                said = (repr(text) if len(text) < 60 else f"an integer of {len(digits)} digits"
                        if digits.isdigit() else f"{text[:40]!r}…")
        try:
            if value is None:
                raise ValueError
            return self.check("", value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {self.expected(value)}, got {said}") from None


#: An integer >= 1 (sizes, counts, steps).
POSITIVE_INT = Check(int, Range(1, math.inf))
#: Any integer.
INTEGER = Check(int)
#: A random seed: an integer in [0, 2**32 − 1], what NumPy's and torch's generators take, with
#: room for the seeds derived from it (``seed * 1_000_003 + step``, ``3 * seed + split``,
#: ``random_state + m``); 2**70 failed inside torch ("Overflow when unpacking long long").
SEED = Check(int, Range(0, 2**32 - 1, True, True))
#: Torch threads: ``n_threads`` of the estimator, ``--threads`` of every command. Counts above
#: the CPUs available are capped there (:func:`capped_threads`).
THREADS = Check(int, Range(1, math.inf))
#: The feature maps a configuration or a flag may name (the keys of
#: :data:`linattn.feature_maps.FEATURE_MAPS`, which imports torch; a test holds them equal).
FEATURE_MAP_NAMES: tuple[str, ...] = ("elu", "relu", "taylor", "polynomial")
FEATURE_MAP = Check(str, choices=FEATURE_MAP_NAMES)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def capped_threads(n: Any, name: str = "n_threads") -> int:
    """``n`` checked as a thread count (:data:`THREADS`: ValueError naming ``name``) and capped
    at :func:`available_cpus`, with one RuntimeWarning when it is: torch and OpenMP abort or
    crash on counts far above the machine's (100,000 threads: SIGSEGV)."""
    n = int(THREADS.check(name, n))
    have = available_cpus()
    if n > have:
        warnings.warn(f"{name}: {n} threads asked for, this machine gives the process {have} "
                      f"CPU(s); using {have}", RuntimeWarning, stacklevel=3)
        return have
    return n


def set_threads(n: Any, name: str = "n_threads") -> int | None:
    """``torch.set_num_threads`` with the count :func:`capped_threads` allows; None leaves
    torch's setting. Returns the count set."""
    if n is None:
        return None
    n = capped_threads(n, name)
    import torch

    torch.set_num_threads(n)
    return n


@contextmanager
def torch_threads(n: Any, name: str = "n_threads") -> Iterator[int | None]:
    """Run the block on ``n`` torch threads (:func:`set_threads`: checked and capped; None
    leaves torch's setting), then restore the caller's count. Yields the count set."""
    if n is None:
        yield None
        return
    import torch

    before = torch.get_num_threads()
    n = capped_threads(n, name)
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def env_raw(name: str) -> object:
    """The environment variable ``name`` as the process holds it now, still encoded (bytes on
    POSIX), or None when unset: a value to compare, for memo keys, not to read. A dictionary
    read (~40 ns) where ``os.environ.get`` takes ~650 ns (it encodes the name, and raises and
    catches a KeyError for an unset one), because the dispatcher's memo reads two settings on
    every decoding step. Where ``os.environ`` is no CPython mapping (or was replaced by a
    plain dict), ``os.environ.get``."""
    env = os.environ
    try:
        key = _ENCODED.get(name)
        if key is None:
            key = _ENCODED[name] = env.encodekey(name)  # type: ignore[attr-defined]
        return env._data.get(key)  # type: ignore[attr-defined]
    except AttributeError:
        return env.get(name)


_ENCODED: dict[str, object] = {}


def env_setting(name: str, parse: Callable[[str], Any], fallback: Any, expected: str,
                using: str, warn: Callable[[str, str], Any]) -> Any:
    """The environment variable ``name`` as ``parse`` reads its stripped value (None: not a
    value it takes), ``fallback`` when it is unset or empty. A value ``parse`` refuses is one
    warning line through ``warn(key, message)`` (the caller's warn-once), naming the variable,
    what it takes (``expected``) and what is used instead (``using``), then ``fallback``: the
    one rule of ``LINATTN_NATIVE``, ``LINATTN_NATIVE_ISA`` and ``LINATTN_CC_TIMEOUT`` (a
    setting is never a traceback at the first compiled call)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return fallback
    value = parse(raw)
    if value is None:
        warn(f"env:{name}={raw}", f"linattn: {name}={raw!r} is not {expected}; using {using}")
        return fallback
    return value
