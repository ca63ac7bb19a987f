"""``npudoctor list``, ``explain`` and ``env``: what npudoctor checks, and what this host has."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from npudoctor.cli import output
from npudoctor.cli.deployment_options import DeploymentOptions, takes_deployment
from npudoctor.cli.options import DataFormat, PythonOption, use_python
from npudoctor.errors import unknown_ids


class ListFormat(str, Enum):
    text = "text"
    json = "json"
    osv = "osv"


@takes_deployment
def list_checks(
    deployment: DeploymentOptions,
    output_format: Annotated[
        ListFormat,
        typer.Option(
            "--format",
            "-f",
            help="text; json (every check and catalog record); osv (the catalog as OSV records, a JSON list).",
        ),
    ] = ListFormat.text,
) -> None:
    """List every check and every record of the known-defect catalog: id, what the release history
    says, title, upstream references.

    With a deployment (given as check takes it), the release history is the deployment's: the
    witness deployments of its attention kind and FIA setting, as check reads it."""
    from npudoctor.engine.registry import all_checks

    if output_format is not ListFormat.text:
        import json

        from npudoctor.formatters import osv

        output.require_stdout()
        items = all_checks()
        data = (
            osv.osv_records(items) if output_format is ListFormat.osv else [osv.check_entry(c) for c in items]
        )
        output.write(json.dumps(data, indent=2) + "\n")
        return
    from npudoctor.formatters import listing

    listing.print_list(output.console(), all_checks(), _facts(deployment))


@takes_deployment
def explain(
    deployment: DeploymentOptions,
    check_id: Annotated[str, typer.Argument(metavar="ID", help="A check id, e.g. NPD001.")],
    full: Annotated[bool, typer.Option("--full", help="Also what the check tests, and how.")] = False,
) -> None:
    """Why a check matters, when its defect bites, and how to fix it (with a deployment: the release
    history for it)."""
    from npudoctor.engine.registry import all_checks
    from npudoctor.formatters import listing

    checks = {c.id: c for c in all_checks()}
    item = checks.get(check_id.strip().upper())
    if item is None:
        raise unknown_ids("", "check", [check_id.strip().upper()], list(checks))
    listing.print_explain(output.console(), item, full, _facts(deployment))


def _facts(deployment: DeploymentOptions):
    """The facts of the deployment the options describe (read as ``check --depth static`` reads it),
    or None for none: every witness of the release history speaks. No sglang is looked for."""
    spec = deployment.spec()
    if not spec.described:
        return None
    from npudoctor.service.subject import Need, resolve

    return resolve(spec, depth="static", need=Need.DEPLOYMENT).facts


def env_command(
    output_format: Annotated[DataFormat, typer.Option("--format", "-f")] = DataFormat.text,
    python: PythonOption = None,
    prepare: Annotated[
        bool,
        typer.Option(
            "--prepare",
            help="Build npudoctor's own live environment (a venv in its cache with a CPU torch and the "
            "packages sglang imports) if the live depth needs it, once, for a runner that is offline "
            "later. Never installs into the environment sglang runs in.",
        ),
    ] = False,
) -> None:
    """Inventory of this host: Python, torch, torch_npu, CANN, npu-smi, sglang, relevant env vars (secrets
    redacted), and which interpreter the live depth runs in."""
    import json

    from npudoctor.target.hostinfo import inventory

    use_python(python)
    if prepare:
        from npudoctor.live import toolenv

        chosen = toolenv.select()
        if isinstance(chosen, toolenv.LiveInterpreter) and chosen.where == "host":  # no download for nothing
            output.say(
                f"the live depth runs in {chosen.python} (torch and numpy import there): nothing to prepare"
            )
            return
        toolenv.prepare(output.say)
        return
    output.require_stdout()
    from npudoctor.formatters.layout import Para, print_whole
    from npudoctor.live import toolenv

    data = inventory(toolenv.describe())
    if output_format is DataFormat.json:
        output.write(json.dumps(data, indent=2) + "\n")
        return
    console = output.console()
    width = max(len(key) for key in data)
    for key, value in data.items():
        if key == "live-depth":
            value = _live_depth_line(value)
        if key != "environment":  # word-wrapped under its value's column: a path is never split
            lead = Text(f"{key:<{width}}  ", style="bold")
            print_whole(console, Para(str(value), lead=lead, max_hang=width + 2))
    if not data["live-depth"]["runs"]:  # the one hint: the command that makes it run
        console.print(
            f"[bold]{'prepare':<{width}}[/]  {escape(data['live-depth']['prepare'])}", soft_wrap=True
        )
    if data["environment"]:
        console.print("[bold]environment[/]")
        for key, value in data["environment"].items():
            console.print(f"  {key}={escape(value)}", soft_wrap=True)


def _live_depth_line(live: dict) -> str:
    """Whether the live depth runs, and in which interpreter."""
    if not live["runs"]:
        return f"does not run: {live['reason']}"
    if live["uses"] == "live-env":
        return f"runs in npudoctor's own live environment ({live['interpreter']})"
    if live["missing"]:
        return f"runs in {live['interpreter']}, standing in what a release imports of the missing: {live['reason']}"
    return f"runs in {live['interpreter']}: every live requirement is installed"
