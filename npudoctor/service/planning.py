"""``npudoctor fix``'s decisions: for each fix, apply, not needed or refused, from its check's
verdict and the shape of the installed code, and the record document ``--apply`` writes and
``npudoctor run`` hands its bootstrap.

The CLI only gathers options; the decisions live here so tests and embedders get the
same behaviour. Patching itself happens in the processes that run sglang
(``npudoctor.patching.activation``); this module never imports sglang.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass

from npudoctor.deployment.facts import Facts
from npudoctor.engine.registry import select
from npudoctor.patching.fixbase import Fix, Safety, all_fixes
from npudoctor.results import Result, Status
from npudoctor.service.evaluate import evaluate
from npudoctor.target.discovery import Target

SCHEMA = 1


class Action(str, enum.Enum):
    APPLY = "apply"
    NOT_NEEDED = "not needed"
    REFUSED = "refused"


@dataclass(frozen=True)
class Decision:
    """What ``npudoctor fix`` would do with one fix on this target, and why."""

    fix_id: str
    action: Action
    reason: str
    shape: dict[str, str]
    release: str | None = None  # the release whose shape matched
    installs: tuple[str, ...] = ()  # the sites of ``replaces`` that would be installed
    # the check fails here: a refusal leaves a confirmed defect in place (``fix`` exits 1, ``refusals``)
    confirmed: bool = False


def decide(fix: Fix, target: Target, result: Result, allow_unsafe: bool = False) -> Decision:
    """Apply only where the check's verdict (``result``, from ``npudoctor.service.evaluate``) is ``fail``
    and the code is a shape the fix knows."""
    if result.status in (Status.PASS, Status.SKIP):
        return Decision(fix.id, Action.NOT_NEEDED, f"{fix.id} {result.status.value}: {result.summary}", {})
    if result.status is not Status.FAIL:
        return Decision(
            fix.id,
            Action.REFUSED,
            f"{fix.id} could not confirm the defect ({result.status.value}: {result.summary})",
            {},
        )
    shape = fix.shape_of_source(target.tree)
    release = fix.known_release(shape)
    if release is None:
        differing = fix.differences(shape) or sorted(shape)
        return Decision(
            fix.id,
            Action.REFUSED,
            "the installed code is not a shape this fix was written for: "
            + ", ".join(f"{site} ({shape[site]})" for site in differing)
            + f" differ from sglang {', '.join(fix.written_for)}",
            shape,
            confirmed=True,
        )
    installs = fix.installs_in_source(target.tree)
    if not installs:
        return Decision(
            fix.id,
            Action.REFUSED,
            f"{fix.id} fails here ({result.summary}), but none of the functions this fix replaces "
            "needs it in this code",
            shape,
            release,
            confirmed=True,
        )
    if fix.safety is Safety.UNSAFE and not allow_unsafe:
        return Decision(
            fix.id,
            Action.REFUSED,
            "changes behaviour of running code (unsafe): pass --unsafe to apply it",
            shape,
            release,
            installs,
            confirmed=True,
        )
    reason = f"{fix.id} fails here: {result.summary}"
    if set(installs) != set(fix.replaces):
        kept = [site.partition(":")[2] for site in fix.replaces if site not in installs]
        reason += (
            f"; replaces only {', '.join(site.partition(':')[2] for site in installs)} here "
            f"({', '.join(kept)} already right in this code)"
        )
    return Decision(fix.id, Action.APPLY, reason, shape, release, installs)


@dataclass(frozen=True)
class Planned:
    fix: Fix
    decision: Decision


def select_fixes(ids: list[str]) -> list[Fix]:
    return select(all_fixes(), ids, "fix")


def plan(
    fixes: list[Fix],
    target: Target,
    facts: Facts,
    allow_unsafe: bool,
    depth: str = "auto",
    on_step: Callable[[str], None] | None = None,
) -> list[Planned]:
    """Each fix's decision from its check's verdict at ``depth``: the verdict ``npudoctor check``
    gives at that depth (live where the target imports, at ``auto``)."""
    results = evaluate([fix.check for fix in fixes], target, facts, depth, on_step=on_step).results
    return decisions(fixes, target, results, allow_unsafe)


def decisions(fixes: list[Fix], target: Target, results: list[Result], allow_unsafe: bool) -> list[Planned]:
    """Each fix's decision from the verdicts ``results`` (one per check id) of an evaluation."""
    verdicts = {result.id: result for result in results}
    return [Planned(fix, decide(fix, target, verdicts[fix.id], allow_unsafe)) for fix in fixes]


def refusals(planned: list[Planned]) -> list[Planned]:
    """The fixes refused where their check fails: the defect stays (``fix`` exits 1, one line each)."""
    return [p for p in planned if p.decision.action is Action.REFUSED and p.decision.confirmed]


def plan_json(planned: list[Planned]) -> list[dict]:
    """The plan as ``npudoctor fix --format json`` shows it: every fix's decision and what it replaces."""
    return [plan_entry(p) for p in planned]


def plan_entry(p: Planned) -> dict:
    """One fix of a plan: its decision, and what it replaces in this code (``--apply`` records a
    fix it applies with the same values, ``record_document``)."""
    return {
        "id": p.fix.id,
        "action": p.decision.action.value,
        "reason": p.decision.reason,
        "safety": p.fix.safety.value,
        "upstream": p.fix.upstream,
        "own": p.fix.own or None,
        "replaces": list(p.decision.installs or p.fix.replaces),  # what this code gets
        "release": p.decision.release,
    }


_RECORDED = ("release", "upstream", "safety", "replaces")  # of a plan entry, in the record's order


def record_document(planned: list[Planned], target: Target) -> dict:
    """What ``--apply`` records and ``npudoctor run`` hands its bootstrap: the fixes to apply, each
    with the shape of the code it was decided for."""
    recorded = {}
    for p in planned:
        if p.decision.action is Action.APPLY:
            entry = plan_entry(p)
            recorded[p.fix.id] = {"shape": p.decision.shape, **{key: entry[key] for key in _RECORDED}}
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "sglang": {"version": target.version, "path": str(target.package_dir)},
        "fixes": recorded,
    }
