"""NPD004 static probe on real releases: verdicts and evidence match the known truths, the
synthetic "0.5.13+cp-gap" source state fails with file:line evidence, and the property (reads
of fields no reaching metadata class defines; a midpoint split of a multi-request batch) is
what decides, not the known diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import NPU_BACKEND, method_span, replace_text
from support.truths import RELEASES, TRUTH, expected_status, truth_locations

CP_PREFILL = EXAMPLES / "qwen3-cp-prefill.yaml"
BACKEND = NPU_BACKEND
REMOVED_FIELDS = ("actual_seq_q_prev", "kv_len_prev", "actual_seq_q_next", "kv_len_next")


def evidence_text(result: dict) -> str:
    return json.dumps(result["evidence"])


def npd004(cli, tree: Path, *args: str) -> dict:
    return result_of(json_report(cli, "--sglang-path", tree, *args), "NPD004")


def line_of(text: str, needle: str, after: int = 0) -> int:
    """1-based line of the first occurrence of ``needle`` at or after line ``after``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if number >= after and needle in line:
            return number
    raise AssertionError(f"{needle!r} not found")


def deployment_text(model: str = "models/qwen3-30b-a3b/config.json", ASCEND_USE_FIA: str = "1") -> str:
    """The example CP deployment with another model or FIA setting, usable from any directory."""
    text = CP_PREFILL.read_text()
    text = text.replace("models/qwen3-30b-a3b/config.json", str((EXAMPLES / model).resolve()))
    return text.replace('ASCEND_USE_FIA: "1"', f'ASCEND_USE_FIA: "{ASCEND_USE_FIA}"')


# ----- the known truths -------------------------------------------------------------------
@pytest.mark.parametrize("version", sweep(RELEASES))
def test_verdict_matches_truth(cli, release, version):
    report = json_report(cli, "--sglang-path", release(version), "--config", CP_PREFILL, "--depth", "static")
    result = result_of(report, "NPD004")
    assert report["target"]["version"] == version
    assert result["status"] == expected_status(version, "NPD004"), result
    assert result["roles"] == ["prefill"]
    # a described deployment: nothing assumed, at most which metadata class its CP strategy builds
    assert all(a.startswith("static: the zigzag CP strategy builds ") for a in result["assumptions"])
    for location in truth_locations(version, "NPD004"):
        assert location in evidence_text(result), f"{location} missing from {result['evidence']}"


def test_release_without_the_fia_cp_path_passes_saying_so(cli, release):
    result = npd004(cli, release("0.5.9"), "--config", CP_PREFILL)
    assert result["status"] == "pass"
    assert "no do_cp_attn_fia in this release" in result["evidence"][0]["observed"]
    assert "code path does not exist" in result["evidence"][0]["observed"]


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12"])
def test_scalar_fields_pass_where_the_metadata_still_defines_them(cli, release, version):
    """0.5.11/0.5.12: do_cp_attn_fia reads the scalar fields and splits q at the midpoint, both
    right there: cp_utils still defines the fields and can_cp_split admits one request only."""
    result = npd004(cli, release(version), "--config", CP_PREFILL)
    observed = result["evidence"][0]["observed"]
    assert result["status"] == "pass"
    for name in REMOVED_FIELDS:
        assert f"cp_meta.{name} ({BACKEND}:" in observed
    assert "all defined by ContextParallelMetadata (sglang/srt/layers/utils/cp_utils.py:21)" in observed
    assert f"torch.chunk(q, 2, dim=0) at {BACKEND}:814" in observed
    assert (
        "can_cp_split (sglang/srt/layers/utils/cp_utils.py:61) admits only CP batches of one request"
        in observed
    )


def test_delegation_to_the_cp_strategy_is_followed(cli, release):
    """0.5.23: do_cp_attn_fia reads nothing itself; the zigzag strategy's run_attention does."""
    result = npd004(cli, release("0.5.23"), "--config", CP_PREFILL)
    observed = result["evidence"][0]["observed"]
    assert result["status"] == "pass"
    assert "ZigzagCPStrategy.run_attention (sglang/srt/layers/cp/zigzag.py:362) reads" in observed
    assert "meta.total_q_prev_tokens (sglang/srt/layers/cp/zigzag.py:376)" in observed
    assert "all defined by ZigzagContextParallelMetadata (sglang/srt/layers/cp/zigzag.py:60)" in observed


# ----- the synthetic buggy state ----------------------------------------------------------
def test_cp_gap_state_fails_with_the_removed_fields_and_the_midpoint_split(cli, cp_gap):
    assert TRUTH["synthetic"]["0.5.13+cp-gap"]["NPD004"]["verdict"] == "present"
    text = (cp_gap / BACKEND).read_text()
    start, _, _ = method_span(text, "AscendAttnBackend", "do_cp_attn_fia")

    result = npd004(cli, cp_gap, "--config", CP_PREFILL)
    assert result["status"] == "fail"
    assert result["remediation"]["fix_id"] == "NPD004"
    by_line = {e["location"]["line"]: e for e in result["evidence"] if e["location"]}
    for name in REMOVED_FIELDS:
        line = line_of(text, f"cp_meta.{name}]", after=start)
        finding = by_line[line]
        assert finding["location"] == {
            "path": BACKEND,
            "line": line,
            "symbol": "AscendAttnBackend.do_cp_attn_fia",
        }
        assert f"reads cp_meta.{name} at {BACKEND}:{line}" in finding["observed"]
        assert f"(it has {name}_list, {name}_tensor)" in finding["observed"]
        assert "ContextParallelMetadata (sglang/srt/layers/utils/cp_utils.py:24)" in finding["expected"]

    chunk_line = line_of(text, "q_prev, q_next = torch.chunk(q, 2", after=start)
    split = by_line[chunk_line]
    assert f"torch.chunk(q, 2, dim=0) at {BACKEND}:{chunk_line}" in split["observed"]
    assert "right only for a batch of one request" in split["observed"]
    assert "can_cp_split (sglang/srt/layers/utils/cp_utils.py:103) does not limit" in split["observed"]
    assert "bs" in split["expected"] and "actual_seq_q_prev_list" in split["expected"]
    assert len(result["evidence"]) == len(REMOVED_FIELDS) + 1
    assert "kv_len_prev" in result["summary"] and "midpoint" in result["summary"]


def test_cp_gap_without_a_deployment_assumes_the_worst_and_says_so(cli, cp_gap):
    result = npd004(cli, cp_gap)
    assert result["status"] == "fail"
    assert result["roles"] == ["prefill (assumed)"]
    assert any("no deployment given" in a and "ASCEND_USE_FIA=1" in a for a in result["assumptions"])


def test_no_deployment_on_a_fixed_release_passes_with_the_assumption(cli, release):
    result = npd004(cli, release("0.5.13"))
    assert result["status"] == "pass"
    assert any("no deployment given" in a for a in result["assumptions"])


# ----- conditions ---------------------------------------------------------------------------
def test_skips_without_context_parallelism(cli, cp_gap):
    result = npd004(cli, cp_gap, "--config", EXAMPLES / "qwen3-moe-pd-fia.yaml")
    assert result["status"] == "skip"
    assert "no prefill-side role uses context parallelism" in result["summary"]


def test_skips_context_parallelism_without_fia_naming_the_guard(cli, cp_gap, tmp_path):
    config = tmp_path / "cp-no-fia.yaml"
    config.write_text(deployment_text(ASCEND_USE_FIA="0"))
    lines = (cp_gap / BACKEND).read_text().splitlines()
    guard = line_of("\n".join(lines), "= self.do_cp_attn_fia(") - 1  # the test right above the call
    assert lines[guard - 1].strip() == "if self.use_fia:"

    result = npd004(cli, cp_gap, "--config", config)
    assert result["status"] == "skip"
    assert f"only under `self.use_fia` ({BACKEND}:{guard})" in result["summary"]
    assert "NotImplementedError" in result["summary"]


def test_an_mla_model_is_judged_on_the_mla_path(cli, cp_gap, tmp_path):
    """The cp-gap state breaks do_cp_attn_fia, which the Ascend backend calls only for non-MLA
    models (under `not self.use_mla`): an MLA model's CP prefill walks its own readers and passes."""
    config = tmp_path / "mla-cp.yaml"
    config.write_text(deployment_text(model="models/deepseek-v3/config.json"))
    result = npd004(cli, cp_gap, "--config", config)
    assert result["status"] == "pass", result
    assert "(MLA, zigzag strategy)" in result["summary"]
    assert "do_cp_attn_fia" not in evidence_text(result)


# ----- siblings: the property, not the diff -------------------------------------------------
def test_strategy_reading_an_undefined_field_fails(cli, release, overlay):
    """0.5.23 delegates to ZigzagCPStrategy.run_attention: make it read a field no class defines."""
    tree = overlay(release("0.5.23"))
    zigzag = tree / "sglang/srt/layers/cp/zigzag.py"
    replace_text(zigzag, "q_prev = q[: meta.total_q_prev_tokens]", "q_prev = q[: meta.total_q_prev_len]")
    line = line_of(zigzag.read_text(), "meta.total_q_prev_len")

    result = npd004(cli, tree, "--config", CP_PREFILL)
    assert result["status"] == "fail"
    finding = result["evidence"][0]
    assert finding["location"] == {
        "path": "sglang/srt/layers/cp/zigzag.py",
        "line": line,
        "symbol": "ZigzagCPStrategy.run_attention",
    }
    assert "on the CP path of AscendAttnBackend.do_cp_attn_fia" in finding["observed"]
    assert "total_q_prev_tokens" in finding["observed"]  # the nearest field it does define


def test_a_field_of_another_strategys_metadata_fails(cli, release, overlay):
    """gather_index exists, but only on InterleaveContextParallelMetadata: the zigzag strategy
    builds ZigzagContextParallelMetadata, so its run_attention cannot read it."""
    tree = overlay(release("0.5.23"))
    zigzag = tree / "sglang/srt/layers/cp/zigzag.py"
    source = zigzag.read_text()
    start = source.index("    def run_attention(")
    anchor = source.index("        meta = forward_batch.attn_cp_metadata\n", start)
    replace_text(
        zigzag,
        source[anchor : anchor + 200],
        source[anchor : anchor + 200].replace(
            "meta = forward_batch.attn_cp_metadata\n",
            "meta = forward_batch.attn_cp_metadata\n        order = meta.gather_index\n",
            1,
        ),
    )
    result = npd004(cli, tree, "--config", CP_PREFILL)
    assert result["status"] == "fail"
    finding = result["evidence"][0]
    assert "reads meta.gather_index" in finding["observed"]
    assert "ZigzagContextParallelMetadata" in finding["expected"]
    assert "InterleaveContextParallelMetadata" not in finding["expected"]


@pytest.mark.parametrize(
    ("module", "cp_v2"),
    [
        # Qwen3-MoE is in 0.5.15's CP_V2_DEFAULT_MODEL_CLASSES: the zigzag strategy builds its metadata
        ("sglang/srt/layers/cp/zigzag.py", None),
        # SGLANG_ENABLE_CP_V2=0 keeps the model-level prepare_context_parallel_metadata (cp_utils)
        ("sglang/srt/layers/utils/cp_utils.py", "0"),
    ],
)
def test_renaming_a_field_in_the_metadata_class_fails(cli, release, overlay, tmp_path, module, cp_v2):
    """0.5.15: the function is unchanged; the metadata class the deployment's preparation builds
    loses the field it reads."""
    tree = overlay(release("0.5.15"))
    replace_text(tree / module, "    total_q_prev_tokens: int = 0\n", "    total_q_prev_len: int = 0\n")
    line = line_of((tree / BACKEND).read_text(), "split = cp_meta.total_q_prev_tokens")
    config = CP_PREFILL
    if cp_v2 is not None:
        config = tmp_path / "cp-v2-off.yaml"
        config.write_text(
            deployment_text().replace(
                'env: {ASCEND_USE_FIA: "1"}', f'env: {{ASCEND_USE_FIA: "1", SGLANG_ENABLE_CP_V2: "{cp_v2}"}}'
            )
        )

    result = npd004(cli, tree, "--config", config)
    assert result["status"] == "fail"
    finding = result["evidence"][0]
    assert finding["location"]["path"] == BACKEND and finding["location"]["line"] == line
    assert "reads cp_meta.total_q_prev_tokens" in finding["observed"]


def test_a_midpoint_slice_of_a_multi_request_batch_fails(cli, release, overlay):
    """No missing field, but q split at its midpoint while the metadata describes several requests."""
    tree = overlay(release("0.5.15"))
    backend = tree / BACKEND
    replace_text(backend, "q[:split]", "q[: q.shape[0] // 2]")
    replace_text(backend, "q[split:]", "q[q.shape[0] // 2 :]")
    result = npd004(cli, tree, "--config", CP_PREFILL)
    assert result["status"] == "fail"
    assert [e["expected"].split(":")[0] for e in result["evidence"]] == ["q split per request"] * 2
    assert "q[:q.shape[0] // 2]" in evidence_text(result)


# ----- unrecognised layouts warn, never pass silently ---------------------------------------
def test_missing_metadata_class_warns(cli, release, overlay):
    tree = overlay(release("0.5.13"))
    replace_text(
        tree / "sglang/srt/layers/utils/cp_utils.py", "class ContextParallelMetadata:", "class CpLayout:"
    )
    result = npd004(cli, tree, "--config", CP_PREFILL)
    assert result["status"] == "warn"
    assert "not one npudoctor recognises" in evidence_text(result)


def test_unresolvable_delegation_warns(cli, release, overlay):
    tree = overlay(release("0.5.23"))
    backend = tree / BACKEND
    source = backend.read_text()
    start = source.index("    def do_cp_attn_fia(")
    old = source[start:].split("cp_strategy = get_cp_strategy()", 1)[0] + "cp_strategy = get_cp_strategy()"
    replace_text(backend, old, old.replace("get_cp_strategy()", "self.pick_strategy(forward_batch)"))
    result = npd004(cli, tree, "--config", CP_PREFILL)
    assert result["status"] == "warn"
    assert "cannot resolve" in evidence_text(result)
    assert "cp_strategy.run_attention(...)" in evidence_text(result)


def test_cp_code_without_the_known_entry_warns(cli, release, overlay):
    """The NPU backend still reads CP metadata, but do_cp_attn_fia is gone (renamed): that is a
    layout npudoctor does not know, not a release without the path."""
    tree = overlay(release("0.5.13"))
    replace_text(tree / BACKEND, "do_cp_attn_fia(", "cp_attention_fia(", count=2)
    assert "do_cp_attn_fia(" not in (tree / BACKEND).read_text()
    result = npd004(cli, tree, "--config", CP_PREFILL)
    assert result["status"] == "warn"
    assert result["evidence"][0]["location"]["path"] == BACKEND
    assert "not one npudoctor recognises" in result["evidence"][0]["observed"]
