"""What a person reads in a terminal, a pipe or a CI log: every human-readable output
fits 80 columns (rich's Console reads $COLUMNS) and never splits a path, a URL or a command, the
check report is short by default, and its hints repeat the user's own flags. Real runs of real
sglang releases, at 80 and at 200 columns."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks
from npudoctor.patching.fixbase import all_fixes

from support.repo import EXAMPLES, fetch_sglang
from support.reports import json_report, result_of

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
WIDTHS = (80, 200)
URL = re.compile(r"https?://\S+")


def run_at(cli, monkeypatch, width: int, *args) -> tuple[int, list[str]]:
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = cli(*args)
    assert code in (0, 1), err
    return code, out.splitlines()


def is_command(line: str) -> bool:
    """A command to copy: the one kind of line allowed past the width (never wrapped)."""
    return re.search(r"\bnpudoctor (?:fix|run|check|advise) ", line) is not None


def over_width(lines: list[str], width: int, also=lambda line: False) -> list[str]:
    return [line for line in lines if len(line) > width and not is_command(line) and not also(line)]


def summary_rows(lines: list[str]) -> list[str]:
    """The check report's block of one row per check without a finding: after its header row, up
    to a blank line."""
    start = next(
        i for i, line in enumerate(lines) if line.split()[:4] == ["check", "status", "depth", "title"]
    )
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip())
    return lines[start + 1 : end]


def assert_no_empty_items(lines: list[str]) -> None:
    assert not [line for line in lines if re.fullmatch(r"\s*[-*•]\s*", line)], "an empty bullet"
    assert not [line for line in lines if re.fullmatch(r"\s*fix:\s*", line)], "an empty fix line"


def locations(report: dict, ids: set[str] | None = None) -> set[str]:
    return {
        f"{e['location']['path']}:{e['location']['line']}"
        for r in report["results"]
        if ids is None or r["id"] in ids
        for e in r["evidence"]
        if e["location"]
    }


def folded(report: dict) -> set[str]:
    """The catalog records the compact report folds into its one ``NPC*`` row: those that pass or
    cannot be triggered, not ignored (``--verbose`` and JSON list them all)."""
    return {
        r["id"]
        for r in report["results"]
        if CheckKind.of(r["id"]) is CheckKind.CATALOG
        and r["status"] in ("pass", "skip")
        and r["ignored"] is None
    }


def own_rows(report: dict) -> list[dict]:
    """The results with a row of their own in the compact report: neither folded into the catalog's
    row nor detailed as a finding (``in_focus``)."""
    return [r for r in report["results"] if r["id"] not in folded(report) and not in_focus(r)]


def in_focus(result: dict) -> bool:
    """A result the compact report details in a few lines: a finding, a warning, an error, an ignored one."""
    return result["status"] in ("fail", "warn", "error") or result["ignored"] is not None


def verdict_line(lines: list[str]) -> str:
    """The closing counts, which open the report's end (the next steps follow it)."""
    (line,) = [line for line in lines if re.match(r"(pass|skip|warn|fail|error): \d+", line)]
    return line


def shown(report: dict) -> set[str]:
    """The results the compact report details: findings, warnings, errors, ignored results."""
    return {r["id"] for r in report["results"] if in_focus(r)}


@pytest.mark.parametrize("width", WIDTHS)
def test_check_report_fits_the_width_and_keeps_paths_and_the_fix_command_whole(
    cli, release, monkeypatch, width
):
    tree = release("0.5.12")
    args = ("--sglang-path", tree, "--config", DEEPSEEK_PD)
    report = json_report(cli, *args)
    code, lines = run_at(cli, monkeypatch, width, "check", *args)
    assert code == 1

    rows = summary_rows(lines)
    assert all(len(row) <= width for row in rows), rows
    for result in own_rows(report):
        assert [row for row in rows if row.split()[0] == result["id"]].__len__() == 1, (result["id"], rows)
        row = next(row for row in rows if row.split()[0] == result["id"])
        assert result["status"].upper() in row.split() and result["depth"] in row.split()
    (catalog,) = [row for row in rows if row.startswith(CheckKind.CATALOG.heading)]
    assert f"{len(folded(report))} more catalog records" in catalog
    assert len(rows) == len(own_rows(report)) + 1
    for result in report["results"]:  # each finding in a few lines, under its status, id and title
        if in_focus(result):
            (heading,) = [
                line for line in lines if line.startswith(f"{result['id']} {result['status'].upper()} ")
            ]
            assert len(heading) <= width

    assert over_width(lines, width) == []
    assert any(report["target"]["path"] in line for line in lines), "the tree's path, whole on one line"
    for result in report["results"]:  # each finding's first located piece of evidence, its path whole
        located = [e for e in result["evidence"] if e["location"]][:1] if in_focus(result) else []
        for evidence in located:
            where = f"{evidence['location']['path']}:{evidence['location']['line']}"
            assert any(where in line for line in lines), f"{where} split or missing"
    assert_no_empty_items(lines)

    # one fix command for both runtime fixes, repeating the flags the user gave, on one line
    with_fix = [r for r in report["results"] if r["status"] == "fail" and r["remediation"]["fix_id"]]
    assert len(with_fix) == 2  # NPD001, NPD006; the records have none
    (hint,) = [line for line in lines if "npudoctor fix --select" in line]
    assert hint.startswith("  npudoctor fix --select NPD001,NPD006 "), hint
    assert f"--sglang-path {tree}" in hint and f"--config {DEEPSEEK_PD}" in hint, hint
    counts = report["summary"]
    verdict = verdict_line(lines)
    tally = "  ".join(f"{s}: {counts[s]}" for s in ("pass", "skip", "warn", "fail", "error") if counts[s])
    assert verdict.startswith(tally)  # NPC134's leak is a warn (tests/cli/test_gate.py)
    assert f"{counts['findings']} finding(s) at or above 'fail'" in verdict
    assert lines.index(verdict) > lines.index(hint) - 3, "the verdict opens the report's end"
    # short by default: the passes have no details
    assert not [line for line in lines if line.startswith(("NPD000 PASS", "NPD005 PASS"))]


def test_verbose_check_report_details_every_result_with_every_location_whole(cli, release, monkeypatch):
    args = ("--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD)
    report = json_report(cli, *args)
    _, lines = run_at(cli, monkeypatch, 80, "check", *args, "--verbose")
    for result in report["results"]:
        assert [line for line in lines if line.startswith(f"{result['id']} {result['status'].upper()}")]
    for where in locations(report):
        assert any(where in line for line in lines), f"{where} split or missing"
    assert over_width(lines, 80) == []
    assert_no_empty_items(lines)


@pytest.mark.parametrize("width", WIDTHS)
def test_clean_release_report_is_the_rows_and_a_closing_line(cli, release, monkeypatch, width):
    args = ("--sglang-path", release("0.5.23"), "--config", DEEPSEEK_PD)
    report = json_report(cli, *args)
    code, lines = run_at(cli, monkeypatch, width, "check", *args)
    assert code == 0
    rows = summary_rows(lines)
    assert len(rows) == len(own_rows(report)) + 1 and all(len(row) <= width for row in rows)
    assert not [line for line in lines if "fix" in line.split()]
    assert over_width(lines, width) == []
    assert lines[-1].endswith("no findings at or above 'fail'")
    # no finding: the header, one row per check, the notes' ids, the verdict
    assert len(lines) <= 4 + 1 + len(rows) + 2 + 2, "\n".join(lines)


# Llama-3-8B's public config.json (meta-llama/Meta-Llama-3-8B): GQA, 32 layers, 8 KV heads of 128
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("width", WIDTHS)
def test_each_skip_says_why_in_one_line_without_verbose(cli, release, monkeypatch, tmp_path, width):
    """A colocated Llama-3-8B server: the PD, PP and CP checks do not apply, and the compact report
    says why for each, one line under the rows, instead of bare SKIPs (the reason was in JSON only)."""
    model = tmp_path / "Meta-Llama-3-8B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B))
    args = ("--sglang-path", release("0.5.23"), "--model-path", model, "--tp-size", "8")
    report = json_report(cli, *args)
    skipped = [r for r in own_rows(report) if r["status"] == "skip" and r["id"] not in shown(report)]
    assert skipped, "a colocated server is out of the PD checks' scope"
    _, lines = run_at(cli, monkeypatch, width, "check", *args)
    rows = summary_rows(lines)
    for result in skipped:  # a row of its own, or of the checks skipped for the same reason
        said = [
            row.split("  SKIP  ", 1)[1].strip().removeprefix(result["depth"]).strip().removesuffix("...")
            for row in rows
            if result["id"] in row.split("  SKIP  ", 1)[0].replace(",", " ").split()
        ]
        reasons = [reason for reason in said if len(reason) > 8 and result["summary"].startswith(reason)]
        assert len(reasons) == 1, (result["summary"], lines)
    assert over_width(lines, width) == []


def test_ignored_findings_say_so_in_the_closing_line(cli, release, monkeypatch):
    ignore = ("--select", "NPD", "--ignore", "NPD001:2999-01-01", "--ignore", "NPD006:2999-01-01")
    code, lines = run_at(
        cli, monkeypatch, 80, "check", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, *ignore
    )
    assert code == 0
    assert "fail: 2 (2 ignored)  -  no findings at or above 'fail'" in lines[-1], lines[-1]
    assert "fail: 2  -" not in lines[-1]
    for finding in ("NPD001", "NPD006"):
        assert [line for line in lines if line.startswith(f"{finding} FAIL ignored")]
    assert len([line for line in lines if line.strip().startswith("ignored: ")]) == 2


def test_expired_ignore_has_advice_but_no_fix_line(cli, release, monkeypatch):
    """An expired ignore entry's remediation has no fix id: no "fix:" line at all, its advice stays."""
    code, lines = run_at(cli, monkeypatch, 80, "check", "--sglang-path", release("0.5.23"), "--config",
                         DEEPSEEK_PD, "--ignore", "NPD001:2020-01-01")  # fmt: skip
    assert code == 1
    start = next(i for i, line in enumerate(lines) if line.startswith("NPD001-ignore-expired FAIL"))
    assert len(lines[start]) <= 80
    block = lines[start : next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))]
    assert not [line for line in block if "fix:" in line or "npudoctor fix" in line]
    assert any("renew the entry" in line for line in block)
    assert_no_empty_items(lines)


def test_evidence_without_a_location_puts_the_expectation_on_its_bullet(release):
    """No empty bullet: an evidence with no location is "- expected: ..." in the full report and
    "observed: ..." in the compact one (a real report of 0.5.12, its first NPD001 evidence without
    its location)."""
    from npudoctor.deployment.spec import DeploymentSpec
    from npudoctor.formatters import text
    from npudoctor.service.hints import UserOptions
    from npudoctor.service.runner import CheckRequest, run

    deployment = DeploymentSpec(config=DEEPSEEK_PD)
    report = run(CheckRequest(deployment=deployment, sglang_path=release("0.5.12"), depth="static"))
    npd001 = next(r for r in report.results if r.id == "NPD001")
    first = dataclasses.replace(npd001.evidence[0], location=None)
    changed = dataclasses.replace(npd001, evidence=(first, *npd001.evidence[1:]))
    report = dataclasses.replace(
        report, results=tuple(changed if r.id == "NPD001" else r for r in report.results)
    )
    user = UserOptions(deployment=("--config", "deploy.yaml"))
    lines = text.render(report, verbose=True, user=user).splitlines()
    assert_no_empty_items(lines)
    expected = " ".join(first.expected.split()[:4])
    assert [line for line in lines if line.startswith(f"  - expected: {expected}")], "\n".join(lines)
    assert "  fix: npudoctor fix --select NPD001 --config deploy.yaml" in lines
    assert over_width(lines, 80) == []
    compact = text.render(report, user=user).splitlines()
    observed = " ".join(first.observed.split()[:3])
    assert [line for line in compact if line.startswith(f"  observed: {observed}")], "\n".join(compact)
    assert "  npudoctor fix --select NPD001,NPD006 --config deploy.yaml" in compact
    assert over_width(compact, 80) == []


@pytest.mark.parametrize("width", WIDTHS)
def test_list_gives_each_check_one_line_and_each_url_whole(cli, monkeypatch, width):
    code, lines = run_at(cli, monkeypatch, width, "list")
    assert code == 0
    urls = [url for check in all_checks() for url in check.upstream]
    assert urls
    for check in all_checks():
        assert len([line for line in lines if line.startswith(f"{check.id} ")]) == 1
        for url in check.upstream:
            assert f"        {url}" in lines, f"{url} not whole on its own line"
    assert over_width(lines, width) == []
    assert [match for line in lines for match in URL.findall(line)] == urls  # nothing else looks like one


@pytest.mark.parametrize("full", [False, True], ids=["short", "full"])
@pytest.mark.parametrize("width", WIDTHS)
def test_explain_is_markdown_without_raw_backticks(cli, monkeypatch, width, full):
    code, lines = run_at(cli, monkeypatch, width, "explain", "NPD001", *(["--full"] if full else []))
    text = "\n".join(lines)
    assert code == 0
    assert "``" not in text
    assert over_width(lines, width) == []
    assert all(line == line.rstrip() for line in lines), "no padding at the ends of lines"
    for heading in ("Why it matters", "When it bites", "How to fix", "Upstream"):
        assert heading in lines
    assert "https://github.com/sgl-project/sglang/pull/25249" in URL.findall(text)
    assert any(line.startswith("Runtime fix (safe)") for line in lines)
    assert ("What the check tests" in lines) == full
    if full:
        assert "Req.offload_kv_cache" in text  # a code span, without its backticks
        if width == 200:  # the docstring's hard line breaks are gone: the paragraph flows
            phrase = "retracts requests and copies their KV to host memory"
            assert any(phrase in line for line in lines), text
    else:
        assert len(lines) <= 45 if width == 80 else 30


@pytest.mark.parametrize("width", WIDTHS)
def test_fix_plan_is_one_line_per_fix_with_reasons_and_urls_whole(cli, release, monkeypatch, width):
    tree = release("0.5.12")
    args = ("fix", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    plan = {p["id"]: p for p in json.loads(cli(*args, "--format", "json")[1])["plan"]}
    code, lines = run_at(cli, monkeypatch, width, *args)
    assert code == 0
    assert over_width(lines, width) == []
    for fix in all_fixes():
        (row,) = [line for line in lines if line.startswith(f"{fix.id} ")]
        action = plan[fix.id]["action"]
        assert row.split()[1 : 1 + len(action.split())] == action.split() and len(row) <= width
    for entry in plan.values():
        if entry["action"] == "apply":  # its reason and where it comes from, the URL whole on its own line
            assert f"port of {entry['upstream']}" in [line.strip() for line in lines]
            assert any(entry["reason"].split(":")[0] in line for line in lines)
    assert [fix_id for fix_id, entry in plan.items() if entry["action"] == "apply"] == ["NPD001", "NPD006"]
    uncured = next((i for i, line in enumerate(lines) if line.startswith("no runtime fix cures")), len(lines))
    assert len(lines[:uncured]) <= (35 if width == 80 else 25), "\n".join(lines)  # the old table: ~65 lines
    (hint,) = [line for line in lines if line.strip().startswith("npudoctor fix --apply")]
    assert f"--sglang-path {tree}" in hint and f"--config {DEEPSEEK_PD}" in hint


@pytest.mark.slow  # a live run (~15 s)
def test_a_pass_with_a_note_shows_the_note(cli, release, monkeypatch):
    """0.5.12 DeepSeek-V3 PD at the live depth: NPD003 passes, with a note per role that sglang's PD
    bootstrap raised (NPD006's finding): the compact report names it among the results with notes,
    and --verbose shows the notes, not only JSON."""
    args = ("--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "--depth", "auto")
    code, compact = run_at(cli, monkeypatch, 80, "check", *args)
    assert code == 1
    (noted,) = [line for line in compact if line.startswith("notes (--verbose shows them): ")]
    assert "NPD003" in noted.split(": ", 1)[1].replace(",", " ").split()
    # the live-depth line above the report's end (it wraps to a second line when its numbers are wide)
    verdict = next(i for i, line in enumerate(compact) if re.match(r"pass: \d+", line))
    assert any(line.startswith("live depth: sglang imported in ") for line in compact[verdict - 4 : verdict])
    assert over_width(compact, 80) == []
    code, lines = run_at(cli, monkeypatch, 80, "check", *args, "--verbose")
    start = next(i for i, line in enumerate(lines) if line.startswith("NPD003 PASS"))
    block = " ".join(
        " ".join(lines[start : next(i for i in range(start, len(lines)) if not lines[i].strip())]).split()
    )
    assert block.count("(NPD006's finding)") == 2, block
    assert "sglang/srt/hardware_backend/npu/memory_pool_npu.py:299" in block
    assert over_width(lines, 80) == []


# -- every command: a path or URL the wide rendering shows is whole in the narrow one --------------

# a path, a URL, or a site a fix replaces (``module:Class.method``, as ``fix --status`` names it)
PATH_OR_URL = re.compile(
    r"https?://[^\s)]+|(?:\.{0,2}/)?[\w.\-]+(?:/[\w.\-]+)+\.(?:py|yaml|json)(?::\d+)?|/[\w.\-]+(?:/[\w.\-]+)+"
    r"|sglang(?:\.\w+)+:\w+(?:\.\w+)*"
)


COMMANDS = {
    "check": "check --sglang-path {old} --config {deployment}",
    "check --verbose": "check --verbose --sglang-path {old} --config {deployment}",
    "fix": "fix --depth static --sglang-path {old} --config {deployment}",
    "fix --apply": "fix --apply --depth static --site {site} --sglang-path {old} --config {deployment}",
    # recorded for 0.5.12 first, asked on 0.5.13: the record no longer fits (exit 1), the next command
    "fix --status": "fix --status --depth static --site {site} --sglang-path {new} --config {deployment}",
    "list": "list",
    "explain": "explain NPD003 --full",
    "env": "env",
    "advise": "advise --wheel-dir {wheels} --config {deployment}",
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_keeps_each_path_and_url_whole_at_80_columns(
    cli, release, monkeypatch, tmp_path, command
):
    paths = {"old": release("0.5.12"), "new": release("0.5.13"), "deployment": DEEPSEEK_PD}
    paths.update(site=tmp_path / "site", wheels=tmp_path / "wheels")
    paths["site"].mkdir()
    paths["wheels"].mkdir()
    for version in ("0.5.12", "0.5.13"):  # advise offline: the wheels, unpacked already in the release cache
        wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", version)
        os.link(wheel, paths["wheels"] / wheel.name)
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(fetch_sglang.cache_dir()))
    if command == "fix --status":
        assert cli(*COMMANDS["fix --apply"].format(**paths).split())[0] == 0
    argv = COMMANDS[command].format(**paths).split()
    wide = run_at(cli, monkeypatch, 200, *argv)[1]
    narrow = run_at(cli, monkeypatch, 80, *argv)[1]
    tokens = {match.group(0).rstrip(".,;:") for line in wide for match in PATH_OR_URL.finditer(line)}
    assert tokens, "the wide rendering names no path or URL: nothing is tested"
    text = "\n".join(narrow)
    missing = [token for token in sorted(tokens) if token not in text]
    if command != "check":  # the compact check report ellipsizes a finding's evidence, whole words only
        assert missing == []
    words = {word.rstrip(".,;:") for line in narrow for word in line.split()}
    split = [t for t in missing if any(len(w) >= 10 and t.startswith(w) and w != t for w in words)]
    assert split == [], "a path cut short or split across lines"
    assert over_width(narrow, 80, also=lambda line: any(t in line and len(t) > 40 for t in tokens)) == []


def test_compact_report_shows_the_first_evidence_and_says_how_much_more_verbose_shows(
    cli, release, monkeypatch
):
    tree = release("0.5.13")  # NPD005 fails there with one piece of evidence per override (known.yaml)
    report = json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK_PD)
    evidence = result_of(report, "NPD005")["evidence"]
    assert len(evidence) > 2
    located = [f"{e['location']['path']}:{e['location']['line']}" for e in evidence if e["location"]]
    text = "\n".join(run_at(cli, monkeypatch, 80, "check", "--sglang-path", tree, "--config", DEEPSEEK_PD)[1])
    assert located[0] in text and located[-1] not in text  # the first piece of evidence, one line
    verbose = "\n".join(
        run_at(cli, monkeypatch, 80, "check", "-v", "--sglang-path", tree, "--config", DEEPSEEK_PD)[1]
    )
    assert all(location in verbose for location in located) and "more: --verbose" not in verbose
