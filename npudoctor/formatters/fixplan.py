"""The runtime-fix plan (``npudoctor fix``, and the plan ``fix --apply`` records), for a terminal
or a CI log at 80 columns.

One line per fix: id, action (apply, not needed, refused), safety, and what it replaces (apply)
or why not (the others), cut to the width. Under each fix marked apply or refused: the reason,
word-wrapped; the functions it replaces; where the replacements come from, the pull request's
URL whole on its own line. ``verbose``: the same for every fix, and the sglang releases whose
code the fix matched. ``--status``'s rows likewise: a site's name is never split.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, RenderableType
from rich.text import Text

from npudoctor.formatters.layout import Para, Rows, Uncropped, Whole, group, print_whole

ACTION_STYLE = {"apply": "bold green", "not needed": "dim", "refused": "bold yellow"}
DETAIL_INDENT = 8  # under the action column


def renderable(planned: Sequence, verbose: bool = False) -> RenderableType:
    """The plan of ``fixing.plan`` (a list of ``Planned``)."""
    return Uncropped(_plan(planned, verbose))


def print_plan(console: Console, planned: Sequence, verbose: bool = False) -> None:
    print_whole(console, _plan(planned, verbose))


def _plan(planned: Sequence, verbose: bool) -> RenderableType:
    id_width = max([len("fix")] + [len(p.fix.id) for p in planned])
    floors = (id_width, len("not needed"), len("unsafe"))
    header = (
        [Text("fix", "bold"), Text("action", "bold"), Text("safety", "bold")],
        Text("replaces, or why not", "bold"),
    )
    parts: list[RenderableType] = [Rows([], header=header, min_widths=floors)]
    for p in planned:
        action = p.decision.action.value
        cells = [p.fix.id, Text(action, style=ACTION_STYLE.get(action, "")), p.fix.safety.value]
        parts.append(Rows([(cells, _gist(p))], min_widths=floors))
        if verbose or action != "not needed":
            parts.extend(_details(p, verbose))
    return group(parts)


def _sites(p) -> list[str]:
    return [site.partition(":")[2] or site for site in (p.decision.installs or p.fix.replaces)]


def _gist(p) -> str:
    """The row's tail: what an applied fix replaces, else the reason without the leading fix id."""
    if p.decision.action.value == "apply":
        return "replaces " + ", ".join(_sites(p))
    reason = p.decision.reason
    prefix = f"{p.fix.id} "
    return reason[len(prefix) :] if reason.startswith(prefix) else reason


def _details(p, verbose: bool) -> list[RenderableType]:
    indent = DETAIL_INDENT
    parts: list[RenderableType] = [Para(p.decision.reason, indent=indent)]
    parts.append(Para(", ".join(_sites(p)), indent=indent, lead=Text("replaces: ", style="dim")))
    if p.fix.upstream:
        parts.append(Whole(Text.assemble(("port of ", "dim"), p.fix.upstream), indent=indent))
    if p.fix.own:
        lead = Text("npudoctor's own fix (no upstream pull request): ", style="dim")
        parts.append(Para(Text.assemble(lead, p.fix.own), indent=indent))
    if verbose and p.decision.release:
        parts.append(Para(f"matches the code of sglang {p.decision.release}", indent=indent))
    return parts


def print_status_rows(console: Console, rows: Sequence) -> None:
    """``fix --status``'s rows (``recordedfixes.SiteStatus``): id, state, and the detail word-wrapped under
    its column; a site (``module:Class.method``) wider than the rest of the line stays whole."""
    cells = [([row.fix_id, Text(row.state, style="bold")], row.detail) for row in rows]
    print_whole(console, Rows(cells, wrap=True, indent=2))


def print_apply_hint(console: Console, planned: Sequence, apply_command: str) -> None:
    """After a plan that changed nothing: ``apply_command``, the ``npudoctor fix --apply`` with the
    user's own options (``npudoctor.service.hints.hint``; one line, never wrapped), or that
    nothing would be applied."""
    if not any(p.decision.action.value == "apply" for p in planned):
        print_whole(
            console,
            Para("nothing changed; no fix is marked apply, so --apply would record none"),
        )
        return
    print_whole(
        console, Para("nothing changed; this records the fixes marked apply:"), Whole(apply_command, indent=2)
    )


def print_uncured(console: Console, uncured: Sequence) -> None:
    r"""The findings no runtime fix cures (``operations.uncured``, ``Result``\ s): the gate stays red
    on them after ``--apply``. Each: id, impact and title, then what cures it (the release that fixes
    it, the workaround), word-wrapped."""
    if not uncured:
        return
    parts: list[RenderableType] = [
        Para(
            f"no runtime fix cures {len(uncured)} finding(s): `npudoctor check` stays red (exit 1) until "
            "you upgrade or apply the workaround each names:"
        )
    ]
    for result in uncured:
        lead = Text.assemble((result.id, "bold"), " ", (result.impact or "", "dim"), "  ")
        parts.append(Para(result.title, indent=2, lead=lead))
        if result.remediation is not None and result.remediation.advice:
            parts.append(Para(result.remediation.advice, indent=DETAIL_INDENT))
    print_whole(console, *parts)
