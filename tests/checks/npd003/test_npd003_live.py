"""NPD003 live: the installed Ascend send_kvcache, run per prefill PP stage on real CPU pools.

Every recorded (source, destination) address is decoded back to (layer, kind); a stage
passes only if its buffers map one to one onto the same layer and kind on decode
(https://github.com/sgl-project/sglang/pull/23893). DeepSeek-V3 and V3.2 have 61 layers:
sglang's get_pp_indices splits them 30 + 31 for PP 2 (the extra layer goes to the last stage).
"""

from __future__ import annotations

import json
import re

import pytest
from test_npd003_static import write_deployment

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import RELEASES, expected_status

DEEPSEEK_V3 = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA (K, V), no draft model
DEEPSEEK_V32 = EXAMPLES / "deepseek-v3.2-pd.yaml"  # MLA + NSA indexer (K, V, IK), decode with MTP
QWEN3_MODEL = EXAMPLES / "models" / "qwen3-30b-a3b" / "config.json"  # GQA, 48 layers
CONN = "sglang/srt/disaggregation/ascend/conn.py"
# (buffer kinds per layer, stage sizes) of each example: 61 layers as 30 + 31
STAGES = {DEEPSEEK_V3: (2, (30, 31)), DEEPSEEK_V32: (3, (30, 31))}
WRONG = re.compile(
    r"prefill stage (\d) \(layers (\d+)-(\d+)\): (\d+) of (\d+) pairs wrong: ((?:IK|K|V)\d+) -> "
)


def npd003(report: dict) -> dict:
    return result_of(report, "NPD003")


def stage_lines(result: dict) -> list[str]:
    return [e["observed"] for e in result["evidence"] if e["observed"].startswith("prefill stage")]


def qwen3_pp2(tmp_path, decode: str = "", prefill_env: str = "") -> str:
    """Qwen3-30B-A3B (GQA) in PD with prefill PP 2, written next to the test."""
    path = tmp_path / "qwen3-pp2.yaml"
    env = f", env: {{{prefill_env}}}" if prefill_env else ""
    path.write_text(
        f"model: {{config: {QWEN3_MODEL}}}\n"
        "roles:\n"
        "  prefill: {server_args: {tp_size: 4, pp_size: 2, disaggregation_mode: prefill,"
        f" disaggregation_transfer_backend: ascend}}{env}}}\n"
        f"  decode: {{server_args: {{tp_size: 4, {decode}disaggregation_mode: decode,"
        " disaggregation_transfer_backend: ascend}}\n"
    )
    return str(path)


@pytest.mark.parametrize(
    "example", [DEEPSEEK_V3, pytest.param(DEEPSEEK_V32, marks=pytest.mark.slow)], ids=lambda p: p.stem
)
@pytest.mark.parametrize("version", sweep(RELEASES))
def test_live_verdict_matches_truth(live_report, version, example):
    result = npd003(live_report(version, example))
    assert result["depth"] == "live"
    assert result["status"] == expected_status(version, "NPD003"), result
    kinds, sizes = STAGES[example]
    lines = stage_lines(result)
    assert len(lines) == 2, lines  # one finding per prefill stage
    for stage, (line, size) in enumerate(zip(lines, sizes)):
        first = 0 if stage == 0 else sizes[0]
        assert line.startswith(f"prefill stage {stage} (layers {first}-{first + size - 1})")
        assert line.endswith("(live, CPU)")
        buffers = kinds * size
        if result["status"] == "pass":
            assert f"{buffers} of {buffers} pairs right, one decode buffer each" in line
        else:
            wrong = WRONG.match(line)
            assert wrong, line
            assert int(wrong.group(5)) == buffers and 0 < int(wrong.group(4)) <= buffers


@pytest.mark.parametrize(
    "example", [DEEPSEEK_V3, pytest.param(DEEPSEEK_V32, marks=pytest.mark.slow)], ids=lambda p: p.stem
)
@pytest.mark.parametrize("version", sweep(RELEASES))
def test_static_depth_agrees_with_live(cli, live_report, release, version, example):
    """The two depths reach the same verdict on the examples (else ``auto`` would warn)."""
    live = npd003(live_report(version, example))
    static = npd003(
        json_report(cli, "--sglang-path", release(version), "--config", example, "--select", "NPD003")
    )
    assert static["depth"] == "static"
    assert static["status"] == live["status"], (static["summary"], live["summary"])


def test_no_pp_handling_sends_stage_pointer_i_to_decode_pointer_i(live_report):
    """0.5.9: the stage's list [K0..K29, V0..V29] goes to decode's first 60 entries: V0 lands in
    K30; stage 1's K30 lands in decode's K0."""
    lines = stage_lines(npd003(live_report("0.5.9", DEEPSEEK_V3)))
    assert "30 of 60 pairs wrong: V0 -> K30, V1 -> K31" in lines[0]
    assert "62 of 62 pairs wrong: K30 -> K0, K31 -> K1" in lines[1]


@pytest.mark.slow
def test_mla_through_the_mha_splitter_names_the_splitter(live_report):
    """0.5.11 halves the V3.2 list [K, V, IK] as if it were [K, V]: the path taken is evidence."""
    result = npd003(live_report("0.5.11", DEEPSEEK_V32))
    lines = stage_lines(result)
    assert all(
        "via CommonKVManager.get_mha_kv_ptrs_with_pp (sglang/srt/disaggregation/common/conn.py:385)" in x
        for x in lines
    )
    assert "V0 -> K30" in lines[0]
    assert any(
        e["location"]["path"] == "sglang/srt/disaggregation/common/conn.py" for e in result["evidence"]
    )


@pytest.mark.slow
def test_fixed_release_uses_sglangs_own_producer_and_split(live_report):
    result = npd003(live_report("0.5.12", DEEPSEEK_V32))
    assumptions = " ".join(result["assumptions"])
    assert "get_pp_indices (sglang/srt/distributed/utils.py:101)" in assumptions
    assert "setup_state_kv_args (sglang/srt/disaggregation/utils.py:552)" in assumptions
    lines = stage_lines(result)
    assert "(K30 -> K30 ... IK60 -> IK60)" in lines[1]
    assert all(
        "AscendKVManager.get_mla_kv_ptrs_with_pp (sglang/srt/disaggregation/ascend/conn.py:44)" in x
        for x in lines
    )


@pytest.mark.slow
def test_pd_bootstrap_crash_is_npd006s_finding(live_report):
    """0.5.12's NPU MLA pool without an indexer raises in get_state_buf_infos when sglang's PD
    bootstrap registers state buffers: NPD006's finding (fail); NPD003 judges the KV mapping with the
    pool reporting no state buffers and says so in a note per role, not in its pass."""
    report = live_report("0.5.12", DEEPSEEK_V3)
    result = npd003(report)
    assert result["status"] == "pass" and "bootstrap" not in result["summary"], result["summary"]
    assert not any(e["observed"].startswith("TypeError") for e in result["evidence"])
    notes = [a for a in result["assumptions"] if "(NPD006's finding)" in a]
    assert len(notes) == 2, result["assumptions"]  # once per role, not once per stage
    assert all("sglang/srt/hardware_backend/npu/memory_pool_npu.py:299" in note for note in notes)
    assert result_of(report, "NPD006")["status"] == "fail"


@pytest.mark.parametrize(("version", "status"), sweep([("0.5.9", "fail"), ("0.5.12", "pass")], quick=()))
def test_mha_deployment_with_prefill_pp(live_report, tmp_path_factory, version, status):
    """Qwen3 (GQA, 48 layers = 24 + 24): 0.5.9 has no PP handling; 0.5.11+ split K/V halves."""
    config = qwen3_pp2(tmp_path_factory.mktemp("qwen3"))
    result = npd003(live_report(version, config, depth="auto"))
    assert (result["status"], result["depth"]) == (status, "live"), result
    lines = stage_lines(result)
    if status == "fail":
        assert "24 of 48 pairs wrong: V0 -> K24" in lines[0]
    else:
        assert "48 of 48 pairs right" in lines[0] and "(K24 -> K24 ... V47 -> V47)" in lines[1]
        assert "CommonKVManager.get_mha_kv_ptrs_with_pp" in lines[0]


@pytest.mark.slow
def test_mha_draft_layers_with_an_uneven_split_fail_even_on_the_newest_release(live_report, tmp_path_factory):
    """A sibling the property catches: the MHA splitter infers decode's draft layers from
    layer-count divisibility, wrong when the stages are uneven (SGLANG_PP_LAYER_PARTITION
    20,28 with an EAGLE3 draft on decode). Both depths see it (static runs the splitter's
    arithmetic from the source)."""
    config = qwen3_pp2(
        tmp_path_factory.mktemp("qwen3-uneven"),
        decode="speculative_algorithm: EAGLE3, ",
        prefill_env='SGLANG_PP_LAYER_PARTITION: "20,28"',
    )
    result = npd003(live_report("0.5.23", config, depth="auto"))
    assert (result["status"], result["depth"]) == ("fail", "live"), result
    lines = stage_lines(result)
    assert lines[0].startswith("prefill stage 0 (layers 0-19): 20 of 40 pairs wrong: V0 -> K40")
    assert any("layers 0-19, 20-47" in a for a in result["assumptions"])
    # the static depth evaluates the same arithmetic and agrees: no disagreement to note
    assert not any(a.startswith("static depth: ") for a in result["assumptions"]), result["assumptions"]


@pytest.mark.slow
def test_no_deployment_probes_both_families_on_uneven_stages(live_report):
    result = npd003(live_report("0.5.23", None))
    assert result["depth"] == "live"
    assumptions = " ".join(result["assumptions"])
    assert (
        "prefill PP 2" in assumptions and "MLA with the NSA indexer" in assumptions and "GQA" in assumptions
    )
    lines = stage_lines(result)
    assert len(lines) == 4
    assert "90 of 90 pairs right" in lines[0] and "93 of 93 pairs right" in lines[1]  # MLA + indexer + draft
    assert result["status"] == "fail" and "pairs wrong" in lines[2]  # MHA + draft, 30 + 31 layers


@pytest.mark.slow
def test_skips_without_pipeline_parallelism(live_report):
    result = npd003(live_report("0.5.12", EXAMPLES / "qwen3-moe-pd-fia.yaml"))
    assert result["status"] == "skip" and "pp_size 1" in result["summary"]


@pytest.mark.slow
def test_broken_group_slicing_in_a_fixed_release_fails_live(cli, release, overlay):
    """Not any release's shape: 0.5.12's splitter slices only the first buffer group. sglang
    itself raises; that is the evidence. The static depth does not see it: the depths disagree."""
    tree = overlay(release("0.5.12"))
    replace_text(tree / CONN, "for i in range(kv_buf_groups):", "for i in range(min(kv_buf_groups, 1)):")
    args = ("--sglang-path", tree, "--config", DEEPSEEK_V32, "--select", "NPD003")
    result = npd003(json_report(cli, *args, "--depth", "live"))
    assert result["status"] == "fail"
    assert (
        f"send_kvcache raised IndexError: list index out of range (live, CPU) at {CONN}:"
        in stage_lines(result)[0]
    )


@pytest.mark.slow
def test_dropping_the_draft_layer_skip_in_the_newest_release_fails_live(cli, release, overlay):
    """Not any release's shape: 0.5.23's splitter offsets each group by decode's list length,
    draft layer included. Every V/IK pointer lands one layer late; static still reads
    ``hidden_kv_layers`` and passes: what sglang's own code did decides (fail), the static miss is noted."""
    tree = overlay(release("0.5.23"))
    replace_text(tree / CONN, "layer_offset = i * hidden_kv_layers", "layer_offset = i * dst_layers")
    args = ("--sglang-path", tree, "--config", DEEPSEEK_V32, "--select", "NPD003")
    live = npd003(json_report(cli, *args, "--depth", "live"))
    assert live["status"] == "fail"
    assert "60 of 90 pairs wrong: V0 -> V1, V1 -> V2" in stage_lines(live)[0]
    auto = npd003(json_report(cli, *args, "--depth", "auto"))
    assert (auto["status"], auto["depth"]) == ("fail", "live")
    assert any(
        a.startswith("static depth: pass") and "gap in the static probe" in a for a in auto["assumptions"]
    )


@pytest.mark.slow
def test_deepseek_sized_run_stays_small(cli, release):
    """61 layers, page 128: the NPD003 live run costs well under 300 MB above the import."""
    report = json_report(
        cli,
        "--sglang-path",
        release("0.5.23"),
        "--config",
        DEEPSEEK_V32,
        "--select",
        "NPD003",
        "--depth",
        "live",
    )
    assert npd003(report)["status"] == "pass"
    assert report["live"]["peak_rss_mb"] - report["live"]["import_rss_mb"] < 300, report["live"]
    assert "(live, CPU)" in json.dumps(npd003(report)["evidence"])


@pytest.mark.slow
def test_more_stages_than_the_assumed_model_has_layers_is_cannot_tell_not_a_hang(cli, release):
    """Without a model config the probe assumes a 61-layer model: PP 100000 has no split to probe."""
    code, out, err = cli(
        "check", "--format", "json", "--depth", "live", "--select", "NPD003", "--sglang-path", release("0.5.23"),
        "--", "python", "-m", "sglang.launch_server", "--pp-size", "100000", "--disaggregation-mode", "prefill",
    )  # fmt: skip
    assert code in (0, 1), err
    result = result_of(json.loads(out), "NPD003")
    assert result["status"] == "warn" and "pp_size 100000 exceeds the 61 layers" in result["summary"]


def _stage_outcome(line: str) -> str:
    """``prefill stage i (layers a-b): N of M pairs wrong: V0 -> K78, ...`` / ``... M of M pairs right``."""
    return line.split(";")[0].split(", one decode buffer each")[0]


# (release, known.yaml deployment): uneven and even MHA splits, with and without a draft layer
AGREEMENT = [
    ("0.5.12", "llama-3-70b-pd-pp3"),
    ("0.5.23", "llama-3-70b-pd-pp3-eagle"),
    ("0.5.11", "qwen3-moe-pd-pp2-uneven-eagle"),
    ("0.5.23", "qwen3-moe-pd-pp2-uneven-eagle"),
    ("0.5.13", "qwen3-moe-pd-pp2-eagle"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("version", "name"), AGREEMENT)
def test_static_mha_arithmetic_agrees_with_live_pairs(cli, live_report, release, tmp_path, version, name):
    """The static depth's model of the MHA splitter (the release's get_pp_indices and
    get_mha_kv_ptrs_with_pp run alone from the source, paired as send_kvcache pairs them) gives
    each stage the same verdict, the same count and the same first wrong pairs as the live run
    of the real code on real pools."""
    config = write_deployment(tmp_path, name)
    live = npd003(live_report(version, config, depth="live"))
    static = npd003(json_report(cli, "--sglang-path", release(version), "--config", config, "--select", "NPD003",
                                "--depth", "static"))  # fmt: skip
    assert (static["depth"], live["depth"]) == ("static", "live")
    assert static["status"] == live["status"], (static["summary"], live["summary"])
    assert [_stage_outcome(x) for x in stage_lines(static)] == [_stage_outcome(x) for x in stage_lines(live)]
