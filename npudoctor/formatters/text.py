"""Human-readable report of ``npudoctor check``, for a terminal, a pipe or a CI log (80 columns).

Compact by default, to fit one screen (a deployment with four findings in 40 rows of 80 columns):
a short header (npudoctor and sglang versions, the tree's path, the deployment); one line per
check without a finding (id, status, depth, and its title, or for a skip why it does not apply,
checks skipped for the same reason on one line; the catalog records that pass or cannot bite
folded into one line); then each finding (fail, warn, error) and each ignored result in a few
lines: ``ID STATUS  title``, its most telling piece of evidence on one line (``path:line:
observed``), and what cures it on one line (the runtime fix, the release that fixes it, the
workaround in the deployment's own form). The report ends the way ruff's does, so that the last
screen says what to do (``_footer``): the verdict, the one ``npudoctor fix`` command for every
runtime fix, the release that fixes every finding (or what no release fixes), and ``npudoctor
explain ID`` for the full text. ``verbose`` gives every result's details (summary, notes, every
piece of evidence, the advice in full) and the live depth's full statistics, then the same end.

Lines fit the width (``npudoctor.formatters.layout``) but a word is never split: a path, a URL
or the ``npudoctor fix`` command stays whole, on a line of its own when it must. A catalog
workaround's launch command is a command too: on a line of its own, whole.

``advise`` in text (``render_advice``, ``print_advice``): the release x check matrix, one short
cell per check, then the recommendation, its commands never wrapped.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from npudoctor.deployment.workarounds import command_of
from npudoctor.engine.kinds import CheckKind
from npudoctor.formatters.advice import SHORT, catalog_cell, matrix_columns, recommendation_lines
from npudoctor.formatters.layout import (
    Gist,
    Labelled,
    Para,
    Rows,
    Trimmed,
    Whole,
    group,
    print_whole,
)
from npudoctor.results import DEFAULT_FAILING, Evidence, Impact, Report, Result, Status
from npudoctor.service.advise import Advice, Row, cell
from npudoctor.service.hints import UserOptions, fix_hint
from npudoctor.terminal import TerminalConsole

STYLE = {
    Status.PASS: "green",
    Status.SKIP: "dim",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
}

WIDTH = 80  # of ``render``: the default width of a pipe or a CI log
INDENT = 2


def render(report: Report, user: UserOptions | None = None, verbose: bool = False) -> str:
    """Plain text (no colour) for files and pipes, ``WIDTH`` columns."""
    buffer = io.StringIO()
    console = TerminalConsole(file=buffer, width=WIDTH, no_color=True, highlight=False, color_system=None)
    print_whole(console, _parts(report, verbose, user))
    return buffer.getvalue()


def print_report(
    console: Console, report: Report, user: UserOptions | None = None, verbose: bool = False
) -> None:
    """The report on ``console``. ``user``: the user's own target and deployment options
    (``npudoctor.service.hints.UserOptions``), repeated in each ``npudoctor fix --select ID ...``
    hint; None: the ``--sglang-path`` and ``--config`` the report itself names. Lines longer than
    the width (a long path, the fix command) are printed whole, not cropped (``layout.Uncropped``)."""
    print_whole(console, _parts(report, verbose, user))


def _parts(report: Report, verbose: bool, user: UserOptions | None) -> RenderableType:
    args = user if user is not None else UserOptions.of_report(report)
    body = _full(report, args) if verbose else _compact(report, args)
    return group([*body, *_footer(report, args)])


def _full(report: Report, user: UserOptions) -> list[RenderableType]:
    """``--verbose``: one row per result, then every result's details, the live depth in full."""
    parts: list[RenderableType] = [*_header(report), Text(""), _summary_rows(list(report.results))]
    for result in report.results:
        parts.append(Text(""))
        parts.extend(_details(result, user))
    parts.append(Text(""))
    parts.extend(_live(report.live, True))
    return parts


def _compact(report: Report, user: UserOptions) -> list[RenderableType]:
    """The default report: the checks without a finding one line each, then each finding in a few
    lines (``_finding``)."""
    focus = [r for r in report.results if _in_focus(r)]
    quiet = [r for r in report.results if _quiet_record(r)]
    listed = [r for r in report.results if r not in focus and r not in quiet]
    parts: list[RenderableType] = [*_header(report)]
    if listed or quiet:
        parts += [Text(""), _overview(listed, quiet)]
    if focus:
        parts.append(Text(""))
        for result in focus:
            parts.extend(_finding(result))
    # what the run cost and which results carry notes, together under the findings
    after = _live(report.live, False)
    noted = [r.id for r in report.results if r.assumptions and r not in quiet]
    if noted and report.deployment.get("source", "none") != "none":  # else the header says what is assumed
        after.append(Para(", ".join(noted), lead=Text("notes (--verbose shows them): ", style="dim")))
    if after:
        parts += [Text(""), *after]
    return parts


def _in_focus(result: Result) -> bool:
    """A result the compact report details: a finding, a warning or error, or one an ignore entry
    accepted (the report says why)."""
    return result.status in (Status.FAIL, Status.WARN, Status.ERROR) or result.ignored is not None


def _overview(results: list[Result], quiet: list[Result]) -> Rows:
    """One row per check without a finding: a pass with its title; a skip with why it does not
    apply, the checks skipped for the same reason in one row (``NPD002, NPD004  SKIP  ...``)."""
    entries: list[Result | tuple[str, str]] = []  # a result, or the (reason, depth) of skips
    skipped: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        if result.status is not Status.SKIP:
            entries.append(result)
            continue
        key = (_skip_reason(result), result.depth.value)
        if key not in skipped:
            entries.append(key)
        skipped.setdefault(key, []).append(result)
    rows: list[tuple[list, str | Text]] = []
    for entry in entries:
        if isinstance(entry, Result):
            rows.append(([entry.id, _status(entry), entry.depth.value], entry.title))
        else:
            same = skipped[entry]
            rows.append(([", ".join(r.id for r in same), _status(same[0]), entry[1]], entry[0]))
    if quiet:
        rows.append(_quiet_row(quiet))
    header = ([Text("check", "bold"), Text("status", "bold"), Text("depth", "bold")],
              Text("title (SKIP: why not)", "bold"))  # fmt: skip
    return Rows(rows, header=header, max_widths=(8,))


def _skip_reason(result: Result) -> str:
    """Why a check does not apply, short: its summary's first clause (what follows ``: `` explains
    it); ``--verbose`` and the JSON report say it all."""
    return result.summary.split(": ", 1)[0]


def _finding(result: Result) -> list[RenderableType]:
    """A finding in a few lines: status, id and title; the most telling piece of evidence; what
    cures it."""
    heading = Text.assemble((result.id, "bold"), " ", _status(result), *_impact(result), "  ")
    parts: list[RenderableType] = [Gist(heading, result.title)]
    evidence = result.evidence[0] if result.evidence else None
    if result.error:
        parts.append(Gist(Text("error: ", style="dim"), result.error, indent=INDENT))
    elif evidence is not None and evidence.location is not None:
        where = Text(f"{evidence.location.path}:{evidence.location.line}", style="cyan")
        parts.append(Gist(where, ": " + (evidence.observed or evidence.expected), indent=INDENT))
    elif evidence is not None:
        said = ("observed: ", evidence.observed) if evidence.observed else ("expected: ", evidence.expected)
        parts.append(Gist(Text(said[0], style="dim"), said[1], indent=INDENT))
    else:
        parts.append(Gist("", result.summary, indent=INDENT))
    if result.ignored is not None:
        parts.append(
            Gist(Text("ignored: ", style="dim"), result.ignored or "(no reason given)", indent=INDENT)
        )
    parts.extend(_cure(result))
    return parts


def _cure(result: Result) -> list[RenderableType]:
    """What cures a finding, on one line: the runtime fix (its command ends the report), the release
    that fixes it upstream, a catalog record's workaround in the deployment's form (a launch
    command whole on its own line); else the advice."""
    fix = result.remediation
    if fix is None:
        return []
    said = []
    if fix.fix_id:
        said.append(f"runtime fix {fix.fix_id} (command below)")
    if fix.upstream:
        said.append(fix.upstream)
    command = ""
    if fix.workaround and not fix.fix_id:
        workaround, command = command_of(fix.workaround)
        said.append(f"workaround: {workaround}")
    if not said:
        advice, command = command_of(fix.advice)
        said.append(advice)
    parts: list[RenderableType] = [Para("; ".join(said), indent=INDENT)]
    if command:  # a catalog workaround's launch command: to paste, whole
        parts.append(Whole(command, indent=INDENT))
    return parts


def _footer(report: Report, user: UserOptions) -> list[RenderableType]:
    """The end of the report, as ruff ends its own: the verdict; the findings a runtime fix cures and
    the one command for all of them; the release that fixes every finding (or which none fixes);
    the findings left to a workaround; where the full text is."""
    findings = report.findings()
    parts: list[RenderableType] = [Text(""), Para(_closing(report))]
    if not findings:
        return parts
    fix_ids = list(
        dict.fromkeys(r.remediation.fix_id for r in findings if r.remediation and r.remediation.fix_id)
    )
    if fix_ids:
        parts.append(
            Para(f"{len(fix_ids)} fixable at run time ({', '.join(fix_ids)}); the plan, then --apply:")
        )
        parts.append(Whole(fix_hint(fix_ids, user), indent=INDENT))
    remedies = [r.remediation for r in findings if r.remediation is not None]
    upgrade = next((fix.upgrade_to for fix in remedies if fix.upgrade_to), None)  # one for the deployment
    cured = [r.id for r in findings if r.remediation and r.remediation.upgrade_to]
    worked = [
        r.id for r in findings if r.remediation and r.remediation.workaround and not r.remediation.fix_id
    ]
    until = f" (workaround above: {', '.join(worked)})" if worked else ""
    if upgrade:
        which = f"all {len(findings)}" if len(cured) == len(findings) else ", ".join(cured)
        parts.append(Para(f"upgrade: sglang {upgrade} or later fixes {which}{until}"))
    unfixed: dict[str, list[str]] = {}  # by the newest release checked
    for r in findings:
        if r.remediation and r.remediation.unfixed_as_of:
            unfixed.setdefault(r.remediation.unfixed_as_of, []).append(r.id)
    for newest, ids in unfixed.items():
        parts.append(Para(f"not fixed upstream as of sglang {newest}: {', '.join(ids)}"))
    if worked and not upgrade:
        parts.append(Para(f"workaround above for {', '.join(worked)}"))
    parts.append(Para(Text.assemble("full text of a finding: ", f"npudoctor explain {findings[0].id}")))
    return parts


def _impact(result: Result) -> tuple:
    """`` leak`` after a finding's status: what the defect does (crash, wrong output, leak,
    performance), which decides whether the gate fails on it."""
    if result.impact and result.status in (Status.FAIL, Status.WARN):
        return (" ", (result.impact, "dim"))
    return ()


def _header(report: Report) -> list[RenderableType]:
    target = report.target
    first = Text.assemble(
        ("npudoctor", "bold"),
        f" {report.tool_version}  " if report.tool_version else "  ",
        ("sglang", "bold"),
        f" {target.version or 'unknown version'}",
        f"  depth {report.depth}",
    )
    lines = [
        Para(first),
        Labelled(Text("sglang:", style="dim"), target.path),
        Labelled(Text("deployment:", style="dim"), _deployment(report.deployment)),
    ]
    from_shell = report.deployment.get("env_from_shell") or []
    if from_shell:  # the deployment's environment starts from the shell's (deployment.shell_env)
        lines.append(Para(Text.assemble(("env from the shell:", "dim"), " " + ", ".join(from_shell))))
    if report.recorded_fixes:  # `fix --apply`'s record beside the target: the verdicts say how they took it
        lines.append(Para(report.recorded_fixes["line"], lead=Text("fix record: ", style="dim")))
    if target.unread:  # files of the tree npudoctor does not read (npudoctor.static.source.read_source)
        lines.append(Para("; ".join(target.unread), lead=Text("not read: ", style="dim")))
    return lines


def _deployment(deployment: dict) -> str:
    source = str(deployment.get("source", "none"))
    if source.startswith("yaml:"):
        return source[len("yaml:") :]
    return {
        "command": "the launch command",
        "flags": "--model-path and flags",
        "none": "none (each check assumes the worst case)",
    }.get(source, source)


def _status(result: Result) -> Text:
    label = Text(result.status.value.upper(), style=STYLE[result.status])
    if result.ignored is not None:
        label.append(" ignored", style="dim")
    return label


def _quiet_record(result: Result) -> bool:
    """A catalog record (``NPC###``, ``npudoctor.engine.catalog``) that passes or cannot be triggered
    and no ignore entry touched: one line for all of them in the compact report."""
    return (
        CheckKind.of(result.id) is CheckKind.CATALOG
        and result.status in (Status.PASS, Status.SKIP)
        and result.ignored is None
    )


def _summary_rows(results: list[Result]) -> Rows:
    rows = [([result.id, _status(result), result.depth.value], result.title) for result in results]
    header = ([Text("check", "bold"), Text("status", "bold"), Text("depth", "bold")], Text("title", "bold"))
    return Rows(rows, header=header, max_widths=(8,))


def _quiet_row(quiet: list[Result]) -> tuple[list, str]:
    counts = {s: sum(r.status is s for r in quiet) for s in (Status.SKIP, Status.PASS)}
    said = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    return (
        [CheckKind.CATALOG.heading, Text("-", style="dim"), "static"],
        f"{len(quiet)} more catalog records: {said} (--verbose lists them)",
    )


def _details(result: Result, user: UserOptions) -> list[RenderableType]:
    """``--verbose``: a result in full: summary, error, notes, every piece of evidence, the fix
    command, the release, the advice."""
    heading = Text.assemble((result.id, "bold"), " ", _status(result), *_impact(result), "  ")
    parts: list[RenderableType] = [Para(result.summary, lead=heading, max_hang=22)]
    if result.error:
        parts.append(Para(result.error, indent=INDENT, lead=Text("error: ", style="dim")))
    for note in result.assumptions:
        parts.append(Para(note, indent=INDENT, lead=Text("note: ", style="dim")))
    for evidence in result.evidence:
        parts.extend(_evidence(evidence))
    if result.ignored is not None:
        parts.append(
            Para(result.ignored or "(no reason given)", indent=INDENT, lead=Text("ignored: ", "dim"))
        )
    fix = result.remediation
    if fix is not None:
        if fix.fix_id:
            parts.append(Whole(Text.assemble(("fix: ", "bold"), fix_hint(fix.fix_id, user)), indent=INDENT))
        if fix.upstream:
            parts.append(Para(fix.upstream, indent=INDENT))
        if fix.advice:
            advice, command = command_of(fix.advice)
            parts.append(Para(advice, indent=INDENT))
            if command:  # a catalog workaround's launch command: to paste, whole
                parts.append(Whole(command, indent=INDENT))
    return parts


def _evidence(evidence: Evidence) -> list[RenderableType]:
    """``- path:line (symbol)`` then expected and observed under it; with no location the
    expectation goes on the bullet line (never an empty bullet)."""
    items = [
        (label, value) for label, value in (("expected", evidence.expected), ("observed", evidence.observed))
    ]
    items = [(label, value) for label, value in items if value]
    parts: list[RenderableType] = []
    if evidence.location is not None:
        parts.append(Para(Text(str(evidence.location), style="cyan"), indent=INDENT, lead="- "))
    elif not items:
        return parts
    for number, (label, value) in enumerate(items):
        bullet = "- " if evidence.location is None and number == 0 else "  "
        parts.append(Para(value, indent=INDENT, lead=Text.assemble(bullet, (f"{label}: ", "dim"))))
    return parts


def _live(live: dict | None, verbose: bool) -> list[RenderableType]:
    if live is None:
        return []
    if not live.get("ran"):
        reason = [Para(str(live.get("reason", "")), lead="live depth not run: ")]
        if live.get("prepare"):  # the one hint: a command to paste, never wrapped
            reason.append(Whole(Text.assemble(("prepare it: ", "bold"), live["prepare"]), indent=INDENT))
        return reason
    kept = (
        " (kept from an earlier identical run; NPUDOCTOR_NO_CACHE=1 runs it again)"
        if live.get("from_cache")
        else ""
    )
    parts: list[RenderableType] = [
        Para(
            f"live depth: sglang imported in {live['import_seconds']} s ({live['import_rss_mb']:.0f} MB), "
            f"peak RSS {live['peak_rss_mb']:.0f} MB{kept}"
        )
    ]
    stood_in, not_run, fixes = live.get("stood_in") or {}, live.get("not_run") or {}, live.get("fixes") or {}
    if verbose:
        probes = live.get("probe_seconds") or {}
        if probes:
            seconds = ", ".join(f"{check_id} {t} s" for check_id, t in probes.items())
            parts.append(Para(seconds, indent=INDENT, lead="probes: "))
        for module, check_id in stood_in.items():
            parts.append(
                Para(
                    f"{module} (not installed here; imported by {check_id})", indent=INDENT, lead="stood in: "
                )
            )
        for check_id, reason in not_run.items():
            parts.append(Para(f"{check_id}: {reason}", indent=INDENT, lead="not run: "))
    else:
        if stood_in:
            parts.append(Para(", ".join(stood_in), indent=INDENT, lead="stood in (not installed here): "))
        if not_run:
            parts.append(Para(", ".join(not_run), indent=INDENT, lead="live probe not run: "))
    for fix_id, outcome in fixes.items():
        parts.append(Para(f"{fix_id}: {outcome}", indent=INDENT, lead="with fix "))
    return parts


def _closing(report: Report) -> Text:
    counts = report.counts()
    ignored = {s: sum(1 for r in report.results if r.status is s and r.ignored is not None) for s in Status}
    line = Text()
    for status in Status:
        if counts[status.value]:
            if line:
                line.append("  ")
            line.append(f"{status.value}: {counts[status.value]}")
            if ignored[status]:
                line.append(f" ({ignored[status]} ignored)")
    line.append("  -  ")
    threshold = f"at or above '{report.fail_on.value}'" + _escalated(report)
    if counts["findings"]:
        line.append(f"{counts['findings']} finding(s) {threshold}", style="bold red")
    else:
        line.append(f"no findings {threshold}", style="green")
    return line


def _escalated(report: Report) -> str:
    """The impacts ``--fail-on`` made fail beyond the default (crashes and silent wrong output)."""
    extra = [i for i in report.failing_impacts if Impact(i) not in DEFAULT_FAILING]
    return f" ({', '.join(extra)} failing)" if extra else ""


# ----- advise: the release x check matrix and the recommendation -------------------------
ADVICE_WIDTH = 100  # of ``render_advice`` (a file or a pipe): wider than a report's, for the matrix


def render_advice(advice: Advice) -> str:
    buffer = io.StringIO()
    print_advice(TerminalConsole(file=buffer, width=ADVICE_WIDTH, no_color=True, highlight=False), advice)
    return buffer.getvalue()


def print_advice(console: Console, advice: Advice) -> None:
    """The matrix, then the recommendation, whose lines are never wrapped: a command stays one
    line to copy, however narrow the terminal."""
    console.print(_advice_renderable(advice))
    for line in recommendation_lines(advice):
        console.print(Text(f"  {line}"), soft_wrap=True)


class _Matrix:
    """The release x check matrix where it fits the width (no vertical rules and no edges: the deep
    checks, the catalog and the marks fit 80 columns); where it does not (more checks, ``--select
    NPP``; long release labels), one line per release naming the checks that are not pass or skip,
    so that no header is cut to ``NPD0...``. No line ends in blanks."""

    def __init__(self, advice: Advice) -> None:
        self.advice = advice

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = _advice_table(self.advice)
        if console.measure(table, options=options.update(width=1 << 16)).maximum <= options.max_width:
            yield Trimmed(table)
        else:
            yield _release_rows(self.advice)


def _release_rows(advice: Advice) -> Rows:
    checks, records = matrix_columns(advice)
    rows = []
    for row in advice.rows:
        said, counts = [], {}
        for check_id in checks:
            status = cell(row, check_id)
            if status is not None and status.severity:
                said.append(f"{check_id} {SHORT[status]}")
            elif status is not None:
                counts[status.value] = counts.get(status.value, 0) + 1
        worst, which = catalog_cell(row, records) if records else (None, [])
        if which:
            said.append(f"{', '.join(which)} {SHORT[worst]}")
        others = [f"{n} {status}" for status, n in counts.items()]
        if records and worst is not None and not which:
            others.append("catalog ok")
        said.append(", ".join(others))
        marks = ", ".join(_marks(advice, row))
        rows.append(
            ([row.candidate.label], "; ".join(s for s in said if s) + (f" ({marks})" if marks else ""))
        )
    header = ([Text("sglang", "bold")], Text("checks that are not pass or skip; the others counted", "bold"))
    return Rows(rows, header=header, wrap=True)


def _marks(advice: Advice, row: Row) -> list[str]:
    marks = []
    if row.candidate.installed:
        marks.append("installed")
    if row.candidate.label == advice.recommendation.baseline and not row.candidate.installed:
        marks.append("baseline")
    if row.error is not None:
        marks.append("not checked")
    elif row.candidate.label == advice.recommendation.earliest_clean:
        marks.append("earliest clean")
    return marks


def _advice_renderable(advice: Advice) -> RenderableType:
    parts: list[RenderableType] = [
        Text(f"npudoctor advise: {len(advice.rows)} release(s), depth {advice.depth}", style="bold"),
        _Matrix(advice),
    ]
    unchecked = [row for row in advice.rows if row.error is not None]
    if unchecked:
        parts.append(Text("Not checked:", style="bold"))
        parts.extend(Text(f"  {row.candidate.label}: {row.error}") for row in unchecked)
    for note in advice.notes:
        parts.append(Text(f"note: {note}"))
    parts.append(Text("Recommendation:", style="bold"))
    return Group(*parts)


def _advice_table(advice: Advice) -> Table:
    checks, records = matrix_columns(advice)
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    table.add_column("sglang", no_wrap=True)
    for check_id in checks:
        table.add_column(check_id, no_wrap=True)
    if records:
        table.add_column(CheckKind.CATALOG.heading, no_wrap=True)  # the catalog: the records it flags
    table.add_column("", no_wrap=True)
    for row in advice.rows:
        cells = []
        for check_id in checks:
            status = cell(row, check_id)
            cells.append("-" if status is None else f"[{STYLE[status]}]{SHORT[status]}[/]")
        if records:
            worst, which = catalog_cell(row, records)
            text = (
                "-"
                if worst is None
                else (
                    "ok" if not which else (which[0] if len(which) == 1 else f"{len(which)} {SHORT[worst]}")
                )
            )
            cells.append(text if worst is None else f"[{STYLE[worst]}]{escape(text)}[/]")
        table.add_row(escape(row.candidate.label), *cells, ", ".join(_marks(advice, row)))
    return table
