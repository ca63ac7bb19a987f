"""SARIF 2.1.0 report, the format GitHub code scanning and most static-analysis
dashboards ingest, so npudoctor findings show up next to the sglang source lines.

One run; one rule per check id (the id is the stable ``ruleId``); one SARIF result per
``fail``/``warn``/``error`` result, its ``level`` from the status (a leak or performance finding the
gate does not fail is a ``warning``) and its ``properties.impact`` the defect's impact. Evidence locations are relative to the directory
holding ``sglang/``, which the run declares as the ``SGLANG_ROOT`` base URI. Results an
ignore entry covers stay in the log with an external suppression, so viewers can show
them as dismissed instead of losing them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from npudoctor.results import Report, Result, Status

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
BASE_ID = "SGLANG_ROOT"

_LEVEL = {Status.FAIL: "error", Status.ERROR: "error", Status.WARN: "warning"}


def render(report: Report) -> str:
    return log([run_of(report)])


def log(runs: list[dict[str, Any]]) -> str:
    """The SARIF log of ``runs``."""
    return json.dumps({"$schema": SCHEMA_URI, "version": "2.1.0", "runs": runs}, indent=2) + "\n"


def run_of(report: Report) -> dict[str, Any]:
    """One SARIF run: a report's rules and results."""
    rule_index: dict[str, int] = {}
    rules: list[dict[str, Any]] = []
    for result in report.results:
        if result.id not in rule_index:
            rule_index[result.id] = len(rules)
            rules.append({"id": result.id, "shortDescription": {"text": result.title}})

    sarif_results = [
        _result(result, rule_index[result.id]) for result in report.results if result.status in _LEVEL
    ]

    driver: dict[str, Any] = {"name": "npudoctor"}
    if report.tool_version:
        driver["version"] = report.tool_version
    uri = information_uri()
    if uri:
        driver["informationUri"] = uri
    driver["rules"] = rules
    run: dict[str, Any] = {
        "tool": {"driver": driver},
        "originalUriBaseIds": {BASE_ID: {"uri": _root_uri(report.target.path)}},
        "results": sarif_results,
        "properties": {
            "sglangVersion": report.target.version,
            "sglangPath": report.target.path,
            "failOn": report.fail_on.value,
            "failingImpacts": list(report.failing_impacts),
        },
    }
    return run


def information_uri() -> str | None:
    """npudoctor's home page (``tool.driver.informationUri``, optional in SARIF 2.1.0): the
    installed distribution's Home-page, else its first Project-URL; None when it declares none
    (npudoctor has no public URL: the field is left out rather than naming another project)."""
    from importlib import metadata

    try:
        meta = metadata.metadata("npudoctor")
    except metadata.PackageNotFoundError:
        return None
    home = (meta.get("Home-page") or "").strip()
    if home.startswith(("https://", "http://")):
        return home
    for entry in meta.get_all("Project-URL") or []:
        url = entry.partition(",")[2].strip()
        if url.startswith(("https://", "http://")):
            return url
    return None


def _root_uri(package_dir: str) -> str:
    """``file://`` URI of the directory holding ``sglang/``, with the trailing slash SARIF requires."""
    uri = Path(package_dir).absolute().parent.as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _result(result: Result, index: int) -> dict[str, Any]:
    lines = [result.summary]
    if result.error:
        lines.append(f"error: {result.error}")
    lines.extend(f"observed: {e.observed}" for e in result.evidence if e.observed)
    sarif: dict[str, Any] = {
        "ruleId": result.id,
        "ruleIndex": index,
        "level": _LEVEL[result.status],
        "message": {"text": "\n".join(lines)},
    }
    locations = []
    for evidence in result.evidence:
        where = evidence.location
        if where is None:
            continue
        physical: dict[str, Any] = {"artifactLocation": {"uri": quote(where.path), "uriBaseId": BASE_ID}}
        if where.line >= 1:
            physical["region"] = {"startLine": where.line}
        location: dict[str, Any] = {"physicalLocation": physical}
        if where.symbol:
            location["logicalLocations"] = [{"fullyQualifiedName": where.symbol}]
        locations.append(location)
    if locations:
        sarif["locations"] = locations
    if result.ignored is not None:
        sarif["suppressions"] = [{"kind": "external", "justification": result.ignored}]
    sarif["properties"] = {
        "status": result.status.value,
        "depth": result.depth.value,
        "impact": result.impact,
    }
    return sarif
