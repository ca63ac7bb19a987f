"""One ``npudoctor check`` run: target + deployment + selected checks -> ``Report``.

The CLI only gathers options into a ``CheckRequest``; everything that decides a
verdict or an exit code lives here, so tests and embedders get the same behaviour.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor import __version__, deployment, ignores
from npudoctor.check import Check, LiveOutcome, all_checks, collector_paused
from npudoctor.errors import InputError
from npudoctor.evaluate import evaluate, reuse
from npudoctor.launch import sglang_parser
from npudoctor.redact import redact_result, redact_value
from npudoctor.registry import select
from npudoctor.results import Report, Status
from npudoctor.serverargs import validate_arguments
from npudoctor.target import discover

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


@dataclass
class CheckRequest:
    config: Path | None = None
    launch_command: list[str] = field(default_factory=list)
    model_path: Path | None = None
    server_flags: dict = field(default_factory=dict)
    env_flags: list[str] = field(default_factory=list)
    sglang_path: Path | None = None
    depth: str = "auto"
    select: list[str] = field(default_factory=list)
    fail_on: str = "fail"
    ignore: list[str] = field(default_factory=list)
    today: dt.date = field(default_factory=dt.date.today)
    with_fixes: list[str] = field(default_factory=list)  # run the live probes with these runtime fixes


def run(request: CheckRequest, progress: Console | None = None) -> Report:
    """Run the requested checks; raises ``InputError``/``NoTargetError`` for the CLI to map."""
    checks = select_checks(request.select)
    deploy = load_deployment(request)
    entries = deploy.ignores + [ignores.parse_cli(spec) for spec in request.ignore]
    ignores.validate(entries, {c.id for c in all_checks()})
    if request.with_fixes and request.depth == "static":
        raise InputError("--with-fix runs the live probes with runtime fixes: it needs --depth live or auto")
    fixes = _selected_fixes(request.with_fixes)
    target = discover(request.sglang_path)
    validate_arguments(deploy.facts, target)  # a name no sglang knows: exit 2 before any probe runs
    facts = deploy.facts

    bar = _progress_bar(progress) if progress is not None else None
    # the collector stays paused until the source is released: resumed with the ASTs still alive,
    # its next full pass would traverse them all (measured: 1.8 s over 16 releases in `advise`)
    with collector_paused(), bar or contextlib.nullcontext():
        task = bar.add_task("checking", total=len(checks)) if bar else None
        titles = {c.id: c.title for c in all_checks()}

        def live_step(step: str) -> None:
            if bar is not None:
                text = (
                    f"live probes: importing sglang {target.version} on CPU ..."
                    if step == "import"
                    else f"live probe {step}: {titles.get(step, '')} ..."
                )
                bar.update(task, description=text)

        def advance(check: Check, _result) -> None:
            if bar is not None:
                bar.update(task, advance=1, description=f"{check.id} done")

        try:
            if fixes:
                # the fixes are decided from the verdicts on the installed code, as `npudoctor fix`
                # decides them; then the live probes run again with the accepted ones in place
                probed = checks + [f.check for f in fixes if f.check not in checks]
                plain = evaluate(probed, target, facts, request.depth, on_step=live_step)
                plan, refused = _fix_plan(fixes, target, plain.results)
                if plan:
                    evaluation = evaluate(checks, target, facts, request.depth, fixes=plan, declined=refused,
                                          on_step=live_step, on_done=advance)  # fmt: skip
                else:  # nothing to run with: the plain live run's probes are the answer
                    evaluation = reuse(plain, checks, target, facts, request.depth, declined=refused)
            else:
                evaluation = evaluate(
                    checks, target, facts, request.depth, on_step=live_step, on_done=advance
                )
        finally:
            target.release()  # the run is done with the source: reference counting frees the ASTs now

    results = ignores.apply(evaluation.results, entries, request.today)
    live_summary = _live_summary(evaluation.live)
    if live_summary is not None and "reason" in live_summary:
        live_summary["reason"] = redact_value(live_summary["reason"])
    return Report(
        target=target.info(),
        deployment=facts.to_dict(),
        results=tuple(redact_result(r) for r in results),
        fail_on=Status(request.fail_on),
        tool_version=__version__,
        live=live_summary,
        depth=request.depth,
    )


def _progress_bar(console: Console) -> Progress:
    """The spinner of a run on a terminal; rich's progress is imported only then (a CI run with
    ``--format json`` shows none and does not pay for it)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True)


def _selected_fixes(ids: list[str]) -> list:
    if not ids:
        return []
    from npudoctor.fix import all_fixes

    return select(all_fixes(), ids, "fix", option="--with-fix")


def _fix_plan(fixes, target, results) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The runtime fixes the live probes run with (``--with-fix``), and why the others were not."""
    from npudoctor.fixing import Action, decisions

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
        return {"ran": False, "reason": outcome.unavailable}
    return {
        "ran": True,
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


def load_deployment_from(config: Path | None) -> deployment.Deployment:
    """The deployment of a YAML file, or none (every check assumes its worst case)."""
    return deployment.from_yaml(config) if config is not None else deployment.no_deployment()


def load_deployment(request: CheckRequest) -> deployment.Deployment:
    given = [
        name
        for name, present in (
            ("--config", request.config is not None),
            ("a launch command", bool(request.launch_command)),
            ("--model-path", request.model_path is not None),
        )
        if present
    ]
    if len(given) > 1:
        raise InputError(f"give one deployment description, not {' and '.join(given)}")
    if (request.server_flags or request.env_flags) and request.model_path is None:
        raise InputError("--disaggregation-mode/--pp-size/--tp-size/--page-size/--env go with --model-path")
    if request.config is not None:
        return deployment.from_yaml(request.config)
    if request.launch_command:
        # sglang's own parser knows every flag of the installed release; it needs an import,
        # so only when the run may import sglang at all and the target is the installed one.
        may_import = request.depth != "static" and request.sglang_path is None
        return deployment.from_command(request.launch_command, sglang_parser() if may_import else None)
    if request.model_path is not None:
        return deployment.from_flags(request.model_path, request.server_flags, _env_pairs(request.env_flags))
    return deployment.no_deployment()


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InputError(f"--env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env
