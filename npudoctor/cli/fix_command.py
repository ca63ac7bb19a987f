"""``npudoctor fix``: plan, apply, revert or inspect the runtime fixes (``npudoctor.service.operations``
does the work; this module reads the options and prints)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from npudoctor.cli import output
from npudoctor.cli.deployment_options import DeploymentOptions, takes_deployment
from npudoctor.cli.options import (
    DEPLOYMENT_HELP,
    AllowUnsafe,
    DataFormat,
    Depth,
    FixSelection,
    PlanDepth,
    PythonOption,
    QuietOption,
    SglangPathOption,
    use_python,
)
from npudoctor.errors import ExitCode, InputError

EPILOG = (
    "Without --apply, --revert or --status: print the plan (what would be patched, where, "
    "why) and change nothing. Fixes are applied only where their check fails for the "
    "deployment and the code is a shape the fix was written for. --apply records them beside "
    "the sglang they fix (the directory it is imported from; --site or $NPUDOCTOR_SITE to choose), "
    "where sglang 0.5.11+ loads them in every scheduler process; --status and --revert look there. "
    "--apply replaces the record with what it selects now, and names each recorded fix it drops. "
    "Kill switch for every process: NPUDOCTOR_DISABLE_FIXES=1. The plan and --apply end with the "
    "findings no runtime fix cures (the catalog's records): `npudoctor check` stays red on those until "
    "the release or workaround each names.\n\n"
    + DEPLOYMENT_HELP
    + "\n\nExit codes: 0 done (plan shown, fixes recorded or reverted, the record fits); 1 a fix the "
    "deployment needs was refused (one line on stderr each: why, and for an unsafe fix the command with "
    "--unsafe), or --status: "
    "the record no longer fits this sglang or deployment (the next command is printed), sglang's processes "
    "will not apply it (why is printed), or nothing is recorded and a fix is needed; 2 usage or input error (unknown fix id, unwritable --site, "
    "damaged record, a record --revert cannot remove: it is left as it was, the record's lock held "
    "by another fix for a minute); 3 internal error; 4 no sglang found, or it has no Ascend NPU "
    "backend; 130 interrupted (Ctrl-C), 143 by SIGTERM, 129 by SIGHUP."
)


@takes_deployment
def fix(
    deployment: DeploymentOptions,
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
    python: PythonOption = None,
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
    from npudoctor.service import operations

    if sum((apply, revert, status)) > 1:
        raise InputError("give at most one of --apply, --revert, --status")
    use_python(python)
    output.require_stdout()
    as_json = output_format is DataFormat.json
    request = deployment.check_request(depth, select=select, sglang_path=sglang_path)
    if revert:
        reverted = operations.revert(site, sglang_path)
        if reverted.removed:
            _report(as_json, {"reverted": str(reverted.removed)}, f"removed {reverted.removed}")
        else:
            where = reverted.searched
            _report(as_json, {"reverted": None}, f"nothing to revert: no fix is recorded in {where}")
        return
    setting = operations.fix_setting(request, site, writing=apply)
    document = operations.recorded(setting) if status else None
    planned = operations.plan_fixes(request, setting.subject, unsafe, quiet)
    if status:
        judged = operations.judged_with_record(setting, planned, quiet) if document is not None else None
        _show_status(operations.status(setting, document, planned, unsafe, judged), setting, unsafe, as_json)
        return
    uncured = operations.uncured(setting)
    if apply:
        _show_applied(operations.apply(setting, planned, unsafe), planned, setting, unsafe, as_json, uncured)
    else:
        _show_plan(planned, as_json, verbose, operations.apply_hint(setting, unsafe), uncured)
    _exit_on_refusal(planned, setting)


def _exit_on_refusal(planned, setting) -> None:
    """A fix refused where its check fails leaves the defect in place: one line each on stderr (why,
    and for an unsafe fix the command with --unsafe), exit 1, never a silent 0."""
    from npudoctor.patching.fixbase import Safety
    from npudoctor.service import operations
    from npudoctor.service.planning import refusals

    refused = refusals(planned)
    for p in refused:
        line = f"refused {p.fix.id}: {p.decision.reason}"
        if p.fix.safety is Safety.UNSAFE and p.decision.installs:  # refused for the flag alone
            line += f": {operations.apply_hint(setting, True, [p.fix.id])}"
        output.say(line)
    if refused:
        raise typer.Exit(ExitCode.FINDINGS)


def _show_status(found, setting, unsafe: bool, as_json: bool) -> None:
    """``fix --status``: what the record holds, whether it still fits; exit 1 with the next command
    when it no longer does. Nothing recorded: what ``--apply`` would record, exit 1 when that is a fix."""
    from npudoctor.formatters import fixplan

    target = setting.subject.target
    if as_json:
        _report(True, found.to_json(), "")
    elif found.document is None:
        console = output.console()
        console.print(f"no fix is recorded in {escape(str(found.record.parent))}", soft_wrap=True)
        fixplan.print_status_rows(console, found.rows)
        if found.fits:
            console.print("no fix is needed for this sglang and deployment: --apply would record none")
        else:
            console.print(f"--apply would record {', '.join(found.needed)}; next:")
            console.print(f"  {escape(found.next_command)}", soft_wrap=True)
    else:
        console = output.console()
        console.print(f"recorded in {escape(str(found.record))}", soft_wrap=True)
        if found.recorded_for != target.version:
            recorded_for, version = escape(str(found.recorded_for)), escape(str(target.version))
            console.print(f"recorded for sglang {recorded_for}; this is sglang {version}")
        _print_plugin_note(console, setting, unsafe)
        fixplan.print_status_rows(console, found.rows)
        if found.fits:
            console.print("the record fits this sglang and deployment")
        elif found.outdated:
            console.print("the record no longer fits; next:")
            console.print(f"  {escape(found.next_command)}", soft_wrap=True)
        else:
            console.print(
                "the record fits this sglang and deployment, but sglang's processes will not apply it"
            )
    if not found.fits:
        raise typer.Exit(ExitCode.FINDINGS)


def _show_plan(planned, as_json: bool, verbose: bool, apply_command: str, uncured) -> None:
    """``fix``: the plan, nothing changed, and the ``--apply`` that records it (the user's options);
    then the findings no fix cures (``operations.uncured``)."""
    from npudoctor.formatters import fixplan
    from npudoctor.service.operations import uncured_json
    from npudoctor.service.planning import plan_json

    if as_json:
        _report(True, {"plan": plan_json(planned), "uncured": uncured_json(uncured)}, "")
        return
    fixplan.print_plan(console := output.console(), planned, verbose)
    fixplan.print_apply_hint(console, planned, apply_command)
    fixplan.print_uncured(console, uncured)


def _show_applied(applied, planned, setting, unsafe: bool, as_json: bool, uncured) -> None:
    """``fix --apply``: what was recorded, what the record no longer holds (and the command that keeps
    it), and how to check and undo it; then the findings no fix cures (``operations.uncured``)."""
    from npudoctor.formatters import fixplan
    from npudoctor.service.operations import uncured_json
    from npudoctor.service.planning import plan_json

    if not applied.fixes:
        decided = "; ".join(f"{p.fix.id} {p.decision.action.value}" for p in planned)
        data = {"applied": [], "plan": plan_json(planned), "uncured": uncured_json(uncured)}
        _report(as_json, data, f"nothing to apply: {decided}")
        if not as_json:
            fixplan.print_uncured(output.console(), uncured)
        return
    if as_json:
        _report(True, {**applied.to_json(), "plan": plan_json(planned), "uncured": uncured_json(uncured)}, "")
        return
    console = output.console()
    fixplan.print_plan(console, planned, False)
    console.print(f"recorded {', '.join(applied.fixes)} in {escape(str(applied.record))}", soft_wrap=True)
    if applied.dropped:
        dropped = ", ".join(f"{fix_id} ({why})" for fix_id, why in applied.dropped.items())
        keep = f"; to keep {', '.join(applied.not_selected)} as well:" if applied.keep_command else ""
        console.print(f"no longer recorded: {dropped}{keep}", soft_wrap=True)
        if applied.keep_command:
            console.print(f"  {escape(applied.keep_command)}", soft_wrap=True)
    _print_plugin_note(console, setting, unsafe)
    console.print(f"check it: {escape(applied.status_command)}", soft_wrap=True)
    console.print(f"undo it:  {escape(applied.undo_command)}", soft_wrap=True)
    fixplan.print_uncured(console, uncured)


def _print_plugin_note(console: Console, setting, unsafe: bool) -> None:
    from npudoctor.service.operations import plugin_note

    note = plugin_note(setting, unsafe)
    console.print(
        f"[bold]note[/]: {escape(note.text)}" if note.warning else escape(note.text), soft_wrap=True
    )
    if note.command is not None:  # one line to copy, never wrapped
        console.print(f"  {escape(note.command)}", soft_wrap=True)


def _report(as_json: bool, data: dict, text: str) -> None:
    """``data`` as JSON, or ``text`` word-wrapped at spaces only (a path in it is never split)."""
    if as_json:
        output.write(json.dumps(data, indent=2) + "\n")
    else:
        from npudoctor.formatters.layout import Para, print_whole

        print_whole(output.console(), Para(text))
