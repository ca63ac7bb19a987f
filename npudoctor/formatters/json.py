"""JSON report: ``Report.to_dict`` with ``schema_version``; the contract CI tools parse."""

from __future__ import annotations

import json

import npudoctor  # its __version__ is looked up on use
from npudoctor.results import Report
from npudoctor.service.advise import Advice
from npudoctor.service.hints import UserOptions


def render(report: Report, user: UserOptions | None = None, verbose: bool = False) -> str:
    """The whole report, whatever ``verbose`` says; it names no command, so ``user`` is not read."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"


def render_advice(advice: Advice) -> str:
    return json.dumps(advice.to_dict(npudoctor.__version__), indent=2) + "\n"
