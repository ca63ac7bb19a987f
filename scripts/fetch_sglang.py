#!/usr/bin/env python3
"""Fetch real sglang releases from PyPI and unpack their source trees, once.

    python scripts/fetch_sglang.py 0.5.9 0.5.12 ...     # prints one unpacked tree per line

Each release is downloaded with ``pip download --no-deps sglang==X`` (the wheel only,
never its dependencies) into ``<cache>/wheels`` and its ``sglang/`` package is unpacked
into ``<cache>/trees/X/``, the layout ``npudoctor check --sglang-path`` takes. A tree that
is already complete is reused, so tests and demos pay for the download only once.
The cache is ``$NPUDOCTOR_SGLANG_CACHE``, else ``.cache/sglang`` in the repository.
Stdlib only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPLETE = ".complete"  # written last: a tree without it was interrupted and is redone


def cache_dir() -> Path:
    return Path(os.environ.get("NPUDOCTOR_SGLANG_CACHE") or REPO / ".cache" / "sglang")


def fetch(version: str, cache: Path | None = None) -> Path:
    """The directory holding ``sglang/`` of release ``version``, downloading it if needed."""
    cache = cache or cache_dir()
    tree = cache / "trees" / version
    if (tree / COMPLETE).is_file():
        return tree
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(wheels, version) or _download(version, wheels)
    tree.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=tree.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [
                m
                for m in archive.namelist()
                if m.startswith("sglang/") or (m.startswith("sglang-") and m.endswith(".dist-info/METADATA"))
            ]
            archive.extractall(staging, members)
        (staging / COMPLETE).write_text(wheel.name + "\n")
        if tree.exists():
            shutil.rmtree(tree)
        staging.rename(tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree


def releases(since: str, cache: Path | None = None) -> list[str]:
    """Every final sglang release on PyPI from ``since`` to the newest (no pre- or post-releases),
    oldest first. The index's answer is kept in the cache, so later runs need no network."""
    cache = cache or cache_dir()
    listing = cache / "pypi-sglang.json"
    if not listing.is_file():
        with urllib.request.urlopen("https://pypi.org/pypi/sglang/json", timeout=60) as answer:
            data = json.load(answer)
        names = sorted(
            v for v, files in data["releases"].items() if files and not all(f.get("yanked") for f in files)
        )
        listing.parent.mkdir(parents=True, exist_ok=True)
        staging = listing.with_suffix(f".{os.getpid()}.partial")
        staging.write_text(json.dumps(names) + "\n")
        staging.replace(listing)  # concurrent test workers read the whole answer or none
    final = [v for v in json.loads(listing.read_text()) if _FINAL.fullmatch(v)]
    key = lambda v: tuple(int(part) for part in v.split("."))  # noqa: E731
    return sorted((v for v in final if key(v) >= key(since)), key=key)


_FINAL = re.compile(r"\d+(\.\d+)*")


def _find_wheel(wheels: Path, version: str) -> Path | None:
    matches = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    return matches[0] if matches else None


def _download(version: str, wheels: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(wheels),
        f"sglang=={version}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = _find_wheel(wheels, version)
    if done.returncode != 0 or wheel is None:
        raise SystemExit(f"fetch_sglang: cannot download sglang=={version}: {done.stderr.strip()[-500:]}")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", help="sglang release versions, e.g. 0.5.12")
    parser.add_argument(
        "--since", metavar="VERSION", help="also every final release from VERSION to the newest"
    )
    args = parser.parse_args(argv)
    if not args.versions and not args.since:
        parser.error("give versions or --since VERSION")
    for version in [*args.versions, *(releases(args.since) if args.since else [])]:
        print(fetch(version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
