"""``npudoctor list --format osv``: the catalog as OSV records that validate against the released OSV
schema they declare (``tests/data/osv-schema-1.6.3.json``: ossf/osv-schema tag v1.6.3,
validation/schema.json, commit c37661d75a28fc759000f863da904f9a2caebac3), one per record, with the
affected PyPI releases as the wheels gave them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from packaging.version import Version

from npudoctor.engine.catalog import all_records

VENDORED_RELEASE = "1.6.3"  # the tag of the schema file below
SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / f"osv-schema-{VENDORED_RELEASE}.json").read_text()
)


def exported(cli) -> list[dict]:
    code, out, err = cli("list", "--format", "osv")
    assert code == 0, err
    return json.loads(out)


def test_every_record_is_one_valid_osv_record(cli):
    """Valid against the released schema whose version each record declares (not an unreleased
    main: a reader validates against the version the record names)."""
    records = exported(cli)
    assert {r["schema_version"] for r in records} == {VENDORED_RELEASE}
    validator = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
    for record in records:
        errors = sorted(validator.iter_errors(record), key=str)
        assert not errors, (record["id"], [e.message for e in errors])
    assert [r["database_specific"]["npudoctor_id"] for r in records] == [r.id for r in all_records()]
    assert len({r["id"] for r in records}) == len(records)


def test_ranges_say_what_the_versions_list_says(cli):
    """The ECOSYSTEM events, read as OSV readers do (affected from each introduced up to the next
    fixed), give exactly the releases listed in ``versions``: the derived ``affected`` list."""
    by_id = {r.id: r for r in all_records()}
    for record in exported(cli):
        (entry,) = record["affected"]
        assert entry["package"] == {"ecosystem": "PyPI", "name": "sglang", "purl": "pkg:pypi/sglang"}
        mine = by_id[record["database_specific"]["npudoctor_id"]]
        assert entry["versions"] == list(mine.releases["affected"])
        derived = sorted((v for vs in mine.releases.values() for v in vs), key=Version)
        inside, covered = False, []
        events = [e for r in entry.get("ranges", []) for e in r["events"]]
        starts = {e["introduced"] for e in events if "introduced" in e}
        ends = {e["fixed"] for e in events if "fixed" in e}
        for version in derived:
            inside = (inside or version in starts) and version not in ends
            if inside:
                covered.append(version)
        assert covered == entry["versions"], record["id"]
        assert entry["ecosystem_specific"]["affected_symbols"] == mine.defective.symbols


def test_references_are_typed_report_fix_introduced(cli):
    by_id = {r.id: r for r in all_records()}
    for record in exported(cli):
        mine = by_id[record["database_specific"]["npudoctor_id"]]
        typed = {(ref["type"], ref["url"]) for ref in record["references"]}
        assert typed == (
            {("REPORT", u) for u in mine.references.report}
            | {("FIX", u) for u in mine.references.fix}
            | {("INTRODUCED", u) for u in mine.references.introduced}
        )
        # a defect found in the wheels that nobody reported upstream says so instead of a reference
        unreported = "not reported upstream" in " ".join(mine.notes.lower().split())
        assert mine.references.all or unreported, record["id"]


def test_list_json_has_every_check_and_record(cli):
    code, out, _ = cli("list", "--format", "json")
    entries = json.loads(out)
    assert code == 0
    kinds = {e["id"]: e["kind"] for e in entries}
    assert {i for i, k in kinds.items() if k == "catalog"} == {r.id for r in all_records()}
    assert any(k == "check" for k in kinds.values())
