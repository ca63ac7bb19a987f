"""The ``npudoctor`` command line.

Reports go to stdout (or ``--output``); logs, progress and error lines go to stderr,
so ``npudoctor check --format json | jq`` always sees clean JSON.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import inspect
import io
import os
import shlex
import sys
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

import npudoctor  # its __version__ is looked up on use: --help, list and explain never need it
from npudoctor.engine.errors import ExitCode, InputError, NoTargetError, NpudoctorError

EXIT_CODES_HELP = """
Exit codes (stable, never renumbered):
0 no finding at or above --fail-on;
1 findings;
2 usage or input error (bad YAML, missing config.json, unknown flag or check id);
3 internal error;
4 nothing to check (no sglang found).
"""

app = typer.Typer(
    name="npudoctor",
    help=(
        "Pre-flight doctor and hot-fix kit for sglang deployments on Ascend NPUs: tells which "
        "known defects the installed sglang has for your deployment, before launch and in CI.\n\n"
        + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
err = Console(stderr=True, highlight=False)


class Depth(str, Enum):
    static = "static"
    live = "live"
    auto = "auto"


class Format(str, Enum):
    text = "text"
    json = "json"
    junit = "junit"
    sarif = "sarif"
    github = "github"
    markdown = "markdown"


class DataFormat(str, Enum):
    text = "text"
    json = "json"


class FailOn(str, Enum):
    fail = "fail"
    warn = "warn"


# Options `fix` and `run` share.
FixSelection = Annotated[
    list[str] | None,
    typer.Option("--select", "-s", metavar="ID", help="Only these fix ids (repeatable, or ID,ID)."),
]
AllowUnsafe = Annotated[
    bool, typer.Option("--unsafe", help="Also apply fixes that change running behaviour.")
]
PlanDepth = Annotated[
    Depth,
    typer.Option(
        help="The depth the checks decide at, as in `npudoctor check`: auto runs the live probes where "
        "the target imports, so a defect only sglang's own code shows is fixed too."
    ),
]


class Role(str, Enum):
    null = "null"
    prefill = "prefill"
    decode = "decode"


# The deployment options every command that needs a deployment takes (check, fix, run, advise).
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", metavar="FILE", help="Deployment YAML (model, env, roles, ignore)."),
]
ModelPathOption = Annotated[
    Path | None,
    typer.Option("--model-path", metavar="DIR", help="Local model directory (its config.json is read)."),
]
RoleOption = Annotated[
    Role | None, typer.Option("--disaggregation-mode", help="With --model-path: the server's PD role.")
]
PpSizeOption = Annotated[int | None, typer.Option("--pp-size", min=1, metavar="N", help="With --model-path.")]
TpSizeOption = Annotated[int | None, typer.Option("--tp-size", min=1, metavar="N", help="With --model-path.")]
PageSizeOption = Annotated[
    int | None, typer.Option("--page-size", min=1, metavar="N", help="With --model-path.")
]
EnvOption = Annotated[
    list[str] | None,
    typer.Option(
        "--env", "-e", metavar="NAME=VALUE", help="With --model-path: an environment variable (repeatable)."
    ),
]
IsolatedOption = Annotated[
    bool,
    typer.Option(
        "--isolated",
        help="Do not read the shell's environment: the deployment's variables are only those it sets.",
    ),
]
SglangPathOption = Annotated[
    Path | None,
    typer.Option(
        "--sglang-path",
        metavar="DIR",
        help="This unpacked wheel or source tree instead of the installed sglang.",
    ),
]
SelectOption = Annotated[
    list[str] | None,
    typer.Option("--select", "-s", metavar="ID", help="Run only these check ids (repeatable, or ID,ID)."),
]
OutputOption = Annotated[
    Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write the report here, not stdout.")
]
FailOnOption = Annotated[FailOn, typer.Option(help="Lowest status that counts as a finding.")]
IgnoreOption = Annotated[
    list[str] | None,
    typer.Option(
        "--ignore",
        metavar="ID[:DATE]",
        help="Accept this check's finding (until DATE, YYYY-MM-DD; repeatable).",
    ),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines on stderr.")]

DEPLOYMENT_HELP = (
    "Deployment, one of: --config deploy.yaml; the launch command after '--' "
    "(npudoctor check -- python -m sglang.launch_server --model-path M --pp-size 2 ...); --model-path DIR "
    "with --disaggregation-mode, --pp-size, --tp-size, --page-size and --env. In every form the shell's "
    "ASCEND_*, SGLANG_*, HCCL_*, PYTORCH_NPU_* and TASK_QUEUE_* variables are read, and what the "
    "deployment sets wins (--isolated reads none). With no deployment, every check assumes the "
    "conditions under which its defect bites and says so."
)


def _ids(values: list[str] | None) -> list[str]:
    """Repeatable id options, each also taking a comma-separated list."""
    return [s for item in (values or []) for s in item.split(",") if s]


# The deployment options, in the order --help lists them: (parameter, its typer annotation, default).
_DEPLOYMENT_OPTIONS = (
    ("config", ConfigOption, None),
    ("model_path", ModelPathOption, None),
    ("role", RoleOption, None),
    ("pp_size", PpSizeOption, None),
    ("tp_size", TpSizeOption, None),
    ("page_size", PageSizeOption, None),
    ("env", EnvOption, None),
    ("isolated", IsolatedOption, False),
)


def takes_deployment(command: Callable) -> Callable:
    """Give ``command`` (check, fix, run, advise) the deployment options, right after its context.

    typer has no option groups: it reads a command's options from its signature, so the options are
    added to the signature here, and the command receives their values as one mapping, its
    ``deployment`` parameter, for ``_check_request``."""
    signature = inspect.signature(command, eval_str=True)
    context, *own = (p for p in signature.parameters.values() if p.name != "deployment")
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    added = [
        inspect.Parameter(name, kind, default=default, annotation=option)
        for name, option, default in _DEPLOYMENT_OPTIONS
    ]

    @functools.wraps(command)
    def with_deployment(*args, **kwargs):
        deployment = {name: kwargs.pop(name) for name, _, _ in _DEPLOYMENT_OPTIONS}
        return command(*args, deployment=deployment, **kwargs)

    with_deployment.__signature__ = signature.replace(parameters=[context, *added, *own])
    with_deployment.__annotations__ = {
        p.name: p.annotation for p in with_deployment.__signature__.parameters.values()
    }
    return with_deployment


def _check_request(ctx, deployment: dict, depth: Depth, select=None, fail_on=FailOn.fail, ignore=None):
    """The ``CheckRequest`` of the deployment options (``takes_deployment``), a launch command after
    ``--`` included."""
    from npudoctor.engine.runner import CheckRequest

    if ctx.args and ctx.args[0].startswith("-"):
        raise InputError(f"unknown option {ctx.args[0]!r} (a launch command goes after '--')")
    role = deployment["role"]
    flags = {
        key: value
        for key, value in (
            ("disaggregation_mode", role.value if role else None),
            ("pp_size", deployment["pp_size"]),
            ("tp_size", deployment["tp_size"]),
            ("page_size", deployment["page_size"]),
        )
        if value is not None
    }
    return CheckRequest(
        config=deployment["config"],
        launch_command=list(ctx.args),
        model_path=deployment["model_path"],
        server_flags=flags,
        env_flags=list(deployment["env"] or []),
        depth=depth.value,
        select=_ids(select),
        fail_on=fail_on.value,
        ignore=list(ignore or []),
        today=dt.date.today(),
        isolated=deployment["isolated"],
    )


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
    epilog=DEPLOYMENT_HELP + "\n\n" + EXIT_CODES_HELP,
)
@takes_deployment
def check(
    ctx: typer.Context,
    deployment: dict,
    sglang_path: SglangPathOption = None,
    depth: Annotated[
        Depth, typer.Option(help="static: read the source; live: run it; auto: live where possible.")
    ] = (Depth.auto),
    select: SelectOption = None,
    output_format: Annotated[Format | None, typer.Option("--format", "-f", help="Default: text.")] = None,
    output: OutputOption = None,
    fail_on: FailOnOption = FailOn.fail,
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
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Text: every check's details, not only the findings'.")
    ] = False,
    quiet: QuietOption = False,
) -> None:
    """Probe sglang against a deployment and report the known defects it has."""
    from npudoctor.engine.progress import Progress
    from npudoctor.engine.runner import run

    _require_destination(output, github=output_format is Format.github)
    request = _check_request(ctx, deployment, depth, select=select, fail_on=fail_on, ignore=ignore)
    request.sglang_path = sglang_path
    request.with_fixes = _ids(with_fix)
    report = run(request, progress=Progress.for_stderr(quiet))
    _emit(report, output_format.value if output_format else "text", output, verbose, request.repeated_args())
    raise typer.Exit(ExitCode.FINDINGS if report.findings() else ExitCode.OK)


def _emit(report, format_name: str, output: Path | None, verbose: bool, fix_args: list[str]) -> None:
    from npudoctor.formatters import renderer

    if format_name == "text":
        from npudoctor.formatters import text

        if output is None:
            text.print_report(_console(), report, verbose=verbose, fix_args=fix_args)
        else:
            _write(text.render(report, verbose=verbose, fix_args=fix_args), output)
    else:
        _write(renderer(format_name)(report), output)
    if format_name == "github":
        from npudoctor.formatters.github import write_step_summary

        _step_summary(lambda path: write_step_summary(report, path))


class ReaderGone(Exception):
    """The reader of stdout went away (a closed pipe). Not an ``OSError``: click answers an EPIPE
    ``OSError`` with ``sys.exit(1)`` itself, and rich with ``SystemExit(1)``; ``main`` ends on this."""


class _Stdout(Console):
    """stdout as rich prints on it; a reader that went away is ``ReaderGone``."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise ReaderGone


def _console() -> Console:
    """The console reports are printed on (stdout; its width from the terminal, or $COLUMNS, else 80)."""
    _require_stdout()
    return _Stdout(highlight=False)


def _require_destination(output: Path | None, github: bool = False) -> None:
    """Before any work: the report (and a GitHub step summary) can be written where it goes, so a
    bad ``-o`` is said at once, not after a live run whose results it would lose."""
    if output is None:
        _require_stdout()
    else:
        _require_writable(output, "--output")
    summary = os.environ.get("GITHUB_STEP_SUMMARY") if github else None
    if summary:
        _require_writable(Path(summary), "GITHUB_STEP_SUMMARY=")


def _require_stdout() -> None:
    try:
        usable = (
            sys.stdout is not None and not sys.stdout.closed and os.fstat(sys.stdout.fileno()) is not None
        )
    except (OSError, ValueError, io.UnsupportedOperation):
        usable = sys.stdout is not None and not sys.stdout.closed  # a stream without a descriptor (tests)
    if not usable:
        raise InputError("standard output is closed: write the report with --output FILE")


def _require_writable(path: Path, option: str) -> None:
    """``path`` can be written: opened for appending (which changes no byte of a file that exists;
    one created for the test is removed again), so a read-only file system or a denied directory is
    found as the real write would find it."""
    shown = f"{option}{path}" if option.endswith("=") else f"{option} {path}"
    if path.is_dir():
        raise InputError(f"{shown}: is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise InputError(
            f"{shown}: {'not a directory' if parent.exists() else 'no such directory'}: {parent}"
        )
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise InputError(f"{shown}: cannot write ({error.strerror})") from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()


def _step_summary(write: Callable[[str], None]) -> None:
    """``write($GITHUB_STEP_SUMMARY)`` when the variable is set (a GitHub Actions step)."""
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary_path:
        return
    try:
        write(summary_path)
    except OSError as error:
        raise InputError(f"GITHUB_STEP_SUMMARY={summary_path}: cannot write ({error.strerror})") from None


class AdviseFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    junit = "junit"
    sarif = "sarif"
    github = "github"


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
    epilog=(
        "Releases: by default every release on the package index from the installed sglang to the "
        "newest; --releases 0.5.9..0.5.23 (or A.., A,B,C) a range of the index; --wheel-dir DIR the "
        "wheels in DIR, offline (with --releases: those of them in the range); --sglang-path (repeatable) "
        "trees of your own, checked first. Wheels are fetched once with `pip download --no-deps` into "
        "$NPUDOCTOR_SGLANG_CACHE (default ~/.cache/npudoctor/sglang); a release that cannot be had is a "
        "row saying why.\n\n" + DEPLOYMENT_HELP + "\n\n"
        "Exit codes: 0 the baseline (the installed release, else the first checked) has no finding at or "
        "above --fail-on; 1 it has; 2 usage or input error; 3 internal error; 4 the baseline could not be "
        "checked (or no sglang to start from)."
    ),
)
@takes_deployment
def advise(
    ctx: typer.Context,
    deployment: dict,
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
    output_format: Annotated[AdviseFormat, typer.Option("--format", "-f")] = AdviseFormat.text,
    output: OutputOption = None,
    fail_on: FailOnOption = FailOn.fail,
    ignore: IgnoreOption = None,
    quiet: QuietOption = False,
) -> None:
    """Which sglang release to run for this deployment: check a range of releases and recommend."""
    from npudoctor.engine.advise import AdviseRequest, exit_status
    from npudoctor.engine.advise import advise as run_advise
    from npudoctor.formatters import advice as advice_format

    _require_destination(output, github=output_format is AdviseFormat.github)
    request = AdviseRequest(
        check=_check_request(ctx, deployment, depth, select=select, fail_on=fail_on, ignore=ignore),
        releases=releases,
        wheel_dir=wheel_dir,
        sglang_paths=list(sglang_path or []),
        jobs=jobs,
    )
    say = (lambda _line: None) if quiet else _say
    started = time.perf_counter()
    result = run_advise(request, on_row=lambda i, n, row: say(advice_format.row_line(i, n, row)))
    say(f"checked {len(result.rows)} release(s) in {time.perf_counter() - started:.1f} s")
    fmt = output_format.value
    if fmt == "text" and output is None:
        advice_format.print_text(result, _console())
    else:
        _write(advice_format.render(result, fmt, npudoctor.__version__), output)
    if fmt == "github":
        _step_summary(lambda path: advice_format.write_step_summary(result, path))
    raise typer.Exit(exit_status(result))


def _write(text: str, output: Path | None = None) -> None:
    """The report on stdout (or in ``output``): every plain write of the CLI goes through here."""
    if output is None:
        _require_stdout()
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            raise ReaderGone from None
        return
    try:
        output.write_text(text, encoding="utf-8", errors="backslashreplace")
    except OSError as error:
        raise InputError(f"--output {output}: cannot write ({error.strerror})") from None


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
    epilog=(
        "Without --apply, --revert or --status: print the plan (what would be patched, where, "
        "why) and change nothing. Fixes are applied only where their check fails for the "
        "deployment and the code is a shape the fix was written for. --apply records them beside "
        "the sglang they fix (the directory it is imported from; --site or $NPUDOCTOR_SITE to choose), "
        "where sglang 0.5.11+ loads them in every scheduler process; --status and --revert look there. "
        "Kill switch for every process: NPUDOCTOR_DISABLE_FIXES=1.\n\n"
        + DEPLOYMENT_HELP
        + "\n\nExit codes: 0 done (plan shown, fixes recorded or reverted, the record fits); 1 --status: "
        "the record no longer fits this sglang or deployment (the next command is printed); 2 usage or "
        "input error (unknown fix id, unwritable --site, damaged record); 3 internal error; 4 no sglang "
        "found, or it has no Ascend NPU backend."
    ),
)
@takes_deployment
def fix(
    ctx: typer.Context,
    deployment: dict,
    apply: Annotated[
        bool, typer.Option("--apply", help="Record the fixes so every sglang process applies them at start.")
    ] = False,
    revert: Annotated[bool, typer.Option("--revert", help="Remove everything --apply created.")] = False,
    status: Annotated[
        bool, typer.Option("--status", help="Show what is recorded and whether it still fits.")
    ] = False,
    select: FixSelection = None,
    unsafe: AllowUnsafe = False,
    sglang_path: SglangPathOption = None,
    site: Annotated[
        Path | None,
        typer.Option(
            "--site",
            metavar="DIR",
            help="Directory on sglang's sys.path for the record (default: $NPUDOCTOR_SITE, else the "
            "directory sglang is imported from).",
        ),
    ] = None,
    output_format: Annotated[DataFormat, typer.Option("--format", "-f")] = DataFormat.text,
    depth: PlanDepth = Depth.auto,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Text: every fix's reason.")] = False,
    quiet: QuietOption = False,
) -> None:
    """Plan, apply, revert or inspect the runtime fixes for the installed sglang."""
    from npudoctor.patching import records
    from npudoctor.engine.runner import load_deployment
    from npudoctor.target.discovery import discover, require_ascend_backend

    if sum((apply, revert, status)) > 1:
        raise InputError("give at most one of --apply, --revert, --status")
    _require_stdout()
    as_json = output_format is DataFormat.json
    request = _check_request(ctx, deployment, depth, select=select)
    request.sglang_path = sglang_path
    if revert:
        _fix_revert(site, sglang_path, as_json)
        return
    target = discover(sglang_path)
    require_ascend_backend(target)
    deploy = load_deployment(request)
    if apply:
        records.require_writable(site, target)  # before the plan's live run
    recorded = records.read(site, target) if status else None
    if status and recorded is None:  # nothing to compare: no plan to make
        where = records.site_dir(site, target)
        _fix_output(as_json, {"recorded": None, "fits": True}, f"no fix is recorded in {where}")
        return
    planned = _plan(request, target, deploy.facts, unsafe, quiet)
    site_args = ["--site", str(site)] if site is not None else []
    if status:
        _fix_status(target, site, as_json, recorded, planned, request.repeated_args() + site_args)
    elif apply:
        undo = (["--sglang-path", str(sglang_path)] if sglang_path is not None else []) + site_args
        _fix_apply(target, planned, site, as_json, request.repeated_args() + site_args, undo)
    else:
        _fix_show_plan(
            planned, as_json, verbose, request.repeated_args() + _select_args(request.select, unsafe)
        )


def _select_args(ids: list[str], unsafe: bool) -> list[str]:
    """The ``--select``/``--unsafe`` options of a hint that repeats the user's command."""
    return (["--select", ",".join(ids)] if ids else []) + (["--unsafe"] if unsafe else [])


def _plan(request, target, facts, unsafe: bool, quiet: bool):
    """``fixing.plan`` of the request's fixes (all of them without --select), with progress."""
    from npudoctor.patching import planning
    from npudoctor.engine.progress import Progress
    from npudoctor.engine.runner import live_steps
    from npudoctor.deployment.serverargs import validate_arguments

    validate_arguments(facts, target)  # a name no sglang knows: exit 2 before planning
    fixes = planning.select_fixes(request.select)
    with Progress.for_stderr(quiet) as progress:
        progress.step(
            f"planning fixes for sglang {target.version} ({len(fixes)} fix(es), depth {request.depth})"
        )
        return planning.plan(
            fixes, target, facts, unsafe, request.depth, on_step=live_steps(progress.step, target)
        )


def _fix_revert(site: Path | None, sglang_path: Path | None, as_json: bool) -> None:
    """``fix --revert``: remove the record --apply wrote (beside the sglang named, or installed)."""
    from npudoctor.patching import records
    from npudoctor.target.discovery import discover

    target = None
    if site is None and sglang_path is None:
        with contextlib.suppress(NoTargetError):  # no sglang installed: this interpreter's site-packages
            target = discover()
    elif site is None:
        target = discover(sglang_path)
    removed = records.remove(site, target)
    _fix_output(as_json, {"reverted": str(removed) if removed else None},
                f"removed {removed}" if removed else "nothing to revert: no fix is recorded in "
                f"{registration.site_dir(site, target)}")  # fmt: skip


def _fix_status(
    target, site: Path | None, as_json: bool, document: dict, planned, fix_args: list[str]
) -> None:
    """``fix --status``: what ``document`` records, whether it still fits the installed sglang,
    whether the deployment still needs it and needs nothing more (the decisions ``fix`` makes now);
    exit 1 with the next command when the record no longer fits."""
    from npudoctor.patching import planning
    from npudoctor.patching import records

    where = records.site_dir(site, target)
    rows = planning.status(document, target, planned)
    fits = all(row.fits for row in rows)
    needed = [p.fix.id for p in planned if p.decision.action is planning.Action.APPLY]
    command = "npudoctor fix " + shlex.join(
        ["--apply", "--select", ",".join(needed), *fix_args] if needed else ["--revert", *fix_args]
    )
    if as_json:
        data = {"recorded": document, "status": [r.__dict__ for r in rows], "fits": fits}
        _fix_output(True, data if fits else {**data, "next": command}, "")
    else:
        console = _console()
        console.print(f"recorded in {escape(str(where / registration.DIST_INFO))}", soft_wrap=True)
        recorded_for = document.get("sglang", {}).get("version")
        if recorded_for != target.version:
            console.print(
                f"recorded for sglang {escape(str(recorded_for))}; this is sglang {escape(str(target.version))}"
            )
        _plugin_note(console, target)
        for row in rows:
            console.print(f"  {row.fix_id}  [bold]{row.state}[/]  {escape(row.detail)}")
        if fits:
            console.print("the record fits this sglang and deployment")
        else:
            console.print("the record no longer fits; next:")
            console.print(f"  {escape(command)}", soft_wrap=True)
    if not fits:
        raise typer.Exit(ExitCode.FINDINGS)


def _fix_show_plan(planned, as_json: bool, verbose: bool = False, fix_args: list[str] | None = None) -> None:
    """``fix``: the plan, nothing changed; ``fix_args`` (the user's options) repeated in the hint."""
    if as_json:
        _fix_output(True, {"plan": _plan_json(planned)}, "")
        return
    from npudoctor.formatters import fixplan

    fixplan.print_plan(console := _console(), planned, verbose)
    fixplan.print_apply_hint(console, planned, fix_args)


def _fix_apply(target, planned, site: Path | None, as_json: bool, status_args: list[str],
               undo_args: list[str]) -> None:  # fmt: skip
    """``fix --apply``: record the fixes the plan accepts where sglang's processes find them; the
    commands that check and undo it repeat the user's options."""
    from npudoctor.patching import planning
    from npudoctor.patching import records

    document = planning.record_document(planned, target)
    if not document["fixes"]:
        _fix_output(as_json, {"applied": [], "plan": _plan_json(planned)},
                    "nothing to apply: " + "; ".join(f"{p.fix.id} {p.decision.action.value}" for p in planned))  # fmt: skip
        return
    path = records.write(document, site, target)
    if as_json:
        _fix_output(
            True, {"applied": sorted(document["fixes"]), "record": str(path), "plan": _plan_json(planned)}, ""
        )
        return
    console = _console()
    _print_plan(console, planned)
    console.print(f"recorded {', '.join(sorted(document['fixes']))} in {escape(str(path))}", soft_wrap=True)
    _plugin_note(console, target)
    console.print(
        f"check it: {escape(shlex.join(['npudoctor', 'fix', '--status', *status_args]))}", soft_wrap=True
    )
    console.print(
        f"undo it:  {escape(shlex.join(['npudoctor', 'fix', '--revert', *undo_args]))}", soft_wrap=True
    )


def _plan_json(planned) -> list[dict]:
    return [
        {
            "id": p.fix.id,
            "action": p.decision.action.value,
            "reason": p.decision.reason,
            "safety": p.fix.safety.value,
            "upstream": p.fix.upstream,
            "own": p.fix.own or None,
            "replaces": list(p.decision.installs or p.fix.replaces),
            "release": p.decision.release,
        }
        for p in planned
    ]


def _print_plan(console: Console, planned, verbose: bool = False) -> None:
    from npudoctor.formatters import fixplan

    fixplan.print_plan(console, planned, verbose)


def _plugin_note(console: Console, target) -> None:
    from npudoctor.patching import planning

    if planning.loads_plugins(target):
        console.print(
            f"sglang {target.version} loads the plugin 'npudoctor' (group sglang.srt.plugins) in every "
            "scheduler process; SGLANG_PLUGINS, if set, must name it"
        )
    else:
        console.print(
            f"[bold]note[/]: sglang {target.version} loads no plugins (the sglang.srt.plugins group "
            "arrived in 0.5.11): start the server with `npudoctor run -- python -m sglang.launch_server ...`"
        )


def _fix_output(as_json: bool, data: dict, text: str) -> None:
    import json

    if as_json:
        _write(json.dumps(data, indent=2) + "\n")
    else:
        _console().print(escape(text))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog=(
        "Every Python process the command starts, sglang's spawned schedulers included, applies "
        "the fixes when sglang's modules are imported (a sitecustomize on PYTHONPATH); works for "
        "every sglang release. Before it starts, one line on stderr says which fixes apply "
        "(--verbose: every fix's decision; --quiet: nothing unless a fix applies). The deployment is "
        "the launch command's, unless --config or --model-path describes it; the shell's ASCEND_*, "
        "SGLANG_*, HCCL_*, PYTORCH_NPU_* and TASK_QUEUE_* variables are read (what the deployment sets "
        "wins; --isolated reads none). A command that is not an sglang launch npudoctor can read gets the "
        "fixes for the worst case. Exit code: the command's; 126/127 when it cannot run or is not found; "
        "2 for bad npudoctor options. Kill switch: NPUDOCTOR_DISABLE_FIXES=1."
    ),
)
@takes_deployment
def run(
    ctx: typer.Context,
    deployment: dict,
    select: FixSelection = None,
    unsafe: AllowUnsafe = False,
    depth: PlanDepth = Depth.auto,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Every fix's decision, on stderr.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress; say nothing when no fix applies.")
    ] = False,
) -> None:
    """Run a command (an sglang server) with the runtime fixes its sglang needs: npudoctor run -- CMD..."""
    from npudoctor.patching import planning
    from npudoctor.engine.runner import load_deployment
    from npudoctor.target.discovery import discover

    command = list(ctx.args)
    if command and command[0].startswith("-"):
        raise InputError(f"unknown option {command[0]!r} (the command goes after '--')")
    if not command:
        raise InputError(
            "run: give the command after '--' (npudoctor run -- python -m sglang.launch_server ...)"
        )
    planning.resolve_command(command[0])  # 127/126 before any planning
    request = _check_request(ctx, deployment, depth, select=select)
    if request.config is not None or request.model_path is not None:
        request.launch_command = []  # the deployment is described; the command is only run
    try:
        deploy = load_deployment(request)
    except InputError:
        if not request.launch_command:
            raise
        request.launch_command = []  # not an sglang launch npudoctor can read: assume the worst
        deploy = load_deployment(request)
    target = discover()
    if target.has_ascend_backend:
        planned = _plan(request, target, deploy.facts, unsafe, quiet)
    else:
        planned = []
        if not quiet:
            _say(f"sglang {target.version} has no Ascend NPU backend: no runtime fix applies")
    document = planning.record_document(planned, target)
    if verbose:
        for p in planned:
            _say(f"{p.fix.id}: {p.decision.action.value}: {p.decision.reason}")
    applied = sorted(document["fixes"])
    if applied:
        _say(f"applying {', '.join(applied)} to sglang {target.version} in every process of the command")
    elif planned and not quiet:
        _say(f"no runtime fix applies to sglang {target.version} for this deployment")
    raise typer.Exit(planning.run_command(command, document))


@app.command("list")
def list_checks() -> None:
    """List every check: id, title, upstream references."""
    from npudoctor.engine.check import all_checks
    from npudoctor.formatters import listing

    listing.print_list(_console(), all_checks())


@app.command()
def explain(
    check_id: Annotated[str, typer.Argument(metavar="ID", help="A check id, e.g. NPD001.")],
    full: Annotated[bool, typer.Option("--full", help="Also what the check tests, and how.")] = False,
) -> None:
    """Why a check matters, when its defect bites, and how to fix it."""
    from npudoctor.engine.check import all_checks
    from npudoctor.formatters import listing

    checks = {c.id: c for c in all_checks()}
    item = checks.get(check_id.strip().upper())
    if item is None:
        raise InputError(f"unknown check id {check_id!r} (known: {', '.join(checks)})")
    listing.print_explain(_console(), item, full)


@app.command("env")
def env_command(
    output_format: Annotated[DataFormat, typer.Option("--format", "-f")] = DataFormat.text,
) -> None:
    """Inventory of this host: Python, torch, torch_npu, CANN, npu-smi, sglang, relevant env vars (secrets redacted)."""
    import json

    from npudoctor.target.hostinfo import inventory

    _require_stdout()
    data = inventory()
    if output_format is DataFormat.json:
        _write(json.dumps(data, indent=2) + "\n")
        return
    console = _console()
    width = max(len(key) for key in data)
    for key, value in data.items():
        if key != "environment":  # one line each, never folded: a long interpreter path stays whole
            console.print(f"[bold]{key:<{width}}[/]  {escape(str(value))}", soft_wrap=True)
    if data["environment"]:
        console.print("[bold]environment[/]")
        for key, value in data["environment"].items():
            console.print(f"  {key}={escape(value)}", soft_wrap=True)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(f"npudoctor {npudoctor.__version__}")
        raise typer.Exit(ExitCode.OK)


EXIT_BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Entry point: map errors to the documented exit codes, one line each, never a traceback."""
    _tolerant_streams()
    code = _main(argv)
    try:  # a reader gone while the last lines sat in the buffer: 141 here too
        if sys.stdout is not None and not sys.stdout.closed:
            sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()
    except (OSError, ValueError):
        pass
    return code


def _main(argv: list[str] | None) -> int:
    try:
        code = app(args=argv, prog_name="npudoctor", standalone_mode=False)
    except typer.Exit as done:
        return int(done.exit_code)
    except NpudoctorError as error:
        _say(f"error: {error}")
        return int(error.exit_code)
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except (ReaderGone, BrokenPipeError):
        return _stdout_gone()
    except Exception as error:
        if _is_usage_error(error):
            _say(f"error: {error.format_message()}")
            return int(ExitCode.USAGE)
        # anything else is our bug: say so, with a way to see it
        if os.environ.get("NPUDOCTOR_DEBUG"):
            err.print_exception()
        _say(f"internal error: {type(error).__name__}: {error} (NPUDOCTOR_DEBUG=1 shows the traceback)")
        return int(ExitCode.INTERNAL)
    return int(code) if isinstance(code, int) else int(ExitCode.OK)


def _stdout_gone() -> int:
    """The reader of stdout went away (``npudoctor explain NPD001 | head -1``): end as a command that
    SIGPIPE stopped does, quietly with 141 (128 + SIGPIPE), the status a shell reports for ``cat``
    there. stdout is pointed at /dev/null so that flushing it at exit raises nothing more."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def _tolerant_streams() -> None:
    """Text npudoctor prints can hold what the console cannot encode: a lone surrogate from a YAML
    escape ("\\ud800") or from a non-UTF-8 file name, a character outside a legacy locale's charset.
    Such a character is written as a backslash escape rather than ending the run with an error."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(errors="backslashreplace")


def _say(message: str) -> None:
    """One unwrapped line on stderr: what a CI log or a grep needs."""
    sys.stderr.write(f"npudoctor: {' '.join(message.split())}\n")


def _is_usage_error(error: Exception) -> bool:
    """click's UsageError family (bad flag, bad value), whether typer uses click or its vendored copy."""
    return (
        callable(getattr(error, "format_message", None))
        and getattr(error, "exit_code", None) == ExitCode.USAGE
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
