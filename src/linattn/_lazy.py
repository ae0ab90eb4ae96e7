"""A package's public names imported on first use (PEP 562), so that importing the package
(the command line's light paths) does not import torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, namespace: dict, modules: dict[str, tuple[str, ...]]
                 ) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__all__``, ``__getattr__`` and ``__dir__``: ``modules`` maps a module to
    the public names it defines; a name once loaded is stored in ``namespace`` (the package's
    globals), so later lookups skip ``__getattr__``."""
    exports = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return list(exports), __getattr__, __dir__
