"""NPD002 live: the real get_contiguous_buf_infos of real NPU pools, built on CPU in the role's env."""

from __future__ import annotations

import json

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import result_of
from support.trees import replace_text
from support.truths import RELEASES, expected_status

QWEN_FIA = EXAMPLES / "qwen3-moe-pd-fia.yaml"


@pytest.mark.parametrize("version", sweep(RELEASES))
def test_live_item_lengths_match_truth(live_report, version):
    result = result_of(live_report(version, QWEN_FIA), "NPD002")
    assert result["depth"] == "live"
    assert result["status"] == expected_status(version, "NPD002"), result
    observed = json.dumps([e["observed"] for e in result["evidence"]])
    assert "(live, CPU)" in observed
    if result["status"] == "fail":
        # Qwen3-30B-A3B at TP 4: 1 KV head x 128 dims x 2 bytes per token, 128 tokens per page
        assert "kv_item_lens[0] = 256 bytes (1/128 of a page)" in observed
        assert any(e["location"]["line"] == 86 for e in result["evidence"] if e.get("location"))
    else:
        assert "are one page (entry 0: 32768 bytes x 5 pages" in observed


@pytest.mark.parametrize(("version", "status"), sweep([("0.5.9", "fail"), ("0.5.23", "pass")], quick=()))
def test_no_deployment_assumes_fia_and_both_families(live_report, version, status):
    result = result_of(live_report(version, None), "NPD002")
    assert (result["status"], result["depth"]) == (status, "live")
    assert any("ASCEND_USE_FIA=1" in a for a in result["assumptions"])


def test_page_major_layout_without_fia_is_skipped_with_what_was_seen(live_report):
    result = result_of(live_report("0.5.9", EXAMPLES / "deepseek-v3-pd.yaml"), "NPD002")
    assert result["status"] == "skip" and "ASCEND_USE_FIA is off" in result["summary"]
    assert "are one page" in json.dumps(result["evidence"])


@pytest.mark.slow
def test_half_page_items_are_caught_live(cli, release, overlay):
    """Not a release's bug: a fixed release whose FIA branch reports half a page per item."""
    tree = overlay(release("0.5.15"))
    pool = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    replace_text(pool, "[0].nbytes * self.page_size", "[0].nbytes * (self.page_size // 2)", count=2)
    code, out, err = cli(
        "check", "--format", "json", "--depth", "live", "--select", "NPD002",
        "--sglang-path", tree, "--config", QWEN_FIA,
    )  # fmt: skip
    assert code == 1, err
    result = result_of(json.loads(out), "NPD002")
    assert result["status"] == "fail" and result["depth"] == "live"
    assert "16384 bytes (1/2 of a page)" in json.dumps(result["evidence"])
