"""NPD001 static probe on real releases: verdicts and evidence match the known truths,
and the property (not the known diff) is what decides."""

from __future__ import annotations

import json

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import RELEASES, expected_status, truth_locations, truth_verdict

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"


def evidence_text(result: dict) -> str:
    return json.dumps(result["evidence"])


@pytest.mark.parametrize("version", sweep(RELEASES))
def test_verdict_matches_truth(cli, release, version):
    report = json_report(cli, "--sglang-path", release(version), "--config", DEEPSEEK_PD, "--depth", "static")
    result = result_of(report, "NPD001")
    assert report["target"]["version"] == version
    assert result["status"] == expected_status(version, "NPD001"), result
    assert result["roles"] == ["decode"]


@pytest.mark.parametrize("version", [v for v in RELEASES if truth_verdict(v, "NPD001") == "present"])
def test_failure_evidence_names_the_truths_file_and_line(cli, release, version):
    result = result_of(json_report(cli, "--sglang-path", release(version), "--config", DEEPSEEK_PD), "NPD001")
    text = evidence_text(result)
    locations = truth_locations(version, "NPD001")
    assert locations, "the truth file should name a location"
    for location in locations:
        assert location in text, f"{location} missing from {text}"
    first = result["evidence"][0]["location"]
    assert (
        first["path"].endswith("mem_cache/memory_pool.py")
        and "kv_buffer" in result["evidence"][0]["observed"]
    )
    assert result["remediation"]["fix_id"] == "NPD001"


def test_removing_the_fixed_override_brings_the_defect_back(cli, release, overlay):
    """Take a fixed release and delete NPUMLATokenToKVPool's offload overrides: the inherited
    generic methods read kv_buffer again, so the check must fail without knowing any version."""
    tree = overlay(release("0.5.15"))
    pool_file = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    text = pool_file.read_text()
    mla = text.index("class NPUMLATokenToKVPool")
    head, body = text[:mla], text[mla:]
    for name in ("get_cpu_copy", "load_cpu_copy"):
        body = body.replace(f"def {name}(", f"def _removed_{name}(", 1)
    pool_file.unlink()
    pool_file.write_text(head + body)

    result = result_of(json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK_PD), "NPD001")
    assert result["status"] == "fail"
    assert "MLATokenToKVPool.get_cpu_copy" in evidence_text(result)


def test_override_reading_an_unassigned_buffer_is_caught(cli, release, overlay):
    """A sibling of the known bug: an NPU MHA override that reads a buffer its pool never builds."""
    tree = overlay(release("0.5.15"))
    pool_file = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    source = pool_file.read_text()
    start = source.index("class NPUMHATokenToKVPool")
    method = source.index("def get_cpu_copy", start)
    end = source.index("def load_cpu_copy", method)
    replace_text(
        pool_file, source[method:end], source[method:end].replace("self.k_buffer", "self.kv_cache_k")
    )

    qwen = EXAMPLES / "qwen3-moe-pd-fia.yaml"
    result = result_of(json_report(cli, "--sglang-path", tree, "--config", qwen), "NPD001")
    assert result["status"] == "fail"
    assert "self.kv_cache_k" in evidence_text(result)


def test_a_pool_that_raises_not_implemented_fails(cli, release, overlay):
    tree = overlay(release("0.5.23"))
    pool_file = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    source = pool_file.read_text()
    start = source.index("class NPUMLATokenToKVPool")
    method = source.index("    def get_cpu_copy", start)
    replace_text(
        pool_file,
        source[method:],
        "    def get_cpu_copy(self, indices, **kw):\n        raise NotImplementedError()\n"
        + source[method:].replace("def get_cpu_copy", "def _old_get_cpu_copy", 1),
    )
    result = result_of(json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK_PD), "NPD001")
    assert result["status"] == "fail"
    assert "NotImplementedError" in evidence_text(result)


def test_unrecognised_layout_warns_instead_of_passing(cli, release, overlay):
    tree = overlay(release("0.5.23"))
    pool_file = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    pool_file.unlink()
    result = result_of(json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK_PD), "NPD001")
    assert result["status"] == "warn"
    assert "not one npudoctor recognises" in evidence_text(result)


def test_skips_when_no_role_offloads(cli, release, tmp_path):
    config = tmp_path / "colocated.yaml"
    model = (EXAMPLES / "models/deepseek-v3/config.json").resolve()
    config.write_text(f"model: {{config: {model}}}\nroles:\n  server: {{server_args: {{tp_size: 16}}}}\n")
    result = result_of(json_report(cli, "--sglang-path", release("0.5.12"), "--config", config), "NPD001")
    assert result["status"] == "skip"
    assert "decode" in result["summary"]


def test_no_deployment_assumes_the_worst_and_says_so(cli, release):
    result = result_of(json_report(cli, "--sglang-path", release("0.5.12")), "NPD001")
    assert result["status"] == "fail"
    assert any("no deployment given" in a for a in result["assumptions"])
