"""NPD006 static: the table builders sglang's PD start-up calls on the deployment's NPU pool read no
buffer that the pool's construction leaves None for the deployment (sglang#25383: 0.5.12's
NPUMLATokenToKVPool.get_state_buf_infos indexes index_k_buffer, None without the NSA indexer)."""

from __future__ import annotations

import pytest
import yaml

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.truths import RELEASES, expected_status, truth_locations

DEEPSEEK_V3 = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA without the NSA indexer
DEEPSEEK_V32 = EXAMPLES / "deepseek-v3.2-pd.yaml"  # MLA with the indexer, decode with MTP
QWEN3 = EXAMPLES / "qwen3-moe-pd.yaml"  # GQA
POOL_FILE = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"


def npd006(cli, tree, *config) -> dict:
    args = ("--config", *map(str, config)) if config else ()
    return result_of(json_report(cli, "--sglang-path", tree, "--select", "NPD006", *args), "NPD006")


def deepseek_v3_pd(directory, backend: str) -> str:
    """DeepSeek-V3 PD (as the example) with another transfer backend on both roles."""
    spec = {
        "model": {"config": str(EXAMPLES / "models/deepseek-v3/config.json")},
        "roles": {
            mode: {
                "server_args": {
                    "tp_size": 8,
                    "disaggregation_mode": mode,
                    "disaggregation_transfer_backend": backend,
                }
            }
            for mode in ("prefill", "decode")
        },
    }
    path = directory / f"deepseek-v3-pd-{backend}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize("version", sweep(RELEASES, quick=("0.5.12", "0.5.13")))  # buggy, fixed
def test_deepseek_v3_pd_matches_the_truth(cli, release, version):
    """Every release with verified truths: fail exactly where get_state_buf_infos indexes a None buffer."""
    result = npd006(cli, release(version), DEEPSEEK_V3)
    assert result["status"] == expected_status(version, "NPD006", "mla"), result
    if result["status"] == "fail":
        (finding,) = [e for e in result["evidence"] if "None" in e["observed"]]
        where = f"{finding['location']['path']}:{finding['location']['line']}"
        assert any(where.endswith(t) for t in truth_locations(version, "NPD006")), (where, finding)
        assert "reads self.index_k_buffer" in finding["observed"], finding
        assert "sets to None at" in finding["observed"] and "PD start-up calls it at" in finding["observed"]


def test_0512_names_the_read_the_none_and_the_caller(cli, release):
    (finding,) = npd006(cli, release("0.5.12"), DEEPSEEK_V3)["evidence"]
    assert finding["location"] == {
        "path": POOL_FILE,
        "line": 299,
        "symbol": "NPUMLATokenToKVPool.get_state_buf_infos",
    }
    assert f"sets to None at {POOL_FILE}:260" in finding["observed"]
    assert "PD start-up calls it at sglang/srt/disaggregation/utils.py:575" in finding["observed"]
    assert "index_head_dim=None" in finding["expected"]


@pytest.mark.parametrize("config", [DEEPSEEK_V32, QWEN3])
def test_0512_pools_that_build_what_the_builders_read_pass(cli, release, config):
    """With the indexer the buffer exists; the MHA pool has no get_state_buf_infos."""
    assert npd006(cli, release("0.5.12"), config)["status"] == "pass"


@pytest.mark.parametrize(("version", "status"), [("0.5.11", "pass"), ("0.5.12", "fail"), ("0.5.13", "pass")])
def test_no_deployment_assumes_mla_without_the_indexer(cli, release, version, status):
    result = npd006(cli, release(version))
    assert result["status"] == status, result
    assert any("MLA models with and without the NSA indexer" in a for a in result["assumptions"])
    if status == "fail":
        assert "MLA without indexer" in result["summary"] and "NSA indexer" not in result["summary"]


def test_other_transfer_backends_are_not_skipped(cli, release, tmp_path):
    """The tables are the pool's and _init_kv_manager builds them for every backend."""
    config = deepseek_v3_pd(tmp_path, "mooncake")
    assert npd006(cli, release("0.5.12"), config)["status"] == "fail"


def test_a_deployment_without_pd_is_skipped(cli, release, tmp_path):
    spec = {
        "model": {"config": str(EXAMPLES / "models/deepseek-v3/config.json")},
        "roles": {"server": {"server_args": {"tp_size": 8}}},
    }
    path = tmp_path / "colocated.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = npd006(cli, release("0.5.12"), path)
    assert result["status"] == "skip" and "not a PD disaggregated deployment" in result["summary"], result


def test_a_sibling_in_the_kv_table_builder_is_found(cli, release, overlay):
    """The property covers every builder: 0.5.13 with get_contiguous_buf_infos' indexer guard
    dropped reads index_k_buffer without the indexer (a sibling no release ships)."""
    tree = overlay(release("0.5.13"))
    pool = tree / POOL_FILE
    text = pool.read_text()
    start = text.index("    def get_contiguous_buf_infos(self):\n        # MLA has only one kv_buffer")
    guard = text.index("        if self.index_head_dim is not None:\n            kv_data_ptrs += [", start)
    guard_line = "        if self.index_head_dim is not None:\n"
    assert text.startswith(guard_line, guard)
    pool.unlink()  # hard-linked to the cached release: never write through the link
    pool.write_text(text[:guard] + "        if True:\n" + text[guard + len(guard_line) :])
    result = npd006(cli, tree, DEEPSEEK_V3)
    assert result["status"] == "fail", result
    (finding,) = [e for e in result["evidence"] if "None" in e["observed"]]
    assert finding["location"]["symbol"] == "NPUMLATokenToKVPool.get_contiguous_buf_infos", finding
    assert finding["observed"].startswith("get_contiguous_buf_infos (")
