"""What every format of ``npudoctor advise`` shares: the columns of the release x check matrix
(the checks one each, the catalog records one for all), a catalog cell, the recommendation in
plain sentences, the user's options a release's command repeats, and the progress line of a
release.

Each format renders the same ``Advice`` in its own module (``render_advice``, the registry in
``npudoctor.formatters``): ``text`` (rich, fits 80 columns: one short cell per check), ``json``
(one ``check`` report per release, plus the recommendation), ``markdown`` (for a pull request),
``junit`` (one test suite per release, the checks as its test cases), ``sarif`` (one run per
checked release, so a code-scanning view can tell releases apart) and ``github`` (annotations for
the baseline's findings, one notice with the recommendation, and the Markdown in
``$GITHUB_STEP_SUMMARY`` when set).
"""

from __future__ import annotations

import dataclasses

from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Status
from npudoctor.service.advise import Advice, Row, cell
from npudoctor.service.hints import UserOptions, hint

SHORT = {
    Status.PASS: "pass",
    Status.SKIP: "skip",
    Status.WARN: "WARN",
    Status.FAIL: "FAIL",
    Status.ERROR: "ERROR",
}


def matrix_columns(advice: Advice) -> tuple[list[str], list[str]]:
    """The checks, one column each, and the catalog records, one column for all of them."""
    records = [i for i in advice.check_ids if CheckKind.of(i) is CheckKind.CATALOG]
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
            here = (
                base is None or base.candidate.installed or base.candidate.tree is not None
            )  # named by path
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
    if row is None or row.candidate.tree is None:
        return advice.user
    return dataclasses.replace(advice.user, target=("--sglang-path", str(row.candidate.tree)))


def row_line(index: int, total: int, row: Row) -> str:
    """The progress line of one release (stderr, on a terminal and in CI logs)."""
    if row.report is None:
        outcome = f"not checked: {row.error}"
    elif row.findings:
        outcome = f"{len(row.findings)} finding(s): {', '.join(row.findings)}"
    else:
        outcome = "no findings"
    return f"[{index}/{total}] sglang {row.candidate.label}: {outcome} ({row.seconds:.1f} s)"
