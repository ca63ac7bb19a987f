"""The ``Check`` base class and the one verdict.

A check is one known defect family: a stable id, its kind (``npudoctor.engine.kinds``), the
upstream references, when it matters, and probes that test the property the defect violates.
Adding a check is adding one module to ``npudoctor/checks/`` (the repo's ``checks/``) that defines
``CHECK = SomeCheck()``; the registry (``npudoctor.engine.registry``) finds it, nothing else needs
editing.
"""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Depth, Evidence, Impact, Remediation, Result, Status
from npudoctor.target import history, resultcache

if TYPE_CHECKING:
    from npudoctor.deployment.facts import Facts
    from npudoctor.target.discovery import Target


@dataclass(frozen=True)
class Probe:
    """What a probe hands back before the check wraps it into a ``Result``."""

    status: Status
    summary: str
    evidence: tuple[Evidence, ...] = ()
    assumptions: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    # third-party modules stood in on this host (``npudoctor.live.standins``) that the live probe
    # reached: it could not tell, and the verdict must not be ``pass`` on its account
    stood_in: tuple[str, ...] = ()


@dataclass
class LiveOutcome:
    """What the live child (``npudoctor.live.child_process``) reported: a probe or an error per check id, and what the run cost."""

    probes: dict[str, Probe] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    unavailable: str | None = None  # why no live probe could run at all
    prepare: str | None = (
        None  # with ``unavailable``: the command that makes it run (``npudoctor.live.toolenv``)
    )
    not_run: dict[str, str] = field(default_factory=dict)  # check id -> why its live probe did not run
    # a module (or a name in one) this host lacks, stood in for the import -> the check that needed it
    stood_in: dict[str, str] = field(default_factory=dict)
    import_seconds: float = 0.0
    probe_seconds: dict[str, float] = field(default_factory=dict)  # check id -> its live probe's wall time
    peak_rss_mb: float = 0.0
    import_rss_mb: float = 0.0  # peak RSS right after importing the probed modules
    fixes: dict[str, str] = field(default_factory=dict)  # runtime fix id -> "applied" or why not
    from_cache: bool = False  # kept from an earlier identical run (``npudoctor.service.evaluate``)


class Check:
    """Base of every check. Subclasses set the metadata and implement ``static``."""

    id: ClassVar[str]
    # deep check, generic property or catalog record: every check names its kind, and its id carries
    # the kind's prefix (``all_checks`` refuses a check without)
    kind: ClassVar[CheckKind]
    title: ClassVar[str]
    # what the defect does where it bites (its worst consequence): the gate's severity (``results.Gate``);
    # every check names one (``all_checks`` refuses a check without)
    impact: ClassVar[Impact]
    upstream: ClassVar[tuple[str, ...]] = ()  # pull-request URLs
    why: ClassVar[str] = ""  # why it matters to a deployment
    bites_when: ClassVar[str] = ""  # the conditions under which the defect shows
    how_to_fix: ClassVar[str] = ""  # what npudoctor offers; the upgrade advice comes from the history
    workaround: ClassVar[str] = ""  # a catalog record's: flags or settings that avoid the defect
    # whether a release fixes it (npudoctor.target.history): a defect of sglang, not of the deployment's input
    upstream_history: ClassVar[bool] = True
    runtime_fix: ClassVar[bool] = True  # whether `npudoctor fix` has a fix of the same id to point at
    # run only when selected by id, prefix or ALL, although its kind is selected by default (the dry
    # run: it costs an import of sglang and a start-up per role)
    opt_in: ClassVar[bool] = False

    @property
    def default_selected(self) -> bool:
        """Run when no ``--select`` is given: its kind's default, unless the check is opt-in."""
        return self.kind.default_selected and not self.opt_in

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

    def out_of_scope(self, facts: Facts) -> Probe | None:
        """The ``skip`` when the deployment alone shows that the defect cannot bite (no role that
        offloads, no PD, no PP ...), else None. Decided before either depth runs: a check out of
        scope reads no source, and no live child is started for it."""
        return None

    def reads_source(self, facts: Facts, depth: str) -> bool:
        """Whether ``run`` at ``depth`` runs the static probe for this deployment: not out of scope,
        and not a live-only run (a check without a live probe answers from the source at every depth)."""
        return self.out_of_scope(facts) is None and (depth != "live" or not self.has_live)

    def run(
        self,
        target: Target,
        facts: Facts,
        depth: str = "auto",
        live: LiveOutcome | None = None,
        static: Probe | None = None,
    ) -> Result:
        """Run the static probe (unless ``depth == "live"``; ``static``: its probe, already run), take
        the live probe's outcome where it ran, and turn the two into the verdict (``verdict``)."""
        skip = self.out_of_scope(facts)
        if skip is not None:
            return self.result(skip.status, Depth.STATIC, skip.summary, skip.evidence, skip.assumptions)
        if static is None and self.reads_source(facts, depth):
            static = cached_static(self, target, facts)
        live_probe, live_note = self._live_probe(depth, live)
        fix_outcome = live.fixes.get(self.id) if live is not None else None
        return verdict(self, static, live_probe, live_note, fix_outcome)

    def remediation(self, own: history.Upstream, deployment: history.Upstream | None = None) -> Remediation:
        """What to do about a finding: the release history's upgrade (``npudoctor.target.history``)
        where there is one, and npudoctor's own remedy. ``own``: where this check's property holds
        for the deployment; ``deployment``: the first release from which every check in the
        deployment's scope holds (``history.deployment_upgrade``): the only upgrade recommended,
        so that no finding points at a release where another check of the deployment fails."""
        deployment = deployment or own
        remedy = self.how_to_fix[:1].upper() + self.how_to_fix[1:]
        if own.fixed_in is None:
            advice = (
                f"Not fixed upstream as of sglang {own.newest_checked}: {self.how_to_fix}"
                if own.newest_checked is not None
                else remedy
            )
        elif deployment.fixed_in is not None:
            also = (
                f"; the other checks of this deployment hold from {deployment.fixed_in}"
                if deployment.fixed_in != own.fixed_in
                else ""
            )
            advice = (
                f"Upgrade sglang to {deployment.fixed_in} or later (this property holds from {own.fixed_in}"
                f"{also}, in every release npudoctor checked through {deployment.newest_checked}), "
                f"or {self.how_to_fix}"
            )
        else:
            advice = (
                f"Fixed upstream in sglang {own.fixed_in}, but no release npudoctor checked through "
                f"{deployment.newest_checked} holds every check of this deployment: {self.how_to_fix}"
            )
        unfixed = own.newest_checked if own.fixed_in is None else None
        upgrade = deployment.fixed_in if own.fixed_in is not None else None
        return Remediation(
            fix_id=self._fix_id,
            fixed_in=own.fixed_in,
            advice=advice,
            unfixed_as_of=unfixed,
            upgrade_to=upgrade,
            workaround=self.workaround,
        )

    def _live_probe(self, depth: str, live: LiveOutcome | None) -> tuple[Probe | None, str]:
        if depth == "static" or not self.has_live:
            return None, ""
        if live is None:
            return None, "not requested"
        if live.unavailable:
            return None, live.unavailable
        if self.id in live.not_run:
            return None, live.not_run[self.id]
        if self.id in live.errors:
            raise LiveProbeError(live.errors[self.id])
        return live.probes.get(self.id), ""

    @property
    def _fix_id(self) -> str | None:
        return self.id if self.runtime_fix else None

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
            remediation = Remediation(
                fix_id=self._fix_id, advice=self.how_to_fix
            )  # Check.run adds the history
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
            impact=self.impact.value,
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
            impact=self.impact.value,
        )


class LiveProbeError(RuntimeError):
    """The live probe itself raised in the child; the check becomes an ``error`` result."""


def verdict(
    check: Check,
    static: Probe | None,
    live: Probe | None,
    live_note: str = "",
    fix_outcome: str | None = None,
) -> Result:
    """The one decision: a check's static and live probes -> its ``Result``.

    Every command reaches its verdict here (``check``, ``fix`` and ``run`` through
    ``npudoctor.service.evaluate``), so they cannot disagree:

    * live did not run: the static verdict, with the reason live did not run;
    * live ran on code a runtime fix replaced: the live verdict, "with runtime fix";
    * live ``fail`` (sglang's own code raised, or returned wrong bytes, pairs or values): ``fail``,
      whatever static said; a static ``pass`` beside it is noted as a gap in the static probe;
    * live reached a module stood in on this host: never ``pass``;
    * static ``fail``, live ``pass``: ``warn`` (the simulation may hide what static saw);
    * otherwise the depth that could tell (``pass``/``fail``) over one that could not.
    """
    if live is not None and fix_outcome == "applied":
        return _with_fix(check, live, static)
    if fix_outcome is not None:
        live_note = f"runtime fix {check.id} requested, {fix_outcome}" + (
            f"; {live_note}" if live_note else ""
        )
        if live is not None:
            live = dataclasses.replace(live, assumptions=live.assumptions + (live_note,))
    if live is None:
        if static is None:
            return check.result(Status.ERROR, Depth.LIVE, f"live depth unavailable: {live_note}")
        notes = (f"live depth not run: {live_note}",) if live_note else ()
        return _from(check, static, Depth.STATIC, static.assumptions + notes)
    if static is None or static.status == live.status:
        return _from(check, live, Depth.LIVE, live.assumptions, static)
    if live.status is Status.FAIL:
        gap = " (sglang's own code failed where the static probe saw none: a gap in the static probe)"
        note = f"static depth: {static.status.value}: {static.summary}" + (
            gap if static.status is Status.PASS else ""
        )
        return _from(check, live, Depth.LIVE, live.assumptions + (note,), static)
    if live.stood_in and static.status is Status.PASS:
        return check.result(
            Status.WARN,
            Depth.LIVE,
            f"{live.summary}; static depth: pass: {static.summary}",
            live.evidence + static.evidence,
            live.assumptions + static.assumptions,
            live.roles or static.roles,
        )
    definitive = [p for p in (live, static) if p.status in (Status.PASS, Status.FAIL)]
    if len(definitive) == 1:  # the other side could not tell (warn) or did not apply (skip)
        chosen = definitive[0]
        other = static if chosen is live else live
        note = f"{'static' if chosen is live else 'live'} depth: {other.status.value}: {other.summary}"
        depth = Depth.LIVE if chosen is live else Depth.STATIC
        return _from(check, chosen, depth, chosen.assumptions + (note,), other)
    return check.result(
        Status.WARN,
        Depth.LIVE,
        f"static and live disagree (static: {static.status.value}, live: {live.status.value}): "
        f"static says {static.summary}; live says {live.summary}",
        live.evidence + static.evidence,
        live.assumptions + static.assumptions,
        live.roles or static.roles,
    )


def _from(
    check: Check, chosen: Probe, depth: Depth, assumptions: tuple[str, ...], other: Probe | None = None
) -> Result:
    evidence = chosen.evidence + (other.evidence if other is not None else ())
    return check.result(chosen.status, depth, chosen.summary, evidence, assumptions, chosen.roles)


def _with_fix(check: Check, live: Probe, static: Probe | None) -> Result:
    """The live probe ran on code the runtime fix replaced: its verdict is the deployment's
    with the fix active; the static depth still reads the installed (unfixed) source."""
    notes = (
        f"runtime fix {check.id} was applied in the live run (npudoctor fix / npudoctor run); "
        "without it, sglang's processes run the installed code",
    )
    if static is not None:
        notes += (f"the installed source, read statically: {static.status.value}: {static.summary}",)
    return check.result(
        live.status,
        Depth.LIVE,
        f"with runtime fix {check.id}: {live.summary}",
        live.evidence + (static.evidence if static else ()),
        live.assumptions + notes,
        live.roles,
    )


def cached_static(check: Check, target: Target, facts: Facts) -> Probe:
    """``check.static(target, facts)``: a function of the target's source and the deployment only,
    so answered from the static-result cache (``npudoctor.target.resultcache``) when this code already ran it."""
    return resultcache.remembered(
        f"static {check.id}", target.cache_key, lambda: check.static(target, facts), repr(facts)
    )
