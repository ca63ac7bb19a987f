"""``npudoctor advise``: which sglang release to run for this deployment.

An operator on a pinned image asks two things after a finding: what does the release we run
need until we move, and which release should we move to? ``advise`` checks a range of real
releases for the one deployment (the verdicts ``check`` gives, from the same ``runner.run``)
and answers from the matrix:

* the baseline (the installed release, else the first one asked for): its findings, and the
  runtime fixes that cure them now (the decisions ``npudoctor fix`` would make);
* the earliest release at or after the baseline with no finding for this deployment;
* regressions: a check that is a finding in a release right after one where it was not (a
  defect that comes back, or a new one): moving past the clean release brings it in.

Releases come from the release cache (``npudoctor.target.releases``), fetched as wheels with ``pip
download --no-deps`` or unpacked from ``--wheel-dir`` (offline); a release that cannot be had
(its wheel missing, not that release, unsafe to unpack; the cache unwritable or not private) is a
row saying why, never the end of the run. Up to ``jobs`` releases are checked at once (one per core by default): at
the static depth in worker processes, at ``auto``/``live`` each with its own live child; the
static-result cache (``npudoctor.target.resultcache``) makes a second run over the same releases cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from npudoctor import interpreters
from npudoctor.errors import ExitCode, InputError, NoTargetError
from npudoctor.live import child_process
from npudoctor.results import Report, Status
from npudoctor.service.hints import UserOptions
from npudoctor.service.runner import CheckRequest, request_gate, run
from npudoctor.target import history, releases
from npudoctor.target.discovery import discover


@dataclass(frozen=True)
class Candidate:
    """One release (or tree) to check: where its source is, or why it cannot be had."""

    label: str  # the version, or the path for a tree without one
    version: str | None
    tree: Path | None = None  # the directory holding sglang/; None: a release to fetch, or the installed one
    installed: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Row:
    candidate: Candidate
    report: Report | None = None
    error: str | None = None  # why this release has no report (not fetched, not checkable)
    seconds: float = 0.0
    tree: Path | None = None  # where the checked source is (None: the installed sglang)

    @property
    def findings(self) -> list[str]:
        return [r.id for r in self.report.findings()] if self.report is not None else []


@dataclass(frozen=True)
class Regression:
    check_id: str
    release: str  # where the finding is back
    clean_in: str  # the nearest earlier checked release where it was not a finding


@dataclass(frozen=True)
class Cure:
    check_id: str
    action: str  # the ``npudoctor fix`` decision on the baseline: apply, refused, not needed
    reason: str
    safety: str


@dataclass(frozen=True)
class Recommendation:
    baseline: str | None  # the label of the installed (or first) release; None: nothing was selected
    baseline_findings: tuple[str, ...]
    cures: tuple[Cure, ...]
    earliest_clean: str | None  # at or after the baseline
    regressions: tuple[Regression, ...]
    # the first release after the baseline from which every later checked release has no finding:
    # "upgrade to X or later", by the rule a finding's remediation uses (``history.holds_from``)
    upgrade_to: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Advice:
    rows: tuple[Row, ...]
    recommendation: Recommendation
    check_ids: tuple[str, ...]
    depth: str
    fail_on: str
    notes: tuple[str, ...] = ()  # e.g. the release list is an older copy
    user: UserOptions = UserOptions()  # the user's deployment options, for the commands the advice names

    @property
    def baseline_row(self) -> Row | None:
        """The first row: the installed release, else the first asked for."""
        return self.rows[0] if self.rows else None

    def to_dict(self, tool_version: str) -> dict:
        first = next((r.report for r in self.rows if r.report is not None), None)
        return {
            "schema_version": "1",
            "tool": {"name": "npudoctor", "version": tool_version},
            "deployment": first.deployment if first is not None else None,
            "depth": self.depth,
            "fail_on": self.fail_on,
            "checks": list(self.check_ids),
            "notes": list(self.notes),
            "releases": [
                {
                    "release": row.candidate.label,
                    "version": row.candidate.version,
                    "installed": row.candidate.installed,
                    "error": row.error,
                    "seconds": round(row.seconds, 2),
                    "report": row.report.to_dict() if row.report is not None else None,
                }
                for row in self.rows
            ],
            "recommendation": self.recommendation.to_dict(),
        }


@dataclass
class AdviseRequest:
    check: CheckRequest  # the deployment, checks, depth, --fail-on and --ignore, as `check` takes them
    releases: str | None = None  # "A..B", "A..", "A,B,C" or "A"
    wheel_dir: Path | None = None
    sglang_paths: list[Path] = field(default_factory=list)
    cache: Path | None = None
    jobs: int = 0  # releases checked at once; 0: one per core


def advise(request: AdviseRequest, on_row: Callable[[int, int, Row], None] | None = None) -> Advice:
    """Check every candidate of ``request`` and recommend; raises ``InputError``/``NoTargetError``."""
    request_gate(request.check)  # a word --fail-on does not know: exit 2 before any release is fetched
    cache = request.cache or releases.user_cache_dir()
    candidates, notes = select_candidates(request, cache)
    jobs = min(request.jobs or os.cpu_count() or 1, len(candidates))
    work = [(candidate, request.check, cache, request.wheel_dir) for candidate in candidates]
    rows: list[Row] = []

    def finished(row: Row) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(len(rows), len(candidates), row)

    if jobs <= 1:
        for item in work:
            finished(_check(*item))
    else:
        # static: parsing is CPU work under the GIL, so one process per core (a fresh interpreter:
        # spawned, never forked from a process that may hold threads); auto/live: threads, each
        # live check runs in a child of its own anyway
        stoppable = child_process.Stoppable()  # the threads' live children
        if request.check.depth == "static":
            pool = ProcessPoolExecutor(
                max_workers=jobs,
                mp_context=interpreters.spawn_context(),
                initializer=worker_started,  # a worker must not outlive npudoctor
                initargs=(os.getpid(),),
            )
        else:
            pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            with workers_starting(isinstance(pool, ProcessPoolExecutor)):  # the workers start here
                futures = [
                    pool.submit(_check, *item)
                    if isinstance(pool, ProcessPoolExecutor)
                    else pool.submit(stoppable.run, _check, *item)
                    for item in work
                ]
            for future in futures:  # reported in the releases' order
                finished(future.result())
        except BaseException:  # Ctrl-C (or a failure): no release is started any more, the workers stop
            _stop(pool, stoppable)
            raise
        pool.shutdown()
    check_ids = tuple(dict.fromkeys(r.id for row in rows if row.report for r in row.report.results))
    return Advice(
        rows=tuple(rows),
        recommendation=recommend(rows),
        check_ids=check_ids,
        depth=request.check.depth,
        fail_on=request.check.fail_on or "fail",
        notes=tuple(notes),
        user=request.check.user_options(default_depth="static"),
    )


@contextlib.contextmanager
def workers_starting(processes: bool) -> Iterator[None]:
    """While worker processes start, npudoctor's stop signals wait: a stop in the middle of a spawn
    left the worker reading its start-up data from a closed pipe (``EOFError``, a traceback on the
    terminal), and a Ctrl-C that was only ignored was lost. SIGTERM and SIGHUP are recorded (a Python
    handler, which runs on the main thread whichever thread the signal reached) and raised again
    once the workers exist. Ctrl-C is ignored, because the workers inherit that (a terminal sends it
    to every process of the command; ``worker_started`` keeps it so), and blocked, so it stays
    pending and arrives when the block ends (a thread of npudoctor's own that does not block it, a
    spinner's, may still take one and drop it). Then npudoctor stops the workers it started."""
    if not processes or threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {number: signal.signal(number, lambda n, _: held.append(n)) for number in _RECORDED}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C held meanwhile arrives here
        for number in held:
            signal.raise_signal(number)


_RECORDED = (signal.SIGTERM, signal.SIGHUP)


def worker_started(parent: int) -> None:
    """A worker's first step: Ctrl-C ignored (npudoctor stops its workers itself) and no longer
    held, and it dies with its parent (``interpreters.die_with_parent``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    interpreters.die_with_parent(parent)


def _stop(pool: ProcessPoolExecutor | ThreadPoolExecutor, stoppable: child_process.Stoppable) -> None:
    """Stop checking: releases not started are dropped; worker processes are ended; the threads' live
    children are killed (a signal to npudoctor alone does not reach them), which ends each thread's
    release at once: the process exits only when its threads have, and a live run lasts minutes."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
    stoppable.stop()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()


def _check(candidate: Candidate, check: CheckRequest, cache: Path, wheel_dir: Path | None) -> Row:
    """One row: fetch the release if needed, then the report ``npudoctor check`` gives for it."""
    started = time.perf_counter()
    if candidate.error is not None:
        return Row(candidate, error=candidate.error)
    tree = candidate.tree
    if tree is None and not candidate.installed:
        try:
            tree = releases.fetch(candidate.version or candidate.label, cache, wheel_dir)
        except releases.FetchError as error:
            return Row(candidate, error=str(error), seconds=time.perf_counter() - started)
    try:
        report = run(dataclasses.replace(check, sglang_path=tree))
    except NoTargetError as error:
        return Row(candidate, error=str(error), seconds=time.perf_counter() - started)
    return Row(candidate, report, seconds=time.perf_counter() - started, tree=tree)


def select_candidates(request: AdviseRequest, cache: Path) -> tuple[list[Candidate], list[str]]:
    """The releases and trees to check, the baseline first; and notes on how they were chosen."""
    candidates = [_path_candidate(p) for p in request.sglang_paths]
    notes: list[str] = []
    if request.releases is None and request.wheel_dir is None and candidates:
        return candidates, notes
    if request.wheel_dir is not None:
        if not request.wheel_dir.is_dir():
            raise InputError(f"--wheel-dir {request.wheel_dir}: no such directory")
        available = releases.wheel_versions(request.wheel_dir)
        if not available:
            raise InputError(f"--wheel-dir {request.wheel_dir}: no sglang-*.whl in it")
    else:
        try:
            available, note = releases.index_versions(cache)
        except releases.FetchError as error:
            raise InputError(f"{error}; give --wheel-dir DIR (offline) or --sglang-path") from None
        if note:
            notes.append(note)
    if request.releases is not None:
        wanted = _in_range(request.releases, available, request.wheel_dir is None)
    elif request.wheel_dir is not None:
        wanted = [release_candidate(v) for v in available]  # every wheel there
    else:
        installed = _installed_candidate()
        if installed is None:
            raise NoTargetError(
                "no sglang installed here to start from: give --releases A..B, --wheel-dir DIR or --sglang-path"
            )
        if installed.version is None or not releases.is_final(installed.version):
            start = None
            notes.append(
                f"the installed sglang's version {installed.version!r} is not a release: every release is checked"
            )
        else:
            start = releases.version_key(installed.version)
        wanted = [release_candidate(v) for v in available if start is None or releases.version_key(v) > start]
        return [installed, *wanted], notes
    return candidates + wanted, notes


def release_candidate(version: str) -> Candidate:
    return Candidate(label=version, version=version)


def _in_range(spec: str, available: list[str], from_index: bool) -> list[Candidate]:
    """``A..B``, ``A..``, ``..B``, ``A,B,C`` or ``A``; a named release the index (or the wheel
    directory) does not have is still a row, saying so."""
    spec = spec.strip()
    where = "on the package index" if from_index else "in --wheel-dir"
    if ".." in spec:
        low, _, high = spec.partition("..")
        for bound in (low, high):
            if bound and not releases.is_final(bound):
                raise InputError(
                    f"--releases {spec!r}: {bound!r} is not a release number (e.g. 0.5.9..0.5.23)"
                )
        lo = releases.version_key(low) if low else ()
        hi = releases.version_key(high) if high else None
        chosen = [
            v
            for v in available
            if releases.version_key(v) >= lo and (hi is None or releases.version_key(v) <= hi)
        ]
        if not chosen:
            raise InputError(f"--releases {spec!r}: no release {where} in that range")
        return [release_candidate(v) for v in chosen]
    named = [v.strip() for v in spec.split(",") if v.strip()]
    if not named:
        raise InputError("--releases: give A..B, A.., A,B,C or A")
    candidates = []
    for version in sorted(
        dict.fromkeys(named), key=lambda v: releases.version_key(v) if releases.is_final(v) else ()
    ):
        if not releases.is_final(version):
            raise InputError(f"--releases: {version!r} is not a release number (e.g. 0.5.12)")
        error = None if version in available else f"sglang {version} is not {where}"
        candidates.append(Candidate(label=version, version=version, error=error))
    return candidates


def _path_candidate(path: Path) -> Candidate:
    target = discover(path)  # an InputError for a path that is not an sglang tree
    return Candidate(label=target.version or str(path), version=target.version, tree=target.root)


def _installed_candidate() -> Candidate | None:
    try:
        target = discover(None)
    except NoTargetError:
        return None
    return Candidate(label=target.version or str(target.package_dir), version=target.version, installed=True)


def recommend(rows: list[Row]) -> Recommendation:
    """The baseline is the first row (the installed release, else the first asked for)."""
    if not rows:
        return Recommendation(None, (), (), None, ())
    baseline = rows[0]
    checked = [row for row in rows if row.report is not None]
    earliest = next((r.candidate.label for r in checked if not r.findings), None)
    return Recommendation(
        baseline=baseline.candidate.label,
        baseline_findings=tuple(baseline.findings),
        cures=tuple(_cures(baseline)) if baseline.report is not None else (),
        earliest_clean=earliest,
        upgrade_to=_upgrade_to(baseline, checked),
        regressions=tuple(_regressions(checked)),
    )


def _upgrade_to(baseline: Row, checked: list[Row]) -> str | None:
    """The release to upgrade to, by the release history's rule (``history.holds_from``) over the
    releases this advice checked itself: ``check``'s "upgrade to X or later" and ``advise`` name a
    release the same way. None when the baseline is clean, or no later release is clean from there on."""
    if baseline.report is not None and not baseline.findings:
        return None
    after = history.version_key(baseline.candidate.version) if baseline.candidate.version else ()
    clean = {row.candidate.version: not row.findings for row in checked if row.candidate.version}
    return history.holds_from(clean, after)


def _regressions(checked: list[Row]) -> list[Regression]:
    """A check that is a finding in a release right after one where it was not."""
    found = []
    for earlier, later in zip(checked, checked[1:]):
        before = set(earlier.findings)
        before_ids = {r.id for r in earlier.report.results}
        for check_id in later.findings:
            if check_id not in before and check_id in before_ids:
                found.append(Regression(check_id, later.candidate.label, earlier.candidate.label))
    return found


def _cures(baseline: Row) -> list[Cure]:
    """What ``npudoctor fix`` decides for each of the baseline's findings that has a runtime fix."""
    from npudoctor.patching.fixbase import all_fixes
    from npudoctor.service.planning import decisions

    fixes = [f for f in all_fixes() if f.id in baseline.findings]
    if not fixes:
        return []
    target = discover(baseline.tree)
    try:
        planned = decisions(fixes, target, list(baseline.report.results), allow_unsafe=True)
    finally:
        target.release()
    return [Cure(p.fix.id, p.decision.action.value, p.decision.reason, p.fix.safety.value) for p in planned]


def exit_status(advice: Advice) -> int:
    """0: the baseline has no finding; 1: it has; 4: the baseline could not be checked."""
    row = advice.baseline_row
    if row is None or row.report is None:
        return int(ExitCode.NOTHING_TO_CHECK)
    return int(ExitCode.FINDINGS if row.report.findings() else ExitCode.OK)


def cell(row: Row, check_id: str) -> Status | None:
    """The status of ``check_id`` in ``row``'s report (None: no report, or the check did not run)."""
    if row.report is None:
        return None
    return next((r.status for r in row.report.results if r.id == check_id), None)
