"""NPD003 static probe: the Ascend PP transfer path must slice each buffer group at the stage offset."""

from __future__ import annotations

import json

import pytest

from conftest import (
    EXAMPLES,
    RELEASES,
    expected_status,
    json_report,
    replace_text,
    result_of,
    sweep,
    truth_locations,
)

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
CONN = "sglang/srt/disaggregation/ascend/conn.py"


def npd003(cli, tree, *args):
    return result_of(json_report(cli, "--sglang-path", tree, "--select", "NPD003", *args), "NPD003")


def deployment(tmp_path, model="deepseek-v3", prefill="pp_size: 2", decode="", backend="ascend"):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        f"model: {{config: {EXAMPLES}/models/{model}/config.json}}\nroles:\n"
        f"  prefill: {{server_args: {{{prefill}, disaggregation_transfer_backend: {backend}}}}}\n"
        f"  decode: {{server_args: {{{decode + ', ' if decode else ''}disaggregation_transfer_backend: {backend}}}}}\n"
    )
    return path


@pytest.mark.parametrize("version", sweep(RELEASES))
@pytest.mark.parametrize("example", ["deepseek-v3-pd.yaml", "deepseek-v3.2-pd.yaml"])
def test_verdict_matches_truth(cli, release, version, example):
    result = npd003(cli, release(version), "--config", EXAMPLES / example)
    assert result["status"] == expected_status(version, "NPD003"), result
    if result["status"] == "fail":
        text = json.dumps(result["evidence"])
        for location in truth_locations(version, "NPD003"):
            assert location in text


def test_mha_model_uses_the_kv_half_splitter(cli, release, tmp_path):
    config = deployment(tmp_path, model="qwen3-30b-a3b")
    assert npd003(cli, release("0.5.11"), "--config", config)["status"] == "pass"
    assert npd003(cli, release("0.5.9"), "--config", config)["status"] == "fail"


def test_skips_without_pipeline_parallelism(cli, release, tmp_path):
    result = npd003(cli, release("0.5.9"), "--config", deployment(tmp_path, prefill="pp_size: 1"))
    assert result["status"] == "skip" and "pp_size 1" in result["summary"]


def test_skips_for_another_transfer_backend(cli, release, tmp_path):
    result = npd003(cli, release("0.5.9"), "--config", deployment(tmp_path, backend="mooncake"))
    assert result["status"] == "skip" and "mooncake" in result["summary"]


def test_mla_through_the_mha_branch_fails(cli, release, overlay):
    """Route MLA pools of a fixed release into the MHA splitter: the 0.5.11 shape, rebuilt."""
    tree = overlay(release("0.5.12"))
    replace_text(tree / CONN, "if self.is_mla_backend:", "if not self.is_mla_backend:")
    result = npd003(cli, tree, "--config", DEEPSEEK_PD)
    assert result["status"] == "fail"
    assert "through the MHA splitter" in json.dumps(result["evidence"])


def test_group_unaware_splitter_fails(cli, release, overlay):
    """Drop the Ascend override: the common splitter slices one group only, wrong for NPU MLA."""
    tree = overlay(release("0.5.15"))
    replace_text(tree / CONN, "def get_mla_kv_ptrs_with_pp(", "def _dropped_get_mla_kv_ptrs_with_pp(")
    result = npd003(cli, tree, "--config", DEEPSEEK_PD)
    assert result["status"] == "fail"
    assert "CommonKVManager.get_mla_kv_ptrs_with_pp" in json.dumps(result["evidence"])


def test_draft_layers_need_a_layer_count(cli, release, overlay, tmp_path):
    """A group-aware splitter that ignores decode's draft layers still shifts later groups."""
    tree = overlay(release("0.5.12"))
    source = (tree / CONN).read_text()
    start = source.index("def get_mla_kv_ptrs_with_pp(")
    end = source.index("def send_kvcache(")
    body = source[start:end]
    patched = (
        body.replace('total_kv_layers = getattr(self.kv_args, "total_kv_layers", 0)', "total = 0")
        .replace("if total_kv_layers", "if total")
        .replace("min(len(dst_kv_ptrs) // kv_buf_groups, total_kv_layers)", "0")
    )
    replace_text(tree / CONN, body, patched)
    with_draft = deployment(tmp_path, decode="speculative_algorithm: NEXTN")
    assert npd003(cli, tree, "--config", with_draft)["status"] == "fail"
    assert npd003(cli, release("0.5.12"), "--config", with_draft)["status"] == "pass"


def test_no_deployment_assumes_pp_and_says_so(cli, release):
    result = npd003(cli, release("0.5.11"))
    assert result["status"] == "fail"
    assert any("prefill PP 2" in a for a in result["assumptions"])
