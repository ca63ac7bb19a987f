"""Stand-ins for the third-party modules this host lacks, so the live depth imports every release.

sglang's modules import far more than the code a probe runs: a web framework (``fastapi`` up to
0.5.7), grammar backends (``xgrammar`` in 0.5.16-0.5.20), CUDA kernels (``sgl_kernel``). npudoctor
installs one CPU dependency set for every release (``requirements-live.txt``) instead of each
release's own, so the live child imports the probed modules with ``import_with_stand_ins``: when an
import fails because a module (or a name in an installed module) is missing, a stand-in takes its
place and the import is retried. Only what an import really needs is stood in: a missing module
that sglang's code guards with ``try/except ImportError`` is never seen here.

A stand-in is permissive while modules import (a decorator, a base class, a constant computed at
import time all get another stand-in) and refuses to be used while a probe runs: calling it,
instantiating a class derived from it, reading its attributes or its truth value raises
``StoodInError``. That error derives from ``BaseException``, so a probe's own ``except Exception``
(which turns sglang's exceptions into findings) cannot mistake it for sglang's failure; the live
child turns it into a ``warn``: the probe reached code this host cannot run, it cannot tell.
"""

from __future__ import annotations

import dis
import importlib.abc
import importlib.machinery
import re
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# never stood in: the code under test, npudoctor itself, and what the simulation builds on
_NEVER = frozenset({"sglang", "npudoctor", "torch", "torch_npu"})
_MAX_RETRIES = 100  # one per missing module: a release needs a handful
_CANNOT_IMPORT_NAME = re.compile(r"cannot import name '([^']+)' from '([^']+)'")

_probing = False
stood_in: dict[str, str] = {}  # what was stood in -> the import that needed it


class StoodInError(BaseException):
    """A probe reached a stand-in: the code it runs needs a module this host does not have."""

    def __init__(self, module: str, touched: str):
        super().__init__(f"the probe reached {touched}, from {module}, stood in on this host")
        self.module = module
        self.touched = touched


def module_code_running(depth: int = 2) -> bool:
    """A module's own top-level code is running (an import made while a probe runs): what it does
    with a stand-in there builds constants, annotations and base classes, it runs nothing."""
    frame = sys._getframe(depth)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
            return True
        frame = frame.f_back
    return False


_IMPORT_FROM = dis.opmap["IMPORT_FROM"]


def _imported_by_name() -> bool:
    """The attribute is read by a ``from module import name`` statement: its ``IMPORT_FROM``, or the
    import system's look for a submodule of that name first (``_handle_fromlist``)."""
    frame = sys._getframe(2)
    return frame.f_code.co_name == "_handle_fromlist" or frame.f_code.co_code[frame.f_lasti] == _IMPORT_FROM


def _check(cls_or_module: Any, action: str) -> None:
    if _probing and not module_code_running():
        name = getattr(cls_or_module, "_stand_in_name", getattr(cls_or_module, "__name__", "?"))
        raise StoodInError(name.split(".")[0], f"{name} ({action})")


class _StandInMeta(type):
    """The type of every stand-in: a class, so sglang can subclass it, annotate with it, call it."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _check(cls, f"attribute {name}")
        child = _stand_in(f"{cls._stand_in_name}.{name}")
        type.__setattr__(cls, name, child)
        return child

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _check(cls, "called")
        return _stand_in(f"{cls._stand_in_name}()")

    def __getitem__(cls, _key: Any) -> Any:
        return cls

    def __or__(cls, _other: Any) -> Any:
        return cls

    __ror__ = __or__

    def __bool__(cls) -> bool:
        _check(cls, "truth value")
        return True

    def __iter__(cls) -> Iterator[Any]:
        _check(cls, "iterated")
        return iter(())


def _stand_in(name: str) -> type:
    return _StandInMeta(
        name.rpartition(".")[2] or name, (), {"_stand_in_name": name, "__module__": name.split(".")[0]}
    )


class _StandInModule(types.ModuleType):
    """A missing module: every attribute is a stand-in; it is a package, so submodules import too."""

    def __init__(self, name: str):
        super().__init__(name, f"stood in by npudoctor: {name} is not installed on this host")
        self.__path__: list[str] = []
        # a path where no file is: torch's compiler reads every loaded module's ``__file__`` as a str
        self.__file__ = f"<stood in by npudoctor>/{name.replace('.', '/')}/__init__.py"
        self._stand_in_name = name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if not _imported_by_name():  # ``from missing import name`` inside a function: an import
            _check(self, f"attribute {name}")
        value = _stand_in(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the stood-in modules and everything under them; last on ``sys.meta_path``."""

    def __init__(self) -> None:
        self.roots: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if any(fullname == root or fullname.startswith(root + ".") for root in self.roots):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_FINDER = _Finder()


class _LateFinder(importlib.abc.MetaPathFinder):
    """While sglang runs (the dry run), a module it imports inside a function that this host lacks
    is stood in as one imported at start would have been, when an ``import`` statement asks for it;
    a question whether it exists (``importlib.util.find_spec``, how sglang and transformers test
    for optional packages) still hears no, so no optional path is taken because of a stand-in."""

    def __init__(self, absent: frozenset[str], needed_by: str):
        self.absent = absent
        self.needed_by = needed_by

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        root = fullname.split(".")[0]
        if "." in fullname or root in self.absent or _asked_whether_it_exists():
            return None
        if not _stand_in_module(fullname, self.needed_by):
            return None
        return _FINDER.find_spec(fullname, path, target)


def _asked_whether_it_exists() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "find_spec" and frame.f_code.co_filename.endswith("importlib/util.py"):
            return True
        frame = frame.f_back
    return False


def stand_in_late_imports(absent: frozenset[str], needed_by: str) -> None:
    """From now on, stand in a missing module an ``import`` statement asks for (``_LateFinder``)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    sys.meta_path.append(_LateFinder(absent, needed_by))


def import_with_stand_ins(
    load: Callable[[], Any], needed_by: str, absent: frozenset[str] = frozenset()
) -> None:
    """Run ``load`` (imports), standing in each missing third-party module or name it needs,
    except the packages in ``absent`` (the dry run's CUDA-only packages: missing on an Ascend host
    too, so their import must fail as it would there).

    Raises what ``load`` raises when it is not a missing module or name (or a missing part of
    sglang itself, which is never stood in). Either way ``sys.modules`` is left whole: what a failed
    attempt imported under a package whose own import failed is taken out (``_drop_orphans``)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    for _ in range(_MAX_RETRIES):
        before = set(sys.modules)
        try:
            load()
            return
        except ModuleNotFoundError as error:
            if (error.name or "").split(".")[0] in absent or not _stand_in_module(error.name, needed_by):
                raise
        except ImportError as error:
            if not _stand_in_name(error, needed_by):
                raise
        finally:  # before the retry, and whatever the attempt ends in
            _drop_orphans(before)
    raise ImportError(f"more than {_MAX_RETRIES} modules missing: not stood in")


def _drop_orphans(before: set[str]) -> None:
    """Take out of ``sys.modules`` every module an import attempt added whose package is not there,
    its own submodules with it: the import system drops a module whose own code raised, but keeps
    the submodules it had imported by then. ``sglang/__init__.py`` raising at ``import numpy``
    (sglang/srt/utils/common.py) leaves the namespace package ``sglang.srt`` without ``sglang``; the
    next attempt then finds ``sglang.srt`` and computes its path from ``sys.modules["sglang"]``:
    ``KeyError: 'sglang'``. A package whose failure the attempt's own code caught (``try: import
    transformers``) leaves the same remains. Modules whose packages are all there stay (a
    third-party package imported whole, torch)."""
    added = [name for name in list(sys.modules) if name not in before]
    for name in sorted(added, key=lambda n: n.count(".")):
        parts = name.split(".")
        if any(".".join(parts[:i]) not in sys.modules for i in range(1, len(parts))):
            sys.modules.pop(name, None)


def _stand_in_module(name: str | None, needed_by: str) -> bool:
    if not name or name.split(".")[0] in _NEVER or name.split(".")[0] in sys.stdlib_module_names:
        return False
    if name in _FINDER.roots:
        return False  # stood in already and still failing: not ours to fix
    _FINDER.roots.add(name)
    stood_in.setdefault(name, needed_by)
    return True


def _stand_in_name(error: ImportError, needed_by: str) -> bool:
    """``from installed import Name`` where this host's version of the package lacks ``Name``."""
    found = _CANNOT_IMPORT_NAME.search(str(error))
    if found is None:
        return False
    name, module_name = found.groups()
    module = sys.modules.get(module_name)
    if module is None or module_name.split(".")[0] in _NEVER or isinstance(module, _StandInModule):
        return False
    if hasattr(module, name):
        return False  # there now: the failure was something else (a circular import)
    setattr(module, name, _stand_in(f"{module_name}.{name}"))
    stood_in.setdefault(f"{module_name}.{name}", needed_by)
    return True


def missing_packages() -> set[str]:
    """The top-level packages stood in whole: not installed on this host at all (not a module or a
    name an installed package of another version lacks)."""
    return {root for root in _FINDER.roots if "." not in root}


@contextmanager
def probing() -> Iterator[None]:
    """While a probe runs, a stand-in it reaches raises ``StoodInError``."""
    global _probing
    previous, _probing = _probing, True
    try:
        yield
    finally:
        _probing = previous
