"""SARIF 2.1.0 report, the format GitHub code scanning and most static-analysis
dashboards ingest, so npudoctor findings show up next to the sglang source lines.

One run; one rule per check id (the id is the stable ``ruleId``), with the check's short help
(``help.text``/``help.markdown``: why it matters, how to fix, the ``explain`` command for the rest)
and its upstream pull request as ``helpUri``; one SARIF result per ``fail``/``warn``/``error``
result, its ``level`` from the status (a leak or performance finding the gate does not fail is a
``warning``) and its ``properties.impact`` the defect's impact. Results an ignore entry covers
stay in the log with an external suppression, so viewers can show them as dismissed instead of
losing them.

Locations are written the way GitHub code scanning resolves them (it reads a relative ``uri`` as
relative to the repository's root, whatever base id the log declares, and makes an absolute one
under the checkout relative to it; the ``SGLANG_ROOT`` base of earlier versions linked nothing): a file
inside the checkout (``$GITHUB_WORKSPACE`` in a workflow, else the working directory, e.g. an
unpacked wheel checked in CI) is relative to it with the ``%SRCROOT%`` base id GitHub's own
examples use; a file elsewhere (an installed sglang) is an absolute ``file://`` URI.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from npudoctor.results import Report, Result, Status
from npudoctor.service.advise import Advice
from npudoctor.service.hints import UserOptions

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
BASE_ID = "%SRCROOT%"  # the checkout's base id in GitHub's SARIF documentation
HELP_CHARS = 300  # a rule's help text: the first sentences of why it matters, up to about this

_LEVEL = {Status.FAIL: "error", Status.ERROR: "error", Status.WARN: "warning"}


def render(report: Report, user: UserOptions | None = None, verbose: bool = False) -> str:
    """The whole report, whatever ``verbose`` says; it names no command, so ``user`` is not read."""
    return log([run_of(report)])


def log(runs: list[dict[str, Any]]) -> str:
    """The SARIF log of ``runs``."""
    return json.dumps({"$schema": SCHEMA_URI, "version": "2.1.0", "runs": runs}, indent=2) + "\n"


def run_of(report: Report) -> dict[str, Any]:
    """One SARIF run: a report's rules and results."""
    from npudoctor.engine.registry import all_checks

    checks = {check.id: check for check in all_checks()}
    rule_index: dict[str, int] = {}
    rules: list[dict[str, Any]] = []
    for result in report.results:
        if result.id not in rule_index:
            rule_index[result.id] = len(rules)
            rules.append(_rule(result, checks.get(result.id)))

    root, checkout = _tree_root(report.target.path), checkout_root()
    sarif_results = [
        _result(result, rule_index[result.id], root, checkout)
        for result in report.results
        if result.status in _LEVEL
    ]

    driver: dict[str, Any] = {"name": "npudoctor"}
    if report.tool_version:
        driver["version"] = report.tool_version
    uri = information_uri()
    if uri:
        driver["informationUri"] = uri
    driver["rules"] = rules
    run: dict[str, Any] = {"tool": {"driver": driver}}
    if any(
        physical["artifactLocation"].get("uriBaseId") == BASE_ID
        for result in sarif_results
        for physical in (location["physicalLocation"] for location in result.get("locations", ()))
    ):
        run["originalUriBaseIds"] = {BASE_ID: {"uri": _directory_uri(checkout)}}
    run |= {
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


def checkout_root() -> Path:
    """The directory GitHub code scanning resolves relative locations against: the workflow's
    checkout (``$GITHUB_WORKSPACE``, upload-sarif's default ``checkout_path``), else the working
    directory (where a CI job outside GitHub runs from its checkout)."""
    return Path(os.path.realpath(os.environ.get("GITHUB_WORKSPACE") or os.getcwd()))


def _tree_root(package_dir: str) -> Path:
    """The directory holding ``sglang/``: evidence paths are relative to it."""
    return Path(os.path.realpath(package_dir)).parent


def _directory_uri(directory: Path) -> str:
    """``file://`` URI of ``directory``, with the trailing slash SARIF requires of a base URI."""
    uri = directory.as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _artifact_location(path: str, root: Path, checkout: Path) -> dict[str, str]:
    """Where ``path`` (relative to the tree ``root``) is, as GitHub links it: relative to the
    checkout when inside it, else an absolute ``file://`` URI (no base id: it needs none)."""
    absolute = root / path
    try:
        inside = absolute.relative_to(checkout)
    except ValueError:
        return {"uri": absolute.as_uri()}
    return {"uri": quote(inside.as_posix()), "uriBaseId": BASE_ID}


def _rule(result: Result, check) -> dict[str, Any]:
    """The reporting descriptor of ``result``'s check: its title, and where ``check`` (None for
    an id npudoctor does not define) has them, its short help and upstream pull request."""
    rule: dict[str, Any] = {"id": result.id, "shortDescription": {"text": result.title}}
    if check is None:
        return rule
    why, fix = _first_sentences(check.why), _first_sentences(check.how_to_fix)
    command = f"npudoctor explain {check.id}"
    text = [_plain(why), f"How to fix: {_plain(fix)}" if fix else "", f"The full text: {command}"]
    markdown = [
        _check_markdown(why),
        f"**How to fix:** {_check_markdown(fix)}" if fix else "",
        f"The full text: `{command}`",
    ]
    rule["help"] = {
        "text": "\n\n".join(part for part in text if part),
        "markdown": "\n\n".join(part for part in markdown if part),
    }
    if check.upstream:
        rule["helpUri"] = check.upstream[0]
    return rule


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def _first_sentences(text: str) -> str:
    """The leading sentences of a check's text up to about ``HELP_CHARS`` (at least the first
    one, whole: a cut sentence says the wrong thing), re-flowed onto one line."""
    kept = ""
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        if kept and len(kept) + 1 + len(sentence) > HELP_CHARS:
            break
        kept = f"{kept} {sentence}" if kept else sentence
    return kept


def _plain(text: str) -> str:
    """A check's text without its RST-style ````code```` marks."""
    return text.replace("``", "")


def _check_markdown(text: str) -> str:
    from npudoctor.formatters.listing import _markdown

    return _markdown(text)


def _result(result: Result, index: int, root: Path, checkout: Path) -> dict[str, Any]:
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
        physical: dict[str, Any] = {"artifactLocation": _artifact_location(where.path, root, checkout)}
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


def render_advice(advice: Advice) -> str:
    runs = []
    for row in advice.rows:
        if row.report is None:
            continue
        run = run_of(row.report)
        run["automationDetails"] = {"id": f"npudoctor-advise/sglang-{row.candidate.label}/"}
        runs.append(run)
    return log(runs)
