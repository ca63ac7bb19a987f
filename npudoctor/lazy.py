"""Modules imported on first use.

The live depth's helpers (``npudoctor.live.livepools``, ``checks/npd004_cp_metadata_fields/live.py``) need torch, and the
check modules import those helpers; the static depth must not pay for torch (1-2 s) when it
never runs them. ``importlib.util.LazyLoader`` defers the module's execution to its first
attribute access; an already imported module is returned as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name``, executed when one of its attributes is first read (``import name`` otherwise).

    Where ``name`` is not installed (a slim CI image without torch runs the static depth), a
    stand-in is returned whose first attribute read raises the ``ModuleNotFoundError`` the import
    would have raised: only the code that really needs the module fails, and says which."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.loader is None:
        return _Absent(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _Absent(ModuleType):
    """A module that is not installed: reading any attribute raises ``ModuleNotFoundError``."""

    def __getattr__(self, attribute: str):
        raise ModuleNotFoundError(f"No module named {self.__name__!r}", name=self.__name__)
