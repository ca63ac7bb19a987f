"""NPD006 live: each PD role's real NPU pools (the MTP draft pool too) built on CPU, ``kv_args``
assembled as the release's ``_init_kv_manager`` does with its own ``setup_state_kv_args``, and the
tables checked against the pools' buffers (sglang#25383: 0.5.12 raises TypeError in
NPUMLATokenToKVPool.get_state_buf_infos for MLA without the NSA indexer)."""

from __future__ import annotations

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.truths import RELEASES, expected_status, truth_locations

DEEPSEEK_V3 = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA without indexer; prefill PP 2 (30 + 31 layers)
DEEPSEEK_V32 = EXAMPLES / "deepseek-v3.2-pd.yaml"  # MLA + indexer; decode with one MTP draft layer
POOL_FILE = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"


def npd006(report: dict) -> dict:
    return result_of(report, "NPD006")


def test_0512_deepseek_v3_dies_at_start_up_in_both_roles(live_report):
    """The witness, live: sglang's own setup_state_kv_args raises in both roles, at the line the truth names."""
    result = npd006(live_report("0.5.12", DEEPSEEK_V3, "--select", "NPD006"))
    assert (result["status"], result["depth"]) == ("fail", "live"), result
    assert (
        "(MLA without indexer; prefill)" in result["summary"]
        and "(MLA without indexer; decode)" in result["summary"]
    )
    crashes = [e for e in result["evidence"] if e["observed"].startswith("TypeError")]
    assert len(crashes) == 2, result["evidence"]  # one per role
    for crash in crashes:
        where = f"{crash['location']['path']}:{crash['location']['line']}"
        assert where == f"{POOL_FILE}:299" and any(
            where.endswith(t) for t in truth_locations("0.5.12", "NPD006")
        )
        assert "'NoneType' object is not subscriptable" in crash["observed"]
        assert (
            "setup_state_kv_args (sglang/srt/disaggregation/utils.py:575) -> "
            f"get_state_buf_infos ({POOL_FILE}:299)" in crash["observed"]
        )
    assert any(
        "setup_state_kv_args (sglang/srt/disaggregation/utils.py:552)" in a for a in result["assumptions"]
    )


@pytest.mark.parametrize("version", sweep(RELEASES))
def test_deepseek_v3_pd_live_matches_the_truth(live_report, version):
    result = npd006(live_report(version, DEEPSEEK_V3))
    assert result["depth"] == "live"
    assert result["status"] == expected_status(version, "NPD006", "mla"), result
    if result["status"] == "pass":
        observed = [e["observed"] for e in result["evidence"]]
        # prefill: its largest PP stage (31 layers x K, V); decode: 61 layers x K, V, no draft model
        assert observed[0].startswith("62 KV entries") and observed[1].startswith("122 KV entries"), observed


@pytest.mark.slow
def test_0512_with_the_indexer_builds_every_table_draft_pool_included(live_report):
    """DeepSeek-V3.2 on 0.5.12: the indexer buffer exists, so the state tables build; every K, V and
    indexer buffer of both pools is registered with its bytes (decode: 61 + 1 draft layers x 3)."""
    result = npd006(live_report("0.5.12", DEEPSEEK_V32))
    assert (result["status"], result["depth"]) == ("pass", "live"), result
    observed = [e["observed"] for e in result["evidence"]]
    assert observed[0].startswith("93 KV entries") and observed[1].startswith("186 KV entries"), observed
    assert "draft pool of 1 layer(s)" in result["evidence"][1]["expected"]


@pytest.mark.slow
def test_no_deployment_fails_only_the_mla_pool_without_indexer(live_report):
    result = npd006(live_report("0.5.12", None))
    assert (result["status"], result["depth"]) == ("fail", "live"), result
    failing = result["summary"].split(":")[0]
    assert failing.count("MLA without indexer") == 2 and "NSA indexer" not in failing and "GQA" not in failing


@pytest.mark.slow
def test_misdescribed_lengths_are_found(cli, release, overlay):
    """The property is more than "does not raise": 0.5.13 with the V lengths of the KV table taken
    from the K buffers (a sibling no release ships) registers lengths no buffer has."""
    tree = overlay(release("0.5.13"))
    pool = tree / POOL_FILE
    text = pool.read_text()
    wrong = text.replace(
        "            self.v_buffer[i].nbytes for i in range(self.layer_num)\n        ]\n        kv_item_lens",
        "            self.k_buffer[i].nbytes for i in range(self.layer_num)\n        ]\n        kv_item_lens",
        1,
    )
    assert wrong != text
    pool.unlink()  # hard-linked to the cached release
    pool.write_text(wrong)
    report = json_report(
        cli, "--depth", "live", "--sglang-path", tree, "--config", DEEPSEEK_V3, "--select", "NPD006"
    )
    result = npd006(report)
    assert (result["status"], result["depth"]) == ("fail", "live"), result
    observed = result["evidence"][0]["observed"]
    assert "kv_data_lens[31] = " in observed and "but pool v_buffer[0] holds" in observed, observed
