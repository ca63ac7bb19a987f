"""Remediation texts come from where the property holds in the release history.

``npudoctor/data/history.json`` is every check's verdict on every release for the witness
deployments (scripts/release_history.py). It must agree with the team's verified truths, and a
finding's "upgrade to X" must name the first release from which its property holds for the
deployment's kind; a defect the newest release checked still has says "not fixed upstream as of".
"""

from __future__ import annotations

import json
import re

import pytest

from npudoctor.deployment.facts import NO_DEPLOYMENT
from npudoctor.deployment.load import from_yaml
from npudoctor.target import history

from support.repo import EXAMPLES
from support.reports import result_of
from support.truths import TRUTH

DATA = json.loads(history.DATA.read_text())
SCENARIO = {  # the witness on which each check's truths are stated (tests/patching/test_fixes.py SCENARIOS)
    "NPD001": "deepseek-v3-pd",
    "NPD002": "qwen3-moe-pd-fia",
    "NPD003": "deepseek-v3-pd",
    "NPD005": "deepseek-v3-pd",
    "NPD006": "deepseek-v3-pd",
}


def test_history_covers_every_release_from_0410():
    assert DATA["releases"][0] == "0.4.10" and "0.5.23" in DATA["releases"]
    for witness in DATA["witnesses"].values():
        for statuses in witness["results"].values():
            assert set(statuses) == set(DATA["releases"])
            assert "error" not in statuses.values()


@pytest.mark.parametrize(
    ("version", "check_id"),
    [(v, c) for v in TRUTH["releases"] for c in SCENARIO if c in TRUTH["releases"][v]],
)
def test_history_agrees_with_the_verified_truths(version, check_id):
    truth = TRUTH["releases"][version][check_id]
    status = DATA["witnesses"][SCENARIO[check_id]]["results"][check_id][version]
    assert status == ("fail" if truth["verdict"] == "present" else "pass"), (version, check_id, truth)


@pytest.mark.parametrize(
    ("example", "version", "check_id", "fixed_in"),
    [
        ("deepseek-v3-pd.yaml", "0.5.12", "NPD001", "0.5.13"),
        ("qwen3-moe-pd.yaml", "0.5.9", "NPD001", "0.5.13"),  # the MHA pool without FIA, seen live
        ("deepseek-v3-pd.yaml", "0.5.11", "NPD003", "0.5.12"),
        ("qwen3-moe-pd-fia.yaml", "0.5.9", "NPD002", "0.5.10"),
        ("deepseek-v3-pd.yaml", "0.5.14", "NPD005", "0.5.15"),  # came back for MLA in 0.5.14
    ],
)
def test_upgrade_advice_names_where_the_property_holds(example, version, check_id, fixed_in):
    found = history.upstream(check_id, from_yaml(EXAMPLES / example).facts, version)
    assert found.fixed_in == fixed_in, found
    assert found.newest_checked == DATA["releases"][-1]


def test_a_defect_in_the_newest_release_is_not_fixed_upstream():
    data = json.loads(json.dumps(DATA))
    witness = data["witnesses"]["deepseek-v3-pd"]["results"]["NPD001"]
    witness[data["releases"][-1]] = "fail"  # the newest release regresses
    facts = from_yaml(EXAMPLES / "deepseek-v3-pd.yaml").facts
    found = history.upstream("NPD001", facts, "0.5.12", data)
    assert found == history.Upstream(None, data["releases"][-1])
    # a release newer than any checked: the history cannot tell
    assert history.upstream("NPD001", facts, "9.0.0") == history.Upstream(None, None)
    # with no deployment, every witness of the check speaks: the latest fix among them
    assert history.upstream("NPD001", NO_DEPLOYMENT, "0.5.12", data).fixed_in is None


def test_the_report_carries_the_history_advice(cli, release):
    """NPD001's property holds for DeepSeek-V3 from 0.5.13, but NPD005 fails for it on 0.5.13 and
    0.5.14 (known.yaml): the upgrade named is the first release from which every check of the
    deployment holds, even with ``--select NPD001``."""
    code, out, err = cli("check", "-f", "json", "--sglang-path", release("0.5.12"),
                         "--config", EXAMPLES / "deepseek-v3-pd.yaml", "--select", "NPD001")  # fmt: skip
    assert code == 1, err
    remediation = result_of(json.loads(out), "NPD001")["remediation"]
    assert remediation["fixed_in"] == "0.5.13" and remediation["unfixed_as_of"] is None
    upgrade = re.match(r"Upgrade sglang to (\S+) or later", remediation["advice"]).group(1)
    assert TRUTH["releases"]["0.5.13"]["NPD005"]["verdict"] == "present"
    assert history.version_key(upgrade) > history.version_key("0.5.14")
    witness = DATA["witnesses"]["deepseek-v3-pd"]["results"]
    later = [r for r in DATA["releases"] if history.version_key(r) >= history.version_key(upgrade)]
    assert all(witness[c][r] in ("pass", "skip") for c in witness for r in later)
    assert "npudoctor fix --apply --select NPD001" in remediation["advice"]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.12"])
@pytest.mark.parametrize("example", ["deepseek-v3-pd.yaml", "qwen3-moe-pd.yaml", "llama3-70b-pp3-pd.yaml"])
def test_no_finding_recommends_a_release_another_finding_is_in(cli, release, example, version):
    """Every finding of one report names the same upgrade, if any, and the history has no check of
    the deployment failing from there on (on any witness of its kind)."""
    code, out, err = cli("check", "-f", "json", "--sglang-path", release(version),
                         "--config", EXAMPLES / example)  # fmt: skip
    assert code in (0, 1), err
    report = json.loads(out)
    named = {
        m.group(1)
        for r in report["results"]
        if r["remediation"]
        and (m := re.match(r"Upgrade sglang to (\S+) or later", r["remediation"]["advice"]))
    }
    assert len(named) <= 1, named
    facts = from_yaml(EXAMPLES / example).facts
    in_scope = [r["id"] for r in report["results"] if r["status"] != "skip"]
    for upgrade in named:
        for check_id in in_scope:
            for table in history.deployment_tables(check_id, facts):
                assert all(
                    status in ("pass", "skip")
                    for r, status in table.items()
                    if history.version_key(r) >= history.version_key(upgrade)
                ), (check_id, upgrade, table)


def test_list_explain_and_check_say_the_same_for_every_check(cli):
    """``list``, ``explain`` and a ``check`` with no deployment (every witness speaks) read one
    history: a check listed "fixed in X" is fixed in X in the report's remediation, one "not fixed
    as of Y" is unfixed as of Y there (NPD003 was "fixed in 0.5.12" in ``list`` while its
    findings on MHA models said no release fixes it)."""
    from npudoctor.engine.registry import all_checks

    code, listed, _ = cli("list")
    assert code == 0
    listed = " ".join(listed.split())
    for check in all_checks():
        if not check.upstream_history:
            continue
        found = history.upstream(check.id, NO_DEPLOYMENT, None)
        said = (
            f"fixed in {found.fixed_in}" if found.fixed_in
            else f"not fixed as of {found.newest_checked}" if found.newest_checked else "-"
        )  # fmt: skip
        assert f"{check.id} {said}" in listed
        _, explained, _ = cli("explain", check.id)
        assert said in " ".join(explained.split())
        remedy = check.remediation(found)
        assert remedy.fixed_in == found.fixed_in
        if found.fixed_in is None and found.newest_checked:
            assert remedy.unfixed_as_of == found.newest_checked


@pytest.mark.parametrize(
    ("example", "version"), [("deepseek-v3-pd.yaml", "0.5.11"), ("llama3-70b-pp3-pd.yaml", "0.5.12")]
)
def test_list_explain_and_check_say_the_same_for_a_deployment(cli, release, example, version):
    """With the deployment given, ``list`` and ``explain`` read its history, as its findings do:
    NPD003 holds for DeepSeek-V3 (MLA) from 0.5.12, and for Llama-3-70B over PP 3 (the MHA
    splitter) in no release."""
    config = EXAMPLES / example
    code, out, _ = cli("check", "-f", "json", "--sglang-path", release(version), "--config", config,
                       "--select", "NPD003")  # fmt: skip
    remedy = result_of(json.loads(out), "NPD003")["remediation"]
    assert code == 1 and remedy is not None
    said = (
        f"fixed in {remedy['fixed_in']}"
        if remedy["fixed_in"]
        else f"not fixed as of {remedy['unfixed_as_of']}"
    )
    _, listed, _ = cli("list", "--config", config)
    assert f"NPD003 {said}" in " ".join(listed.split())
    _, explained, _ = cli("explain", "NPD003", "--config", config)
    assert f"Release history npudoctor checked: {said}" in " ".join(explained.split())


def test_the_history_has_a_witness_for_every_family_a_check_names():
    """NPD003's MHA splitter is wrong on uneven PP splits through the newest release: the history
    must have a witness that says so, or ``list`` calls NPD003 fixed (its MLA witness passes)."""
    assert "llama3-70b-pp3-pd" in DATA["witnesses"]
    statuses = DATA["witnesses"]["llama3-70b-pp3-pd"]["results"]["NPD003"]
    assert statuses[DATA["releases"][-1]] == "fail"
    assert history.upstream("NPD003", NO_DEPLOYMENT, None).fixed_in is None


def test_no_witness_of_the_deployments_kind_gives_no_upgrade_advice(tmp_path):
    """A release that fixed the witnesses' path need not have fixed the deployment's: a GQA model
    whose V head dim is not K's (MiMo-V2-Flash, 192/128) builds its own V buffers, and NPD001 is
    wrong for them from 0.5.14 through the newest release, while the Qwen3 witnesses pass from
    0.5.13. With no witness of that kind, the history says nothing rather than "upgrade to 0.5.16"."""
    config = json.loads((EXAMPLES / "models" / "qwen3-30b-a3b" / "config.json").read_text())
    config.update(head_dim=192, v_head_dim=128)
    (tmp_path / "config.json").write_text(json.dumps(config))
    deployment = tmp_path / "mimo-like.yaml"
    deployment.write_text(
        (EXAMPLES / "qwen3-moe-pd.yaml")
        .read_text()
        .replace("models/qwen3-30b-a3b/config.json", "config.json")
    )
    facts = from_yaml(deployment).facts
    assert facts.model.v_head_dim == 128 and facts.model.head_dim == 192
    assert history.upstream("NPD001", facts, "0.5.15") == history.Upstream(None, None)
    # the same model with V as wide as K is the witnesses' kind: their advice holds
    config.update(v_head_dim=192)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert history.upstream("NPD001", from_yaml(deployment).facts, "0.5.12").fixed_in == "0.5.13"


def test_explain_says_on_which_deployments_the_history_saw_the_fix(cli):
    """ "fixed in X" holds for the witnesses, not for every deployment (NPD003's MHA splitter is still
    wrong on uneven splits in the newest release): explain names them."""
    code, out, _ = cli("explain", "NPD003")
    text = " ".join(out.split())
    witnesses = history.witness_deployments("NPD003")
    assert code == 0 and witnesses
    assert f"(on {', '.join(witnesses)})" in text


def test_history_takes_only_reports_that_answer_its_question(tmp_path):
    """scripts/release_history.py --reports reuses test reports: only a ``check --depth auto`` with
    every check and no runtime fix is a release's verdict (a --with-fix report of 0.5.14 once
    turned DeepSeek-V3's NPD005 failure into a pass)."""
    import importlib.util

    from npudoctor.engine.registry import all_checks

    from support.repo import REPO

    spec = importlib.util.spec_from_file_location("release_history", REPO / "scripts" / "release_history.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    every = [{"id": c.id, "status": "pass"} for c in all_checks()]

    def report(name: str, **changes) -> None:
        body = {
            "target": {"version": "0.5.14"},
            "deployment": {"source": "examples/deepseek-v3-pd.yaml"},
            "depth": "auto",
            "live": {"ran": True, "fixes": {}},
            "results": every,
        }
        (tmp_path / f"{name}.json").write_text(json.dumps({**body, **changes}))

    report("with-fix", live={"ran": True, "fixes": {"NPD005": "applied"}})
    report("selected", results=every[:1])
    report("live-depth", depth="live")
    chosen = {"deepseek-v3-pd": "deepseek-v3-pd.yaml"}
    assert script._reports(tmp_path, chosen) == {}
    report("plain")
    assert list(script._reports(tmp_path, chosen)) == [("deepseek-v3-pd", "0.5.14")]
