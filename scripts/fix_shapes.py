#!/usr/bin/env python3
"""Print the ``written_for`` table of a fix: the shape of its sites in real sglang releases.

    python scripts/fix_shapes.py NPD001 0.5.9 0.5.10 0.5.11 0.5.12
    python scripts/fix_shapes.py NPD004 0.5.13+cp-gap=/tmp/cp-gap-tree   # a source state no wheel ships

Run it when a fix is written or extended to another release, after checking that the
fix's replacements are right for that release's code; paste the output into the fix
module. ``tests/patching/test_fixes.py`` (``test_written_for_matches_the_real_releases``) checks
the table against the real releases.
"""

from __future__ import annotations

import argparse
import pprint
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_sglang import fetch  # noqa: E402

from npudoctor.patching.fixbase import fix_by_id  # noqa: E402
from npudoctor.target.discovery import discover  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fix_id")
    parser.add_argument("versions", nargs="+", help="release versions, or LABEL=TREE for a source tree")
    args = parser.parse_args()
    fix = fix_by_id(args.fix_id.upper())
    table: dict[str, dict[str, str]] = {}
    for spec in args.versions:
        version, _, path = spec.partition("=")
        shape = fix.shape_of_source(discover(path or fetch(version)).tree)
        same = next((label for label, known in table.items() if known == shape), None)
        if same is None:
            table[version] = shape
        else:  # releases that ship the same code share one entry
            table[f"{same}, {version}"] = table.pop(same)
    print("written_for = " + pprint.pformat(table, width=110, sort_dicts=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
