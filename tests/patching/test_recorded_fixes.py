"""`npudoctor check` after `npudoctor fix --apply`: sglang's processes install the recorded fixes
whose shape the installed code still has, so the deployment is judged with them, as `--with-fix`
judges it (the live probes run with the fix applied); the report says so, and a gate that a fix
cures passes. `--no-recorded-fixes` judges the installed code alone; a record whose shapes no
longer match, a static run (which runs no fix) and a record written for another sglang are said,
never taken. `fix --status` with nothing recorded says what `--apply` would record.

DeepSeek-V3 PD (MLA without the NSA indexer) on real releases: the truths say which of its
defects a release has (NPD001, the offload round-trip of sglang#25249; NPD006, the PD start-up
tables of sglang#25383)."""

from __future__ import annotations

import json

import pytest

from npudoctor.patching import records

from support.repo import EXAMPLES
from support.reports import result_of
from support.truths import truth_present

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
OLD, NEW = "0.5.12", "0.5.23"
FIXED_HERE = ("NPD001", "NPD006")  # safe fixes of the defects DeepSeek-V3 PD can have


@pytest.fixture
def site(tmp_path, monkeypatch):
    """Where `fix --apply` records and `check` looks (NPUDOCTOR_SITE): the test's own directory,
    never beside the shared release trees."""
    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.setenv(records.SITE_ENV, str(directory))
    return directory


def _present(version: str) -> list[str]:
    return [c for c in FIXED_HERE if truth_present(version, c, "mla")]


def _apply(cli, tree) -> list[str]:
    code, out, err = cli("fix", "--apply", "--format", "json", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    assert code == 0, err
    return json.loads(out)["applied"]


def _check(cli, tree, *options) -> tuple[int, dict]:
    """The seven checks (``--select NPD``), the ones runtime fixes cure; the catalog's records of this
    deployment on 0.5.12 (its prefill PP 2: NPC072) have no runtime fix."""
    code, out, err = cli(
        "check", "-f", "json", "--sglang-path", tree, "--config", DEEPSEEK_PD, "--select", "NPD", *options
    )
    assert code in (0, 1), err
    return code, json.loads(out)


def test_check_judges_the_deployment_with_the_fixes_fix_apply_recorded(cli, release, site):
    tree = release(OLD)
    present = _present(OLD)
    assert present, "the truths name a defect of this deployment on this release"
    assert sorted(_apply(cli, tree)) == present
    code, report = _check(cli, tree, "--depth", "auto")
    assert code == 0, report["recorded_fixes"]  # the gate passes: the recorded fixes cure it
    recorded = report["recorded_fixes"]
    assert recorded["record"] == str(site / records.DIST_INFO)
    assert {fix_id for fix_id, state in recorded["fixes"].items() if state["judged"]} == set(present)
    assert recorded["line"].startswith(f"judged with recorded fix {', '.join(present)} (shape verified)")
    for check_id in present:
        result = result_of(report, check_id)
        assert (result["status"], result["depth"]) == ("pass", "live"), result
        assert result["summary"].startswith(f"with runtime fix {check_id}")
    code, text, _ = cli(
        "check", "--sglang-path", tree, "--config", DEEPSEEK_PD, "--depth", "auto", "--select", "NPD"
    )
    assert code == 0 and f"fix record: judged with recorded fix {', '.join(present)}" in text, text

    # the installed code alone: the findings the record cures
    code, alone = _check(cli, tree, "--depth", "auto", "--no-recorded-fixes")
    assert code == 1
    assert [r["id"] for r in alone["results"] if r["status"] == "fail"] == present
    assert not any(state["judged"] for state in alone["recorded_fixes"]["fixes"].values())
    assert "--no-recorded-fixes" in alone["recorded_fixes"]["line"]


def test_a_static_check_says_it_runs_no_recorded_fix(cli, release, site):
    tree = release(OLD)
    _apply(cli, tree)
    code, report = _check(cli, tree, "--depth", "static")
    assert code == 1  # a fix is judged by running it: the static verdicts are the installed code's
    line = report["recorded_fixes"]["line"]
    assert "not judged: shape verified; --depth static runs no fix" in line, line
    assert {result_of(report, c)["status"] for c in _present(OLD)} == {"fail"}


def test_a_stale_record_is_named_and_not_taken(cli, release, site):
    tree = release(OLD)
    applied = _apply(cli, tree)
    plan = site / records.DIST_INFO / "npudoctor-fixes.json"
    document = json.loads(plan.read_text())
    stale = applied[0]
    first_site = sorted(document["fixes"][stale]["shape"])[0]
    document["fixes"][stale]["shape"][first_site] = "0" * 16  # code that changed since --apply
    plan.write_text(json.dumps(document))
    _, report = _check(cli, tree, "--depth", "static")
    state = report["recorded_fixes"]["fixes"][stale]
    assert not state["judged"] and state["detail"].startswith("stale: the installed code changed"), state
    assert first_site in state["detail"]


def test_a_record_for_another_sglang_is_not_this_ones(cli, release, site):
    _apply(cli, release(OLD))
    _, report = _check(cli, release(NEW), "--depth", "static")
    assert report["recorded_fixes"] is None


def test_status_with_nothing_recorded_says_what_apply_would_record(cli, release, site):
    old = ("--sglang-path", release(OLD), "--config", DEEPSEEK_PD)
    code, out, err = cli("fix", "--status", *old)
    present = _present(OLD)
    assert code == (1 if present else 0), out + err
    assert f"no fix is recorded in {site}" in out
    assert f"--apply would record {', '.join(present)}; next:" in out
    assert f"npudoctor fix --apply --select {','.join(present)} --sglang-path {release(OLD)}" in out
    code, out, err = cli("fix", "--status", "--format", "json", *old)
    status = json.loads(out)
    assert (status["recorded"], status["fits"]) == (None, False)
    assert [row["fix_id"] for row in status["status"]] == present
    assert status["next"].startswith(f"npudoctor fix --apply --select {','.join(present)}")

    new = ("--sglang-path", release(NEW), "--config", DEEPSEEK_PD)
    code, out, err = cli("fix", "--status", *new)
    assert not _present(NEW) and code == 0, out + err
    assert "no fix is needed for this sglang and deployment: --apply would record none" in out
