"""What the dispatcher decides for a call: a backend and, for a compiled one, the ISA build.

Its own module because both :mod:`linattn.ops.dispatch` (which decides) and
:mod:`linattn.ops.calibration` (which measures the candidates for it) speak of it, and the
calibration must not import the dispatcher that consults it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Choice"]


class Choice(NamedTuple):
    """A backend's name and, for a compiled one, the build (None for torch backends)."""

    backend: str
    isa: str | None = None
