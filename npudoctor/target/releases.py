"""The release cache: real sglang releases from PyPI, fetched once as wheels and unpacked.

``npudoctor advise`` and ``scripts/fetch_sglang.py`` (tests, demo, benchmarks) share it.
Each release is downloaded with ``pip download --no-deps sglang==X`` (the wheel only, never
its dependencies) into ``<cache>/wheels`` and its ``sglang/`` package is unpacked into
``<cache>/trees/X/``, the layout ``npudoctor check --sglang-path`` takes. A tree that is
already complete is reused. Stdlib only: the script imports it before anything is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

COMPLETE = ".complete"  # written last: a tree without it was interrupted and is redone
INDEX_URL = "https://pypi.org/pypi/sglang/json"
INDEX_MAX_AGE = 24 * 3600  # the cached index answer is asked again after a day: releases appear
_FINAL = re.compile(r"\d+(\.\d+)*")


class FetchError(Exception):
    """A release could not be had (not on the index, no network, no wheel): the reason, one line."""


def user_cache_dir() -> Path:
    """``$NPUDOCTOR_SGLANG_CACHE``, else ``$XDG_CACHE_HOME/npudoctor/sglang`` (``~/.cache/...``)."""
    if os.environ.get("NPUDOCTOR_SGLANG_CACHE"):
        return Path(os.environ["NPUDOCTOR_SGLANG_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "npudoctor" / "sglang"


def version_key(version: str) -> tuple[int, ...]:
    """Order of final release numbers ("0.5.10" after "0.5.9")."""
    return tuple(int(part) for part in version.split("."))


def is_final(version: str) -> bool:
    return bool(_FINAL.fullmatch(version))


def fetch(version: str, cache: Path, wheel_dir: Path | None = None) -> Path:
    """The directory holding ``sglang/`` of release ``version``: the cached tree, else unpacked
    from a wheel in ``wheel_dir`` (offline) or in the cache, else downloaded from the index."""
    tree = cache / "trees" / version
    if (tree / COMPLETE).is_file():
        return tree
    if wheel_dir is not None:
        wheel = find_wheel(wheel_dir, version)
        if wheel is None:
            raise FetchError(f"no sglang-{version}-*.whl in {wheel_dir}")
    else:
        wheels = cache / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        wheel = find_wheel(wheels, version) or _download(version, wheels)
    return _unpack(wheel, tree)


def find_wheel(wheels: Path, version: str) -> Path | None:
    matches = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    return matches[0] if matches else None


def wheel_versions(wheels: Path) -> list[str]:
    """The final releases whose sglang wheel is in ``wheels``, oldest first."""
    found = {p.name.split("-")[1] for p in wheels.glob("sglang-*-*.whl")}
    return sorted((v for v in found if is_final(v)), key=version_key)


def index_versions(cache: Path) -> tuple[list[str], str]:
    """Every final sglang release on PyPI (no pre-, post- or yanked releases), oldest first, and
    a note when the answer is an older copy. The index's answer is kept in the cache and asked
    again once it is a day old; without network the kept copy is used, and said so."""
    listing = cache / "pypi-sglang.json"
    age = time.time() - listing.stat().st_mtime if listing.is_file() else None
    note = ""
    if age is None or age > INDEX_MAX_AGE:
        try:
            _refresh_index(listing)
        except (OSError, ValueError, KeyError) as error:
            if age is None:
                raise FetchError(f"cannot read the release list from {INDEX_URL}: {error}") from None
            note = f"the release list is {age / 3600:.0f} h old: {INDEX_URL} could not be read ({error})"
    names = json.loads(listing.read_text())
    return sorted((v for v in names if is_final(v)), key=version_key), note


_PUBLISHED = re.compile(r"\d+(\.\d+)*(\.post\d+)?")


def published_releases(since: str, cache: Path) -> list[str]:
    """Every release from ``since`` to the newest, post-releases included (no pre-releases), in
    PyPI order: what the catalog's release ranges are derived over (``scripts/catalog_ranges.py``)."""
    names = (
        json.loads((cache / "pypi-sglang.json").read_text()) if (cache / "pypi-sglang.json").is_file() else []
    )
    if not names:
        index_versions(cache)
        names = json.loads((cache / "pypi-sglang.json").read_text())

    def key(version: str) -> tuple[tuple[int, ...], int]:
        final, _, post = version.partition(".post")
        return version_key(final), int(post or -1)

    found = sorted((v for v in names if _PUBLISHED.fullmatch(v)), key=key)
    return [v for v in found if key(v) >= key(since)]


def releases(since: str, cache: Path) -> list[str]:
    """Every final release from ``since`` to the newest, oldest first."""
    versions, _ = index_versions(cache)
    return [v for v in versions if version_key(v) >= version_key(since)]


def _refresh_index(listing: Path) -> None:
    with urllib.request.urlopen(INDEX_URL, timeout=30) as answer:
        data = json.load(answer)
    names = sorted(
        v for v, files in data["releases"].items() if files and not all(f.get("yanked") for f in files)
    )
    listing.parent.mkdir(parents=True, exist_ok=True)
    staging = listing.with_suffix(f".{os.getpid()}.partial")
    staging.write_text(json.dumps(names) + "\n")
    staging.replace(listing)  # concurrent readers see the whole answer or none


def _unpack(wheel: Path, tree: Path) -> Path:
    tree.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{tree.name}-", dir=tree.parent))
    try:
        try:
            with zipfile.ZipFile(wheel) as archive:
                members = [
                    m
                    for m in archive.namelist()
                    if m.startswith("sglang/")
                    or (m.startswith("sglang-") and m.endswith(".dist-info/METADATA"))
                ]
                archive.extractall(staging, members)
        except (zipfile.BadZipFile, OSError) as error:
            raise FetchError(f"cannot unpack {wheel}: {error}") from None
        (staging / COMPLETE).write_text(wheel.name + "\n")
        if tree.exists():
            shutil.rmtree(tree)
        staging.rename(tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree


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
    wheel = find_wheel(wheels, version)
    if done.returncode != 0 or wheel is None:
        reason = (done.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise FetchError(f"cannot download sglang=={version}: {reason}")
    return wheel
