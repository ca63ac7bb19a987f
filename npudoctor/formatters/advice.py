"""The formats of ``npudoctor advise``: a release x check matrix and the recommendation.

Every format carries the same ``Advice``: ``text`` (rich, fits 80 columns: one short cell per
check), ``json`` (one ``check`` report per release, plus the recommendation), ``markdown`` (for
a pull request), ``junit`` (one test suite per release, the checks as its test cases), ``sarif``
(one run per checked release, so a code-scanning view can tell releases apart) and ``github``
(annotations for the baseline's findings, one notice with the recommendation, and the Markdown
in ``$GITHUB_STEP_SUMMARY`` when set).
"""

from __future__ import annotations

import dataclasses
import io
import json
import xml.etree.ElementTree as ET

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from npudoctor.formatters import FORMATS as FORMATS  # advise renders every format check does
from npudoctor.formatters import github, junit, markdown, sarif
from npudoctor.formatters.layout import Rows, Trimmed
from npudoctor.formatters.text import CATALOG_PREFIX, STYLE
from npudoctor.results import Status
from npudoctor.service.advise import Advice, Row, cell
from npudoctor.service.hints import UserOptions, hint
from npudoctor.terminal import TerminalConsole

_SHORT = {
    Status.PASS: "pass",
    Status.SKIP: "skip",
    Status.WARN: "WARN",
    Status.FAIL: "FAIL",
    Status.ERROR: "ERROR",
}


def render(advice: Advice, format_name: str, tool_version: str) -> str:
    if format_name == "json":
        return json.dumps(advice.to_dict(tool_version), indent=2) + "\n"
    if format_name == "markdown":
        return render_markdown(advice)
    if format_name == "junit":
        return render_junit(advice)
    if format_name == "sarif":
        return render_sarif(advice)
    if format_name == "github":
        return render_github(advice)
    buffer = io.StringIO()
    print_text(advice, TerminalConsole(file=buffer, width=100, no_color=True, highlight=False))
    return buffer.getvalue()


def _columns(advice: Advice) -> tuple[list[str], list[str]]:
    """The checks, one column each, and the catalog records, one column for all of them."""
    records = [i for i in advice.check_ids if i.startswith(CATALOG_PREFIX)]
    return [i for i in advice.check_ids if i not in records], records


def catalog_cell(row: Row, records: list[str]) -> tuple[Status | None, list[str]]:
    """The worst status of the catalog records on a release, and the records at it (warn or worse)."""
    statuses = {i: cell(row, i) for i in records}
    known = [s for s in statuses.values() if s is not None]
    if not known:
        return None, []
    worst = max(known, key=lambda s: s.severity)
    return worst, [
        i for i, s in statuses.items() if s is not None and s.severity and s.severity == worst.severity
    ]


# ----- text -----------------------------------------------------------------------------
class Matrix:
    """The release x check matrix where it fits the width (no vertical rules and no edges: seven
    checks, the catalog and the marks fit 80 columns); where it does not (more checks, ``--select
    NPP``; long release labels), one line per release naming the checks that are not pass or skip,
    so that no header is cut to ``NPD0...``. No line ends in blanks."""

    def __init__(self, advice: Advice) -> None:
        self.advice = advice

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = _table(self.advice)
        if console.measure(table, options=options.update(width=1 << 16)).maximum <= options.max_width:
            yield Trimmed(table)
        else:
            yield _release_rows(self.advice)


def _release_rows(advice: Advice) -> Rows:
    checks, records = _columns(advice)
    rows = []
    for row in advice.rows:
        said, counts = [], {}
        for check_id in checks:
            status = cell(row, check_id)
            if status is not None and status.severity:
                said.append(f"{check_id} {_SHORT[status]}")
            elif status is not None:
                counts[status.value] = counts.get(status.value, 0) + 1
        worst, which = catalog_cell(row, records) if records else (None, [])
        if which:
            said.append(f"{', '.join(which)} {_SHORT[worst]}")
        others = [f"{n} {status}" for status, n in counts.items()]
        if records and worst is not None and not which:
            others.append("catalog ok")
        said.append(", ".join(others))
        marks = ", ".join(_marks(advice, row))
        rows.append(([row.subject.label], "; ".join(s for s in said if s) + (f" ({marks})" if marks else "")))
    header = ([Text("sglang", "bold")], Text("checks that are not pass or skip; the others counted", "bold"))
    return Rows(rows, header=header, wrap=True)


def _marks(advice: Advice, row: Row) -> list[str]:
    marks = []
    if row.subject.installed:
        marks.append("installed")
    if row.subject.label == advice.recommendation.baseline and not row.subject.installed:
        marks.append("baseline")
    if row.error is not None:
        marks.append("not checked")
    elif row.subject.label == advice.recommendation.earliest_clean:
        marks.append("earliest clean")
    return marks


def renderable(advice: Advice) -> RenderableType:
    parts: list[RenderableType] = [
        Text(f"npudoctor advise: {len(advice.rows)} release(s), depth {advice.depth}", style="bold"),
        Matrix(advice),
    ]
    unchecked = [row for row in advice.rows if row.error is not None]
    if unchecked:
        parts.append(Text("Not checked:", style="bold"))
        parts.extend(Text(f"  {row.subject.label}: {row.error}") for row in unchecked)
    for note in advice.notes:
        parts.append(Text(f"note: {note}"))
    parts.append(Text("Recommendation:", style="bold"))
    return Group(*parts)


def _table(advice: Advice) -> Table:
    checks, records = _columns(advice)
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    table.add_column("sglang", no_wrap=True)
    for check_id in checks:
        table.add_column(check_id, no_wrap=True)
    if records:
        table.add_column(f"{CATALOG_PREFIX}*", no_wrap=True)  # the catalog: the records it flags
    table.add_column("", no_wrap=True)
    for row in advice.rows:
        cells = []
        for check_id in checks:
            status = cell(row, check_id)
            cells.append("-" if status is None else f"[{STYLE[status]}]{_SHORT[status]}[/]")
        if records:
            worst, which = catalog_cell(row, records)
            text = (
                "-"
                if worst is None
                else (
                    "ok" if not which else (which[0] if len(which) == 1 else f"{len(which)} {_SHORT[worst]}")
                )
            )
            cells.append(text if worst is None else f"[{STYLE[worst]}]{escape(text)}[/]")
        table.add_row(escape(row.subject.label), *cells, ", ".join(_marks(advice, row)))
    return table


def print_text(advice: Advice, console: Console) -> None:
    """The matrix, then the recommendation, whose lines are never wrapped: a command stays one
    line to copy, however narrow the terminal."""
    console.print(renderable(advice))
    for line in recommendation_lines(advice):
        console.print(Text(f"  {line}"), soft_wrap=True)


def recommendation_lines(advice: Advice) -> list[str]:
    """The recommendation in plain sentences (text and Markdown say the same)."""
    rec = advice.recommendation
    if rec.baseline is None:
        return ["nothing was checked"]
    lines = []
    base = advice.baseline_row
    if base is not None and base.report is None:
        lines.append(f"{rec.baseline} (the baseline) could not be checked: {base.error}")
    elif rec.baseline_findings:
        lines.append(
            f"{rec.baseline} (the baseline) has {len(rec.baseline_findings)} finding(s): {', '.join(rec.baseline_findings)}"
        )
        applies = [c.check_id for c in rec.cures if c.action == "apply"]
        for cure in rec.cures:  # an applicable fix's reason is the finding itself: said above
            detail = "" if cure.action == "apply" else f": {cure.reason}"
            lines.append(f"  {cure.check_id}: runtime fix {cure.action} ({cure.safety}){detail}")
        uncured = [f for f in rec.baseline_findings if f not in applies]
        if applies:
            unsafe = any(c.safety == "unsafe" for c in rec.cures if c.action == "apply")
            here = base is None or base.subject.installed or base.subject.tree is not None  # named by path
            where = "" if here else f" (on the host that runs {rec.baseline})"
            own = ["--apply", "--select", ",".join(applies), *(["--unsafe"] if unsafe else [])]
            lines.append(f"until you move{where}: {hint('fix', *own, user=baseline_options(advice))}")
        if uncured:
            lines.append(f"no runtime fix applies to {', '.join(uncured)} on {rec.baseline}")
    else:
        lines.append(f"{rec.baseline} (the baseline) has no findings for this deployment")
    if rec.earliest_clean is None:
        lines.append("no checked release is free of findings for this deployment")
    elif rec.upgrade_to is not None:
        lines.append(
            f"upgrade to sglang {rec.upgrade_to} or later: from there every checked release has no findings"
        )
        if rec.earliest_clean not in (rec.upgrade_to, rec.baseline):
            lines.append(f"({rec.earliest_clean} has none either, but a later release has findings again)")
    elif rec.earliest_clean != rec.baseline:
        lines.append(
            f"move to sglang {rec.earliest_clean}: the earliest checked release with no findings "
            "(a later one has findings again)"
        )
    for regression in rec.regressions:
        lines.append(
            f"regression: {regression.check_id} is a finding in {regression.release}, not in {regression.clean_in}"
        )
    return lines


def baseline_options(advice: Advice) -> UserOptions:
    return row_options(advice, advice.baseline_row)


def row_options(advice: Advice, row: Row | None) -> UserOptions:
    """The user's options for a command about ``row``'s release: a tree of their own
    (``--sglang-path``) is named; the installed sglang and a fetched release (on the host that runs
    it) are not."""
    if row is None or row.subject.tree is None:
        return advice.user
    return dataclasses.replace(advice.user, target=("--sglang-path", str(row.subject.tree)))


# ----- markdown -------------------------------------------------------------------------
def render_markdown(advice: Advice) -> str:
    checks, records = _columns(advice)
    columns = checks + ([f"catalog ({len(records)} records)"] if records else [])
    header = "| sglang | " + " | ".join(columns) + " | |"
    lines = [f"## npudoctor advise: {len(advice.rows)} release(s), depth {advice.depth}", "", header]
    lines.append("|" + " --- |" * (len(columns) + 2))
    for row in advice.rows:
        cells = []
        for check_id in checks:
            status = cell(row, check_id)
            cells.append(
                "-" if status is None else (f"**{_SHORT[status]}**" if status.severity else _SHORT[status])
            )
        if records:
            worst, which = catalog_cell(row, records)
            cells.append(
                "-" if worst is None else (f"**{_SHORT[worst]}**: " + ", ".join(which) if which else "ok")
            )
        note = markdown.cell(row.error) if row.error else ("installed" if row.subject.installed else "")
        lines.append(f"| {markdown.cell(row.subject.label)} | " + " | ".join(cells) + f" | {note} |")
    lines += ["", "### Recommendation", ""]
    lines += [f"- {markdown.cell(line.strip())}" for line in recommendation_lines(advice)]
    lines += [f"- note: {markdown.cell(note)}" for note in advice.notes]
    return "\n".join(lines) + "\n"


# ----- junit ----------------------------------------------------------------------------
def render_junit(advice: Advice) -> str:
    root = ET.Element("testsuites", {"name": "npudoctor advise"})
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for row in advice.rows:
        suite = ET.SubElement(root, "testsuite", {"name": junit.clean(f"sglang {row.subject.label}")})
        if row.report is None:  # a release that could not be had does not turn the build red by itself
            tally = {"tests": 1, "failures": 0, "errors": 0, "skipped": 1}
            case = ET.SubElement(
                suite, "testcase", {"classname": "npudoctor.service.advise", "name": "fetch and check"}
            )
            ET.SubElement(case, "skipped", {"message": junit.clean(row.error or "")})
        else:
            tally = junit.counts(row.report.results)
            for result in row.report.results:
                junit.testcase(suite, result, row_options(advice, row))
        suite.attrib.update({k: str(v) for k, v in tally.items()})
        for key in totals:
            totals[key] += tally[key]
    root.attrib.update({k: str(v) for k, v in totals.items()})
    return junit.document(root)


# ----- sarif ----------------------------------------------------------------------------
def render_sarif(advice: Advice) -> str:
    runs = []
    for row in advice.rows:
        if row.report is None:
            continue
        run = sarif.run_of(row.report)
        run["automationDetails"] = {"id": f"npudoctor-advise/sglang-{row.subject.label}/"}
        runs.append(run)
    return sarif.log(runs)


# ----- github ---------------------------------------------------------------------------
def render_github(advice: Advice) -> str:
    base = advice.baseline_row
    lines = []
    if base is not None and base.report is not None:
        lines.append(github.render(base.report, baseline_options(advice)).rstrip("\n"))
    summary = "\n".join(line.strip() for line in recommendation_lines(advice))  # a command ends its line
    lines.append(f"::notice title=npudoctor advise::{github.escape_data(summary)}")
    return "\n".join(lines) + "\n"


def write_step_summary(advice: Advice, path: str) -> None:
    """Append the Markdown matrix and recommendation to the job summary ``path``."""
    github.append_step_summary(render_markdown(advice), path)


def row_line(index: int, total: int, row: Row) -> str:
    """The progress line of one release (stderr, on a terminal and in CI logs)."""
    if row.report is None:
        outcome = f"not checked: {row.error}"
    elif row.findings:
        outcome = f"{len(row.findings)} finding(s): {', '.join(row.findings)}"
    else:
        outcome = "no findings"
    return f"[{index}/{total}] sglang {row.subject.label}: {outcome} ({row.seconds:.1f} s)"
