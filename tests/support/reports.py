"""Reading what ``npudoctor`` says: a ``check`` JSON report, one check's result, stderr less progress."""

from __future__ import annotations

import json
import re

PROGRESS_LINE = re.compile(r"npudoctor: \[\d+\.\d s\] ")


def without_progress(err: str) -> str:
    """stderr less the progress lines a run without a terminal writes (``npudoctor.service.progress``)."""
    return "".join(line for line in err.splitlines(keepends=True) if not PROGRESS_LINE.match(line))


def json_report(cli, *args: str) -> dict:
    """The JSON report of ``npudoctor check ARGS`` through the ``cli`` fixture (exit 0 or 1)."""
    code, out, err = cli("check", "--format", "json", *args)
    assert code in (0, 1), f"exit {code}: {err}"
    return json.loads(out)


def result_of(report: dict, check_id: str) -> dict:
    """The result of check ``check_id`` in a report."""
    return next(r for r in report["results"] if r["id"] == check_id)
