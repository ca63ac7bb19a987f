"""The Python interpreters npudoctor starts for itself, each isolated from where it was started.

npudoctor starts interpreters of its own: the live child (``npudoctor.live.child_process``) and
the zygotes (``npudoctor.live.zygote``), ``python -m pip download`` for ``advise``
(``npudoctor.target.releases``, which imports no npudoctor: it adds ``-I`` itself), and
``advise``'s static workers (multiprocessing's spawn, and its resource tracker). Python puts the
working directory first on the ``sys.path`` of ``python -m``/``-c``, so a ``pickle.py``,
``torch.py``, ``pip.py`` or ``npudoctor/`` in the folder ``npudoctor`` is run from (a pull
request's workspace in CI) would run as the user. Each runs with ``-I`` instead (isolated mode):
neither the working directory nor a script's folder is on ``sys.path``, the ``PYTHON*`` variables
are not interpreted (they stay in ``os.environ``, as do ``SGLANG_*``, ``ASCEND_*`` and the user's
``PIP_*``, which sglang and pip read), and the user site is not processed (its ``.pth`` files and
``usercustomize``). ``-P`` alone would keep the rest, and needs Python 3.11.

What npudoctor's own code needs then comes by the command line, never by ``PYTHONPATH``: a module
of npudoctor runs through this file (``npudoctor_command``), which loads the very ``npudoctor``
package the caller runs (from its folder, whatever finds it there: site-packages, an editable
install, ``PYTHONPATH``) and puts the folders the caller names first on ``sys.path`` (the sglang
tree under test; the absolute folders of the user's ``PYTHONPATH``, where an installed sglang or
the NPU stack's packages may be), each whole, whatever characters its path holds, and, last, the
package folders the live depth adds after its interpreter's own (``npudoctor.live.toolenv``). A
``sitecustomize`` in those folders is not run: that happens only at start, from ``sys.path`` as
it was then. The command the user has ``npudoctor run`` start is the user's own and keeps its
environment (``npudoctor.service.launcher``).

This file is also the script such an interpreter starts with (``python -I .../interpreters.py``):
the standard library is all it imports before ``npudoctor`` is loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import multiprocessing.context
import multiprocessing.popen_spawn_posix
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import runpy
import signal
import site
import sys
import threading
from collections.abc import Iterator


def npudoctor_command(
    module: str,
    import_paths: list[str],
    *arguments: str,
    python: str | None = None,
    last_paths: tuple[str, ...] | list[str] = (),
) -> list[str]:
    """An isolated interpreter of this Python (or of ``python``: the live depth's,
    ``npudoctor.live.toolenv``) running npudoctor's ``module`` as ``python -m`` would, with
    ``import_paths`` first on its ``sys.path`` and ``last_paths`` last; its ``sys.argv[1:]`` are
    ``arguments``. It writes no bytecode when this one does not (``-I`` ignores
    ``PYTHONDONTWRITEBYTECODE``, which images often set)."""
    flags = ["-I", "-B"] if sys.dont_write_bytecode else ["-I"]
    paths = json.dumps({"first": list(import_paths), "last": list(last_paths)})
    return [python or sys.executable, *flags, os.path.abspath(__file__), module, paths, *arguments]


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent ends (Linux ``PR_SET_PDEATHSIG``), however
    the parent ends (a SIGKILL runs none of its cleanup): the live child, each zygote and its forks,
    ``advise``'s workers. Elsewhere it just lives on. ``parent``: the parent's pid, to catch one that
    ended before the call (the orphan's new parent may be a subreaper, not init)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)


def user_import_paths(env: dict[str, str]) -> list[str]:
    """The folders of ``PYTHONPATH`` in ``env`` that an interpreter npudoctor starts keeps: the
    absolute ones (an empty or relative entry names the working directory)."""
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]


@contextlib.contextmanager
def _isolated_launches() -> Iterator[None]:
    """multiprocessing takes the options of the interpreters it starts from one function, for a
    worker (``spawn.get_command_line``) and for the resource tracker (``resource_tracker``): while
    this lasts, they include ``-I``."""
    util = multiprocessing.util
    with _LAUNCHING:
        flags = util._args_from_interpreter_flags
        util._args_from_interpreter_flags = lambda: [*flags(), "-I"]
        try:
            yield
        finally:
            util._args_from_interpreter_flags = flags


_LAUNCHING = threading.Lock()


class _IsolatedPopen(multiprocessing.popen_spawn_posix.Popen):
    def _launch(self, process_obj):
        with _isolated_launches():
            super()._launch(process_obj)


class IsolatedProcess(multiprocessing.context.SpawnProcess):
    """A spawned process whose interpreter runs isolated (``spawn_context``)."""

    @staticmethod
    def _Popen(process_obj):
        return _IsolatedPopen(process_obj)


class _IsolatedSpawnContext(multiprocessing.context.SpawnContext):
    Process = IsolatedProcess


def spawn_context() -> multiprocessing.context.SpawnContext:
    """multiprocessing's spawn context whose interpreters (each worker, and the resource tracker
    the first one starts) run isolated. A spawned worker starts as ``python -c ...`` and imports
    ``multiprocessing`` (and ``pickle``) before it takes the caller's ``sys.path``; ``-I`` keeps
    the working directory out of that. The caller's ``sys.path`` is the worker's after that, as
    multiprocessing always does. The resource tracker starts here: the pool's queues, made before
    any worker, would start it otherwise."""
    with _isolated_launches():
        multiprocessing.resource_tracker.ensure_running()
    return _IsolatedSpawnContext()


def _start() -> None:
    """``python -I interpreters.py MODULE IMPORT_PATHS_JSON ARGS...``: the import paths first and
    last on ``sys.path`` (the last ones as site directories: their ``.pth`` files are read, an
    editable install's finder among them; those already on it stay where they are), ``npudoctor``
    loaded from this file's folder, then ``MODULE`` run as ``__main__`` with ``ARGS`` as its
    arguments."""
    module, import_paths = sys.argv[1], json.loads(sys.argv[2])
    sys.path[:0] = import_paths["first"]
    for folder in import_paths["last"]:  # with its .pth files, as its own interpreter reads them
        site.addsitedir(folder)
    package = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "npudoctor", os.path.join(package, "__init__.py"), submodule_search_locations=[package]
    )
    npudoctor = importlib.util.module_from_spec(spec)
    sys.modules["npudoctor"] = npudoctor
    spec.loader.exec_module(npudoctor)
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _start()
