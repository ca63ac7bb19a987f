"""Human-readable report with rich: a table of checks, then the evidence of each finding."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from npudoctor.results import Report, Result, Status

STYLE = {
    Status.PASS: "green",
    Status.SKIP: "dim",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
}


def render(report: Report) -> str:
    """Plain text (no colour) for files and pipes."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, no_color=True, highlight=False, soft_wrap=False)
    console.print(renderable(report))
    return buffer.getvalue()


def renderable(report: Report) -> RenderableType:
    target = report.target
    deployment = report.deployment.get("source", "none")
    header = Text.from_markup(
        f"[bold]npudoctor[/] {escape(report.tool_version)}  sglang [bold]{escape(str(target.version))}[/] "
        f"at {escape(target.path)}  deployment: {escape(str(deployment))}"
    )
    table = Table(show_header=True, header_style="bold", expand=True)
    table.add_column("Check", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("Depth", no_wrap=True)
    table.add_column("Result", ratio=1)
    for result in report.results:
        table.add_row(
            result.id,
            _status(result),
            result.depth.value,
            f"[bold]{escape(result.title)}[/]\n{escape(result.summary)}",
        )
    parts: list[RenderableType] = [header, table]
    for result in report.results:
        if result.status in (Status.FAIL, Status.WARN, Status.ERROR) or result.ignored:
            parts.append(_details(result))
    if report.live is not None:
        if report.live.get("ran"):
            parts.append(
                Text(
                    f"live depth: sglang imported on CPU in {report.live['import_seconds']} s; peak RSS "
                    f"{report.live['peak_rss_mb']} MB ({report.live['import_rss_mb']} MB after the import)"
                )
            )
        else:
            parts.append(Text(f"live depth not run: {report.live['reason']}"))
    counts = report.counts()
    verdict = (
        f"[bold red]{counts['findings']} finding(s) at or above '{report.fail_on.value}'[/]"
        if counts["findings"]
        else f"[green]no findings at or above '{report.fail_on.value}'[/]"
    )
    parts.append(
        Text.from_markup(
            " ".join(f"{s.value}: {counts[s.value]}" for s in Status if counts[s.value]) + f"  -  {verdict}"
        )
    )
    return Group(*parts)


def _status(result: Result) -> str:
    label = f"[{STYLE[result.status]}]{result.status.value.upper()}[/]"
    return f"{label} [dim](ignored)[/]" if result.ignored else label


def _details(result: Result) -> RenderableType:
    lines = [f"\n[bold]{result.id}[/] {_status(result)}  {escape(result.title)}"]
    for assumption in result.assumptions:
        lines.append(f"  [dim]assumed:[/] {escape(assumption)}")
    for evidence in result.evidence:
        where = f" [cyan]{escape(str(evidence.location))}[/]" if evidence.location else ""
        lines.append(f"  -{where}")
        lines.append(f"    expected: {escape(evidence.expected)}")
        lines.append(f"    observed: {escape(evidence.observed)}")
    if result.ignored:
        lines.append(f"  [dim]ignored:[/] {escape(result.ignored)}")
    if result.remediation:
        fix = result.remediation
        detail = f"  [bold]fix:[/] npudoctor fix --select {fix.fix_id}" if fix.fix_id else "  [bold]fix:[/]"
        if fix.fixed_in:
            detail += f"; fixed upstream in sglang {escape(fix.fixed_in)}"
        elif fix.unfixed_as_of:
            detail += f"; not fixed upstream as of sglang {escape(fix.unfixed_as_of)}"
        lines.append(detail)
        if fix.advice:
            lines.append(f"  {escape(fix.advice)}")
    return Text.from_markup("\n".join(lines))
