"""One ``npudoctor check`` run: target + deployment + selected checks -> ``Report``.

The CLI only gathers options into a ``CheckRequest``; everything that decides a
verdict or an exit code lives here, so tests and embedders get the same behaviour.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor import __version__
from npudoctor.deployment import ignores
from npudoctor.deployment.redact import redact_argv, redact_result, redact_value
from npudoctor.deployment.spec import DeploymentSpec
from npudoctor.engine.check import Check, LiveOutcome
from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks, select
from npudoctor.engine.running import collector_paused
from npudoctor.errors import InputError
from npudoctor.results import Gate, Impact, Report
from npudoctor.service.evaluate import evaluate, reuse
from npudoctor.service.hints import UserOptions
from npudoctor.service.planning import Action, decisions
from npudoctor.service.recordedfixes import recorded_fixes
from npudoctor.service.subject import resolve

if TYPE_CHECKING:
    from npudoctor.service.progress import Progress


@dataclass
class CheckRequest:
    deployment: DeploymentSpec = field(default_factory=DeploymentSpec)  # as the command line described it
    sglang_path: Path | None = None
    depth: str = "auto"
    select: list[str] = field(default_factory=list)
    fail_on: str | None = None  # --fail-on's words (``results.Gate``); None: the YAML's, else fail
    ignore: list[str] = field(default_factory=list)
    today: dt.date = field(default_factory=dt.date.today)
    with_fixes: list[str] = field(default_factory=list)  # run the live probes with these runtime fixes
    # judge with the fixes `fix --apply` recorded beside the target (False: --no-recorded-fixes)
    recorded_fixes: bool = True

    def user_options(self, default_depth: str = "auto") -> UserOptions:
        """The user's own options a hint repeats (``hints.hint``): of ``check``, ``fix``, and
        ``advise`` (whose ``default_depth`` is static): a depth other than the command's default is
        the user's own choice."""
        target = ["--sglang-path", str(self.sglang_path)] if self.sglang_path is not None else []
        return UserOptions(
            target=tuple(redact_argv(target, for_shell=True)),
            deployment=tuple(redact_argv(self.deployment.options(), for_shell=True)),
            depth=self.depth if self.depth != default_depth else None,
            launch_command=tuple(redact_argv(self.deployment.launch_command, for_shell=True)),
        )


def run(request: CheckRequest, progress: Progress | None = None) -> Report:
    """Run the requested checks; raises ``InputError``/``NoTargetError`` for the CLI to map.
    ``progress`` (``npudoctor.service.progress``) is told each step: the start, the live import, each probe."""
    checks = select_checks(request.select)
    if request.with_fixes and request.depth == "static":
        raise InputError("--with-fix runs the live probes with runtime fixes: it needs --depth live or auto")
    fixes = _selected_fixes(request.with_fixes)
    # a word --fail-on does not know: exit 2 before anything is read; the YAML's, before any probe runs
    gate = request_gate(request) if request.fail_on is not None else None
    subject = resolve(
        request.deployment, depth=request.depth, sglang_path=request.sglang_path, ignore=request.ignore
    )
    gate = gate if gate is not None else request_gate(request, subject.fail_on)
    target, facts = subject.target, subject.facts

    say = progress.step if progress is not None else (lambda _text: None)
    # the collector stays paused until the source is released: resumed with the ASTs still alive,
    # its next full pass would traverse them all (measured: 1.8 s over 16 releases in `advise`)
    with collector_paused(), progress or contextlib.nullcontext():
        records = sum(c.kind is CheckKind.CATALOG for c in checks)
        counted = f"{len(checks) - records} check(s)" + (f", {records} catalog record(s)" if records else "")
        say(f"checking sglang {target.version} ({counted}, depth {request.depth})")
        live_step = live_steps(say, target)
        try:
            # sglang's processes run the fixes `fix --apply` recorded: the verdicts are judged with them
            recorded = recorded_fixes(target, request.depth, use=request.recorded_fixes)
            kept = recorded.plan if recorded is not None else {}
            if fixes:
                # the fixes are decided from the verdicts on the installed code, as `npudoctor fix`
                # decides them; then the live probes run again with the accepted ones in place
                probed = checks + [f.check for f in fixes if f.check not in checks]
                plain = evaluate(probed, target, facts, request.depth, on_step=live_step)
                plan, refused = _fix_plan(fixes, target, plain.results)
                plan = {**kept, **plan}
                if plan:
                    say(f"live probes again, with the runtime fix(es) {', '.join(plan)}")
                    evaluation = evaluate(checks, target, facts, request.depth, fixes=plan, declined=refused,
                                          on_step=live_step)  # fmt: skip
                else:  # nothing to run with: the plain live run's probes are the answer
                    evaluation = reuse(plain, checks, target, facts, request.depth, declined=refused)
            else:
                evaluation = evaluate(
                    checks, target, facts, request.depth, fixes=kept or None, on_step=live_step
                )
        finally:
            target.release()  # the run is done with the source: reference counting frees the ASTs now

    graded = [gate.grade(r) for r in _with_workarounds(evaluation.results, checks, request.deployment)]
    results = ignores.apply(graded, subject.ignores, request.today)
    live_summary = _live_summary(evaluation.live)
    if live_summary is not None and "reason" in live_summary:
        live_summary["reason"] = redact_value(live_summary["reason"])
    return Report(
        target=target.info(),
        deployment=facts.to_dict(),
        results=tuple(redact_result(r) for r in results),
        fail_on=gate.threshold,
        failing_impacts=tuple(i.value for i in Impact if i in gate.failing),
        tool_version=__version__,
        live=live_summary,
        depth=request.depth,
        recorded_fixes=recorded.summary(evaluation.results, evaluation.live) if recorded else None,
    )


def request_gate(request: CheckRequest, yaml_fail_on: str | None = None) -> Gate:
    """What counts against the deployment: ``--fail-on`` when given, else the YAML's ``fail_on``,
    else the default (crashes and silent wrong output fail, leaks and performance warn)."""
    text = request.fail_on if request.fail_on is not None else yaml_fail_on
    try:
        return Gate.parse(text, "--fail-on" if request.fail_on is not None else "fail_on")
    except ValueError as error:
        raise InputError(str(error)) from None


def _with_workarounds(results, checks: list[Check], deployment: DeploymentSpec) -> list:
    """Each catalog finding's workaround in the form the user gave the deployment."""
    records = {c.id: c for c in checks if c.kind is CheckKind.CATALOG}
    return [deployment.with_workaround(r, records[r.id]) if r.id in records else r for r in results]


def live_steps(say, target) -> Callable[[str], None]:
    """The live child's steps (``import``, then each probe's check id; ``kept``: the outcome is
    the result cache's) as progress text."""
    titles = {c.id: c.title for c in all_checks()}

    def step(name: str) -> None:
        if name == "import":
            say(f"live probes: importing sglang {target.version} on CPU")
        elif name == "kept":
            say(
                "live probes: kept from an earlier identical run (same tree, deployment, npudoctor, environment)"
            )
        else:
            say(f"live probe {name}: {titles.get(name, '')}")

    return step


def _selected_fixes(ids: list[str]) -> list:
    if not ids:
        return []
    from npudoctor.patching.fixbase import all_fixes

    return select(all_fixes(), ids, "fix", option="--with-fix")


def _fix_plan(fixes, target, results) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The runtime fixes the live probes run with (``--with-fix``), and why the others were not."""
    plan, refused = {}, {}
    for planned in decisions(fixes, target, results, allow_unsafe=True):
        decision = planned.decision
        if decision.action is Action.APPLY:
            plan[decision.fix_id] = decision.shape
        else:
            refused[decision.fix_id] = f"{decision.action.value}: {decision.reason}"
    return plan, refused


def _live_summary(outcome: LiveOutcome | None) -> dict | None:
    if outcome is None:
        return None
    if outcome.unavailable:
        prepare = {"prepare": outcome.prepare} if outcome.prepare else {}  # the command that makes it run
        return {"ran": False, "reason": outcome.unavailable, **prepare}
    return {
        "ran": True,
        "from_cache": outcome.from_cache,  # kept from an earlier identical run: the seconds are that run's
        "import_seconds": round(outcome.import_seconds, 2),
        "probe_seconds": {check_id: round(t, 2) for check_id, t in outcome.probe_seconds.items()},
        "import_rss_mb": round(outcome.import_rss_mb, 1),
        "peak_rss_mb": round(outcome.peak_rss_mb, 1),
        "stood_in": dict(
            sorted(outcome.stood_in.items())
        ),  # not installed here -> the check that imported it
        "not_run": dict(sorted(outcome.not_run.items())),  # check id -> why its live probe did not run
        "fixes": dict(sorted(outcome.fixes.items())),  # runtime fix id -> "applied" or why not (--with-fix)
    }


def select_checks(ids: list[str]) -> list[Check]:
    return select(all_checks(), ids, "check")
