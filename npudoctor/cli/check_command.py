"""``npudoctor check``: probe sglang against a deployment and report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npudoctor.cli import output
from npudoctor.cli.deployment_options import DeploymentOptions, takes_deployment
from npudoctor.cli.options import (
    DEPLOYMENT_HELP,
    EXIT_CODES_HELP,
    Depth,
    FailOnOption,
    IgnoreOption,
    NoRecordedFixesOption,
    OutputOption,
    PythonOption,
    QuietOption,
    ReportFormat,
    SelectOption,
    SglangPathOption,
    ids,
    use_python,
)
from npudoctor.errors import ExitCode

if TYPE_CHECKING:
    from npudoctor.formatters import Format
    from npudoctor.service.hints import UserOptions

EPILOG = DEPLOYMENT_HELP + "\n\n" + EXIT_CODES_HELP


@takes_deployment
def check(
    deployment: DeploymentOptions,
    sglang_path: SglangPathOption = None,
    python: PythonOption = None,
    depth: Annotated[
        Depth, typer.Option(help="static: read the source; live: run it; auto: live where possible.")
    ] = (Depth.auto),
    select: SelectOption = None,
    output_format: Annotated[
        ReportFormat | None, typer.Option("--format", "-f", help="Default: text.")
    ] = None,
    output_path: OutputOption = None,
    fail_on: FailOnOption = None,
    ignore: IgnoreOption = None,
    with_fix: Annotated[
        list[str] | None,
        typer.Option(
            "--with-fix",
            metavar="ID",
            help="Run the live probes with this runtime fix applied, as `npudoctor run --select ID` would "
            "(repeatable): shows whether the fix cures the deployment.",
        ),
    ] = None,
    no_recorded_fixes: NoRecordedFixesOption = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Text: every check's details, not only the findings'.")
    ] = False,
    quiet: QuietOption = False,
) -> None:
    """Probe sglang against a deployment and report the known defects it has."""
    from npudoctor.formatters import DEFAULT, named
    from npudoctor.service.progress import Progress
    from npudoctor.service.runner import run as run_checks

    use_python(python)
    chosen = named(output_format.value) if output_format else DEFAULT
    output.require_destination(
        output_path,
        step_summary=chosen.step_summary,
        inputs=[*deployment.inputs(), *_checked_tree(sglang_path)],
    )
    request = deployment.check_request(
        depth,
        select=select,
        fail_on=fail_on,
        ignore=ignore,
        sglang_path=sglang_path,
        with_fixes=ids(with_fix),
        recorded_fixes=not no_recorded_fixes,
    )
    report = run_checks(request, progress=Progress.for_stderr(quiet))
    _emit(report, chosen, output_path, verbose, request.user_options())
    raise typer.Exit(_exit_code(report))


def _exit_code(report) -> ExitCode:
    """0 no finding; 5 when the only findings are checks the live depth could not run (``--depth
    live`` without a live depth: one line on stderr says why); else 1."""
    unchecked, findings = report.unchecked(), report.findings()
    if findings and len(unchecked) == len(findings):
        reason = (report.live or {}).get("reason") or "the live probes did not run"
        ids = ", ".join(r.id for r in unchecked)
        output.say(f"could not check as asked: the live depth is unavailable ({ids}): {reason}")
        return ExitCode.LIVE_UNAVAILABLE
    return ExitCode.FINDINGS if findings else ExitCode.OK


def _checked_tree(sglang_path: Path | None) -> list[tuple[Path, str]]:
    """The sglang package directory this check reads, if it can be found now (else the check
    itself says why it cannot): a report written into it would change the code it judged."""
    from npudoctor.errors import NpudoctorError
    from npudoctor.target.discovery import discover

    try:
        return [(discover(sglang_path).package_dir, "the checked sglang tree")]
    except NpudoctorError:
        return []


def _emit(report, output_format: Format, output_path: Path | None, verbose: bool, user: UserOptions) -> None:
    module = output_format.module()
    if output_format.terminal and output_path is None:
        module.print_report(output.console(), report, user=user, verbose=verbose)
    else:
        output.write(module.render(report, user=user, verbose=verbose), output_path)
    if output_format.step_summary:
        output.step_summary(lambda path: module.write_step_summary(report, path))
