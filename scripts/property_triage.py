#!/usr/bin/env python3
"""Run the generic properties (NPP*) over every PyPI release x every example deployment and print
what they find, for triage: each finding is either a real defect (recorded in
``tests/data/properties/<id>.yaml`` with its evidence, and catalogued) or a false alarm (then the
property is fixed). ``--check`` compares the findings with those files and exits 1 on a finding
no file triages, so the sweep is a regression test of "zero false alarms".

    python scripts/property_triage.py                      # every NPP check, 0.5.8 .. newest
    python scripts/property_triage.py --select NPP001 --releases 0.5.13 0.5.23
    python scripts/property_triage.py --check              # exit 1 on an untriaged finding
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import fetch_sglang  # noqa: E402

SINCE = "0.5.8"
TRIAGE = REPO / "tests" / "data" / "properties"


def examples() -> list[Path]:
    """examples/*.yaml and the deployments kept for the triage alone (tests/data/properties/deployments)."""
    return sorted((REPO / "examples").glob("*.yaml")) + sorted((TRIAGE / "deployments").glob("*.yaml"))


def findings_for(version: str, ids: list[str], example_paths: list[Path]) -> list[dict]:
    """Every finding (fail or warn evidence) of the selected properties on one release, per example."""
    from npudoctor.deployment.load import from_yaml
    from npudoctor.engine.kinds import CheckKind
    from npudoctor.engine.registry import all_checks
    from npudoctor.target.discovery import discover

    target = discover(fetch_sglang.fetch(version) / "sglang")
    checks = [c for c in all_checks() if c.kind is CheckKind.PROPERTY and (not ids or c.id in ids)]
    rows = []
    for example in example_paths:
        facts = from_yaml(example).facts
        for check in checks:
            if check.out_of_scope(facts) is not None:
                continue
            probe = check.static(target, facts)
            if probe.status.value not in ("fail", "warn"):
                continue
            for evidence in probe.evidence or (None,):  # a finding without evidence: its summary
                rows.append(
                    {
                        "release": version,
                        "example": example.name,
                        "check": check.id,
                        "status": probe.status.value,
                        "where": str(evidence.location) if evidence and evidence.location else "",
                        "observed": evidence.observed if evidence else probe.summary,
                        "expected": evidence.expected if evidence else "",
                    }
                )
    target.release()
    return rows


def triaged() -> dict[str, list[dict]]:
    """check id -> its triage entries (each with a ``where`` pattern and a verdict)."""
    found = {}
    for path in sorted(TRIAGE.glob("NPP*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        found[path.stem] = list(data.get("findings") or [])
    return found


def is_triaged(row: dict, entries: list[dict]) -> bool:
    for entry in entries:
        if re.search(entry["where"], row["where"] or row["observed"]) and row["release"] in _releases(entry):
            return True
    return False


def _releases(entry: dict) -> list[str]:
    from npudoctor.target.releases import published_releases

    listed = entry.get("releases")
    if isinstance(listed, list):
        return listed
    first, _, last = str(listed).partition("..")
    every = published_releases("0.4.10", fetch_sglang.cache_dir())
    last = last or first
    return every[every.index(first) : every.index(last) + 1]


def main() -> int:
    from npudoctor.target.releases import published_releases

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--select", nargs="*", default=[], help="property ids (default: every NPP check)")
    parser.add_argument(
        "--releases", nargs="*", help=f"releases (default: {SINCE} .. newest, posts included)"
    )
    parser.add_argument(
        "--examples",
        nargs="*",
        type=Path,
        help="deployments (default: examples/*.yaml and tests/data/properties/deployments/*.yaml)",
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 on a finding no triage file names")
    args = parser.parse_args()
    releases = args.releases or published_releases(SINCE, fetch_sglang.cache_dir())
    example_paths = args.examples or examples()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        per_release = list(
            pool.map(findings_for, releases, [args.select] * len(releases), [example_paths] * len(releases))
        )
    rows = [row for rows in per_release for row in rows]
    entries = triaged()
    untriaged = [r for r in rows if not is_triaged(r, entries.get(r["check"], []))]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        grouped: dict[tuple, list[str]] = {}
        for row in rows:
            key = (row["check"], row["status"], row["where"], row["observed"])
            grouped.setdefault(key, []).append(f"{row['release']}:{row['example']}")
        for (check, status, where, observed), seen in sorted(grouped.items()):
            mark = (
                ""
                if is_triaged(
                    {"where": where, "observed": observed, "release": seen[0].split(":")[0]},
                    entries.get(check, []),
                )
                else "  [untriaged]"
            )
            releases_seen = sorted({s.split(":")[0] for s in seen}, key=releases.index)
            examples_seen = sorted({s.split(":")[1] for s in seen})
            print(
                f"{check} {status} {where}{mark}\n    {observed}\n    releases: {', '.join(releases_seen)}\n    examples: {', '.join(examples_seen)}"
            )
        print(
            f"{len(rows)} finding(s) over {len(releases)} release(s) x {len(example_paths)} deployment(s); "
            f"{len(untriaged)} untriaged"
        )
    return 1 if args.check and untriaged else 0


if __name__ == "__main__":
    sys.exit(main())
