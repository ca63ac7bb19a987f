"""NPD007, the dry run, on real releases: sglang's own scheduler started on a simulated Ascend.

Each test runs ``npudoctor check --select NPD007 --depth live`` on a real release tree (one fresh
interpreter per role imports sglang and starts its scheduler: ~15 s) and reads the JSON report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npudoctor.checks.npd007_dry_run.live import judged_outcomes
from npudoctor.checks.npd007_dry_run.outcome import PREFILL, START_UP, STEPS, DryRunOutcome, Step
from npudoctor.checks.npd007_dry_run.serve import server_args_for
from npudoctor.live.locations import Raised
from npudoctor.results import Location

DATA = Path(__file__).resolve().parents[1] / "data" / "dryrun"
TINY_LLAMA = DATA / "models" / "tiny-llama"


def dry_run(cli, tree: Path, *deployment: str) -> dict:
    code, out, err = cli(
        "check",
        "--select",
        "NPD007",
        "--depth",
        "live",
        "--sglang-path",
        tree,
        "--format",
        "json",
        *deployment,
    )
    assert code in (0, 1), err
    (result,) = [r for r in json.loads(out)["results"] if r["id"] == "NPD007"]
    return result


def steps_run(result: dict) -> list[str]:
    line = next(a for a in result["assumptions"] if ": steps run: " in a)
    return line.split(": steps run: ", 1)[1].split(", ")


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3-moe"])
def test_a_dense_and_a_moe_model_serve_every_step_on_0_5_23(cli, release, model):
    """The real 0.5.23 scheduler starts (distributed groups, dummy weights, pools, the ascend
    attention backend, the radix cache) and serves every step on the simulated NPU: two prompts
    prefilled together, a prompt longer than the chunk, a hit on two cached pages, decode."""
    result = dry_run(cli, release("0.5.23"), "--model-path", DATA / "models" / model)
    assert result["status"] == "pass", result["summary"]
    assert steps_run(result) == list(STEPS)
    calls = next(a for a in result["assumptions"] if ": simulated NPU calls: " in a)
    assert "torch_npu._npu_paged_attention" in calls  # decode ran through the Ascend backend's kernel


def test_rope_importing_vllm_on_npu_is_found_by_running_the_model(cli, release):
    """Catalog record NPC070 (a start-up crash): up to 0.5.8 ``RotaryEmbedding`` imports vllm on
    NPU for a rope head size outside 64/128/256/512 (the tiny Llama's is 32); 0.5.9 does not. The
    dry run builds the model and the import fails as it would on an Ascend host (vllm is CUDA-only)."""
    failing = dry_run(cli, release("0.5.8"), "--model-path", TINY_LLAMA)
    assert failing["status"] == "fail", failing["summary"]
    (evidence,) = failing["evidence"]
    assert evidence["location"]["path"] == "sglang/srt/layers/rotary_embedding.py"
    assert "No module named 'vllm'" in evidence["observed"] and "(dry run, start-up)" in evidence["observed"]
    fixed = dry_run(cli, release("0.5.9"), "--model-path", TINY_LLAMA)
    assert fixed["status"] == "pass", fixed["summary"]


def test_without_a_model_the_dry_run_says_what_it_needs(cli, release):
    result = dry_run(cli, release("0.5.23"), "--", "python", "-m", "sglang.launch_server", "--tp", "2")
    assert result["status"] == "skip"
    assert "no model given" in result["summary"]


def test_features_one_simulated_device_cannot_serve_are_named_not_dropped_silently():
    accepted = {"tp_size", "pp_size", "disaggregation_mode", "chunked_prefill_size", "model_path", "device"}
    given, adjusted, not_simulated = server_args_for(
        {"tp_size": 16, "pp_size": 1, "disaggregation_mode": "prefill", "chunked_prefill_size": 8192},
        accepted,
        "/scratch/model",
    )
    assert given["tp_size"] == 1 and given["disaggregation_mode"] == "prefill"  # the role's own path
    assert any("tensor parallelism" in n and "tp_size=16" in n for n in not_simulated)
    assert any("KV transfer engine" in n for n in not_simulated)
    assert not any("pipeline" in n for n in not_simulated)  # pp 1 is what the run does
    assert any(a.startswith("chunked_prefill_size 8192 -> ") for a in adjusted)


def _outcome(failure: Raised | None = None, gap: str | None = None) -> DryRunOutcome:
    return DryRunOutcome(
        role="decode",
        steps=[Step(START_UP, True), Step(PREFILL, failure is None and gap is None)],
        failed_step=PREFILL if failure else None,
        failure=failure,
        gap=gap,
        gap_step=PREFILL if gap else None,
    )


def test_only_an_exception_in_sglang_code_fails_the_gate():
    where = Location("sglang/srt/managers/schedule_batch.py", 2875, "prepare_for_extend")
    in_sglang = Raised(
        "AttributeError", "'Req' object has no attribute 'fill_id'", where, (where,), False, True
    )
    in_simulation = Raised("TypeError", "bad operand", where, (where,), False, False)
    failed = judged_outcomes([_outcome(in_sglang)], [])
    assert failed.status.value == "fail"
    assert failed.evidence[0].location == where and "prefill" in failed.evidence[0].observed
    assert judged_outcomes([_outcome(in_simulation)], []).status.value == "warn"
    gap = judged_outcomes([_outcome(gap="no CPU reference for torch_npu.npu_rms_norm")], [])
    assert gap.status.value == "warn" and "npu_rms_norm" in gap.summary


PD_PREFILL = DATA / "deepseek-v3-pd-prefill.yaml"


def test_the_pd_start_up_crash_of_0_5_12_is_found_by_running_it(cli, release):
    """0.5.12's NPU MLA pool builds state tables from a buffer it never made for a model without
    the NSA indexer (sglang PR #25383): the real prefill start-up raises. No rule names it here:
    the dry run starts the role and sglang raises. 0.5.13 (the fix) starts."""
    failing = dry_run(cli, release("0.5.12"), "--config", PD_PREFILL)
    assert failing["status"] == "fail", failing["summary"]
    (evidence,) = failing["evidence"]
    assert evidence["location"]["path"] == "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    assert evidence["location"]["line"] == 299
    assert "TypeError: 'NoneType' object is not subscriptable (dry run, start-up)" in evidence["observed"]
    fixed = dry_run(cli, release("0.5.13"), "--config", PD_PREFILL)
    assert START_UP in steps_run(fixed)
    assert not any("(dry run, start-up" in e["observed"] for e in fixed["evidence"]), fixed["evidence"]


MUTANTS = DATA / "mutants"


def _mutant_run(cli, release, tmp_path, name: str) -> dict:
    from support.patches import mutated_tree

    tree = mutated_tree(release("0.5.23"), MUTANTS / f"{name}.patch", tmp_path / name)
    return dry_run(cli, tree, "--model-path", TINY_LLAMA)


def _touched(patch: Path) -> str:
    return next(
        line[len("+++ b/") :].split("\t")[0].strip()
        for line in patch.read_text().splitlines()
        if line.startswith("+++ b/")
    )


# Two regressions and one refactor run in every CI; the whole set with --full (about 12 s each).
_EVERY_CI = {
    "regression-sgl-kernel-import-sampler-on-npu",
    "regression-attr-typo-chunked-req",
    "refactor-rename-local-extend-cumsum",
}
PATCHES = [
    pytest.param(p.stem, marks=() if p.stem in _EVERY_CI else pytest.mark.sweep)
    for p in sorted(MUTANTS.glob("*.patch"))
]


@pytest.mark.parametrize("name", PATCHES)
def test_the_mutants_of_0_5_23(cli, release, tmp_path, name):
    """tests/data/dryrun/mutants, written before the dry run was tuned: a regression on the path a
    dense deployment runs fails, with sglang's exception in the file the regression touched (an
    attribute typo, a dropped keyword, a CUDA-only import, a None where a tensor goes, an
    ``else: raise`` the NPU defaults reach); a behaviour-keeping refactor passes, as 0.5.23 does."""
    result = _mutant_run(cli, release, tmp_path, name)
    if name.startswith("refactor-"):
        assert result["status"] == "pass", result["summary"]
        assert steps_run(result) == list(STEPS)
        return
    assert result["status"] == "fail", result["summary"]
    (evidence,) = result["evidence"]
    assert "(dry run, " in evidence["observed"]
    touched = _touched(MUTANTS / f"{name}.patch")
    if "'NoneType' object" in evidence["observed"]:
        return  # a None handed on: it raises where it is used, not where the regression made it
    assert evidence["location"]["path"] == touched, evidence
