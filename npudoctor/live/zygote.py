"""Live runs served by forking a process that already imported sglang, for callers that run many.

``npudoctor check`` starts one live child per run (``npudoctor.live.child_process``), and its
import of sglang is most of the run's cost (seconds per run). A caller that runs many live
checks against the same few trees (the test suite) installs a ``Pool`` with
``child_process.serve_from``: a tree's live runs then go to one long-lived process per tree
(a *zygote*), started once, which forks for every run.

The result must be the one a fresh child gives, so a zygote replays a fresh child's steps
exactly and only forks between them. A fresh child, inside the NPU simulation, enables the
run's runtime fixes, imports each requested check's modules in the checks' order (standing in
what this host lacks), then probes. Which modules get stood in, and what a fix patches, depend
on that whole sequence; so the zygote keeps a tree of processes, one per prefix of it: the
root has entered the simulation, its child ``fixes={...}`` enabled the plan, its child
``NPD001`` imported NPD001's modules after that, and so on. A run descends to the node of its
own sequence (creating the missing ones by forking their parent, which then imports) and that
node forks once more for the probes: process-global state, stand-ins and patches never leak
from one run to the next, and two runs with the same fixes and checks share every import.

A run the zygote cannot answer (a node or the probes' process died, the answer is unreadable)
is handed back to a fresh child, whose outcome then says what went wrong as it always did.
Every process of a tree dies with its parent (``PR_SET_PDEATHSIG``), so closing the pool or
ending the caller ends them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from npudoctor import interpreters
from npudoctor.engine.check import LiveOutcome
from npudoctor.target.privatestore import MISS, PrivateStore, entry_name

# Environment variables that differ between a pool's runs without changing what sglang or a
# probe does (PYTHONPATH, whose folders are a zygote's import paths, is part of its key instead): a
# run whose environment differs from the pool's in anything else gets a fresh child.
VOLATILE_ENV = frozenset({"NPUDOCTOR_CACHE_DIR", "PYTEST_CURRENT_TEST", "PYTHONPATH"})

_HEADER = struct.Struct("!Q")


def _send(fd: int, message: object) -> None:
    data = pickle.dumps(message)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int) -> object | None:
    """The next message on ``fd``; None when the writer is gone."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    data = _read_exactly(fd, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


# -- inside the zygote ---------------------------------------------------------------------------


class _Node:
    """One process of a zygote's tree: the state after a prefix of a fresh child's steps."""

    def __init__(self, target, checks: dict, steps_fd: int):
        self.target, self.checks, self.steps_fd = target, checks, steps_fd
        self.fixes: dict[str, dict[str, str]] = {}
        self.outcome = LiveOutcome()  # what the imports so far found (not_run, import time)
        self.children: dict[tuple[str, str], tuple[int, int, int]] = {}  # step -> (pid, to, from)

    def advance(self, step: tuple[str, str]) -> None:
        """Take one more step of a fresh child's sequence, in this (just forked) process."""
        from npudoctor.live import child_process
        from npudoctor.patching import activation

        kind, value = step
        if kind == "fixes":
            self.fixes = json.loads(value)
            activation.enable(self.fixes)
        else:
            started = time.perf_counter()
            child_process.import_for(value, self.checks[value], self.outcome)
            self.outcome.import_seconds += time.perf_counter() - started

    def serve(self, upstream_in: int, upstream_out: int) -> None:
        """Answer requests ``(steps left, run)`` from the parent until it goes away."""
        while True:
            message = _receive(upstream_in)
            if message is None:  # the parent is done: so are the children, once they are reaped
                for pid, to_child, from_child in self.children.values():
                    os.close(to_child)
                    os.close(from_child)
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                return
            steps, run = message
            _send(upstream_out, self._descend(steps, run) if steps else self._probe(run))

    def _descend(self, steps: list, run: dict) -> tuple[str, object]:
        step = tuple(steps[0])
        if step not in self.children and _threads() > 1:
            return ("failed", "a thread runs in the zygote's process: it does not fork")
        if step not in self.children:
            self.children[step] = self._fork_child(step)
        pid, to_child, from_child = self.children[step]
        try:
            _send(to_child, (steps[1:], run))
            answer = _receive(from_child)
        except OSError:
            answer = None
        if answer is None:  # the child died (an import crashed it): forget it, the caller falls back
            self._drop(step)
            return ("failed", f"the zygote's process for {step[0]} {step[1]} ended")
        return answer

    def _fork_child(self, step: tuple[str, str]) -> tuple[int, int, int]:
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                interpreters.die_with_parent(parent)
                os.close(to_write)
                os.close(from_read)
                for _, theirs_to, theirs_from in self.children.values():  # siblings' pipes stay theirs
                    os.close(theirs_to)
                    os.close(theirs_from)
                self.children = {}
                self.outcome = _copy(self.outcome)
                self.advance(step)
                self.serve(to_read, from_write)
                status = 0
            finally:
                os._exit(status)
        os.close(to_read)
        os.close(from_write)
        return pid, to_write, from_read

    def _drop(self, step) -> None:
        pid, to_child, from_child = self.children.pop(step)
        for fd in (to_child, from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    def _probe(self, run: dict) -> tuple[str, object]:
        """Fork once more and run the probes there: the node itself stays as the imports left it."""
        if _threads() > 1:
            return ("failed", "a thread runs in the zygote's process: it does not fork")
        answer_read, answer_write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                interpreters.die_with_parent(parent)
                os.close(answer_read)
                data = pickle.dumps(self._probed(run))
                view = memoryview(data)
                while view:
                    view = view[os.write(answer_write, view) :]
                status = 0
            finally:
                os._exit(status)
        os.close(answer_write)
        chunks = []
        while chunk := os.read(answer_read, 1 << 20):
            chunks.append(chunk)
        os.close(answer_read)
        _, status = os.waitpid(pid, 0)
        if status != 0 or not chunks:
            return ("failed", f"the zygote's probe process ended with status {status}")
        return ("ok", b"".join(chunks))

    def _probed(self, run: dict) -> LiveOutcome:
        from npudoctor.live import child_process, processstate, sealing

        os.environ.clear()  # the run's own environment, as a fresh child would have it
        os.environ.update(run["env"])
        sealing.seal()  # and sealed as a fresh child is (the hubs' switches are variables too)
        processstate.serve_model(run["facts"].model)
        steps = os.fdopen(os.dup(self.steps_fd), "w", buffering=1, encoding="utf-8")

        def step(name: str) -> None:
            with contextlib.suppress(OSError):
                steps.write(name + "\n")

        outcome = _copy(self.outcome)
        started = time.perf_counter()
        child_process.imports_done(outcome, self.fixes)
        outcome.import_seconds += time.perf_counter() - started
        outcome.import_rss_mb = child_process._peak_rss_mb()
        wanted = {i: check for i, check in self.checks.items() if i in run["checks"]}
        child_process.probe_all(wanted, self.target, run["facts"], outcome, step)
        outcome.peak_rss_mb = child_process._peak_rss_mb()
        with contextlib.suppress(OSError):
            steps.close()
        return outcome


def _threads() -> int:
    """Python threads of this process. A fork copies only the calling thread: a lock another thread
    held would stay locked in the copy, so a process running a Python thread does not fork. Native
    pools are their libraries' business: OpenBLAS (numpy's, one worker thread from import on) stops
    its workers around a fork; torch's OpenMP team is started by the first parallel operator, which
    only the probes run, each in its own process (with torch's default thread count, as in a fresh
    child: which thread meets an error first shows in the evidence)."""
    return threading.active_count()


def _copy(outcome: LiveOutcome) -> LiveOutcome:
    return pickle.loads(pickle.dumps(outcome))


def _zygote() -> int:
    """Entry point of a zygote: ``npudoctor.live.zygote SGLANG_ROOT STEPS_FD SCRATCH PARENT_PID`` run in an
    isolated interpreter (``npudoctor.interpreters``), requests on stdin, answers on stdout."""
    from npudoctor.live import processstate, sealing

    root, steps_fd = sys.argv[1], int(sys.argv[2])
    sealing.use_scratch(Path(sys.argv[3]))  # the caller's, for the whole tree of processes
    sealing.seal()  # as a fresh child: before anything imports sglang, transformers or huggingface_hub
    upstream_in = os.dup(0)
    upstream_out = os.dup(1)
    os.dup2(2, 1)  # what sglang prints must not mix with the answers
    sys.stdout = sys.stderr
    interpreters.die_with_parent(int(sys.argv[4]))
    from npudoctor.engine.registry import all_checks
    from npudoctor.live.npusim import simulated_npu
    from npudoctor.target.discovery import discover

    target = discover(root)
    processstate.use_tree(target.tree)
    node = _Node(target, {c.id: c for c in all_checks()}, steps_fd)
    with simulated_npu():
        node.serve(upstream_in, upstream_out)
    return 0


# -- in the caller -------------------------------------------------------------------------------


def _same_environment(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in VOLATILE_ENV}


class _Zygote:
    """The caller's end of one zygote: its process, its pipes, and the progress it reports."""

    def __init__(self, root: str, paths: list[str], env: dict[str, str]):
        from npudoctor.live import child_process, toolenv

        interpreter = toolenv.select()  # a run the pool serves has had it chosen (``child_process.start``)
        if isinstance(interpreter, toolenv.NoLiveInterpreter):
            raise OSError(interpreter.reason)
        steps_read, steps_write = os.pipe()
        self.on_step: Callable[[str], None] | None = None
        self.scratch = child_process.new_scratch()
        try:
            self.process = subprocess.Popen(
                interpreters.npudoctor_command(
                    "npudoctor.live.zygote",
                    paths,
                    root,
                    str(steps_write),
                    self.scratch,
                    str(os.getpid()),
                    python=interpreter.python,
                    last_paths=interpreter.last,
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                pass_fds=(steps_write,),
            )
        finally:
            os.close(steps_write)
        self._to = self.process.stdin.fileno()
        self._from = self.process.stdout.fileno()
        threading.Thread(target=self._read_steps, args=(steps_read,), daemon=True).start()

    def _read_steps(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as steps:
            for line in steps:
                if self.on_step is not None:
                    self.on_step(line.strip())

    def ask(self, steps: list, run: dict) -> bool:
        try:
            _send(self._to, (steps, run))
            return True
        except OSError:
            return False

    def answer(self, timeout: float) -> LiveOutcome | None:
        ready, _, _ = select.select([self._from], [], [], timeout)
        message = _receive(self._from) if ready else None
        if not isinstance(message, tuple) or message[0] != "ok":
            return None
        try:
            outcome = pickle.loads(message[1])
        except Exception:
            return None
        return outcome if isinstance(outcome, LiveOutcome) else None

    def close(self) -> None:
        """End the zygote: its requests end, each process of its tree reaps its children and exits
        (killed after a while if it does not: a process the kernel then kills is not reaped here)."""
        with contextlib.suppress(Exception):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except Exception:
            with contextlib.suppress(Exception):
                self.process.kill()
                self.process.wait(timeout=30)
        with contextlib.suppress(Exception):
            self.process.stdout.close()
        from npudoctor.live import child_process

        child_process.remove_scratch(self.scratch)


class Pool:
    """Zygotes for the trees ``accepts`` admits, at most ``limit`` at a time (least recently
    used first out: each holds a tree of processes of several hundred MB).

    With ``memo`` (a directory, which other processes may share) an outcome the pool computed is
    kept there and is the answer to the same run asked again (same tree, checks, fixes, facts and
    environment): the probes too run once, and no zygote starts for it. The memo is a
    ``PrivateStore``: an outcome is unpickled only when this user's pool sealed it."""

    def __init__(self, limit: int = 2, accepts: Callable[[str], bool] = lambda root: True, memo=None):
        self.limit, self.accepts, self.memo = limit, accepts, memo
        self.environment = _same_environment(dict(os.environ))
        self._zygotes: OrderedDict[tuple[str, str], _Zygote] = OrderedDict()
        self.served = self.fallbacks = self.remembered = 0

    def start(
        self,
        root: str,
        paths: list[str],
        ids: list[str],
        fixes: dict,
        facts,
        env: dict[str, str],
        on_step,
        fresh,
    ):
        """A live run of the checks ``ids`` with ``fixes`` against the tree at ``root``, its interpreter's
        import ``paths`` first on ``sys.path`` (``child_process.import_paths``), served by its
        zygote; ``fresh()`` starts a fresh child instead (other environments, trees not admitted,
        anything the zygote cannot answer). Returns an object with ``outcome()``."""
        from npudoctor.engine.registry import all_checks

        if not self.accepts(root) or _same_environment(env) != self.environment:
            return fresh()
        key = (root, tuple(paths))
        order = [c.id for c in all_checks() if c.id in ids]
        steps = [("fixes", json.dumps(fixes, sort_keys=True))] + [("import", i) for i in order]
        memo = self._memo_file(root, paths, steps, facts, env)
        outcome = PrivateStore(self.memo).load(memo.name) if memo is not None else MISS
        if isinstance(outcome, LiveOutcome):  # the answer is known: no zygote needed for it
            for step in ["import", *(i for i in order if i in outcome.probe_seconds)]:
                if on_step is not None:
                    on_step(step)
            self.remembered += 1
            return _PooledRun(self, key, None, fresh, outcome)
        zygote = self._zygotes.pop(key, None)
        if zygote is not None and zygote.process.poll() is not None:
            zygote.close()  # it died: its pipes and its scratch directory go
            zygote = None
        if zygote is None:
            zygote = _Zygote(root, paths, env)
        self._zygotes[key] = zygote
        while len(self._zygotes) > self.limit:
            self._zygotes.popitem(last=False)[1].close()
        zygote.on_step = on_step
        if on_step is not None:
            on_step("import")
        asked = zygote.ask(steps, {"facts": facts, "checks": order, "env": env})
        return _PooledRun(self, key, zygote if asked else None, fresh, memo=memo)

    def _memo_file(self, root: str, paths: list[str], steps: list, facts, env: dict[str, str]) -> Path | None:
        """The file of ``memo`` (a ``PrivateStore``: shared, so sealed) that keeps this run's outcome."""
        if self.memo is None:
            return None
        try:
            environment = sorted(_same_environment(env).items())
            key = pickle.dumps((root, tuple(paths), steps, facts, environment))
        except Exception:
            return None
        return Path(self.memo) / entry_name(key)

    def _failed(self, key) -> None:
        zygote = self._zygotes.pop(key, None)
        if zygote is not None:
            zygote.close()

    def close(self) -> None:
        while self._zygotes:
            self._zygotes.popitem()[1].close()


class _PooledRun:
    def __init__(self, pool: Pool, key, zygote: _Zygote | None, fresh, outcome=None, memo=None):
        self._pool, self._key, self._zygote, self._fresh = pool, key, zygote, fresh
        self._outcome: LiveOutcome | None = outcome
        self._memo = memo

    def __enter__(self) -> _PooledRun:  # as ``child_process.LiveRun``: an abandoned run ends with the pool
        return self

    def __exit__(self, *_exc) -> None:
        pass

    def outcome(self) -> LiveOutcome:
        if self._outcome is None:
            from npudoctor.live.child_process import TIMEOUT_SECONDS

            answer = self._zygote.answer(TIMEOUT_SECONDS) if self._zygote is not None else None
            if self._zygote is not None:
                self._zygote.on_step = None
            if answer is None:
                self._pool.fallbacks += 1
                self._pool._failed(self._key)
                answer = self._fresh().outcome()
            else:
                self._pool.served += 1
                if self._memo is not None:
                    PrivateStore(self._memo.parent).save(answer, self._memo.name)
            self._outcome = answer
        return self._outcome


if __name__ == "__main__":
    from npudoctor.live.child_process import exit_now
    from npudoctor.live.zygote import _zygote as zygote

    exit_now(zygote())  # its children reaped, it has nothing left to do: no teardown
