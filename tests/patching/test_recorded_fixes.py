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
    never beside the shared release trees, and on the PYTHONPATH a server started here has, where
    sglang's plugin loading finds the record."""
    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.setenv(records.SITE_ENV, str(directory))
    monkeypatch.setenv("PYTHONPATH", str(directory))
    return directory


def _present(version: str) -> list[str]:
    return [c for c in FIXED_HERE if truth_present(version, c, "mla")]


def _apply(cli, tree) -> list[str]:
    code, out, err = cli("fix", "--apply", "--format", "json", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    assert code == 0, err
    return json.loads(out)["applied"]


def _check(cli, tree, *options) -> tuple[int, dict]:
    """The deep checks (``--select NPD``), the ones runtime fixes cure; the catalog's records of this
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


# -- a record sglang's own plugin loading would not run is never judged --------------------------
# sglang's load_plugins() (sglang/srt/plugins/__init__.py, the same in 0.5.11 to 0.5.23): the entry
# points of group sglang.srt.plugins on the server's sys.path, those SGLANG_PLUGINS (comma-separated)
# does not name skipped when it is set


def _unload(how: str, site, monkeypatch) -> str:
    """Put the record of ``site`` out of reach of sglang's plugin loading, ``how``; the words the
    reason names."""
    if how == "SGLANG_PLUGINS names another plugin":
        monkeypatch.setenv("SGLANG_PLUGINS", "other_plugin, another")
        return "SGLANG_PLUGINS"
    if how == "the site is off the server's path":
        monkeypatch.delenv("PYTHONPATH")
        return "not on the sys.path"
    (site / records.DIST_INFO / "entry_points.txt").unlink()  # the entry point removed
    return "no entry point"


UNLOADED = ["SGLANG_PLUGINS names another plugin", "the site is off the server's path", "entry point removed"]


@pytest.mark.parametrize("how", UNLOADED)
def test_a_record_sglang_will_not_load_is_not_judged_and_status_says_why(
    cli, release, site, monkeypatch, how
):
    from npudoctor.service.recordedfixes import recorded_fixes
    from npudoctor.target.discovery import discover

    tree = release(OLD)
    code, out, err = cli("fix", "--apply", "-f", "json", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    assert code == 0 and json.loads(out)["applied"], err
    target = discover(tree)
    assert sorted(recorded_fixes(target, "auto").plan) == _present(OLD)  # within reach: judged with it
    said = _unload(how, site, monkeypatch)

    recorded = recorded_fixes(target, "auto")
    assert recorded.plan == {}, recorded  # the live probes would run without it, as the server does
    assert all(said in why for why in recorded.not_used.values()), recorded.not_used
    _, report = _check(cli, tree, "--depth", "static")
    line = report["recorded_fixes"]["line"]
    assert said in line and "--depth static" not in line, line  # the reason that holds at every depth

    status = ("fix", "--status", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    code, out, err = cli(*status)
    assert code == 1, out + err
    assert " in place " not in out and said in out, out
    code, out, _ = cli(*status, "-f", "json")
    document = json.loads(out)
    assert document["fits"] is False and said in document["not_applied"], document
    assert {row["state"] for row in document["status"]} == {"not applied"}, document


def test_sglang_plugins_naming_npudoctor_among_others_keeps_the_record_judged(
    cli, release, site, monkeypatch
):
    from npudoctor.service.recordedfixes import recorded_fixes
    from npudoctor.target.discovery import discover

    tree = release(OLD)
    cli("fix", "--apply", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    monkeypatch.setenv("SGLANG_PLUGINS", "other_plugin, npudoctor ,")  # sglang strips each name
    assert sorted(recorded_fixes(discover(tree), "auto").plan) == _present(OLD)
    code, out, err = cli("fix", "--status", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    assert code == 0 and "in place" in out, out + err
