"""Run checks at a depth and reach their verdicts: the one path every command takes.

``npudoctor check``, ``fix`` (plan, ``--apply``, ``--status``), ``run``, ``--with-fix`` and
the in-process API all call ``evaluate``, and every verdict comes from ``check.verdict``:
a deployment gets the same answer whichever command asks. At ``auto`` and ``live`` depth the
live probes run in one child (``npudoctor.live.child_process``), and only for the checks whose scope the
deployment is in: a deployment no check applies to starts no child at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, LiveOutcome, collector_paused, run_checks, static_probes
from npudoctor.live import child_process
from npudoctor.results import Result
from npudoctor.target.discovery import Target

NO_LIVE_PROBE_APPLIES = (
    "no live probe applies to this deployment (the checks run are out of its scope or have none)"
)


@dataclass(frozen=True)
class Evaluation:
    results: list[Result]
    live: LiveOutcome | None  # None: the live depth was not asked for


def live_checks(checks: list[Check], facts: Facts, depth: str) -> list[Check]:
    """The checks whose live probe a run at ``depth`` starts for this deployment."""
    if depth == "static":
        return []
    return [c for c in checks if c.has_live and c.out_of_scope(facts) is None]


def evaluate(
    checks: list[Check],
    target: Target,
    facts: Facts,
    depth: str = "auto",
    *,
    fixes: dict[str, dict[str, str]] | None = None,
    declined: dict[str, str] | None = None,
    on_step: Callable[[str], None] | None = None,
    on_done: Callable[[Check, Result], None] | None = None,
) -> Evaluation:
    """Each check's verdict at ``depth``. ``fixes`` (``{id: shape}``) are enabled in the live child;
    ``declined`` (``{id: why}``) names runtime fixes asked for but not applied, for the verdicts to say."""
    outcome = None
    statics = {}
    if depth != "static":
        probed = live_checks(checks, facts, depth)
        child = child_process.start(target, facts, probed, on_step, fixes) if probed else None
        # the static probes run while the child imports sglang (seconds of a live run)
        statics = static_probes(checks, target, facts, depth) if child is not None else {}
        outcome = child.outcome() if child is not None else LiveOutcome(unavailable=NO_LIVE_PROBE_APPLIES)
        outcome.fixes.update(declined or {})
    with collector_paused():
        results = run_checks(checks, target, facts, depth, on_done, outcome, statics)
    return Evaluation(results, outcome)


def reuse(
    earlier: Evaluation,
    checks: list[Check],
    target: Target,
    facts: Facts,
    depth: str,
    declined: dict[str, str] | None = None,
) -> Evaluation:
    """The verdicts of ``checks`` from an earlier evaluation's live outcome (no new child), with
    the runtime fixes that were asked for and ``declined`` named in them."""
    outcome = earlier.live
    if outcome is not None:
        outcome.fixes.update(declined or {})
    with collector_paused():
        return Evaluation(run_checks(checks, target, facts, depth, None, outcome), outcome)
