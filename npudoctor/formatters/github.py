"""GitHub Actions workflow commands, so a ``npudoctor check --format github`` step
annotates the run (and, with a location, the file and line) without any extra action.

One ``::error``/``::warning`` line per fail/error/warn result (``::notice`` instead when
an ignore entry covers it; pass and skip get no line), then one plain summary line. Values are escaped as the Actions
runner expects (``%`` and LF in the message, other controls as the text report shows them;
additionally ``:`` and ``,`` in properties): an unescaped newline would end the command early and let check text
inject workflow commands of its own. ``write_step_summary`` appends the Markdown table
to ``$GITHUB_STEP_SUMMARY`` for the job summary page.

Annotation paths are relative to the directory holding ``sglang/`` (as in every format);
in a workflow (``$GITHUB_WORKSPACE`` set) whose workspace holds that directory (an unpacked
wheel checked in CI), they are made relative to the workspace, so GitHub links the file.
"""

from __future__ import annotations

import os

from npudoctor.formatters import markdown
from npudoctor.formatters.advice import baseline_options, recommendation_lines
from npudoctor.results import Report, Result, Status
from npudoctor.service.advise import Advice
from npudoctor.service.hints import UserOptions, fix_hint
from npudoctor.terminal import printable

_COMMAND = {Status.FAIL: "error", Status.ERROR: "error", Status.WARN: "warning"}


def escape_data(value: object) -> str:
    """``value`` for a workflow command: control characters but newline shown escaped as the text
    report shows them (``npudoctor.terminal.printable``: a CR, C1's CSI or a bidirectional override
    would act on the log viewer or reorder what it shows), then ``%`` and newline as the runner
    reads them (an unescaped newline would end the command)."""
    return printable(str(value)).replace("%", "%25").replace("\n", "%0A")


def escape_property(value: object) -> str:
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def render(report: Report, user: UserOptions | None = None, verbose: bool = False) -> str:
    """``user``: the user's own options the fix hints repeat (None: those the report names).
    ``verbose`` is the text format's: this one says the same either way."""
    user = user if user is not None else UserOptions.of_report(report)
    prefix = _workspace_prefix(report.target.path)
    lines = [_annotation(r, user, prefix) for r in report.results if r.status in _COMMAND]
    lines.append(_summary(report))
    return "\n".join(lines) + "\n"


def _workspace_prefix(package_dir: str) -> str:
    """The tree root (the directory holding ``sglang/``) relative to ``$GITHUB_WORKSPACE``, with
    a trailing slash; empty outside a workflow or when the tree lies outside the workspace."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if not workspace or not package_dir:
        return ""
    root = os.path.dirname(os.path.realpath(package_dir))
    relative = os.path.relpath(root, os.path.realpath(workspace))
    if relative == os.curdir:
        return ""
    return "" if relative.startswith(os.pardir) else relative.replace(os.sep, "/") + "/"


def _annotation(result: Result, user: UserOptions, prefix: str = "") -> str:
    command = "notice" if result.ignored is not None else _COMMAND[result.status]
    properties = []
    first = result.evidence[0].location if result.evidence else None
    if first is not None:
        properties.append(f"file={escape_property(prefix + first.path)}")
        if first.line >= 1:
            properties.append(f"line={first.line}")
    properties.append(f"title={escape_property(f'{result.id} {result.title}')}")
    return f"::{command} {','.join(properties)}::{escape_data(_message(result, user))}"


def _message(result: Result, user: UserOptions) -> str:
    lines = []
    if result.ignored is not None:
        lines.append(f"ignored ({result.status.value}): {result.ignored}")
    lines.append(result.summary)
    if result.impact and result.status in (Status.FAIL, Status.WARN):
        lines.append(f"impact: {result.impact}")
    if result.error:
        lines.append(f"error: {result.error}")
    for evidence in result.evidence:
        where = f" at {evidence.location}" if evidence.location else ""
        lines.append(f"expected: {evidence.expected}; observed: {evidence.observed}{where}")
    fix = result.remediation
    if fix is not None and fix.fix_id:
        lines.append(f"fix: {fix_hint(fix.fix_id, user)}")
    return "\n".join(lines)


def _summary(report: Report) -> str:
    counts = report.counts()
    version = " ".join(str(report.target.version or "unknown").split())
    parts = ", ".join(f"{s.value}: {counts[s.value]}" for s in Status)
    ignored = sum(1 for r in report.results if r.ignored is not None)
    return (
        f"npudoctor: sglang {version}: {parts}; ignored: {ignored}; "
        f"{counts['findings']} finding(s) at or above '{report.fail_on.value}'"
    )


def write_step_summary(report: Report, path: str | os.PathLike[str]) -> None:
    """Append ``markdown.table(report)`` to ``path`` (the CLI passes ``$GITHUB_STEP_SUMMARY``)."""
    append_step_summary(markdown.table(report), path)


def append_step_summary(text: str, path: str | os.PathLike[str]) -> None:
    """Append ``text`` (Markdown) to the job summary file ``path``, after what earlier steps wrote."""
    with open(path, "a", encoding="utf-8", errors="backslashreplace") as handle:
        if handle.tell() > 0:
            handle.write("\n")
        handle.write(text)


def render_advice(advice: Advice) -> str:
    base = advice.baseline_row
    lines = []
    if base is not None and base.report is not None:
        lines.append(render(base.report, baseline_options(advice)).rstrip("\n"))
    summary = "\n".join(line.strip() for line in recommendation_lines(advice))  # a command ends its line
    lines.append(f"::notice title=npudoctor advise::{escape_data(summary)}")
    return "\n".join(lines) + "\n"


def write_advice_step_summary(advice: Advice, path: str | os.PathLike[str]) -> None:
    """Append the Markdown matrix and recommendation to the job summary ``path``."""
    append_step_summary(markdown.render_advice(advice), path)
