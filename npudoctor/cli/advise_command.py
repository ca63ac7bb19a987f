"""``npudoctor advise``: which sglang release to run for a deployment."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from npudoctor.cli import output
from npudoctor.cli.deployment_options import DeploymentOptions, takes_deployment
from npudoctor.cli.options import (
    DEPLOYMENT_HELP,
    Depth,
    FailOnOption,
    IgnoreOption,
    NoRecordedFixesOption,
    OutputOption,
    PythonOption,
    QuietOption,
    ReportFormat,
    SelectOption,
    use_python,
)

EPILOG = (
    "Releases: by default every release on the package index from the installed sglang to the "
    "newest; --releases 0.5.9..0.5.23 (or A.., A,B,C) a range of the index; --wheel-dir DIR the "
    "wheels in DIR, offline (with --releases: those of them in the range); --sglang-path (repeatable) "
    "trees of your own, checked first. Wheels are fetched once with `pip download --no-deps` into "
    "$NPUDOCTOR_SGLANG_CACHE (default ~/.cache/npudoctor/sglang, a folder only you can write) and "
    "unpacked there, each tree proven to be its wheel's on every run; a release that cannot be had "
    "(or whose wheel is not that release, or cannot be unpacked safely) is a row saying why.\n\n"
    + DEPLOYMENT_HELP
    + "\n\n"
    "Exit codes: 0 the baseline (the installed release, else the first checked) has no finding at or "
    "above --fail-on; 1 it has; 2 usage or input error; 3 internal error; 4 the baseline could not be "
    "checked (or no sglang to start from); 130 interrupted (Ctrl-C), 143 by SIGTERM, 129 by SIGHUP."
)


@takes_deployment
def advise(
    deployment: DeploymentOptions,
    releases: Annotated[
        str | None,
        typer.Option("--releases", "-r", metavar="A..B", help="Releases to check: A..B, A.., A,B,C or A."),
    ] = None,
    wheel_dir: Annotated[
        Path | None,
        typer.Option(
            "--wheel-dir", metavar="DIR", help="Check the sglang wheels in this directory (offline)."
        ),
    ] = None,
    sglang_path: Annotated[
        list[Path] | None,
        typer.Option(
            "--sglang-path",
            metavar="DIR",
            help="Also check this unpacked wheel or source tree, first (repeatable).",
        ),
    ] = None,
    depth: Annotated[
        Depth, typer.Option(help="static (default): read each release's source; auto/live: also run it.")
    ] = Depth.static,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=0,
            metavar="N",
            help="Releases checked at once (default 0: one per core).",
        ),
    ] = 0,
    select: SelectOption = None,
    output_format: Annotated[ReportFormat, typer.Option("--format", "-f")] = ReportFormat.text,
    output_path: OutputOption = None,
    fail_on: FailOnOption = None,
    ignore: IgnoreOption = None,
    no_recorded_fixes: NoRecordedFixesOption = False,
    python: PythonOption = None,
    quiet: QuietOption = False,
) -> None:
    """Which sglang release to run for this deployment: check a range of releases and recommend."""
    from npudoctor.formatters import advice as advice_format
    from npudoctor.formatters import named
    from npudoctor.service.advise import AdviseRequest, exit_status
    from npudoctor.service.advise import advise as check_releases

    use_python(python)
    chosen = named(output_format.value)
    output.require_destination(output_path, step_summary=chosen.step_summary, inputs=deployment.inputs())
    request = AdviseRequest(
        check=deployment.check_request(
            depth, select=select, fail_on=fail_on, ignore=ignore, recorded_fixes=not no_recorded_fixes
        ),
        releases=releases,
        wheel_dir=wheel_dir,
        sglang_paths=list(sglang_path or []),
        jobs=jobs,
    )
    say = (lambda _line: None) if quiet else output.say
    started = time.perf_counter()
    result = check_releases(request, on_row=lambda i, n, row: say(advice_format.row_line(i, n, row)))
    say(f"checked {len(result.rows)} release(s) in {time.perf_counter() - started:.1f} s")
    module = chosen.module()
    if chosen.terminal and output_path is None:
        module.print_advice(output.console(), result)
    else:
        output.write(module.render_advice(result), output_path)
    if chosen.step_summary:
        output.step_summary(lambda path: module.write_advice_step_summary(result, path))
    raise typer.Exit(exit_status(result))
