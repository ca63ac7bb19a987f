"""The ``npudoctor`` command line.

Reports go to stdout (or ``--output``); logs, progress and error lines go to stderr,
so ``npudoctor check --format json | jq`` always sees clean JSON.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import sys
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import npudoctor  # its __version__ is looked up on use: --help, list and explain never need it
from npudoctor.errors import ExitCode, InputError, NpudoctorError

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
    list[str] | None, typer.Option("--select", "-s", help="Only these fix ids (repeatable).")
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


# The deployment and selection options `check` and `advise` share.
ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="Deployment YAML (model, env, roles, ignore).")
]
ModelPathOption = Annotated[
    Path | None, typer.Option("--model-path", help="Local model directory (its config.json is read).")
]
RoleOption = Annotated[
    Role | None, typer.Option("--disaggregation-mode", help="With --model-path: the server's PD role.")
]
PpSizeOption = Annotated[int | None, typer.Option("--pp-size", min=1, help="With --model-path.")]
TpSizeOption = Annotated[int | None, typer.Option("--tp-size", min=1, help="With --model-path.")]
PageSizeOption = Annotated[int | None, typer.Option("--page-size", min=1, help="With --model-path.")]
EnvOption = Annotated[
    list[str] | None, typer.Option("--env", "-e", help="With --model-path: NAME=VALUE, repeatable.")
]
SelectOption = Annotated[
    list[str] | None, typer.Option("--select", "-s", help="Run only these check ids (repeatable).")
]
OutputOption = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write the report here, not stdout.")
]
FailOnOption = Annotated[FailOn, typer.Option(help="Lowest status that counts as a finding.")]
IgnoreOption = Annotated[
    list[str] | None,
    typer.Option("--ignore", help="ID or ID:YYYY-MM-DD: accept this check's finding (until the date)."),
]


def _ids(values: list[str] | None) -> list[str]:
    """Repeatable id options, each also taking a comma-separated list."""
    return [s for item in (values or []) for s in item.split(",") if s]


def _check_request(ctx, config, model_path, role, pp_size, tp_size, page_size, env, depth, select, fail_on,
                   ignore):  # fmt: skip
    """The ``CheckRequest`` of the deployment options, a launch command after ``--`` included."""
    from npudoctor.runner import CheckRequest

    if ctx.args and ctx.args[0].startswith("-"):
        raise InputError(f"unknown option {ctx.args[0]!r} (a launch command goes after '--')")
    flags = {
        key: value
        for key, value in (
            ("disaggregation_mode", role.value if role else None),
            ("pp_size", pp_size),
            ("tp_size", tp_size),
            ("page_size", page_size),
        )
        if value is not None
    }
    return CheckRequest(
        config=config,
        launch_command=list(ctx.args),
        model_path=model_path,
        server_flags=flags,
        env_flags=list(env or []),
        depth=depth.value,
        select=_ids(select),
        fail_on=fail_on.value,
        ignore=list(ignore or []),
        today=dt.date.today(),
    )


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
    epilog=(
        "Deployment: --config deploy.yaml, or a launch command after '--' "
        "(npudoctor check -- python -m sglang.launch_server --model-path M --pp-size 2 ...), "
        "or --model-path with the flags below. With none, every check assumes the conditions "
        "under which its defect bites and says so.\n\n" + EXIT_CODES_HELP
    ),
)
def check(
    ctx: typer.Context,
    config: ConfigOption = None,
    model_path: ModelPathOption = None,
    role: RoleOption = None,
    pp_size: PpSizeOption = None,
    tp_size: TpSizeOption = None,
    page_size: PageSizeOption = None,
    env: EnvOption = None,
    sglang_path: Annotated[
        Path | None,
        typer.Option(
            "--sglang-path", help="Check this unpacked wheel or source tree instead of the installed sglang."
        ),
    ] = None,
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
            help="Run the live probes with this runtime fix applied, as `npudoctor run --select ID` would "
            "(repeatable): shows whether the fix cures the deployment.",
        ),
    ] = None,
) -> None:
    """Probe sglang against a deployment and report the known defects it has."""
    from npudoctor.runner import run

    request = _check_request(ctx, config, model_path, role, pp_size, tp_size, page_size, env, depth, select,
                             fail_on, ignore)  # fmt: skip
    request.sglang_path = sglang_path
    request.with_fixes = _ids(with_fix)
    report = run(request, progress=err if err.is_terminal else None)
    _emit(report, output_format.value if output_format else "text", output)
    raise typer.Exit(ExitCode.FINDINGS if report.findings() else ExitCode.OK)


def _emit(report, format_name: str, output: Path | None) -> None:
    from npudoctor.formatters import renderer

    if format_name == "text" and output is None:
        from npudoctor.formatters.text import renderable

        Console(highlight=False).print(renderable(report))
    else:
        _write(renderer(format_name)(report), output)
    if format_name == "github":
        from npudoctor.formatters.github import write_step_summary

        _step_summary(lambda path: write_step_summary(report, path))


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
        "row saying why. The deployment options are those of `npudoctor check`.\n\n"
        "Exit codes: 0 the baseline (the installed release, else the first checked) has no finding at or "
        "above --fail-on; 1 it has; 2 usage or input error; 3 internal error; 4 the baseline could not be "
        "checked (or no sglang to start from)."
    ),
)
def advise(
    ctx: typer.Context,
    config: ConfigOption = None,
    model_path: ModelPathOption = None,
    role: RoleOption = None,
    pp_size: PpSizeOption = None,
    tp_size: TpSizeOption = None,
    page_size: PageSizeOption = None,
    env: EnvOption = None,
    releases: Annotated[
        str | None,
        typer.Option("--releases", "-r", metavar="A..B", help="Releases to check: A..B, A.., A,B,C or A."),
    ] = None,
    wheel_dir: Annotated[
        Path | None, typer.Option("--wheel-dir", help="Check the sglang wheels in this directory (offline).")
    ] = None,
    sglang_path: Annotated[
        list[Path] | None,
        typer.Option(
            "--sglang-path", help="Also check this unpacked wheel or source tree, first (repeatable)."
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
            help="Releases checked at once (default 0: one per core).",
        ),
    ] = 0,
    select: SelectOption = None,
    output_format: Annotated[AdviseFormat, typer.Option("--format", "-f")] = AdviseFormat.text,
    output: OutputOption = None,
    fail_on: FailOnOption = FailOn.fail,
    ignore: IgnoreOption = None,
) -> None:
    """Which sglang release to run for this deployment: check a range of releases and recommend."""
    from npudoctor.advise import AdviseRequest, exit_status
    from npudoctor.advise import advise as run_advise
    from npudoctor.formatters import advice as advice_format

    request = AdviseRequest(
        check=_check_request(
            ctx, config, model_path, role, pp_size, tp_size, page_size, env, depth, select, fail_on, ignore
        ),  # fmt: skip
        releases=releases,
        wheel_dir=wheel_dir,
        sglang_paths=list(sglang_path or []),
        jobs=jobs,
    )
    if output is not None and output.is_dir():
        raise InputError(f"--output {output}: is a directory")
    started = time.perf_counter()
    result = run_advise(request, on_row=lambda i, n, row: _say(advice_format.row_line(i, n, row)))
    _say(f"checked {len(result.rows)} release(s) in {time.perf_counter() - started:.1f} s")
    fmt = output_format.value
    if fmt == "text" and output is None:
        advice_format.print_text(result, Console(highlight=False))
    else:
        _write(advice_format.render(result, fmt, npudoctor.__version__), output)
    if fmt == "github":
        _step_summary(lambda path: advice_format.write_step_summary(result, path))
    raise typer.Exit(exit_status(result))


def _write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8", errors="backslashreplace")
    except OSError as error:
        raise InputError(f"--output {output}: cannot write ({error.strerror})") from None


@app.command(
    context_settings={"allow_extra_args": False},
    epilog=(
        "Without --apply, --revert or --status: print the plan (what would be patched, where, "
        "why) and change nothing. Fixes are applied only where their check fails for the "
        "deployment and the code is a shape the fix was written for. Kill switch for every "
        "process: NPUDOCTOR_DISABLE_FIXES=1.\n\n"
        "Exit codes: 0 done (plan shown, fixes recorded or reverted, status shown); 2 usage or "
        "input error (unknown fix id, unwritable --site, damaged record); 3 internal error; "
        "4 no sglang found."
    ),
)
def fix(
    apply: Annotated[
        bool, typer.Option("--apply", help="Record the fixes so every sglang process applies them at start.")
    ] = False,
    revert: Annotated[bool, typer.Option("--revert", help="Remove everything --apply created.")] = False,
    status: Annotated[
        bool, typer.Option("--status", help="Show what is recorded and whether it still fits.")
    ] = False,
    select: FixSelection = None,
    unsafe: AllowUnsafe = False,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Deployment YAML; default: assume the worst case.")
    ] = None,
    sglang_path: Annotated[
        Path | None, typer.Option("--sglang-path", help="Plan for this unpacked wheel or source tree.")
    ] = None,
    site: Annotated[
        Path | None,
        typer.Option(
            "--site",
            help="Directory on sglang's sys.path for the record (default: this interpreter's site-packages, "
            "or $NPUDOCTOR_SITE).",
        ),
    ] = None,
    output_format: Annotated[DataFormat, typer.Option("--format", "-f")] = DataFormat.text,
    depth: PlanDepth = Depth.auto,
) -> None:
    """Plan, apply, revert or inspect the runtime fixes for the installed sglang."""
    from npudoctor.target import discover

    if sum((apply, revert, status)) > 1:
        raise InputError("give at most one of --apply, --revert, --status")
    as_json = output_format is DataFormat.json
    if revert:
        _fix_revert(site, as_json)
    elif status:
        _fix_status(discover(sglang_path), site, as_json, config, depth.value)
    else:
        from npudoctor import fixing
        from npudoctor.runner import load_deployment_from
        from npudoctor.serverargs import validate_arguments

        target = discover(sglang_path)
        deploy = load_deployment_from(config)
        validate_arguments(deploy.facts, target)  # a name no sglang knows: exit 2 before planning
        ids = _ids(select)
        planned = fixing.plan(fixing.select_fixes(ids), target, deploy.facts, unsafe, depth.value)
        if apply:
            _fix_apply(target, planned, site, as_json)
        else:
            _fix_show_plan(planned, as_json)


def _fix_revert(site: Path | None, as_json: bool) -> None:
    """``fix --revert``: remove the record --apply wrote."""
    from npudoctor import registration

    removed = registration.remove(site)
    _fix_output(as_json, {"reverted": str(removed) if removed else None},
                f"removed {removed}" if removed else "nothing to revert: no fix is recorded in "
                f"{registration.site_dir(site)}")  # fmt: skip


def _fix_status(target, site: Path | None, as_json: bool, config: Path | None, depth: str) -> None:
    """``fix --status``: what is recorded, whether it still fits the installed sglang, and whether
    the deployment still needs it (the decision ``fix`` makes)."""
    from npudoctor import fixing, registration
    from npudoctor.fix import fix_by_id
    from npudoctor.runner import load_deployment_from

    document = registration.read(site)
    if document is None:
        _fix_output(as_json, {"recorded": None}, f"no fix is recorded in {registration.site_dir(site)}")
        return
    known = []
    for fix_id in sorted(document["fixes"]):
        with contextlib.suppress(KeyError):
            known.append(fix_by_id(fix_id))
    planned = fixing.plan(known, target, load_deployment_from(config).facts, True, depth)
    rows = fixing.status(document, target, planned)
    if as_json:
        _fix_output(True, {"recorded": document, "status": [r.__dict__ for r in rows]}, "")
        return
    console = Console(highlight=False)
    console.print(f"recorded in {registration.site_dir(site) / registration.DIST_INFO}")
    _plugin_note(console, target)
    for row in rows:
        console.print(f"  {row.fix_id}  [bold]{row.state}[/]  {escape(row.detail)}")


def _fix_show_plan(planned, as_json: bool) -> None:
    """``fix``: the plan, nothing changed."""
    if as_json:
        _fix_output(True, {"plan": _plan_json(planned)}, "")
        return
    console = Console(highlight=False)
    _print_plan(console, planned)
    console.print("nothing changed: `npudoctor fix --apply` records the fixes marked apply")


def _fix_apply(target, planned, site: Path | None, as_json: bool) -> None:
    """``fix --apply``: record the fixes the plan accepts where sglang's processes find them."""
    from npudoctor import fixing, registration

    document = fixing.record_document(planned, target)
    if not document["fixes"]:
        _fix_output(as_json, {"applied": [], "plan": _plan_json(planned)},
                    "nothing to apply: " + "; ".join(f"{p.fix.id} {p.decision.action.value}" for p in planned))  # fmt: skip
        return
    path = registration.write(document, site)
    if as_json:
        _fix_output(
            True, {"applied": sorted(document["fixes"]), "record": str(path), "plan": _plan_json(planned)}, ""
        )
        return
    console = Console(highlight=False)
    _print_plan(console, planned)
    console.print(f"recorded {', '.join(sorted(document['fixes']))} in {path}")
    _plugin_note(console, target)


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


def _print_plan(console: Console, planned) -> None:
    table = Table(show_header=True, header_style="bold")
    for column in ("ID", "Action", "Safety", "Replaces", "Why"):
        table.add_column(column, no_wrap=column in ("ID", "Action", "Safety"), overflow="fold")
    for p in planned:
        table.add_row(
            p.fix.id,
            p.decision.action.value,
            p.fix.safety.value,
            "\n".join(s.split(":")[1] for s in (p.decision.installs or p.fix.replaces)),
            escape(f"{p.decision.reason}\n{p.fix.provenance}"),
        )
    console.print(table)


def _plugin_note(console: Console, target) -> None:
    from npudoctor import fixing

    if fixing.loads_plugins(target):
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
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        Console(highlight=False).print(escape(text))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog=(
        "Every Python process the command starts, sglang's spawned schedulers included, applies "
        "the fixes when sglang's modules are imported (a sitecustomize on PYTHONPATH); works for "
        "every sglang release. The deployment is read from the launch command (or --config). "
        "Exit code: the command's; 126/127 when it cannot run or is not found; 2 for bad npudoctor "
        "options. Kill switch: NPUDOCTOR_DISABLE_FIXES=1."
    ),
)
def run(
    ctx: typer.Context,
    select: FixSelection = None,
    unsafe: AllowUnsafe = False,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Deployment YAML; default: the launch command's.")
    ] = None,
    depth: PlanDepth = Depth.auto,
) -> None:
    """Run a command (an sglang server) with the runtime fixes its sglang needs: npudoctor run -- CMD..."""
    from npudoctor import deployment, fixing
    from npudoctor.runner import load_deployment_from
    from npudoctor.serverargs import validate_arguments
    from npudoctor.target import discover

    command = list(ctx.args)
    if command and command[0].startswith("-"):
        raise InputError(f"unknown option {command[0]!r} (the command goes after '--')")
    if not command:
        raise InputError(
            "run: give the command after '--' (npudoctor run -- python -m sglang.launch_server ...)"
        )
    fixing.resolve_command(command[0])  # 127/126 before any planning
    if config is not None:
        deploy = load_deployment_from(config)
    else:
        try:
            deploy = deployment.from_command(command)
        except InputError:
            deploy = deployment.no_deployment()  # not an sglang launch we can read: assume the worst
    target = discover()
    validate_arguments(deploy.facts, target)  # a name no sglang knows: exit 2, the server would not start
    planned = fixing.plan(
        fixing.select_fixes(_ids(select)),
        target,
        deploy.facts,
        unsafe,
        depth.value,
    )
    document = fixing.record_document(planned, target)
    for p in planned:
        _say(f"{p.fix.id}: {p.decision.action.value}: {p.decision.reason}")
    raise typer.Exit(fixing.run_command(command, document))


@app.command("list")
def list_checks() -> None:
    """List every check: id, title, upstream references."""
    from npudoctor.check import all_checks

    table = Table(show_header=True, header_style="bold")
    table.add_column("ID", no_wrap=True)
    table.add_column("Title")
    table.add_column("Upstream")
    table.add_column("Fixed in", no_wrap=True)
    for item in all_checks():
        table.add_row(item.id, item.title, "\n".join(item.upstream), _fixed_in_history(item))
    Console(highlight=False).print(table)


def _fixed_in_history(item) -> str:
    """What ``npudoctor.history`` says for the check on any deployment: the first release from
    which every witness deployment holds the property, or that the newest still fails."""
    from npudoctor import history
    from npudoctor.facts import NO_DEPLOYMENT

    if not item.upstream_history:
        return "-"
    found = history.upstream(item.id, NO_DEPLOYMENT, None)
    if found.fixed_in:
        return f"fixed in {found.fixed_in}"
    return f"not fixed as of {found.newest_checked}" if found.newest_checked else "-"


@app.command()
def explain(check_id: Annotated[str, typer.Argument(metavar="ID", help="A check id, e.g. NPD001.")]) -> None:
    """Why a check matters, when its defect bites, and how to fix it."""
    from npudoctor import history
    from npudoctor.check import all_checks
    from npudoctor.fix import fix_by_id

    checks = {c.id: c for c in all_checks()}
    item = checks.get(check_id.strip().upper())
    if item is None:
        raise InputError(f"unknown check id {check_id!r} (known: {', '.join(checks)})")
    console = Console(highlight=False)
    console.print(f"[bold]{item.id}[/]  {escape(item.title)}\n")
    console.print(f"[bold]Why it matters[/]\n{escape(item.why)}\n")
    console.print(f"[bold]When it bites[/]\n{escape(item.bites_when)}\n")
    console.print(f"[bold]How to fix[/]\n{escape(item.how_to_fix)}")
    console.print(f"Upstream (release history npudoctor checked): {escape(_fixed_in_history(item))}", end="")
    witnesses = history.witness_deployments(item.id) if item.upstream_history else []
    console.print(f" (on {escape(', '.join(witnesses))})." if witnesses else ".")
    for url in item.upstream:
        console.print(f"Upstream: {url}")
    try:
        fix = fix_by_id(item.id)
    except KeyError:  # a check without a runtime fix (NPD000)
        fix = None
    if fix is not None:
        console.print(
            f"\n[bold]Runtime fix[/] ({fix.safety.value})\n{escape(fix.title)}: {escape(fix.provenance)}."
        )
    doc = (sys.modules[type(item).__module__].__doc__ or "").strip()
    if doc:
        console.print(f"\n[bold]What the check tests[/]\n{escape(doc)}")


@app.command("env")
def env_command(
    output_format: Annotated[
        Format | None, typer.Option("--format", "-f", help="text (default) or json.")
    ] = None,
) -> None:
    """Inventory of this host: Python, torch, torch_npu, CANN, npu-smi, sglang, relevant env vars (secrets redacted)."""
    import json

    from npudoctor.envinfo import inventory

    data = inventory()
    if output_format in (None, Format.text):
        table = Table(show_header=False, box=None)
        for key, value in data.items():
            if key != "environment":
                table.add_row(f"[bold]{key}[/]", escape(str(value)))
        console = Console(highlight=False)
        console.print(table)
        if data["environment"]:
            console.print("[bold]environment[/]")
            for key, value in data["environment"].items():
                console.print(f"  {key}={escape(value)}")
    elif output_format == Format.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        raise InputError("env: --format must be text or json")


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(f"npudoctor {npudoctor.__version__}")
        raise typer.Exit(ExitCode.OK)


def main(argv: list[str] | None = None) -> int:
    """Entry point: map errors to the documented exit codes, one line each, never a traceback."""
    _tolerant_streams()
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
