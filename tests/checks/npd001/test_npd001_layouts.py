"""NPD001 over every NPU pool layout a decode server builds, not only the MLA pool of sglang#25249
(the property, not the diff): the view the offload methods
index with token slots must address the tokens set_kv_buffer writes. Real releases; expectations
from known.yaml (the NPD001 verdict for the MLA pool, its ``layouts`` for the MHA pool without FIA
and with v_head_dim != head_dim). Static and live must agree; the fix cures the live probe.
"""

from __future__ import annotations

import json
import re

import pytest

from npudoctor.static.source import SourceTree

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import RELEASES, TRUTH, truth_present

MHA_PD = EXAMPLES / "qwen3-moe-pd.yaml"  # FIA off: page-major NPU MHA pool
DEPLOYMENTS = {
    "deepseek-v3": (EXAMPLES / "deepseek-v3-pd.yaml", "mla"),  # MLA
    "deepseek-v3.2": (EXAMPLES / "deepseek-v3.2-pd.yaml", "mla"),  # MLA + indexer
    "llama4-swa": (EXAMPLES / "llama4-scout-swa-pd.yaml", "mha"),  # SWAKVPool over the NPU MHA pool
    "qwen3-next": (EXAMPLES / "qwen3-next-decode.yaml", "mha"),  # HybridLinearKVPool over the NPU MHA pool
    "qwen3-moe-fia": (EXAMPLES / "qwen3-moe-pd-fia.yaml", "mha-fia"),
}


def layout_truth(version: str, layout: str) -> dict:
    return TRUTH["releases"][version]["NPD001"].get("layouts", {}).get(layout, {"verdict": "absent"})


def layout_present(version: str, layout: str) -> bool:
    return layout_truth(version, layout)["verdict"] == "present"


def cited_lines(version: str, layout: str) -> list[str]:
    """``(:N)`` references of a layout truth's evidence: the lines where the wrong view is indexed/taken."""
    return re.findall(r"\(:(\d+)\)", layout_truth(version, layout).get("evidence", ""))


def expected(version: str, family: str) -> str:
    """NPD001's status for a deployment of ``family`` on ``version`` by the truths: the MLA pool's
    defect for MLA; for MHA without FIA the page-major one; with FIA none in the stated releases."""
    if family == "mla":
        return "fail" if truth_present(version, "NPD001", "mla") else "pass"
    if family == "mha":
        return "fail" if layout_present(version, "mha-page-major") else "pass"
    return "pass"


@pytest.fixture(scope="session")
def mimo(tmp_path_factory):
    """A MiMo-V2-Flash-like GQA deployment: head_dim 192, v_head_dim 128 (PD decode; FIA off and on)."""
    directory = tmp_path_factory.mktemp("mimo")
    config = json.loads((EXAMPLES / "models/qwen3-30b-a3b/config.json").read_text())
    config.update(head_dim=192, v_head_dim=128)
    (directory / "config.json").write_text(json.dumps(config))
    roles = (
        "roles:\n"
        "  decode: {server_args: {tp_size: 4, disaggregation_mode: decode, "
        "disaggregation_transfer_backend: ascend}}\n"
    )
    paths = {}
    for name, env in (("off", ""), ("on", 'env: {ASCEND_USE_FIA: "1"}\n')):
        paths[name] = directory / f"mimo-fia-{name}.yaml"
        paths[name].write_text(f"model: {{config: {directory / 'config.json'}}}\n{env}{roles}")
    return paths


def static(cli, tree, config) -> dict:
    return result_of(
        json_report(
            cli, "--sglang-path", tree, "--config", config, "--select", "NPD001", "--depth", "static"
        ),
        "NPD001",
    )


# ----- MHA without FIA: the page-major pool -------------------------------------------------
@pytest.mark.parametrize("version", sweep(RELEASES, quick=("0.5.12",)))
def test_static_page_major_mha_matches_truth(cli, release, version):
    result = static(cli, release(version), MHA_PD)
    present = layout_present(version, "mha-page-major")
    assert result["status"] == ("fail" if present else "pass"), result
    text = json.dumps(result["evidence"])
    if present:
        for line in cited_lines(version, "mha-page-major"):
            assert f"mem_cache/memory_pool.py:{line}" in text, (line, text)
        assert "token slots" in text and "page_size" in text


# ----- MHA with v_head_dim != head_dim (MiMo-V2-Flash-like, 192/128) ----------------------------
V_HEAD_CASES = [(version, "off") for version in RELEASES] + [("0.5.23", "on"), ("0.5.13", "on")]


@pytest.mark.parametrize(("version", "fia"), sweep(V_HEAD_CASES, quick=(("0.5.23", "off"),)))
def test_static_v_head_dim_matches_truth(cli, release, mimo, version, fia):
    result = static(cli, release(version), mimo[fia])
    v_view = layout_present(version, "mha-v-head-dim")
    page_major = fia == "off" and layout_present(version, "mha-page-major")
    assert result["status"] == ("fail" if v_view or page_major else "pass"), result
    if v_view:
        text = json.dumps(result["evidence"])
        for line in cited_lines(version, "mha-v-head-dim"):
            assert f"memory_pool_npu.py:{line}" in text, (line, text)


def test_a_v_view_with_v_head_dim_passes(cli, release, overlay, mimo):
    """The property decides, not the release: 0.5.23 with the V views taken with v_head_dim passes."""
    tree = overlay(release("0.5.23"))
    pool = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    view = "v_layer = self.v_buffer[local_layer_id].view(\n                -1, self.head_num, self.head_dim\n            )"
    replace_text(pool, view, view.replace("self.head_dim", "self.v_head_dim"), count=2)
    assert static(cli, tree, mimo["off"])["status"] == "pass"


# ----- every deployment kind ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
@pytest.mark.parametrize("version", sweep(RELEASES, quick=()))
def test_static_deployments_match_truth(cli, release, version, name):
    config, family = DEPLOYMENTS[name]
    assert static(cli, release(version), config)["status"] == expected(version, family)


LIVE = [
    ("0.5.12", "mha-pd"),
    ("0.5.23", "mimo"),
    ("0.5.14", "mimo"),
    ("0.5.13", "mimo"),
    ("0.5.12", "llama4-swa"),
    ("0.5.23", "llama4-swa"),
    ("0.5.12", "qwen3-next"),
    ("0.5.23", "qwen3-next"),
    ("0.5.12", "deepseek-v3.2"),
    ("0.5.23", "deepseek-v3.2"),
]


def _config(name: str, mimo) -> tuple:
    if name == "mimo":
        return mimo["off"], "mha"
    if name == "mha-pd":
        return MHA_PD, "mha"
    return DEPLOYMENTS[name]


@pytest.mark.parametrize(("version", "name"), sweep(LIVE, quick=(("0.5.23", "mimo"),)))
def test_live_agrees_with_static_and_truth(live_report, version, name, mimo):
    """The live round trip (real pool on CPU, every buffer compared) and the static verdict agree."""
    config, family = _config(name, mimo)
    result = result_of(live_report(version, config, "--select", "NPD001", depth="auto"), "NPD001")
    want = expected(version, family)
    if name == "mimo" and layout_present(version, "mha-v-head-dim"):
        want = "fail"
    assert (result["status"], result["depth"]) == (want, "live"), result
    assert not any("static depth:" in a for a in result["assumptions"]), "static and live disagree"
    text = json.dumps(result["evidence"])
    if want == "fail":
        assert "(live, CPU)" in text and ("token slots" in text or "resolves to" in text)
        if name == "mimo":
            assert "RuntimeError" in text and "memory_pool_npu.py:" in text


# ----- the fix -------------------------------------------------------------------------------
def test_fix_installs_only_the_sites_the_release_needs(release):
    from npudoctor.fixes.npd001_cpu_offload_roundtrip import FIX

    newest = FIX.installs_in_source(SourceTree(release("0.5.23") / "sglang"))
    assert newest and all(":NPUMHATokenToKVPool." in site for site in newest)  # MLA's own overrides stay
    assert FIX.installs_in_source(SourceTree(release("0.5.12") / "sglang")) == FIX.replaces
    assert "npudoctor's own" in FIX.provenance and "0.5.23" in FIX.own


def test_fix_plans_own_replacement_on_the_newest_release(cli, release, mimo):
    code, out, err = cli("fix", "-f", "json", "--sglang-path", release("0.5.23"), "--config", mimo["off"],
                         "--select", "NPD001")  # fmt: skip
    assert code == 0, err
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "apply", entry


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "name"),
    [("0.5.23", "mimo"), ("0.5.14", "mimo"), ("0.5.9", "mha-pd"), ("0.5.12", "llama4-swa")],
)
def test_fix_cures_the_live_probe(live_report, version, name, mimo):
    config, _ = _config(name, mimo)
    plain = result_of(live_report(version, config, "--select", "NPD001", depth="auto"), "NPD001")
    cured = result_of(
        live_report(version, config, "--select", "NPD001", "--with-fix", "NPD001", depth="auto"), "NPD001"
    )
    assert plain["status"] == "fail", plain
    assert (cured["status"], cured["depth"]) == ("pass", "live"), cured
    assert cured["summary"].startswith("with runtime fix NPD001:")
