"""JUnit XML report, so CI systems that only understand test results (Jenkins, GitLab,
Azure Pipelines, most "test report" widgets) can show each check as a test case.

The output validates against the Jenkins xunit-plugin ``junit-10.xsd`` (the most
widely accepted JUnit dialect): ``fail`` becomes ``<failure>``, ``error`` becomes
``<error>``, ``skip`` and ignored results become ``<skipped>``, and ``warn`` passes with
its evidence in ``<system-out>`` (a warning must not turn the build red by itself).
Control characters of the text (C0 but tab and newline, CR included, DEL, C1, and Unicode's
bidirectional controls) are shown escaped (``\\r``, ``\\u202e``), as the text report shows them
(``npudoctor.terminal.printable``): a test report viewer would otherwise act on them. What XML 1.0
cannot carry at all besides (lone surrogates, U+FFFE) is stripped, since no escape exists for it
and a single one would make the whole file unparsable.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from npudoctor.formatters.advice import row_options
from npudoctor.results import Report, Result, Status
from npudoctor.service.advise import Advice
from npudoctor.service.hints import UserOptions, fix_hint
from npudoctor.terminal import printable

# Everything outside the XML 1.0 ``Char`` production, and the controls it discourages (DEL, C1:
# U+009B is ESC [ to an 8-bit terminal that shows the file).
_ILLEGAL_XML = re.compile("[^\t\n\r\u0020-\u007e\u00a0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean(text: object) -> str:
    return _ILLEGAL_XML.sub("", printable(str(text)))


def render(report: Report, user: UserOptions | None = None, verbose: bool = False) -> str:
    """``user``: the user's own options the fix hints repeat (None: those the report names).
    ``verbose`` is the text format's: this one says the same either way."""
    user = user if user is not None else UserOptions.of_report(report)
    results = report.results
    tally = counts(results)
    root = ET.Element(
        "testsuites", {"name": "npudoctor", **{k: str(tally[k]) for k in ("tests", "failures", "errors")}}
    )
    suite = ET.SubElement(root, "testsuite", {"name": "npudoctor", **{k: str(v) for k, v in tally.items()}})
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("npudoctor.version", report.tool_version),
        ("sglang.version", report.target.version or "unknown"),
        ("sglang.path", report.target.path),
        ("sglang.source", report.target.source),
        ("fail_on", report.fail_on.value),
        ("failing_impacts", ",".join(report.failing_impacts)),
    ):
        ET.SubElement(properties, "property", {"name": name, "value": clean(value)})

    for result in results:
        testcase(suite, result, user)

    return document(root)


def counts(results) -> dict[str, int]:
    """A test suite's counts: ``fail`` and ``error`` not ignored are failures and errors; ``skip``
    and ignored results are skipped."""
    return {
        "tests": len(results),
        "failures": sum(1 for r in results if r.ignored is None and r.status is Status.FAIL),
        "errors": sum(1 for r in results if r.ignored is None and r.status is Status.ERROR),
        "skipped": sum(1 for r in results if r.ignored is not None or r.status is Status.SKIP),
    }


def document(root: ET.Element) -> str:
    """The XML file of ``root``, indented, with its declaration."""
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def testcase(suite: ET.Element, result: Result, user: UserOptions | None = None) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        {"classname": clean(f"npudoctor.{result.id}"), "name": clean(f"{result.id} {result.title}")},
    )
    details = clean(_details(result, user or UserOptions()))
    if result.ignored is not None:
        child = ET.SubElement(case, "skipped", {"message": clean(f"ignored: {result.ignored}")})
        child.text = details
    elif result.status is Status.FAIL:
        kind = result.impact or "fail"  # what the defect does: startup-crash, silent-wrong-output, ...
        child = ET.SubElement(case, "failure", {"message": clean(result.summary), "type": kind})
        child.text = details
    elif result.status is Status.ERROR:
        message = result.error or result.summary
        child = ET.SubElement(case, "error", {"message": clean(message), "type": "error"})
        child.text = details
    elif result.status is Status.SKIP:
        ET.SubElement(case, "skipped", {"message": clean(result.summary)})
    else:  # warn passes, pass passes; the evidence goes to system-out
        out = ET.SubElement(case, "system-out")
        out.text = details


def _details(result: Result, user: UserOptions) -> str:
    lines = [f"{result.status.value.upper()}: {result.summary}"]
    if result.impact and result.status in (Status.FAIL, Status.WARN):
        lines.append(f"impact: {result.impact}")
    if result.ignored is not None:
        lines.append(f"ignored: {result.ignored}")
    if result.error:
        lines.append(f"error: {result.error}")
    for assumption in result.assumptions:
        lines.append(f"assumed: {assumption}")
    for evidence in result.evidence:
        lines.append(f"- at {evidence.location}" if evidence.location else "-")
        lines.append(f"  expected: {evidence.expected}")
        lines.append(f"  observed: {evidence.observed}")
    fix = result.remediation
    if fix is not None:
        if fix.fix_id:
            lines.append(f"fix: {fix_hint(fix.fix_id, user)}")
        if fix.upstream:
            lines.append(fix.upstream)
        if fix.advice:
            lines.append(fix.advice)
    return "\n".join(lines)


def render_advice(advice: Advice) -> str:
    root = ET.Element("testsuites", {"name": "npudoctor advise"})
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for row in advice.rows:
        suite = ET.SubElement(root, "testsuite", {"name": clean(f"sglang {row.candidate.label}")})
        if row.report is None:  # a release that could not be had does not turn the build red by itself
            tally = {"tests": 1, "failures": 0, "errors": 0, "skipped": 1}
            case = ET.SubElement(
                suite, "testcase", {"classname": "npudoctor.service.advise", "name": "fetch and check"}
            )
            ET.SubElement(case, "skipped", {"message": clean(row.error or "")})
        else:
            tally = counts(row.report.results)
            for result in row.report.results:
                testcase(suite, result, row_options(advice, row))
        suite.attrib.update({k: str(v) for k, v in tally.items()})
        for key in totals:
            totals[key] += tally[key]
    root.attrib.update({k: str(v) for k, v in totals.items()})
    return document(root)
