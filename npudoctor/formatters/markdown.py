"""Markdown report, for pasting into issues and pull requests and for the GitHub Actions
job summary (``table`` is what the github formatter appends to ``$GITHUB_STEP_SUMMARY``).

Check text comes from sglang source and deployment files, so it is escaped before it
lands in Markdown: ``|`` and line breaks would otherwise split table cells and rows,
and ``<``/``&`` would otherwise be read as HTML by GitHub's renderer. Control characters (CR,
C1, Unicode's bidirectional controls that reorder what a reader sees) are shown escaped
(``\\u202e``), as the text report shows them (``npudoctor.terminal.printable``).
"""

from __future__ import annotations

import re

from npudoctor.formatters.advice import SHORT, catalog_cell, matrix_columns, recommendation_lines
from npudoctor.results import Report, Result, Status
from npudoctor.service.advise import Advice
from npudoctor.service.advise import cell as status_cell
from npudoctor.service.hints import UserOptions, fix_hint
from npudoctor.terminal import printable


def render(report: Report, user: UserOptions | None = None, verbose: bool = False) -> str:
    """``user``: the user's own options the fix hints repeat (None: those the report names).
    ``verbose`` is the text format's: this one says the same either way."""
    user = user if user is not None else UserOptions.of_report(report)
    parts = [_heading(report), "", _summary_line(report), "", *_table_lines(report)]
    details = [r for r in report.results if r.status is not Status.PASS or r.ignored is not None]
    if details:
        parts += ["", "### Details"]
        for result in details:
            parts += ["", *_details(result, user)]
    return "\n".join(parts) + "\n"


def table(report: Report) -> str:
    """The heading and the ``| Check | Status | Summary |`` table, without details."""
    return "\n".join([_heading(report), "", *_table_lines(report)]) + "\n"


def _heading(report: Report) -> str:
    version = report.target.version or "unknown version"
    return f"## npudoctor: sglang {_text(version)} at {_code(report.target.path)}"


def _summary_line(report: Report) -> str:
    counts = report.counts()
    parts = [f"{counts[s.value]} {s.value}" for s in Status if counts[s.value]] or ["no checks run"]
    ignored = sum(1 for r in report.results if r.ignored is not None)
    line = f"**{', '.join(parts)}**"
    if ignored:
        line += f" ({ignored} ignored)"
    findings = counts["findings"]
    fail_on = f"`{report.fail_on.value}`"
    if findings:
        return f"{line} - {findings} finding(s) at or above {fail_on}"
    return f"{line} - no findings at or above {fail_on}"


def _table_lines(report: Report) -> list[str]:
    lines = ["| Check | Status | Summary |", "| --- | --- | --- |"]
    for result in report.results:
        check = f"**{cell(result.id)}** {cell(result.title)}"
        lines.append(f"| {check} | {_status(result)} | {cell(result.summary)} |")
    return lines


def _status(result: Result) -> str:
    label = result.status.value.upper()
    return f"{label} (ignored)" if result.ignored is not None else label


def _text(value: object) -> str:
    """Inline text: controls escaped, HTML-significant characters as entities."""
    text = printable(str(value))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cell(value: object) -> str:
    """Text safe inside one table cell: ``|`` escaped, a line break within the text as ``<br>``
    (none at its ends: a folded YAML scalar's closing newline is no line)."""
    text = _text(value).replace("|", "\\|").replace("\r\n", "\n").replace("\r", "\n").strip()
    return "<br>".join(line.rstrip() for line in text.split("\n"))


def _inline(value: object) -> str:
    """Text safe on one list-item line (same escaping as a table cell)."""
    return cell(value)


def _code(value: object) -> str:
    """A code span holding ``value`` verbatim (fence longer than any backtick run inside)."""
    text = " ".join(printable(str(value)).splitlines())
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _details(result: Result, user: UserOptions) -> list[str]:
    lines = [f"#### {_text(result.id)} {_text(result.title)}: {_status(result)}", "", _inline(result.summary)]
    bullets: list[str] = []
    if result.ignored is not None:
        bullets.append(f"- ignored: {_inline(result.ignored)}")
    if result.error:
        bullets.append(f"- error: {_inline(result.error)}")
    for assumption in result.assumptions:
        bullets.append(f"- assumed: {_inline(assumption)}")
    for evidence in result.evidence:
        where = evidence.location
        if where is not None:
            symbol = f" ({_text(where.symbol)})" if where.symbol else ""
            bullets.append(f"- {_code(f'{where.path}:{where.line}')}{symbol}")
        else:
            bullets.append("- evidence")
        bullets.append(f"  - expected: {_inline(evidence.expected)}")
        bullets.append(f"  - observed: {_inline(evidence.observed)}")
    fix = result.remediation
    if fix is not None and (fix.fix_id or fix.fixed_in or fix.advice):
        remedy = []
        if fix.fix_id:
            remedy.append(f"fix {_code(fix.fix_id)}: run {_code(fix_hint(fix.fix_id, user))}")
        if fix.upstream:
            remedy.append(_text(fix.upstream))
        if fix.advice:
            remedy.append(_inline(fix.advice))
        bullets.append("- **Remediation:** " + "; ".join(remedy))
    if bullets:
        lines += ["", *bullets]
    return lines


def render_advice(advice: Advice) -> str:
    checks, records = matrix_columns(advice)
    columns = checks + ([f"catalog ({len(records)} records)"] if records else [])
    header = "| sglang | " + " | ".join(columns) + " | |"
    lines = [f"## npudoctor advise: {len(advice.rows)} release(s), depth {advice.depth}", "", header]
    lines.append("|" + " --- |" * (len(columns) + 2))
    for row in advice.rows:
        cells = []
        for check_id in checks:
            status = status_cell(row, check_id)
            cells.append(
                "-" if status is None else (f"**{SHORT[status]}**" if status.severity else SHORT[status])
            )
        if records:
            worst, which = catalog_cell(row, records)
            cells.append(
                "-" if worst is None else (f"**{SHORT[worst]}**: " + ", ".join(which) if which else "ok")
            )
        note = cell(row.error) if row.error else ("installed" if row.candidate.installed else "")
        lines.append(f"| {cell(row.candidate.label)} | " + " | ".join(cells) + f" | {note} |")
    lines += ["", "### Recommendation", ""]
    lines += [f"- {cell(line.strip())}" for line in recommendation_lines(advice)]
    lines += [f"- note: {cell(note)}" for note in advice.notes]
    return "\n".join(lines) + "\n"
