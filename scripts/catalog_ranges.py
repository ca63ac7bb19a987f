#!/usr/bin/env python3
"""Derive every catalog record's release ranges from the wheels, and write them into the record.

    python scripts/catalog_ranges.py                 # every record, every release 0.4.10 .. newest
    python scripts/catalog_ranges.py --select NPC003 # some records
    python scripts/catalog_ranges.py --check         # compare with the stored ranges; exit 1 on a change

Each record's fingerprints (``npudoctor.engine.catalog``) are evaluated on the unpacked tree of
every PyPI release from 0.4.10 to the newest, post-releases included (the release cache of
``npudoctor.target.releases``, fetched once). The answer per release is ``affected`` (the
defective shape), ``fixed``, ``absent`` (none of the record's symbols) or ``unrecognised``; the
lists are written at the end of ``catalog/<id>_*.yaml`` below the ``releases:`` marker. Where an
upstream text says one release and the wheels another, the wheels win: the record's ``notes`` say so.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import fetch_sglang  # noqa: E402

MARKER = "# releases: derived from the wheels by scripts/catalog_ranges.py (do not edit by hand)"
SINCE = "0.4.10"


def versions() -> list[str]:
    from npudoctor.target.releases import published_releases

    return published_releases(SINCE, fetch_sglang.cache_dir())


def verdicts_for(version: str, ids: list[str] | None = None) -> dict[str, str]:
    """record id -> the kind of code release ``version`` has (one tree, parsed once)."""
    from npudoctor.engine.catalog import all_records
    from npudoctor.target.discovery import discover

    target = discover(fetch_sglang.fetch(version) / "sglang")
    answers = {r.id: r.source_verdict(target).kind for r in all_records() if ids is None or r.id in ids}
    target.release()
    return answers


def derive(
    ids: list[str] | None = None, jobs: int = 2, releases: list[str] | None = None
) -> dict[str, dict[str, list[str]]]:
    """record id -> kind -> releases, in PyPI order."""
    from npudoctor.engine.catalog import RANGE_KINDS

    releases = releases or versions()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        per_release = list(pool.map(verdicts_for, releases, [ids] * len(releases)))
    ranges: dict[str, dict[str, list[str]]] = {}
    for version, answers in zip(releases, per_release):
        for record_id, kind in answers.items():
            ranges.setdefault(record_id, {k: [] for k in RANGE_KINDS})[kind].append(version)
    return ranges


def block(ranges: dict[str, list[str]], derived: str) -> str:
    lines = [MARKER, "releases:", f"  derived: '{derived}'"]
    for kind, found in ranges.items():
        if found:
            lines.append(f"  {kind}: [{', '.join(found)}]")
    return "\n".join(lines) + "\n"


def record_file(record_id: str) -> Path:
    (path,) = (REPO / "catalog").glob(f"{record_id}_*.yaml")
    return path


def write(
    record_id: str, ranges: dict[str, list[str]], stored: dict[str, list[str]] | None, derived: str
) -> None:
    """Store ``ranges`` in the record's file, stamped ``derived`` when they changed (OSV's ``modified``)."""
    from npudoctor.engine.catalog import all_records

    path = record_file(record_id)
    text = path.read_text()
    if ranges == stored:
        derived = next(r.modified for r in all_records() if r.id == record_id)
    head = text.split(MARKER)[0].rstrip("\n") + "\n\n"
    path.write_text(head + block(ranges, derived))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--select", action="append", default=[], help="record ids (default: all)")
    parser.add_argument("--check", action="store_true", help="compare with the stored ranges; write nothing")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    from npudoctor.engine.catalog import all_records

    ids = [i.upper() for i in args.select] or None
    ranges = derive(ids, args.jobs)
    stored = {r.id: {k: list(v) for k, v in r.releases.items()} for r in all_records()}
    changed = [i for i, found in ranges.items() if found != stored.get(i)]
    if args.check:
        for record_id in changed:
            print(
                f"{record_id}: stored {stored.get(record_id)}\n{' ' * len(record_id)}  wheels {ranges[record_id]}"
            )
        return 1 if changed else 0
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for record_id, found in ranges.items():
        write(record_id, found, stored.get(record_id), now)
        affected = found["affected"]
        span = f"{affected[0]} .. {affected[-1]} ({len(affected)})" if affected else "none"
        print(f"{record_id}: affected {span}; unrecognised {found['unrecognised'] or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
