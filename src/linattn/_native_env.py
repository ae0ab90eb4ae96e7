"""What the compiled path reads from its surroundings: the ``LINATTN_*`` settings of the
compiled kernels, the CPU they are built for, and one warning per cause.

* :data:`SETTINGS` (``LINATTN_NATIVE``, ``LINATTN_NATIVE_ISA``, ``LINATTN_CC_TIMEOUT``,
  ``LINATTN_AMX``) and
  :func:`setting`: one rule for all (:func:`linattn._config.env_setting`): a bad value warns
  once and is ignored; :func:`check_environment` reads them all up front.
* The CPU (:func:`cpu_tag`, :func:`cpu_flags`): what keys a ``-march=native`` build in the
  cache, and which ISA builds this machine can run.
* :func:`warn_once`: the one-line RuntimeWarning, once per key and process.

Torch-free (the commands read the settings before torch is imported). :mod:`linattn._cbuild`
builds and caches the libraries with these and re-exports every public name here.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import platform
import warnings

from linattn._config import env_setting

__all__ = ["CC_TIMEOUT_S", "ISA_NAMES", "SETTINGS", "setting", "native_setting", "isa_setting",
           "check_environment", "cc_timeout", "cpu_tag", "cpu_flags", "warn_once"]

#: Seconds a compiler (and a test load) may take unless ``LINATTN_CC_TIMEOUT`` says otherwise:
#: the largest build takes ~3.5 s on a 2-core machine.
CC_TIMEOUT_S = 60.0


#: The compiled builds by name (:data:`linattn.ops.native.ISA_FLAGS` holds their flags; a test
#: holds the two equal), here torch-free for the settings below.
ISA_NAMES: tuple[str, ...] = ("native", "avx512", "avx2", "generic", "scalar")
_OFF, _ON = ("0", "off", "false", "no"), ("1", "on", "true", "yes")


def _on_off(value: str) -> str | None:
    value = value.lower()
    return "0" if value in _OFF else "1" if value in _ON else None


def _native(value: str) -> str | None:
    return "auto" if value.lower() == "auto" else _on_off(value)


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 and math.isfinite(seconds) else None


#: Every ``LINATTN_*`` setting: name → (how a value is read, None for one it does not take;
#: the value when unset, empty or refused; what it takes; what a refused one means). One rule
#: for all (:func:`linattn._config.env_setting`): a bad value warns once and is ignored.
SETTINGS: dict[str, tuple] = {
    "LINATTN_NATIVE": (_native, "auto", "one of 0, 1, off, on, false, true, no, yes, auto",
                       "auto"),
    "LINATTN_NATIVE_ISA": (lambda v: v.lower() if v.lower() in ISA_NAMES else None, None,
                           f"one of {', '.join(ISA_NAMES)}", "the calibration's choice"),
    "LINATTN_CC_TIMEOUT": (_seconds, CC_TIMEOUT_S, "a positive number of seconds",
                           f"{CC_TIMEOUT_S:g}"),
    # bfloat16 products on AMX tiles where the CPU and the kernel have them (ops/native/tiles.h)
    "LINATTN_AMX": (_on_off, "1", "one of 0, 1, off, on, false, true, no, yes", "1"),
}


def setting(name: str):
    """The value of setting ``name`` (:data:`SETTINGS`): a bad one warns once and is ignored."""
    return env_setting(name, *SETTINGS[name], warn_once)


def native_setting() -> str:
    """``LINATTN_NATIVE``: "0" (off: 0, off, false, no), "1" (on wherever it applies: 1, on,
    true, yes) or "auto" (unset, empty or "auto": measured), in any case."""
    return setting("LINATTN_NATIVE")


def isa_setting() -> str | None:
    """``LINATTN_NATIVE_ISA``: one build (:data:`ISA_NAMES`, any case) for every compiled
    call, or None (an unknown build was a traceback at the first compiled call)."""
    return setting("LINATTN_NATIVE_ISA")


def check_environment() -> list[str]:
    """Read every ``LINATTN_*`` setting now: each bad one is one warning line (once per
    process) before a command starts its work, not at its first compiled call. Returns the
    names of the variables whose values were refused."""
    refused = []
    for name, (parse, *_) in SETTINGS.items():
        setting(name)
        raw = os.environ.get(name, "").strip()
        if raw and parse(raw) is None:
            refused.append(name)
    return refused


def cc_timeout() -> float:
    """``LINATTN_CC_TIMEOUT`` (seconds, > 0), else :data:`CC_TIMEOUT_S`."""
    return setting("LINATTN_CC_TIMEOUT")



_CPU_KEYS = ("flags", "model name", "Features", "CPU implementer", "CPU part")  # x86, ARM


@functools.cache
def _cpu_lines() -> tuple[str, ...]:
    """The distinct /proc/cpuinfo lines that describe the CPU's model and features (read once
    per process), or the platform's processor string where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return tuple(sorted({ln for ln in f if ln.startswith(_CPU_KEYS)}))
    except OSError:
        return (platform.processor(),)


def cpu_tag() -> str:
    """A short hash of the CPU's model and feature flags: a library built with -march=native
    must not be loaded on another CPU that shares the cache folder."""
    return hashlib.sha256("".join(_cpu_lines()).encode()).hexdigest()[:8]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (x86 ``flags``, ARM ``Features``), empty where unknown."""
    return frozenset(word for ln in _cpu_lines() if ln.startswith(("flags", "Features"))
                     for word in ln.partition(":")[2].split())


_warned: set[str] = set()


def warn_once(key: str, message: str) -> bool:
    """Emit ``message`` as one line (RuntimeWarning) unless ``key`` was warned already in this
    process; True if it warned. Callers that retry with other flags share the key, so a user
    sees one warning per library."""
    if key in _warned:
        return False
    _warned.add(key)
    warnings.warn(" ".join(message.split()), RuntimeWarning, stacklevel=3)
    return True
