"""The CI formats (JUnit, SARIF, GitHub, Markdown) on a hand-built report with every status."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from npudoctor.formatters import github, junit, markdown, named, sarif
from npudoctor.results import Depth, Evidence, Location, Remediation, Report, Result, Status, TargetInfo

XSD = Path(__file__).parents[1] / "data" / "junit-10.xsd"
# OASIS SARIF 2.1.0 (errata01) schema, from oasis-tcs/sarif-spec sarif-2.1/schema/sarif-schema-2.1.0.json
# (last changed in a560296ca8c921f3bdb8d4a8db57ab83dae968a7)
SARIF_SCHEMA = Path(__file__).parents[1] / "data" / "sarif-schema-2.1.0.json"

NASTY = "a|b\nc <tag> & \x01d"

FAIL = Result(
    id="NPD001",
    title="KV pool | sizing",
    status=Status.FAIL,
    depth=Depth.STATIC,
    summary=f"pool too small: {NASTY}",
    evidence=(
        Evidence(
            expected="size >= 2 & aligned",
            observed="size < 2\nline two",
            location=Location("sglang/srt/mem_cache/memory_pool.py", 123, "MHATokenToKVPool.__init__"),
        ),
        Evidence(
            expected="no copy",
            observed="copies: a, b",
            location=Location("sglang/srt/model_executor/model_runner.py", 45),
        ),
    ),
    remediation=Remediation(fix_id="FIX001", fixed_in="0.5.2", advice="Upgrade | or patch"),
)
WARN = Result(
    id="NPD002",
    title="Graph capture",
    status=Status.WARN,
    depth=Depth.LIVE,
    summary="capture is slow, 100% of: time",
    evidence=(Evidence(expected="fast", observed="slow", location=Location("sglang/srt/a,b:c.py", 7)),),
)
ERROR = Result(
    id="NPD003",
    title="Broken check",
    status=Status.ERROR,
    depth=Depth.STATIC,
    summary="check crashed",
    error="KeyError: 'x'",
)
SKIP = Result(
    id="NPD004", title="Not applicable", status=Status.SKIP, depth=Depth.STATIC, summary="no NPU role"
)
PASS = Result(
    id="NPD005",
    title="All good",
    status=Status.PASS,
    depth=Depth.STATIC,
    summary="fine",
    evidence=(Evidence(expected="x", observed="x", location=Location("sglang/srt/ok.py", 1)),),
)
IGNORED = Result(
    id="NPD006",
    title="Known issue",
    status=Status.FAIL,
    depth=Depth.STATIC,
    summary="would fail",
    evidence=(Evidence(expected="e", observed="o", location=Location("sglang/srt/ign.py", 9)),),
    ignored="accepted risk, ticket 42",
)

REPORT = Report(
    target=TargetInfo(version="0.5.1", path="/opt/site-packages/sglang", source="path"),
    deployment={"source": "none"},
    results=(FAIL, WARN, ERROR, SKIP, PASS, IGNORED),
    fail_on=Status.FAIL,
    tool_version="0.1.0",
)


# --- JUnit ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def junit_xml() -> str:
    return junit.render(REPORT)


def _cases(xml: str) -> dict[str, ET.Element]:
    root = ET.fromstring(xml.encode("utf-8"))
    return {case.get("classname"): case for case in root.iter("testcase")}


def test_junit_validates_against_jenkins_xsd(junit_xml):
    xmlschema = pytest.importorskip("xmlschema")
    schema = xmlschema.XMLSchema(str(XSD))
    schema.validate(junit_xml)  # raises with the offending element on failure


def test_junit_xsd_rejects_a_broken_document():
    # The schema file is the real one, not a permissive stand-in: an attribute it
    # does not declare on <testsuites> and a missing required one are rejected.
    xmlschema = pytest.importorskip("xmlschema")
    schema = xmlschema.XMLSchema(str(XSD))
    assert not schema.is_valid('<testsuites skipped="1"><testsuite tests="0"/></testsuites>')
    assert not schema.is_valid("<testsuites><testsuite/></testsuites>")


def test_junit_counts(junit_xml):
    root = ET.fromstring(junit_xml.encode("utf-8"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    assert suite.get("name") == "npudoctor"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "6",
        "1",
        "1",
        "2",
    )
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("6", "1", "1")
    assert len(suite.findall("testcase")) == 6


def test_junit_elements_per_status(junit_xml):
    cases = _cases(junit_xml)
    assert set(cases) == {f"npudoctor.NPD00{i}" for i in range(1, 7)}

    fail = cases["npudoctor.NPD001"]
    assert fail.get("name") == "NPD001 KV pool | sizing"
    (failure,) = fail.findall("failure")
    assert failure.get("type") == "fail"
    assert failure.get("message").startswith("pool too small: a|b\nc <tag> & \\x01d")  # shown escaped
    for needle in (
        "size >= 2 & aligned",
        "size < 2\nline two",
        "sglang/srt/mem_cache/memory_pool.py:123",
        "no copy",
        "copies: a, b",
        "sglang/srt/model_executor/model_runner.py:45",
        "FIX001",
    ):
        assert needle in failure.text
    assert not fail.findall("error") and not fail.findall("skipped")

    (error,) = cases["npudoctor.NPD003"].findall("error")
    assert error.get("type") == "error"
    assert "KeyError" in error.get("message")

    (skipped,) = cases["npudoctor.NPD004"].findall("skipped")
    assert skipped.get("message") == "no NPU role"

    warn = cases["npudoctor.NPD002"]
    assert not warn.findall("failure") and not warn.findall("error") and not warn.findall("skipped")
    assert "slow" in warn.find("system-out").text

    passed = cases["npudoctor.NPD005"]
    assert [child.tag for child in passed if child.tag in ("failure", "error", "skipped")] == []

    ignored = cases["npudoctor.NPD006"]
    assert not ignored.findall("failure")
    (ignored_skip,) = ignored.findall("skipped")
    assert ignored_skip.get("message") == "ignored: accepted risk, ticket 42"


def test_junit_escapes_control_characters(junit_xml):
    assert "\x01" not in junit_xml
    ET.fromstring(junit_xml.encode("utf-8"))  # would raise on an illegal character
    assert "&lt;tag&gt; &amp; \\x01d" in junit_xml  # as the text report shows it


# --- SARIF ------------------------------------------------------------------------------------------


@pytest.fixture
def sarif_log(monkeypatch) -> dict:
    """The log as a workflow whose checkout holds the tree renders it (``/opt`` checked out)."""
    monkeypatch.setenv("GITHUB_WORKSPACE", "/opt")
    return json.loads(sarif.render(REPORT))


def test_sarif_validates_against_the_oasis_schema(sarif_log, monkeypatch):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SARIF_SCHEMA.read_text())
    validator = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())
    monkeypatch.setenv("GITHUB_WORKSPACE", "/elsewhere")
    for log in (sarif_log, json.loads(sarif.render(REPORT))):
        assert [error.message for error in validator.iter_errors(log)] == []
    # the schema is the real one: a driver without its required name is rejected
    assert not validator.is_valid({"version": "2.1.0", "runs": [{"tool": {"driver": {}}}]})


def test_sarif_envelope(sarif_log):
    assert sarif_log["version"] == "2.1.0"
    assert sarif_log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    (run,) = sarif_log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "npudoctor"
    assert driver["version"] == "0.1.0"
    # informationUri describes npudoctor (its distribution's Home-page/Project-URL), never sglang;
    # npudoctor declares none, so the optional field is left out
    assert driver.get("informationUri") == sarif.information_uri() and "sgl-project" not in str(
        driver.get("informationUri")
    )
    # the one base id GitHub documents, declared as the checkout for viewers other than GitHub
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": "file:///opt/"}}


def test_sarif_rules_are_stable_check_ids(sarif_log):
    (run,) = sarif_log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [rule["id"] for rule in rules] == [f"NPD00{i}" for i in range(1, 7)]
    assert rules[0]["shortDescription"]["text"] == "KV pool | sizing"
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    # Rendering again gives the same ids and indices.
    again = json.loads(sarif.render(REPORT))["runs"][0]
    assert [(r["ruleId"], r["ruleIndex"]) for r in again["results"]] == [
        (r["ruleId"], r["ruleIndex"]) for r in run["results"]
    ]


def test_sarif_rules_carry_short_help_and_the_upstream_pr(sarif_log):
    """Code scanning shows a rule's help beside the alert: each rule says why its defect matters
    and how to fix it (the check's own texts, a few sentences), names ``explain`` for the rest,
    and links its upstream pull request."""
    from npudoctor.engine.registry import all_checks

    checks = {check.id: check for check in all_checks()}
    for rule in sarif_log["runs"][0]["tool"]["driver"]["rules"]:
        check = checks[rule["id"]]
        text, markdown_help = rule["help"]["text"], rule["help"]["markdown"]
        first_sentence = " ".join(check.why.split()).split(". ")[0].replace("``", "")
        assert text.startswith(first_sentence), (rule["id"], text)
        assert text.endswith(f"npudoctor explain {check.id}")
        assert markdown_help.endswith(f"`npudoctor explain {check.id}`")
        assert "How to fix" in text and "How to fix" in markdown_help
        assert len(text) < len(check.why) + len(check.how_to_fix) + 80  # short: never more than the two
        assert len(text) <= 3 * sarif.HELP_CHARS, (rule["id"], len(text))
        assert rule["helpUri"] == check.upstream[0]
        assert rule["helpUri"].startswith("https://github.com/sgl-project/sglang/pull/")


def test_sarif_results_levels_and_suppression(sarif_log):
    results = {r["ruleId"]: r for r in sarif_log["runs"][0]["results"]}
    assert set(results) == {"NPD001", "NPD002", "NPD003", "NPD006"}  # no skip, no pass
    assert results["NPD001"]["level"] == "error"
    assert results["NPD002"]["level"] == "warning"
    assert results["NPD003"]["level"] == "error"
    assert results["NPD006"]["suppressions"] == [
        {"kind": "external", "justification": "accepted risk, ticket 42"}
    ]
    assert all("suppressions" not in results[i] for i in ("NPD001", "NPD002", "NPD003"))


def test_sarif_locations_link_into_the_checkout(sarif_log):
    """GitHub code scanning reads a relative uri as relative to the repository checkout (and ignores
    base ids of its own): a tree inside the checkout is named from the checkout's root."""
    results = {r["ruleId"]: r for r in sarif_log["runs"][0]["results"]}
    fail = results["NPD001"]
    physical = [loc["physicalLocation"] for loc in fail["locations"]]
    assert [p["artifactLocation"] for p in physical] == [
        {"uri": "site-packages/sglang/srt/mem_cache/memory_pool.py", "uriBaseId": "%SRCROOT%"},
        {"uri": "site-packages/sglang/srt/model_executor/model_runner.py", "uriBaseId": "%SRCROOT%"},
    ]
    assert [p["region"]["startLine"] for p in physical] == [123, 45]
    assert results["NPD002"]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == (
        "site-packages/sglang/srt/a%2Cb%3Ac.py"
    )
    assert fail["message"]["text"].startswith("pool too small")
    assert "size < 2\nline two" in fail["message"]["text"]
    assert "copies: a, b" in fail["message"]["text"]
    assert "locations" not in results["NPD003"]


def test_sarif_locations_outside_the_checkout_are_absolute_file_uris(monkeypatch, tmp_path):
    """An installed sglang outside the checkout: an absolute ``file://`` URI (GitHub makes it
    relative to the checkout when it can; no base id, which would name another file)."""
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    (run,) = json.loads(sarif.render(REPORT))["runs"]
    results = {r["ruleId"]: r for r in run["results"]}
    locations = [loc["physicalLocation"]["artifactLocation"] for loc in results["NPD001"]["locations"]]
    assert locations == [
        {"uri": "file:///opt/site-packages/sglang/srt/mem_cache/memory_pool.py"},
        {"uri": "file:///opt/site-packages/sglang/srt/model_executor/model_runner.py"},
    ]
    assert "originalUriBaseIds" not in run


def test_sarif_working_directory_is_the_checkout_outside_github(monkeypatch, tmp_path):
    """A CI job outside GitHub runs from its checkout: the working directory stands for it."""
    tree = tmp_path / "trees" / "sglang"
    tree.mkdir(parents=True)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    report = Report(
        target=TargetInfo(version="0.5.1", path=str(tree), source="path"),
        deployment={"source": "none"},
        results=(FAIL,),
        fail_on=Status.FAIL,
    )
    (run,) = json.loads(sarif.render(report))["runs"]
    location = run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "trees/sglang/srt/mem_cache/memory_pool.py", "uriBaseId": "%SRCROOT%"}
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": tmp_path.resolve().as_uri() + "/"}}


# --- GitHub -----------------------------------------------------------------------------------------


def test_github_escaping():
    # a CR is shown escaped, as the text report shows it; the newline is the runner's %0A
    assert github.escape_data("100%\r\nx: a,b") == "100%25\\r%0Ax: a,b"
    assert github.escape_property("100%\r\nx: a,b") == "100%25\\r%0Ax%3A a%2Cb"


def test_github_annotations():
    lines = github.render(REPORT).splitlines()
    assert len(lines) == 5  # fail, warn, error, ignored, summary
    fail, warn, error, ignored, summary = lines
    assert fail.startswith(
        "::error file=sglang/srt/mem_cache/memory_pool.py,line=123,title=NPD001 KV pool | sizing::"
    )
    # The message stays on one line: newlines and % escaped, ':' and ',' left alone in data.
    assert "pool too small: a|b%0Ac <tag> & \\x01d%0A" in fail
    assert "\x01" not in github.render(REPORT)
    assert (
        "%0Aexpected: no copy; observed: copies: a, b at sglang/srt/model_executor/model_runner.py:45" in fail
    )
    assert warn.startswith("::warning file=sglang/srt/a%2Cb%3Ac.py,line=7,title=NPD002 Graph capture::")
    assert warn.endswith(
        "capture is slow, 100%25 of: time%0Aexpected: fast; observed: slow at sglang/srt/a,b:c.py:7"
    )
    assert error.startswith("::error title=NPD003 Broken check::check crashed%0Aerror: KeyError: 'x'")
    assert ignored.startswith("::notice file=sglang/srt/ign.py,line=9,title=NPD006 Known issue::")
    assert "accepted risk, ticket 42" in ignored
    assert not summary.startswith("::")
    assert "fail: 2" in summary and "warn: 1" in summary and "error: 1" in summary
    assert "skip: 1" in summary and "pass: 1" in summary and "ignored: 1" in summary
    assert "2 finding(s)" in summary


def test_github_step_summary_appends(tmp_path):
    target = tmp_path / "summary.md"
    target.write_text("# earlier step\n", encoding="utf-8")
    github.write_step_summary(REPORT, target)
    github.write_step_summary(REPORT, str(target))
    text = target.read_text(encoding="utf-8")
    assert text.startswith("# earlier step\n")
    table = markdown.table(REPORT)
    assert text.count(table) == 2
    assert text.count("| Check | Status | Summary |") == 2


# --- Markdown ---------------------------------------------------------------------------------------


def test_markdown_table_escapes_cells():
    table = markdown.table(REPORT)
    lines = table.splitlines()
    assert lines[0] == "## npudoctor: sglang 0.5.1 at `/opt/site-packages/sglang`"
    assert "| Check | Status | Summary |" in lines
    row = next(line for line in lines if "NPD001" in line)
    assert row == (
        r"| **NPD001** KV pool \| sizing | FAIL | pool too small: a\|b<br>c &lt;tag&gt; &amp; \x01d |"
    )
    # Every row has exactly the three columns: only the separators are unescaped pipes.
    for line in lines[lines.index("| Check | Status | Summary |") :]:
        assert line.replace("\\|", "").count("|") == 4, line
    assert "Details" not in table


def test_markdown_render_details():
    text = markdown.render(REPORT)
    assert "**1 pass, 1 skip, 1 warn, 2 fail, 1 error** (1 ignored) - 2 finding(s) at or above `fail`" in text
    assert "| **NPD006** Known issue | FAIL (ignored) | would fail |" in text
    details = text.split("### Details", 1)[1]
    assert "`sglang/srt/mem_cache/memory_pool.py:123` (MHATokenToKVPool.__init__)" in details
    assert "  - expected: size &gt;= 2 &amp; aligned" in details
    assert "  - observed: size &lt; 2<br>line two" in details
    assert "`sglang/srt/model_executor/model_runner.py:45`" in details
    assert "`FIX001`" in details and "0.5.2" in details and r"Upgrade \| or patch" in details
    assert "error: KeyError: 'x'" in details
    assert "ignored: accepted risk, ticket 42" in details
    assert "NPD005" not in details  # a plain pass has no details section
    assert "\x01" not in text


def test_formats_registered():
    for name, module in (("junit", junit), ("sarif", sarif), ("github", github), ("markdown", markdown)):
        assert named(name).module().render is module.render
