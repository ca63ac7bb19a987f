"""The ``Check`` base class and the registry that finds every check module.

A check is one known defect family: a stable id, the upstream references, when it
matters, and probes that test the property the defect violates. Adding a check is
adding one module to ``npudoctor/checks/`` (the repo's ``checks/``) that defines
``CHECK = SomeCheck()``; nothing else needs editing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from npudoctor.results import Depth, Evidence, Remediation, Result, Status

if TYPE_CHECKING:
    from npudoctor.facts import Facts
    from npudoctor.target import Target


@dataclass(frozen=True)
class Probe:
    """What a probe hands back before the check wraps it into a ``Result``."""

    status: Status
    summary: str
    evidence: tuple[Evidence, ...] = ()
    assumptions: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()


@dataclass
class LiveOutcome:
    """What the live child (``npudoctor.live``) reported: a probe or an error per check id, and what the run cost."""

    probes: dict[str, Probe] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    unavailable: str | None = None  # why no live probe could run at all
    import_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    import_rss_mb: float = 0.0  # peak RSS right after importing the probed modules
    fixes: dict[str, str] = field(default_factory=dict)  # runtime fix id -> "applied" or why not


class Check:
    """Base of every check. Subclasses set the metadata and implement ``static``."""

    id: ClassVar[str]
    title: ClassVar[str]
    upstream: ClassVar[tuple[str, ...]] = ()  # pull-request URLs
    fixed_in: ClassVar[str | None] = None  # first release with the fixed shape, if known
    why: ClassVar[str] = ""  # why it matters to a deployment
    bites_when: ClassVar[str] = ""  # the conditions under which the defect shows
    how_to_fix: ClassVar[str] = ""

    def static(self, target: Target, facts: Facts) -> Probe:
        """Read the target's source (never import it) and test the property."""
        raise NotImplementedError

    def live_imports(self) -> None:
        """Import the sglang modules the live probe needs (in the live child, behind the NPU simulation)."""

    def live(self, target: Target, facts: Facts) -> Probe:
        """Run the real sglang code on CPU and test the property with data (in the live child).

        ``target`` is the same tree the static probe reads (its source can name what to call)."""
        raise NotImplementedError

    @property
    def has_live(self) -> bool:
        return type(self).live is not Check.live

    def run(
        self, target: Target, facts: Facts, depth: str = "auto", live: LiveOutcome | None = None
    ) -> Result:
        """Combine the depths: static always (unless ``depth == "live"``), live where it ran.

        When both ran and disagree, the result is ``warn`` with both findings: one of them is wrong.
        """
        static = self.static(target, facts) if depth != "live" else None
        live_probe, live_note = self._live_probe(depth, live)
        fix_outcome = live.fixes.get(self.id) if live is not None else None
        if live_probe is not None and fix_outcome == "applied":
            return self._with_fix(live_probe, static)
        if fix_outcome is not None:
            live_note = f"runtime fix {self.id} requested, {fix_outcome}" + (
                f"; {live_note}" if live_note else ""
            )
            if live_probe is not None:
                live_probe = dataclasses.replace(
                    live_probe, assumptions=live_probe.assumptions + (live_note,)
                )
        if live_probe is None:
            if static is None:
                return self.result(Status.ERROR, Depth.LIVE, f"live depth unavailable: {live_note}")
            notes = (f"live depth not run: {live_note}",) if live_note else ()
            return self.result(
                static.status,
                Depth.STATIC,
                static.summary,
                static.evidence,
                static.assumptions + notes,
                static.roles,
            )
        if static is None or static.status == live_probe.status:
            evidence = live_probe.evidence + (static.evidence if static else ())
            return self.result(
                live_probe.status,
                Depth.LIVE,
                live_probe.summary,
                evidence,
                live_probe.assumptions,
                live_probe.roles,
            )
        definitive = [p for p in (live_probe, static) if p.status in (Status.PASS, Status.FAIL)]
        if len(definitive) == 1:  # the other side could not tell (warn) or did not apply (skip)
            chosen = definitive[0]
            depth_used = Depth.LIVE if chosen is live_probe else Depth.STATIC
            other = static if chosen is live_probe else live_probe
            note = (
                f"{'static' if chosen is live_probe else 'live'} depth: {other.status.value}: {other.summary}"
            )
            return self.result(
                chosen.status,
                depth_used,
                chosen.summary,
                chosen.evidence + other.evidence,
                chosen.assumptions + (note,),
                chosen.roles,
            )
        return self.result(
            Status.WARN,
            Depth.LIVE,
            f"static and live disagree (static: {static.status.value}, live: {live_probe.status.value}): "
            f"static says {static.summary}; live says {live_probe.summary}",
            live_probe.evidence + static.evidence,
            live_probe.assumptions + static.assumptions,
            live_probe.roles or static.roles,
        )

    def _with_fix(self, live_probe: Probe, static: Probe | None) -> Result:
        """The live probe ran on code the runtime fix replaced: its verdict is the deployment's
        with the fix active; the static depth still reads the installed (unfixed) source."""
        notes = (
            f"runtime fix {self.id} was applied in the live run (npudoctor fix / npudoctor run); "
            "without it, sglang's processes run the installed code",
        )
        if static is not None:
            notes += (f"the installed source, read statically: {static.status.value}: {static.summary}",)
        return self.result(
            live_probe.status,
            Depth.LIVE,
            f"with runtime fix {self.id}: {live_probe.summary}",
            live_probe.evidence + (static.evidence if static else ()),
            live_probe.assumptions + notes,
            live_probe.roles,
        )

    def _live_probe(self, depth: str, live: LiveOutcome | None) -> tuple[Probe | None, str]:
        if depth == "static":
            return None, ""
        if not self.has_live:
            return None, "this check has no live probe yet"
        if live is None:
            return None, "not requested"
        if live.unavailable:
            return None, live.unavailable
        if self.id in live.errors:
            raise LiveProbeError(live.errors[self.id])
        return live.probes.get(self.id), ""

    def result(
        self,
        status: Status,
        depth: Depth,
        summary: str,
        evidence: tuple[Evidence, ...] = (),
        assumptions: tuple[str, ...] = (),
        roles: tuple[str, ...] = (),
    ) -> Result:
        remediation = None
        if status in (Status.FAIL, Status.WARN):
            remediation = Remediation(fix_id=self.id, fixed_in=self.fixed_in, advice=self.how_to_fix)
        return Result(
            id=self.id,
            title=self.title,
            status=status,
            depth=depth,
            summary=summary,
            evidence=tuple(evidence),
            remediation=remediation,
            assumptions=tuple(assumptions),
            roles=tuple(roles),
        )

    def error_result(self, error: BaseException) -> Result:
        """The check itself broke: report it and let the run go on."""
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        return Result(
            id=self.id,
            title=self.title,
            status=Status.ERROR,
            depth=Depth.STATIC,
            summary=f"the check could not run: {type(error).__name__}: {error}{where}",
            error=f"{type(error).__name__}: {error}",
        )


class LiveProbeError(RuntimeError):
    """The live probe itself raised in the child; the check becomes an ``error`` result."""


def all_checks() -> list[Check]:
    """Every check module in ``npudoctor.checks``, ordered by id."""
    from npudoctor.registry import discover

    return discover("npudoctor.checks", "CHECK", Check)


def run_checks(
    checks: list[Check],
    target: Target,
    facts: Facts,
    depth: str,
    on_done=None,
    live: LiveOutcome | None = None,
) -> list[Result]:
    """Run each check; one that raises becomes an ``error`` result and the others still run.

    ``live`` is the outcome of the live child (``npudoctor.live.run``) for these checks, if it ran.
    """
    results = []
    with collector_paused():
        for check in checks:
            try:
                result = check.run(target, facts, depth, live)
            except Exception as error:  # a broken check must not hide the others' findings
                result = check.error_result(error)
            results.append(result)
            if on_done is not None:
                on_done(check, result)
    return results


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Parsing sglang's large modules keeps millions of AST nodes alive, and every full
    collection of the cyclic garbage collector re-traverses them all: measured, that made a
    static run several times slower. The checks make no garbage cycles worth collecting
    early, so the collector waits until they are done; its previous state is restored (nested,
    only the outermost pause resumes it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
