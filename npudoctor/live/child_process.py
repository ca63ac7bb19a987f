"""The live depth: import the target's real sglang modules and run the probed code.

Live probes run in a child interpreter (``npudoctor.live.child_process`` run as ``python -m``
would, isolated from the working directory: ``npudoctor.interpreters``), one per ``npudoctor
check`` run, for three reasons: the target may be a tree that is not the installed sglang (it
goes first on the child's ``sys.path``); importing sglang and the
NPU stand-ins must not leak into the caller's interpreter; and a crash or a runaway
allocation in sglang code ends the child, not the report. The child gets the facts and
the check ids as a pickle on stdin and answers with a pickle of ``Probe`` objects (or the
exception text per check), its import time and its peak RSS. While it works it names
each step on a pipe of its own (sglang writes freely to stdout and stderr), so the
caller can show progress.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import gc
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from npudoctor import interpreters
from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, LiveOutcome, Probe
from npudoctor.live import toolenv
from npudoctor.results import Status
from npudoctor.target import pythonenv
from npudoctor.target.discovery import Target

# A live run imports a few hundred sglang modules; on a 2-core CI machine that is ~10 s.
TIMEOUT_SECONDS = 600


def run(
    target: Target,
    facts: Facts,
    checks: list[Check],
    on_step: Callable[[str], None] | None = None,
    fixes: dict[str, dict[str, str]] | None = None,
) -> LiveOutcome:
    """Run the live probes of ``checks`` against ``target`` in a child interpreter (``start``, then
    wait for its ``outcome``)."""
    return start(target, facts, checks, on_step, fixes).outcome()


class LiveRun:
    """A live child at work; ``outcome`` waits for its answer. The caller may do other work in
    between (``npudoctor.service.evaluate`` reads the source while the child imports sglang), inside
    ``with``: a caller stopped there (a signal's ``Interrupted``, a failure) must not leave the child
    importing sglang on its own."""

    def __init__(
        self,
        outcome: LiveOutcome | None = None,
        child: subprocess.Popen | None = None,
        reader: threading.Thread | None = None,
        scratch: str | None = None,
        stoppable: Stoppable | None = None,
    ):
        self._outcome, self._child, self._reader, self._scratch = outcome, child, reader, scratch
        self._stoppable = stoppable

    def outcome(self) -> LiveOutcome:
        if self._outcome is None:
            try:
                self._outcome = _answer(self._child, self._reader)
            finally:  # the child has ended, answered or not
                self.stop()
        return self._outcome

    def stop(self) -> None:
        """End the child if it still runs, reap it and remove its temporary folder (idempotent)."""
        if self._child is not None:
            _end(self._child, self._stoppable)
        remove_scratch(self._scratch)
        self._scratch = None

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()


def new_scratch() -> str:
    """A scratch directory for a live interpreter (``sealing.use_scratch``: the hubs' caches, the
    probes' model), made here, in ``$TMPDIR``, and removed here (``remove_scratch``) once that
    interpreter ended: one Ctrl-C or a kill ends it before any exit handler of its own would run.
    Those this process has not removed when it exits go then."""
    directory = tempfile.mkdtemp(prefix="npudoctor-live-")
    _scratches.add(directory)
    return directory


def remove_scratch(directory: str | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
        _scratches.discard(directory)


_scratches: set[str] = set()  # the scratch directories made here and not removed yet


@atexit.register
def _remove_scratches() -> None:
    for directory in list(_scratches):
        remove_scratch(directory)


def start(
    target: Target,
    facts: Facts,
    checks: list[Check],
    on_step: Callable[[str], None] | None = None,
    fixes: dict[str, dict[str, str]] | None = None,
) -> LiveRun:
    """Start the live probes of ``checks`` against ``target`` in a child interpreter.

    ``on_step`` is called (from a reader thread) with each step the child names:
    ``"import"`` while it imports sglang, then the id of each check it probes.
    ``fixes`` is a plan of runtime fixes (``{id: shape}``, see ``npudoctor.service.planning.decide``)
    that the child enables before it imports sglang, as sglang's own processes would.
    """
    ids = [c.id for c in checks]
    if not ids:
        return LiveRun(LiveOutcome())
    interpreter = toolenv.select()  # the checked environment's, or npudoctor's own live environment
    if isinstance(interpreter, toolenv.NoLiveInterpreter):  # the static depth is all there is
        return LiveRun(LiveOutcome(unavailable=interpreter.reason, prepare=interpreter.prepare))
    env = dict(os.environ)
    paths = import_paths(target, env)
    if _pool is not None:

        def fresh() -> LiveRun:
            return _spawn(target, facts, ids, on_step, fixes, env, paths)

        return _pool.start(str(target.root), paths, ids, fixes or {}, facts, env, on_step, fresh)
    return _spawn(target, facts, ids, on_step, fixes, env, paths)


def import_paths(target: Target, env: dict[str, str]) -> list[str]:
    """The folders first on the live interpreter's ``sys.path``: the tree under test (unless it is
    the installed sglang), then those of the user's ``PYTHONPATH`` (``npudoctor.interpreters``).
    Each is one whole path: a tree at ``/x/col:on`` is not ``/x/col`` and ``on``."""
    tree = [str(target.root)] if target.source == "path" else []
    return tree + interpreters.user_import_paths(env)


# Where live runs go instead of a fresh child each: None (``npudoctor check``: one run, one child)
# or a ``npudoctor.live.zygote.Pool`` a caller that runs many installed with ``serve_from``.
_pool = None


def serve_from(pool):
    """Serve this process's live runs from ``pool`` (None: a fresh child each again); returns the
    pool served from before."""
    global _pool
    previous, _pool = _pool, pool
    return previous


class Stoppable:
    """The live children that work run through ``run`` starts, in whichever thread: ``stop`` kills
    them and has that work start no more. For a caller whose threads each wait for a live child
    (``advise`` at the live depth): a signal to npudoctor reaches its main thread only, and the
    process exits once its threads have, a live run lasting up to ``TIMEOUT_SECONDS``."""

    def __init__(self):
        self._children: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopped = False

    def run(self, work: Callable, *args):
        """``work(*args)``, its live children ours (a worker thread's call)."""
        token = _stoppable.set(self)
        try:
            return work(*args)
        finally:
            _stoppable.reset(token)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            children = list(self._children)
        for child in children:
            with contextlib.suppress(OSError):
                child.kill()

    def _started(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._children.add(child)
            if self.stopped:  # stopped while the child started
                child.kill()

    def _ended(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._children.discard(child)


_stoppable: contextvars.ContextVar[Stoppable | None] = contextvars.ContextVar("stoppable", default=None)


def _end(child: subprocess.Popen, stoppable: Stoppable | None) -> None:
    """Kill ``child`` if it still runs, and reap it."""
    if child.poll() is None:
        with contextlib.suppress(OSError):
            child.kill()
    child.wait()
    if stoppable is not None:
        stoppable._ended(child)
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()


def _spawn(
    target: Target,
    facts: Facts,
    ids: list[str],
    on_step: Callable[[str], None] | None,
    fixes: dict[str, dict[str, str]] | None,
    env: dict[str, str],
    paths: list[str],
) -> LiveRun:
    """Start a fresh child interpreter for the run (isolated, in the live interpreter
    ``toolenv.select`` chose, ``paths`` first on its ``sys.path``), the request on its stdin.

    The child's scratch directory (and ``TMPDIR``) is one this process makes and removes once the
    child is reaped (``LiveRun.stop``): what the child puts there (``npudoctor.live.sealing``; the
    stand-ins' metadata) goes with it even when it is killed before its own cleanup runs."""
    stoppable = _stoppable.get()
    if stoppable is not None and stoppable.stopped:
        return LiveRun(LiveOutcome(unavailable="stopped: the live run did not start"))
    interpreter = toolenv.select()
    if isinstance(interpreter, toolenv.NoLiveInterpreter):
        return LiveRun(LiveOutcome(unavailable=interpreter.reason, prepare=interpreter.prepare))
    scratch = new_scratch()
    env = {**env, "TMPDIR": scratch}
    steps_read, steps_write = os.pipe()
    request = pickle.dumps(
        {
            "facts": facts,
            "checks": ids,
            "sglang_root": str(target.root),
            "steps_fd": steps_write,
            "fixes": fixes or {},
            "parent": os.getpid(),
        }
    )
    reader = threading.Thread(target=_read_steps, args=(steps_read, on_step), daemon=True)
    request_read, request_write = os.pipe()
    try:
        child = subprocess.Popen(
            interpreters.npudoctor_command(
                "npudoctor.live.child_process",
                paths,
                scratch,
                python=interpreter.python,
                last_paths=interpreter.last,
            ),
            stdin=request_read,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            pass_fds=(steps_write,),
        )
    except OSError as error:
        os.close(steps_read)
        os.close(request_write)
        remove_scratch(scratch)
        return LiveRun(LiveOutcome(unavailable=f"the live run could not start: {error}"))
    finally:
        os.close(steps_write)
        os.close(request_read)
    run = LiveRun(child=child, reader=reader, scratch=scratch, stoppable=stoppable)
    try:
        if stoppable is not None:
            stoppable._started(child)
        reader.start()
        # the request goes now: the child imports sglang while the caller goes on
        with contextlib.suppress(BrokenPipeError), open(request_write, "wb", buffering=0) as pipe:
            pipe.write(request)  # a child that died at start breaks the pipe: its exit says why
    except BaseException:  # a signal's Interrupted before the caller holds the run
        run.stop()
        raise
    return run


def _answer(child: subprocess.Popen, reader: threading.Thread) -> LiveOutcome:
    """Wait for the child and read its answer."""
    try:
        stdout, stderr = child.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return LiveOutcome(unavailable=f"the live run did not finish in {TIMEOUT_SECONDS} s")
    except BaseException:  # Ctrl-C or a signal to this process alone: the child must not run on
        child.kill()
        child.wait()
        raise
    finally:
        reader.join(timeout=5)
    tail = (stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"])[0][:300]
    if child.returncode < 0:  # a crash in native code, the OOM killer, a kill
        try:
            name = signal.Signals(-child.returncode).name
        except ValueError:
            name = f"signal {-child.returncode}"
        return LiveOutcome(unavailable=f"the live run was killed by {name}")  # its stderr tells nothing then
    if child.returncode != 0 or not stdout:
        return LiveOutcome(unavailable=f"the live run exited {child.returncode}: {tail}")
    try:
        outcome = pickle.loads(stdout)
    except Exception as error:  # the child's answer was cut short or overwritten
        return LiveOutcome(
            unavailable=f"the live run gave no readable answer ({type(error).__name__}): {tail}"
        )
    if not isinstance(outcome, LiveOutcome):
        return LiveOutcome(unavailable=f"the live run gave no readable answer (a {type(outcome).__name__})")
    return outcome


def _read_steps(fd: int, on_step: Callable[[str], None] | None) -> None:
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as steps:
        for line in steps:
            if on_step is not None:
                on_step(line.strip())


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _release_probe_memory() -> None:
    """Free a finished probe's pools before the next probe builds its own.

    sglang's pools sit in reference cycles, which reference counting never frees: without a
    collection here the probes' pools add up (+129 MB above the import at 61 layers, DeepSeek-V3
    PD on 0.5.12) instead of costing the largest probe's (+88-90 MB, NPD003)."""
    gc.collect()


def _described(error: BaseException) -> str:
    """``Type: message at file:line`` of the innermost frame: where a probe or an import broke."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _cannot_tell(module: str, what: str) -> Probe:
    return Probe(Status.WARN, f"cannot tell: {what}", stood_in=(module,))


def _stood_in_note(outcome: LiveOutcome) -> str:
    note = (
        "live: not installed on this host, stood in for the import (no probe ran their code): "
        + ", ".join(sorted(outcome.stood_in))
    )
    required = _required_here()
    return f"{note}; {required}" if required else note


def _required_here() -> str | None:
    """The packages of npudoctor's live requirements stood in (the live interpreter lacks them).
    Never an install command: this interpreter may be the one sglang serves from."""
    from npudoctor.live import standins

    required = sorted(standins.missing_packages() & set(pythonenv.live_requirements()))
    if not required:
        return None
    return f"npudoctor's live requirements not installed for {sys.executable}: {', '.join(required)}"


def import_for(check_id: str, check: Check, outcome: LiveOutcome) -> None:
    """Import the modules ``check``'s live probe needs, standing in what this host lacks; a check
    whose modules do not import is ``not_run`` (the others may still import)."""
    from npudoctor.live import standins

    try:
        standins.import_with_stand_ins(check.live_imports, check_id)
    except Exception as error:
        required = _required_here()
        outcome.not_run[check_id] = f"sglang does not import here: {_described(error)}" + (
            f"; {required}" if required else ""
        )


def imports_done(outcome: LiveOutcome, fixes: dict[str, dict[str, str]]) -> None:
    """After the last import: what was stood in, and what became of each runtime fix."""
    from npudoctor.live import standins
    from npudoctor.patching import activation

    if standins.stood_in:
        gc.collect()  # classes of an import attempt that failed halfway must not be found again
    outcome.stood_in = dict(standins.stood_in)
    outcome.fixes = {
        fix_id: activation.outcomes().get(fix_id, "not applied: the probes imported none of its modules")
        for fix_id in fixes
    }


def probe_all(wanted: dict[str, Check], target: Target, facts: Facts, outcome: LiveOutcome, step) -> None:
    """Run the live probe of each imported check of ``wanted`` into ``outcome`` (the phase after the
    imports; ``npudoctor.live.zygote`` runs it too, in a process forked after them)."""
    from npudoctor.live import sealing, standins
    from npudoctor.live.npusim import npu_runtime

    note = _stood_in_note(outcome) if outcome.stood_in else None
    for check_id, check in wanted.items():
        if check_id in outcome.not_run:
            continue
        step(check_id)
        started = time.perf_counter()
        try:
            # every probe's exceptions the host caused are judged here, in one place (npudoctor.live.sealing)
            with npu_runtime(), standins.probing(), sealing.watching():
                probe = sealing.judged(check.live(target, facts))
        except standins.StoodInError as reached:
            probe = _cannot_tell(reached.module, str(reached))
        except ModuleNotFoundError as error:
            if not error.name or error.name.split(".")[0] == "sglang":
                outcome.errors[check_id] = _described(error)
                continue
            probe = _cannot_tell(error.name, f"the probe imported {error.name}, not installed on this host")
        except Exception as error:
            probe = sealing.ended_by_host(error)
            if probe is None:
                outcome.errors[check_id] = _described(error)
                continue
        finally:
            outcome.probe_seconds[check_id] = time.perf_counter() - started
            _release_probe_memory()
        if note is not None:
            probe = dataclasses.replace(probe, assumptions=probe.assumptions + (note,))
        outcome.probes[check_id] = probe


def _child() -> int:
    """Entry point of the child: import the probed sglang modules behind the NPU simulation, sealed
    from the model hubs and the network (``npudoctor.live.sealing``)."""
    from npudoctor.live import processstate, sealing

    sealing.use_scratch(Path(sys.argv[1]))  # its caller's: removed however this process ends
    sealing.seal()  # before anything imports sglang, transformers or huggingface_hub
    request = pickle.loads(sys.stdin.buffer.read())
    interpreters.die_with_parent(
        request["parent"]
    )  # npudoctor SIGKILLed: no import of sglang runs on without it
    # whatever sglang prints, from Python or from native code writing to fd 1, must not corrupt
    # the answer: the answer gets its own copy of the pipe, and fd 1 becomes stderr
    sys.stdout.flush()
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from npudoctor.engine.registry import all_checks
    from npudoctor.live.npusim import simulated_npu
    from npudoctor.patching import activation
    from npudoctor.target.discovery import discover

    outcome = LiveOutcome()
    target = discover(request["sglang_root"])
    processstate.use_tree(target.tree)  # the probes' imports read the same parse as the probes
    processstate.serve_model(request["facts"].model)  # the deployment's config.json at the model path
    wanted = {c.id: c for c in all_checks() if c.id in request["checks"]}
    steps = os.fdopen(request["steps_fd"], "w", buffering=1, encoding="utf-8")

    def step(name: str) -> None:
        with contextlib.suppress(OSError):  # the caller stopped listening; the answer still matters
            steps.write(name + "\n")

    with simulated_npu():
        activation.enable(request["fixes"])
        step("import")
        start = time.perf_counter()
        for check_id, check in wanted.items():
            import_for(check_id, check, outcome)
        imports_done(outcome, request["fixes"])
        outcome.import_seconds = time.perf_counter() - start
        outcome.import_rss_mb = _peak_rss_mb()
        probe_all(wanted, target, request["facts"], outcome, step)
    outcome.peak_rss_mb = _peak_rss_mb()
    answer.write(pickle.dumps(outcome))
    answer.close()
    return 0


def exit_now(code: int) -> None:
    """End a live interpreter once its answer is delivered, without tearing it down: unloading
    sglang, torch and the stand-ins (finalizers, the collector over millions of objects, exit
    handlers) took 2.5-13 s after the answer while ``npudoctor`` waited for the exit in silence.
    Nothing is lost: the answer is written and closed, the streams are flushed here, and the
    scratch folder is the caller's to remove once it has reaped this process (``LiveRun.stop``)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    # run the child through the importable module, so everything it pickles names its real module
    from npudoctor.live.child_process import _child as child
    from npudoctor.live.child_process import exit_now

    exit_now(child())
