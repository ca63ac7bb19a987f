"""NPD004 live: sglang's own CP metadata preparation and one whole CP prefill attention layer of
the installed release (the K/V all-gather and save, then ``do_cp_attn_fia``), run on CPU for every
CP rank of the deployment, on real releases and on the synthetic "0.5.13+cp-gap" state
(sglang#26705), compared with causal attention computed independently."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from npudoctor.checks.npd004_cp_metadata_fields import live
from npudoctor.live import npusim
from npudoctor.live.forwardpass import AttentionDims

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import NPU_BACKEND, method_span, replace_text
from support.truths import RELEASES, TRUTH, expected_status

CP_PREFILL = EXAMPLES / "qwen3-cp-prefill.yaml"
# The releases by what their CP preparation admits (the truths' evidence): no FIA CP path at all,
# one request per CP batch (can_cp_split), or several requests.
WITHOUT_FIA_CP = [
    v for v in RELEASES if "no do_cp_attn_fia" in TRUTH["releases"][v]["NPD004"].get("evidence", "")
]
ONE_REQUEST_GATE = ["0.5.11", "0.5.12"]
SEVERAL_REQUESTS = [v for v in RELEASES if v not in (*WITHOUT_FIA_CP, *ONE_REQUEST_GATE)]
NO_CP = EXAMPLES / "qwen3-moe-pd-fia.yaml"
QWEN3_MOE = "sglang/srt/models/qwen3_moe.py"
# What the live probe runs for examples/qwen3-cp-prefill.yaml (Qwen3-30B-A3B: 32 q / 4 KV heads
# x 128; tp 4 over attn_cp 2 -> attention TP 2; page size 128, sglang's NPU default).
SEVERAL = "batch of 2 requests (45 tokens; 158 tokens after a cached 133-token prefix)"
ONE = "batch of 1 request (158 tokens after a cached 133-token prefix)"
RANKS = "CP ranks 0, 1 of 2, 16 q heads / 2 KV heads x 128 per rank (attention TP 2), page size 128"
MAX_ERROR = re.compile(r"max abs error (\S+) over (\d+) rows")


def line_of(text: str, needle: str, after: int = 0) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        if number >= after and needle in line:
            return number
    raise AssertionError(f"{needle!r} not found")


def npd004_live(cli, tree, *args: str, depth: str = "live") -> dict:
    return result_of(
        json_report(cli, "--sglang-path", tree, "--select", "NPD004", "--depth", depth, *args), "NPD004"
    )


# ----- the known truths -------------------------------------------------------------------
@pytest.mark.parametrize("version", sweep(RELEASES, quick=("0.5.13",)))
def test_live_verdict_matches_truth_and_static(cli, release, live_report, version):
    """Live agrees with the known truth, and with the static probe on the same deployment."""
    result = result_of(live_report(version, CP_PREFILL), "NPD004")
    static = npd004_live(cli, release(version), "--config", CP_PREFILL, depth="static")
    assert result["depth"] == "live"
    assert result["status"] == expected_status(version, "NPD004"), result
    assert result["status"] == static["status"], (result["summary"], static["summary"])
    assert result["roles"] == ["prefill"]


@pytest.mark.parametrize("version", sweep(SEVERAL_REQUESTS, quick=("0.5.13",)))
def test_pass_evidence_names_the_batch_the_ranks_and_the_error(release, live_report, version):
    """Releases whose preparation admits several requests per CP batch are probed with two
    requests of different lengths, one after a cached prefix, on both CP ranks."""
    result = result_of(live_report(version, CP_PREFILL), "NPD004")
    runs = [o for o in result["evidence"] if o["observed"].startswith("live, CPU")]
    assert runs, result
    for evidence in runs:
        observed = evidence["observed"]
        assert f"{SEVERAL}, {RANKS}" in observed
        assert "every output row of every rank matches" in observed
        error, rows = MAX_ERROR.search(observed).groups()
        assert float(error) <= live.TOLERANCE and int(rows) == 45 + 158
        method = evidence["location"]
        assert method["path"] == NPU_BACKEND and method["symbol"] == "AscendAttnBackend.do_cp_attn_fia"
        source = (release(version) / NPU_BACKEND).read_text()
        assert method["line"] == method_span(source, "AscendAttnBackend", "do_cp_attn_fia")[0]
    assert "batch of 2 requests" in result["summary"]


@pytest.mark.slow
def test_each_preparation_of_a_release_is_probed(live_report):
    """0.5.15 ships both preparations: Qwen3-MoE's own prepare_context_parallel_metadata call and
    the CP strategy's prepare_cp_forward (CP-v2); both feed do_cp_attn_fia and both are run."""
    result = result_of(live_report("0.5.15", CP_PREFILL), "NPD004")
    observed = " | ".join(e["observed"] for e in result["evidence"])
    assert f"metadata from prepare_context_parallel_metadata (called at {QWEN3_MOE}:991)" in observed
    assert "metadata from prepare_cp_forward (at sglang/srt/layers/cp/utils.py:69)" in observed


@pytest.mark.parametrize("version", sweep(ONE_REQUEST_GATE, quick=()))
def test_a_one_request_gate_is_observed_live(release, live_report, version):
    """0.5.11/0.5.12: can_cp_split admits one request per CP batch. The probe calls it, as
    Qwen3-MoE's forward does, with a batch of two; it refuses, and one request is probed."""
    result = result_of(live_report(version, CP_PREFILL), "NPD004")
    (observed,) = [e["observed"] for e in result["evidence"] if e["observed"].startswith("live, CPU")]
    gate = line_of((release(version) / QWEN3_MOE).read_text(), "if can_cp_split(len(input_ids)")
    assert f"{ONE}, {RANKS}" in observed
    assert (
        f"`can_cp_split(len(input_ids), self.attn_cp_size, forward_batch)` ({QWEN3_MOE}:{gate}) "
        "refused a batch of 2 requests (live)"
    ) in observed
    error, rows = MAX_ERROR.search(observed).groups()
    assert float(error) <= live.TOLERANCE and int(rows) == 158


@pytest.mark.slow
def test_skips_without_context_parallelism(live_report):
    result = result_of(live_report("0.5.13", NO_CP), "NPD004")
    # decided from the deployment before either depth runs: no live probe is started for it
    assert result["status"] == "skip" and result["depth"] == "static"
    assert "no prefill-side role uses context parallelism" in result["summary"]


# ----- the synthetic buggy state ----------------------------------------------------------
def test_cp_gap_fails_live_with_the_removed_field(subject, live_report):
    """0.5.13's metadata with 0.5.12's do_cp_attn_fia: the first CP prefill raises, on every rank."""
    assert TRUTH["synthetic"]["0.5.13+cp-gap"]["NPD004"]["verdict"] == "present"
    text = (subject("0.5.13+cp-gap") / NPU_BACKEND).read_text()
    start, _, _ = method_span(text, "AscendAttnBackend", "do_cp_attn_fia")
    line = line_of(text, "cp_meta.actual_seq_q_prev]", after=start)

    result = result_of(live_report("0.5.13+cp-gap", CP_PREFILL), "NPD004")
    assert result["status"] == "fail" and result["depth"] == "live"
    (evidence,) = result["evidence"]
    assert evidence["location"] == {
        "path": NPU_BACKEND,
        "line": line,
        "symbol": "AscendAttnBackend.do_cp_attn_fia",
    }
    assert evidence["observed"].startswith(
        f"AttributeError: 'ContextParallelMetadata' object has no attribute 'actual_seq_q_prev' at {NPU_BACKEND}:{line}"
    )
    assert (
        f"CP rank 0; role prefill, metadata from prepare_context_parallel_metadata (called at {QWEN3_MOE}:"
        in (evidence["observed"])
    )
    assert f"{SEVERAL}, {RANKS}); rank 1 too" in evidence["observed"]
    assert (
        "reads only fields the CP metadata built by prepare_context_parallel_metadata defines"
        in (evidence["expected"])
    )
    assert "AttributeError" in result["summary"] and "actual_seq_q_prev" in result["summary"]
    assert result["remediation"]["fix_id"] == "NPD004"


@pytest.mark.slow
def test_cp_gap_without_a_deployment_fails_live_in_the_assumed_role(cli, cp_gap):
    result = npd004_live(cli, cp_gap)
    assert result["status"] == "fail" and result["depth"] == "live"
    assert result["roles"] == ["prefill (assumed)"]
    assert any(
        "live: ran the assumed prefill role with tp_size 2, attn_cp_size 2" in a
        for a in result["assumptions"]
    )
    observed = result["evidence"][0]["observed"]
    assert "no attribute 'actual_seq_q_prev'" in observed
    assert "32 q heads / 4 KV heads x 128 per rank (attention TP 1)" in observed


@pytest.mark.slow
# ----- general, not tuned -----------------------------------------------------------------
def test_per_request_lengths_for_cumulative_ends_are_a_numerical_mismatch(cli, release, overlay):
    """A defect no release had: 0.5.13's do_cp_attn_fia passing the per-request q lengths where
    FIA's TND layout takes cumulative ends. Every field it reads exists and q is split at
    total_q_prev_tokens, so the static probe (which checks fields and fixed splits) passes;
    only running it shows that request 1's queries are cut at the wrong rows. What sglang's own
    code did decides: ``fail``, carrying both findings and the static miss as a note."""
    tree = overlay(release("0.5.13"))
    backend = tree / NPU_BACKEND
    for half in ("prev", "next"):
        replace_text(
            backend,
            f"actual_seq_lengths=np.cumsum(cp_meta.actual_seq_q_{half}_list).tolist(),",
            f"actual_seq_lengths=cp_meta.actual_seq_q_{half}_list,",
        )

    result = npd004_live(cli, tree, "--config", CP_PREFILL, depth="auto")
    assert (result["status"], result["depth"]) == ("fail", "live")
    assert any(a.startswith("static depth: pass") for a in result["assumptions"])
    mismatch, *static = result["evidence"]  # the live finding, then the static probe's readers
    assert mismatch["expected"].startswith(
        "request 1 (158 tokens after a cached 133-token prefix) on CP rank 0, zigzag block 0, token at position "
    )
    assert "as full causal attention gives" in mismatch["expected"]
    got = re.search(
        r"then do_cp_attn_fia\) gave (\S+) \(live, CPU\); (\d+) of 102 rows", mismatch["observed"]
    )
    want = re.search(r"head \d+: (\S+), as full", mismatch["expected"])
    assert got and want and abs(float(got.group(1)) - float(want.group(1))) > live.TOLERANCE
    assert f"{SEVERAL}, {RANKS}; rank 1 too" in mismatch["observed"]
    assert mismatch["location"]["symbol"] == "AscendAttnBackend.do_cp_attn_fia"
    assert static and any("all defined by ContextParallelMetadata" in e["observed"] for e in static)


# ----- the independent reference and the simulated device ------------------------------------
def test_the_reference_is_causal_attention_with_a_prefix():
    """The float64 reference the probe compares with agrees with PyTorch's own attention."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(7, 8, 16, generator=generator)
    k = torch.randn(12, 2, 16, generator=generator)
    v = torch.randn(12, 2, 16, generator=generator)
    got = live.causal_attention(q, k, v, prefix=5, scale=0.25)
    mask = torch.arange(12)[None, :] <= (5 + torch.arange(7))[:, None]
    want = F.scaled_dot_product_attention(
        q.double().transpose(0, 1),
        k.double().repeat_interleave(4, dim=1).transpose(0, 1),
        v.double().repeat_interleave(4, dim=1).transpose(0, 1),
        attn_mask=mask,
        scale=0.25,
    ).transpose(0, 1)
    torch.testing.assert_close(got, want)


def test_the_paged_cache_holds_each_request_in_its_own_pages():
    dims = AttentionDims(
        q_heads=4, kv_heads=2, head_dim=8, v_head_dim=8, page_size=16, cp_size=2, attn_tp_size=1
    )
    load = live.workload(live.SEVERAL, dims)
    pages = [[int(p) for p in row if p] for row in load.block_tables]
    assert [len(p) for p in pages] == [-(-r.total // 16) for r in live.SEVERAL]
    assert 0 not in sum(pages, []) and len(set(sum(pages, []))) == len(sum(pages, []))
    assert len(load.request_of) == load.q.shape[0] == 45 + 158
    assert load.position_of[45] == 133  # request 1's first extend token follows its cached prefix


def test_cuda_tensors_land_on_the_cpu_only_inside_the_simulation():
    """sglang's shared code names device="cuda"; on Ascend transfer_to_npu maps it to the NPU."""
    before = (torch.tensor, torch.Tensor.to, torch.Tensor.cuda)
    with npusim.accelerator_on_cpu():
        assert torch.tensor([1, 2], device="cuda").device.type == "cpu"
        assert torch.zeros(2).to("npu").device.type == "cpu"
    assert (torch.tensor, torch.Tensor.to, torch.Tensor.cuda) == before
    with pytest.raises((AssertionError, RuntimeError)):
        torch.tensor([1], device="cuda")
