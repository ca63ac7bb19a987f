"""The catalog as OSV records (``npudoctor list --format osv``), and every check as JSON (``--format json``).

OSV (https://ossf.github.io/osv-schema/) is what pip-audit, osv-scanner and govulncheck read.
One record per catalogued defect: the package ``PyPI/sglang``, the affected releases both as an
``ECOSYSTEM`` range (one ``introduced``/``fixed`` pair per contiguous run of affected releases
in PyPI order, derived from the wheels) and as the explicit ``versions`` list, the references
typed ``REPORT``, ``FIX`` and ``INTRODUCED``, and in ``ecosystem_specific`` what the scanner needs
to judge reachability as npudoctor does: the affected symbols (the defective fingerprints), what
breaks, when it bites, and the workaround.

The records declare schema 1.6.3, the newest release of the OSV schema whose ``id`` admits a
database that is not one OSV.dev aggregates: from 1.6.4 through the newest release (1.7.5) the id
must start with one of OSV.dev's home-database prefixes, and only the unreleased main adds ``x_``
for a private database (ossf/osv-schema#499). The id keeps that ``x_`` form, so it stays valid
when a release adds it. Every field the records use exists in 1.6.3.
``tests/data/osv-schema-1.6.3.json`` (ossf/osv-schema tag v1.6.3, validation/schema.json)
validates the export.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npudoctor.engine.catalog import RANGE_KINDS, CatalogRecord, sort_key
from npudoctor.engine.kinds import CheckKind

OSV_SCHEMA_VERSION = "1.6.3"  # the newest released schema whose id admits ID_PREFIX
ID_PREFIX = "x_npudoctor-"


def osv_record(record: CatalogRecord) -> dict[str, Any]:
    derived = sorted((v for kind in RANGE_KINDS for v in record.releases[kind]), key=sort_key)
    events: list[dict[str, str]] = []
    for run, after in record.affected_runs():
        events.append({"introduced": run[0]})
        if after is not None:
            events.append({"fixed": after})
    specific: dict[str, Any] = {
        "affected_symbols": record.defective.symbols,
        "impact": record.impact.value,
        "bites_when": record.bites_when,
        "bites_when_expression": record.predicate_text,
    }
    if record.remedy.workaround:
        specific["workaround"] = record.remedy.workaround
    package = {"ecosystem": "PyPI", "name": "sglang", "purl": "pkg:pypi/sglang"}
    entry: dict[str, Any] = {
        "package": package,
        "versions": [v for run, _ in record.affected_runs() for v in run],
    }
    if events:
        entry["ranges"] = [{"type": "ECOSYSTEM", "events": events}]
    entry["ecosystem_specific"] = specific
    references = [
        {"type": kind, "url": url}
        for kind, urls in (
            ("REPORT", record.references.report),
            ("FIX", record.references.fix),
            ("INTRODUCED", record.references.introduced),
        )
        for url in urls
    ]
    return {
        "schema_version": OSV_SCHEMA_VERSION,
        "id": ID_PREFIX + record.id,
        "modified": record.modified,
        "summary": record.title,
        "details": _details(record),
        "affected": [entry],
        "references": references,
        "database_specific": {
            "npudoctor_id": record.id,
            "derived_from": f"every PyPI wheel of sglang {derived[0]} .. {derived[-1]}" if derived else "",
            "fixed_in": record.first_fixed,
        },
    }


def _details(record: CatalogRecord) -> str:
    parts = [record.summary, f"What breaks: {record.impact.meaning}.", f"When it bites: {record.bites_when}."]
    parts.append(f"Defective code: {record.defective.says}.")
    if record.fixed is not None:
        parts.append(f"Fixed code: {record.fixed.says}.")
    parts.append(f"Remedy: {record.how_to_fix}.")
    if record.notes:
        parts.append(record.notes)
    return "\n\n".join(p.strip() for p in parts if p.strip())


def osv_records(checks: Sequence) -> list[dict[str, Any]]:
    """The OSV record of every catalogued defect among ``checks`` (the deep checks are not
    catalogue records: they have their own release history)."""
    return [osv_record(c) for c in checks if c.kind is CheckKind.CATALOG]


def check_entry(item) -> dict[str, Any]:
    """One check or record as ``list --format json`` gives it."""
    from npudoctor.formatters.listing import fixed_in_history

    entry: dict[str, Any] = {
        "id": item.id,
        "kind": item.kind.listed_as,
        "title": item.title,
        "upstream": list(item.upstream),
        "release_history": fixed_in_history(item),
        "bites_when": item.bites_when,
        "impact": item.impact.value,
        "runtime_fix": item.id if item.runtime_fix else None,  # a record: its remedy's, below
    }
    if item.kind is CheckKind.CATALOG:
        entry["runtime_fix"] = item.remedy.fix
        entry["affected"] = list(item.releases["affected"])
        entry["fixed_in"] = item.first_fixed
        entry["affected_symbols"] = item.defective.symbols
    return entry
