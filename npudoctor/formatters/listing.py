"""``npudoctor list`` and ``npudoctor explain``: the checks, for a terminal or a pipe at 80 columns.

``list``: one line per check (id, what the release history says, title), then each upstream
URL whole on its own indented line. ``explain``: Markdown rendered by rich (headings, inline
code, lists): title, why it matters, when it bites, how to fix, the runtime fix, upstream; with
``full`` also what the check tests (its module docstring). The checks' texts are written with
RST-style ````code```` and hard-wrapped lines: they become Markdown code spans and re-flowed
paragraphs (blank-line breaks and list items kept).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from rich.console import Console, RenderableType
from rich.markdown import Markdown
from rich.text import Text

from npudoctor.engine.kinds import CheckKind
from npudoctor.formatters.layout import Rows, Trimmed, Uncropped, Whole, group, print_whole


def fixed_in_history(item, facts=None) -> str:
    """What ``npudoctor.target.history`` says for the check on the deployment of ``facts`` (None: any
    deployment): the first release from which every witness deployment of its kind holds the
    property, or that the newest still fails; what ``check``'s remediation reads too."""
    from npudoctor.deployment.facts import NO_DEPLOYMENT
    from npudoctor.target import history

    if item.kind is CheckKind.CATALOG:  # its own ranges, derived from the wheels
        if item.first_fixed:
            return f"fixed in {item.first_fixed}"
        return f"not fixed as of {item.newest_checked}" if item.releases["affected"] else "-"
    if not item.upstream_history:
        return "-"
    found = history.upstream(item.id, facts or NO_DEPLOYMENT, None)
    if found.fixed_in:
        return f"fixed in {found.fixed_in}"
    return f"not fixed as of {found.newest_checked}" if found.newest_checked else "-"


# --- list ------------------------------------------------------------------------------------


def list_renderable(checks: Sequence, facts=None) -> RenderableType:
    """One line per check, its title wrapped under its column, then its upstream URLs."""
    header = ([Text("check", "bold"), Text("upstream", "bold")], Text("title", "bold"))
    said = {c.id: fixed_in_history(c, facts) for c in checks}
    floors = (
        max([len("check")] + [len(c.id) for c in checks]),
        max(len(text) for text in said.values()),
    )
    parts: list[RenderableType] = [Rows([], header=header, min_widths=floors)]
    for item in checks:
        parts.append(Rows([([item.id, said[item.id]], item.title)], wrap=True, min_widths=floors))
        parts.extend(Whole(url, indent=floors[0] + 2) for url in item.upstream)
    return Uncropped(group(parts))


def print_list(console: Console, checks: Sequence, facts=None) -> None:
    print_whole(console, list_renderable(checks, facts))


# --- explain ---------------------------------------------------------------------------------


def explain_markdown(item, full: bool = False, facts=None) -> str:
    """The Markdown text of ``npudoctor explain``."""
    from npudoctor.patching.fixbase import fix_by_id
    from npudoctor.target import history

    lines = [f"## {item.id}: {_prose(item.title)}", ""]
    for heading, text in (
        ("Why it matters", item.why),
        ("When it bites", item.bites_when),
        ("How to fix", _capitalized(item.how_to_fix)),
    ):
        if text:
            lines += [f"### {heading}", "", _markdown(text), ""]
    if not item.kind.default_selected:
        lines += [f"Not in the default selection: runs with `--select {item.kind.prefix}` (or `ALL`).", ""]
    elif not getattr(item, "default_selected", True):
        lines += [f"Opt-in: not in the default selection; runs with `--select {item.id}` (or `ALL`).", ""]
    try:
        fix = fix_by_id(item.id)
    except KeyError:  # a check without a runtime fix (NPD000)
        fix = None
    if fix is not None:
        lines += [f"**Runtime fix** ({fix.safety.value}): {_prose(fix.title)}: {_prose(fix.provenance)}.", ""]
    answer = fixed_in_history(item, facts)
    witnesses = history.witness_deployments(item.id, facts) if item.upstream_history else []
    if item.upstream or answer != "-":
        lines += ["### Upstream", ""]
        lines += [f"- <{url}>" for url in item.upstream]
    if answer == "-":
        lines += ["- No verdict in the release history npudoctor checked." if item.upstream else "", ""]
    else:
        record = f"- Release history npudoctor checked: {_prose(answer)}"
        lines += [record + (f" (on {_prose(', '.join(witnesses))})." if witnesses else "."), ""]
    if item.kind is CheckKind.CATALOG:
        lines += _record_markdown(item, full)
        return "\n".join(lines)
    doc = (sys.modules[type(item).__module__].__doc__ or "").strip()
    if full and doc:
        lines += ["### What the check tests", "", _markdown(doc), ""]
    return "\n".join(lines)


def _record_markdown(record, full: bool) -> list[str]:
    """A catalog record's releases (derived from the wheels) and, with ``full``, how npudoctor tells."""
    affected = record.releases["affected"]
    lines = ["### Releases that ship it (derived from every wheel)", ""]
    lines += [f"- {_prose(', '.join(affected))}" if affected else "- none of the releases checked", ""]
    if record.notes:
        lines += [_markdown(record.notes), ""]
    if full:
        lines += ["### How npudoctor tells", ""]
        lines += [
            f"- Defective code: {_prose(record.defective.says)} ({_prose(', '.join(record.defective.symbols))})"
        ]
        if record.fixed is not None:
            lines += [
                f"- Fixed code: {_prose(record.fixed.says)} ({_prose(', '.join(record.fixed.symbols))})"
            ]
        lines += [f"- Bites when (per role): `{record.predicate_text}`", ""]
    return lines


def explain_renderable(item, full: bool = False, facts=None) -> RenderableType:
    return Trimmed(Markdown(explain_markdown(item, full, facts), hyperlinks=True))


def print_explain(console: Console, item, full: bool = False, facts=None) -> None:
    console.print(explain_renderable(item, full, facts))
    if not full:
        from npudoctor.service.hints import hint

        command = hint("explain", item.id, "--full")
        console.print(Text(f"\nalso what the check tests: {command}", style="dim"), soft_wrap=True)


_CODE = re.compile(r"``(.+?)``", re.DOTALL)
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SPECIAL = re.compile(r"([\\`*_\[\]<>#|])")


def _prose(text: str) -> str:
    """Plain text as Markdown: every character Markdown would read as syntax escaped."""
    return _SPECIAL.sub(r"\\\1", " ".join(text.split()))


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def _markdown(text: str) -> str:
    """A check's text (RST-style ````code````, hard-wrapped lines, Markdown-style ``**bold**`` and
    lists) as Markdown: ````x```` -> ```x```, each paragraph and list item re-flowed onto one line,
    ``<`` outside code escaped (never read as HTML)."""
    blocks = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        items: list[str] = []
        for line in paragraph.splitlines():
            if not items or _ITEM.match(line):
                items.append(line.strip())
            else:
                items[-1] += " " + line.strip()
        blocks.append("\n".join(_inline(item) for item in items))
    return "\n\n".join(blocks)


def _inline(text: str) -> str:
    """````code```` as a Markdown code span, ``<`` elsewhere escaped."""
    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(text[last : match.start()].replace("<", "\\<"))
        code = " ".join(match.group(1).split())
        out.append(f"`{code}`" if "`" not in code else f"`` {code} ``")
        last = match.end()
    out.append(text[last:].replace("<", "\\<"))
    return "".join(out)
