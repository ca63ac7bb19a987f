"""NPD003 static probe: the Ascend PP transfer path must slice each buffer group at the stage offset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import RELEASES, TRUTH, expected_status, truth_locations

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
CONN = "sglang/srt/disaggregation/ascend/conn.py"
QWEN3_MODEL = EXAMPLES / "models" / "qwen3-30b-a3b" / "config.json"  # GQA, 48 layers
# Llama-3-70B's public config.json, trimmed to what a server reads: GQA 64 heads / 8 KV heads of 128.
LLAMA_3_70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# known.yaml "deployments": truths that hold for one deployment (NPD003's MHA splitter maps some
# PP layer splits right and others wrong). Each one is written here.
DEPLOYMENT_TRUTHS = TRUTH["deployments"]
EAGLE = {"speculative_algorithm": "EAGLE3"}


def write_deployment(directory: Path, name: str) -> Path:
    """The deployment known.yaml's ``deployments`` section names, as a YAML in ``directory``."""
    prefill = {
        "tp_size": 8,
        "pp_size": 3,
        "disaggregation_mode": "prefill",
        "disaggregation_transfer_backend": "ascend",
    }
    decode = {"tp_size": 8, "disaggregation_mode": "decode", "disaggregation_transfer_backend": "ascend"}
    env = {}
    if name.startswith("llama-3-70b"):
        model = directory / "llama-3-70b" / "config.json"
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_text(json.dumps(LLAMA_3_70B))
        if name.endswith("-eagle"):
            decode.update(EAGLE)
    else:  # qwen3-moe-pd-pp2*: Qwen3-30B-A3B, prefill PP 2
        model = QWEN3_MODEL
        prefill.update(tp_size=4, pp_size=2)
        decode.update(tp_size=4, **EAGLE)
        if "uneven" in name:
            env["SGLANG_PP_LAYER_PARTITION"] = "20,28"
    roles = {"prefill": {"server_args": prefill}, "decode": {"server_args": decode}}
    if env:
        roles["prefill"]["env"] = env
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"model": {"config": str(model)}, "roles": roles}))
    return path


def deployment_truth(name: str, version: str) -> dict:
    return DEPLOYMENT_TRUTHS[name]["NPD003"][version]


def deployment_locations(name: str, version: str) -> list[str]:
    """``path:line`` in a deployment truth's evidence (a bare ``:N`` refers to the file before it)."""
    found, current = [], None
    for path, line in re.findall(r"([\w/]+\.py)?:(\d+)", deployment_truth(name, version).get("evidence", "")):
        current = path or current
        found.append(f"{current}:{line}")
    return found


MHA_CASES = [(v, name) for name in DEPLOYMENT_TRUTHS for v in DEPLOYMENT_TRUTHS[name]["NPD003"]]


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


@pytest.mark.parametrize(("version", "name"), sweep(MHA_CASES))
def test_mha_split_verdict_matches_the_deployment_truth(cli, release, tmp_path, version, name):
    """The MHA splitter's layer arithmetic, evaluated from the release's own source: Llama-3-70B
    over prefill PP 3 (26 + 27 + 27) and Qwen3 over 20 + 28 map V elsewhere on every release;
    Qwen3 over 24 + 24 with an EAGLE3 draft layer maps right (its guess lands on 48)."""
    truth = deployment_truth(name, version)
    result = npd003(cli, release(version), "--config", write_deployment(tmp_path, name), "--depth", "static")
    assert result["status"] == ("fail" if truth["verdict"] == "present" else "pass"), result["summary"]
    text = json.dumps(result["evidence"])
    for location in deployment_locations(name, version):
        assert location.split(":")[0] in text and location in text.replace("sglang/srt/", ""), location
    if version != "0.5.9":  # 0.5.9 has no PP branch: its finding is the shape
        stages = [e["observed"] for e in result["evidence"] if e["observed"].startswith("prefill stage")]
        assert stages and all("(static, evaluated)" in s and "get_pp_indices (sglang/srt/distributed/utils.py:" in s
                              for s in stages)  # fmt: skip


def test_llama_pp3_names_every_wrong_stage(cli, release, tmp_path):
    """80 layers as 26 + 27 + 27: no stage's count divides 80, the splitter's draft branch slices
    V at 78 or 54 instead of 80, with no draft model at all (0.5.23, no upstream fix)."""
    result = npd003(cli, release("0.5.23"), "--config", write_deployment(tmp_path, "llama-3-70b-pd-pp3"))
    assert result["status"] == "fail" and result["depth"] == "static"
    lines = [e["observed"] for e in result["evidence"]]
    assert lines[0].startswith(
        "prefill stage 0 (layers 0-25): 26 of 52 pairs wrong: V0 -> K78, V1 -> K79, V2 -> V0"
    )
    assert lines[1].startswith("prefill stage 1 (layers 26-52): 27 of 54 pairs wrong: V26 -> V0")
    assert lines[2].startswith("prefill stage 2 (layers 53-79): 27 of 54 pairs wrong: V53 -> V27")
    assert {(e["location"]["path"], e["location"]["line"]) for e in result["evidence"]} == {
        ("sglang/srt/disaggregation/common/conn.py", 1739)  # dst_v_ptrs = dst_kv_ptrs[v_ptr_offset + ...]
    }


def test_the_partition_honours_the_roles_environment(cli, release, tmp_path):
    """SGLANG_PP_LAYER_PARTITION on the prefill role sets the stages the splitter is run on."""
    result = npd003(
        cli, release("0.5.12"), "--config", write_deployment(tmp_path, "qwen3-moe-pd-pp2-uneven-eagle")
    )
    lines = [e["observed"] for e in result["evidence"]]
    assert lines[0].startswith("prefill stage 0 (layers 0-19): 20 of 40 pairs wrong: V0 -> K40")
    assert lines[1].startswith("prefill stage 1 (layers 20-47): 28 of 56 pairs wrong: V20 -> V0, V21 -> V1")


def test_a_partition_sglang_would_refuse_is_cannot_tell(cli, release, tmp_path):
    """A partition that does not sum to the model's layers: sglang's get_pp_indices raises (the
    server would not start); the static depth reports that it cannot evaluate the split."""
    path = write_deployment(tmp_path, "qwen3-moe-pd-pp2-uneven-eagle")
    path.write_text(path.read_text().replace("20,28", "20,20"))
    result = npd003(cli, release("0.5.12"), "--config", path, "--depth", "static")
    assert result["status"] == "warn", result
    assert "get_pp_indices (sglang/srt/distributed/utils.py:101) raised ValueError" in json.dumps(
        result["evidence"]
    )
