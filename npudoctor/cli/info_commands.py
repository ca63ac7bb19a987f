"""``npudoctor list``, ``explain`` and ``env``: what npudoctor checks, and what this host has."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from npudoctor.cli import output
from npudoctor.cli.options import DataFormat
from npudoctor.errors import InputError


def list_checks() -> None:
    """List every check: id, title, upstream references."""
    from npudoctor.engine.check import all_checks
    from npudoctor.formatters import listing

    listing.print_list(output.console(), all_checks())


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
    listing.print_explain(output.console(), item, full)


def env_command(
    output_format: Annotated[DataFormat, typer.Option("--format", "-f")] = DataFormat.text,
) -> None:
    """Inventory of this host: Python, torch, torch_npu, CANN, npu-smi, sglang, relevant env vars (secrets redacted)."""
    import json

    from npudoctor.target.hostinfo import inventory

    output.require_stdout()
    data = inventory()
    if output_format is DataFormat.json:
        output.write(json.dumps(data, indent=2) + "\n")
        return
    console = output.console()
    width = max(len(key) for key in data)
    for key, value in data.items():
        if key == "live-depth":
            value = _live_depth_line(value)
        if key != "environment":  # one line each, never folded: a long interpreter path stays whole
            console.print(f"[bold]{key:<{width}}[/]  {escape(str(value))}", soft_wrap=True)
    if data["environment"]:
        console.print("[bold]environment[/]")
        for key, value in data["environment"].items():
            console.print(f"  {key}={escape(value)}", soft_wrap=True)


def _live_depth_line(live: dict) -> str:
    """Whether the live depth runs here, and what to install when a requirement is missing."""
    if not live["runs"]:
        return f"does not run here: {live['reason']}"
    if live["missing"]:
        return f"runs here, standing in what a release imports of the missing: {live['reason']}"
    return "runs here: every module of npudoctor's live requirements is installed"
