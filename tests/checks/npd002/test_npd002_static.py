"""NPD002 static probe: PD transfer items must be one page of the buffer layout sglang builds."""

from __future__ import annotations

import json

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import drop_fia_page_factor, replace_text
from support.truths import RELEASES, expected_status, truth_locations

QWEN_FIA = EXAMPLES / "qwen3-moe-pd-fia.yaml"
POOL = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"


def npd002(cli, tree, *args):
    return result_of(json_report(cli, "--sglang-path", tree, "--select", "NPD002", *args), "NPD002")


@pytest.mark.parametrize("version", sweep(RELEASES))
def test_verdict_matches_truth_under_fia(cli, release, version):
    result = npd002(cli, release(version), "--config", QWEN_FIA)
    assert result["status"] == expected_status(version, "NPD002"), result
    if result["status"] == "fail":
        text = json.dumps(result["evidence"])
        for location in truth_locations(version, "NPD002"):
            assert location in text
        assert "1/page_size of a page" in text


def test_without_fia_the_check_does_not_apply(cli, release, tmp_path):
    config = tmp_path / "nofia.yaml"
    config.write_text(QWEN_FIA.read_text().replace('"1"', '"0"').replace("models/", f"{EXAMPLES}/models/"))
    result = npd002(cli, release("0.5.9"), "--config", config)
    assert result["status"] == "skip" and "ASCEND_USE_FIA is off" in result["summary"]


def test_mla_pools_do_not_depend_on_fia(cli, release):
    result = npd002(cli, release("0.5.9"), "--config", EXAMPLES / "deepseek-v3-pd.yaml")
    assert result["status"] == "skip" and "NPUMLATokenToKVPool" in result["summary"]


def test_colocated_server_skips(cli, release):
    result = npd002(
        cli, release("0.5.9"), "--model-path", EXAMPLES / "models/qwen3-30b-a3b", "--env", "ASCEND_USE_FIA=1"
    )
    assert result["status"] == "skip" and "not a PD disaggregated" in result["summary"]


def test_dropping_the_page_factor_from_a_fixed_release_fails(cli, release, overlay):
    tree = overlay(release("0.5.15"))
    drop_fia_page_factor(tree)
    assert npd002(cli, tree, "--config", QWEN_FIA)["status"] == "fail"


def test_a_page_major_fia_view_makes_the_old_formula_right(cli, release, overlay):
    """Same item formula as 0.5.9, other layout: the property, not the diff, decides."""
    tree = overlay(release("0.5.9"))
    replace_text(
        tree / POOL,
        ".view(\n                        -1, 1, self.head_num, self.head_dim\n",
        ".view(\n                        -1, self.page_size, self.head_num, self.head_dim\n",
        count=2,
    )
    assert npd002(cli, tree, "--config", QWEN_FIA)["status"] == "pass"


def test_no_deployment_assumes_fia_and_says_so(cli, release):
    result = npd002(cli, release("0.5.9"))
    assert result["status"] == "fail"
    assert any("ASCEND_USE_FIA=1" in a for a in result["assumptions"])
