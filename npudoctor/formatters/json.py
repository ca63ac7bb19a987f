"""JSON report: ``Report.to_dict`` with ``schema_version``; the contract CI tools parse."""

from __future__ import annotations

import json

from npudoctor.results import Report


def render(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"
