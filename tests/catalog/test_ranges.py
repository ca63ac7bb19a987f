"""Every record's stored release ranges are what its fingerprints give on the wheels today: the
slow tier re-derives them over every release they were derived from (``scripts/catalog_ranges.py``)
and fails on any change, so an edit of a fingerprint, or of the engine, that moves a release
from one kind to another is seen."""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.version import Version

from npudoctor.engine.catalog import RANGE_KINDS, all_records

from support.repo import REPO

_spec = importlib.util.spec_from_file_location("catalog_ranges", REPO / "scripts" / "catalog_ranges.py")
catalog_ranges = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("catalog_ranges", catalog_ranges)
_spec.loader.exec_module(catalog_ranges)


def stored_versions() -> list[str]:
    found = {v for r in all_records() for kind in RANGE_KINDS for v in r.releases[kind]}
    return sorted(found, key=Version)


@pytest.mark.slow
def test_every_stored_range_is_what_the_wheels_give(release):
    versions = stored_versions()
    # fetched once into the tests' release cache (~45 wheels: several at once, as scripts/test.sh does)
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(release, versions))
    derived = catalog_ranges.derive(None, jobs=2, releases=versions)
    for record in all_records():
        assert derived[record.id] == {k: list(v) for k, v in record.releases.items()}, record.id


def test_every_record_was_derived_over_every_release_from_0_4_10_with_none_unrecognised():
    """No record is stored half-derived: each covers the same releases (0.4.10 .. newest, posts
    included), and none of them is a state the fingerprints do not recognise."""
    versions = stored_versions()
    assert versions[0] == "0.4.10" and any(".post" in v for v in versions)
    for record in all_records():
        mine = sorted((v for kind in RANGE_KINDS for v in record.releases[kind]), key=Version)
        assert mine == versions, record.id
        assert not record.releases["unrecognised"], (record.id, record.releases["unrecognised"])
        assert record.releases["affected"], f"{record.id} ships in no release: not a catalog record"
