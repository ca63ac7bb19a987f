#!/usr/bin/env python3
"""Print the catalog as a Markdown table: id, upstream, what breaks, the releases that ship it
(derived from the wheels, as runs of consecutive releases), and the remedy.

    python scripts/catalog_table.py            # the table catalog/README.md holds
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from npudoctor.engine.catalog import all_records  # noqa: E402


def runs(record) -> str:
    """The affected releases as runs over every release derived (``0.5.6.post1..0.5.23``)."""
    spans = [run for run, _ in record.affected_runs()]
    return ", ".join(s[0] if len(s) == 1 else f"{s[0]}..{s[-1]}" for s in spans) or "none"


def short(url: str) -> str:
    match = re.search(r"github\.com/([^/]+)/([^/]+)/(?:pull|issues)/(\d+)", url)
    if not match:
        return url
    owner, repo, number = match.groups()
    prefix = "" if (owner, repo) == ("sgl-project", "sglang") else f"{owner}/{repo}"
    return f"[{prefix}#{number}]({url})"


def remedy(record) -> str:
    parts = []
    parts.append(f"upgrade to {record.first_fixed}" if record.first_fixed else "no fixed release")
    if record.remedy.flags or record.remedy.env:
        from npudoctor.deployment.workarounds import workaround_text

        parts.append("workaround: " + workaround_text(record.remedy.flags, record.remedy.env, []))
    if record.remedy.fix:
        parts.append(f"runtime fix {record.remedy.fix}")
    return "; ".join(parts)


def main() -> int:
    print("| id | title | upstream | impact | ships in (derived) | remedy |")
    print("|---|---|---|---|---|---|")
    for record in all_records():
        urls = dict.fromkeys(record.references.report + record.references.fix)
        upstream = ", ".join(short(u) for u in urls) or "-"
        title = record.title.replace("|", "\\|")
        print(
            f"| {record.id} | {title} | {upstream} | {record.impact.value} | {runs(record)} | {remedy(record)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
