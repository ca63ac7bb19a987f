#!/usr/bin/env python3
"""Fetch real sglang releases from PyPI and unpack their source trees, once.

    python scripts/fetch_sglang.py 0.5.9 0.5.12 ...     # prints one unpacked tree per line
    python scripts/fetch_sglang.py --published-since 0.4.10 --jobs 6   # what the test suite reads

The release cache of ``npudoctor.target.releases`` (``npudoctor advise`` uses the same one): each
release is downloaded with ``pip download --no-deps sglang==X`` into ``<cache>/wheels`` and
its ``sglang/`` package unpacked into ``<cache>/trees/X-<the wheel's sha256, 16 hex>/``, the
layout ``npudoctor check --sglang-path`` takes, so tests and demos pay for the download only once;
a tree is proven to be its wheel's, unchanged and private, each time it is handed out. The cache
is ``$NPUDOCTOR_SGLANG_CACHE``, else ``.cache/sglang`` in the repository. Stdlib only: it runs
before anything is installed (``npudoctor/target/releases.py`` is loaded from the checkout).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the module alone, not the package: no sys.path change for the tests that load this script
_spec = importlib.util.spec_from_file_location(
    "_npudoctor_releases", REPO / "npudoctor" / "target" / "releases.py"
)
_releases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_releases)


def cache_dir() -> Path:
    return Path(os.environ.get("NPUDOCTOR_SGLANG_CACHE") or REPO / ".cache" / "sglang")


# Trees handed out by this process: the tests ask for one release hundreds of times in a session,
# and proving a tree walks all of it (0.5.23: ~6,400 entries, 50-400 ms on a busy machine).
_FETCHED: dict[tuple[str, Path], Path] = {}


def fetch(version: str, cache: Path | None = None) -> Path:
    """The directory holding ``sglang/`` of release ``version``, downloading it if needed; proven
    the first time this process asks (``npudoctor advise`` proves it on every run)."""
    key = (version, cache or cache_dir())
    if key not in _FETCHED:
        try:
            _FETCHED[key] = _releases.fetch(version, key[1])
        except _releases.FetchError as error:
            raise SystemExit(f"fetch_sglang: {error}") from None
    return _FETCHED[key]


def cached(finals_only: bool = False) -> dict[str, Path]:
    """Every release whose wheel is in the cache -> its tree (unpacked if it is not yet), oldest first."""
    cache = cache_dir()
    return {v: fetch(v, cache) for v in _releases.wheel_versions(cache / "wheels", finals_only)}


def releases(since: str, cache: Path | None = None) -> list[str]:
    """Every final sglang release on PyPI from ``since`` to the newest, oldest first."""
    try:
        return _releases.releases(since, cache or cache_dir())
    except _releases.FetchError as error:
        raise SystemExit(f"fetch_sglang: {error}") from None


def published_releases(since: str, cache: Path | None = None) -> list[str]:
    """Every sglang release on PyPI from ``since`` to the newest, post-releases included, oldest
    first: what the catalog's release ranges are derived over (``scripts/catalog_ranges.py``)."""
    try:
        return _releases.published_releases(since, cache or cache_dir())
    except _releases.FetchError as error:
        raise SystemExit(f"fetch_sglang: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", help="sglang release versions, e.g. 0.5.12")
    parser.add_argument(
        "--since", metavar="VERSION", help="also every final release from VERSION to the newest"
    )
    parser.add_argument(
        "--published-since",
        metavar="VERSION",
        help="also every release from VERSION to the newest, post-releases included",
    )
    # Each download is a pip process waiting on the network, each unpack mostly zlib and sha256
    # (they release the GIL): threads overlap them. The test suite reads ~45 releases; one after
    # another they cost minutes on a clean clone (scripts/test.sh fetches them with --jobs).
    parser.add_argument("--jobs", type=int, default=1, help="releases fetched at once (default 1)")
    args = parser.parse_args(argv)
    if not args.versions and not args.since and not args.published_since:
        parser.error("give versions, --since VERSION or --published-since VERSION")
    versions = [
        *args.versions,
        *(releases(args.since) if args.since else []),
        *(published_releases(args.published_since) if args.published_since else []),
    ]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for tree in pool.map(fetch, dict.fromkeys(versions)):
            print(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
