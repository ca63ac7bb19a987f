"""NPD004 over the K/V all-gather and save that runs before the FIA CP attention (the property, not
the diff): the first CP prefill of an MHA/GQA model on Ascend must not die in it, and must leave the
whole sequence's K/V in the pool where the attention reads it.

sglang 0.5.20 removed the legacy CP algorithms from ``layers/utils/cp_utils.py`` and kept their names
as import-only shims whose body is ``_deprecated_platform_cp()``, which raises ``ValueError``; the NPU
backend's ``_cp_allgather_and_save_kv_npu`` still calls ``cp_all_gather_rerange_kv_cache`` there, on
every CP prefill (0.5.20-0.5.22). 0.5.19 has the real gather; 0.5.23 gathers through the CP strategy
(``materialize_full_kv``). Statically: a call on the path into a function that always raises
(``walker.AlwaysRaises``, transitively) fails with the call and the raise. Live: one whole CP prefill
attention layer runs on every CP rank from ``AscendAttnBackend.forward`` (the gather simulated across
the ranks, the save into the release's NPU pool), so the raise, a save that does not happen or a
gather in the wrong order is seen; so is what the wheels showed besides the stub: on 0.5.16-0.5.19
the CP-v2 preparation pads every rank to a physical length and the NPU path's legacy gather, unaware
of the pad rows, splits by the logical lengths (RuntimeError; a size mismatch the static probe cannot
see). The truths are tests/data/known.yaml ``kv_all_gather``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import NPU_BACKEND, replace_text
from support.truths import TRUTH

KV = TRUTH["kv_all_gather"]["NPD004"]
STATES = list(KV["releases"])
RELEASED = [v for v in STATES if "+" not in v]
PRESENT = [v for v in RELEASED if KV["releases"][v]["verdict"] == "present"]
# present, but only the live probe can see it (a size mismatch in the gather, not a read or a raise)
LIVE_ONLY = [v for v in PRESENT if KV["releases"][v].get("seen") == "live"]
# the live probe cannot tell on these (a gap of the probe, not a verdict: known.yaml says why)
LIVE = [v for v in RELEASED if v not in KV["live_cannot_tell"]]
CP_UTILS = "sglang/srt/layers/utils/cp_utils.py"
MODELS = EXAMPLES / "models"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split("."))


def accepts(version: str, name: str) -> bool:
    """The release accepts the server argument ``name`` (known.yaml ``server_args``)."""
    first, last = TRUTH["server_args"][name]["accepted"].split("..")
    return version_key(first) <= version_key(version) <= version_key(last)


def deployment(directory: Path, version: str) -> Path:
    """examples/qwen3-cp-prefill.yaml's prefill role with the CP flags ``version`` accepts: the
    zigzag strategy's (enable_prefill_cp, cp_strategy) where it has them, else the legacy ones."""
    if accepts(version, "enable_prefill_cp"):
        flags = "enable_prefill_cp: true, cp_strategy: zigzag"
    else:
        flags = "enable_prefill_context_parallel: true, prefill_cp_mode: in-seq-split"
    path = directory / f"qwen3-cp-{version}.yaml"
    path.write_text(
        f"model: {{config: {MODELS / 'qwen3-30b-a3b' / 'config.json'}}}\n"
        'env: {ASCEND_USE_FIA: "1"}\n'
        "roles:\n"
        "  prefill:\n"
        "    server_args: {disaggregation_mode: prefill, disaggregation_transfer_backend: ascend, "
        f"tp_size: 4, attn_cp_size: 2, {flags}}}\n"
    )
    return path


def truth_locations(version: str) -> list[str]:
    """``sglang/srt/<path>:<line>`` of the truth's evidence, in order; a bare ``:N`` is in the file
    named before it."""
    found, current = [], None
    for path, line in re.findall(r"([\w/]+\.py)?:(\d+)", KV["releases"][version]["evidence"]):
        current = path or current
        found.append(f"sglang/srt/{current}:{line}")
    return found


def npd004(cli, tree: Path, config: Path, depth: str = "static") -> dict:
    return result_of(
        json_report(cli, "--sglang-path", tree, "--config", config, "--select", "NPD004", "--depth", depth),
        "NPD004",
    )


def at(evidence: dict) -> str:
    return f"{evidence['location']['path']}:{evidence['location']['line']}" if evidence["location"] else ""


# ----- the truths, both directions ----------------------------------------------------------------
@pytest.mark.parametrize("version", sweep(RELEASED, quick=("0.5.20", "0.5.23")))
def test_static_verdict_matches_the_truths(cli, release, tmp_path, version):
    """A release whose K/V all-gather always raises fails at the raise, naming each call from the
    backend's forward_extend down to it; one whose gather gathers has no such finding (nor one
    whose gather fails on sizes: that is the live probe's to see)."""
    result = npd004(cli, release(version), deployment(tmp_path, version))
    text = json.dumps(result["evidence"])
    if version not in PRESENT or version in LIVE_ONLY:
        assert result["status"] == "pass", result["summary"]
        assert "raises whatever it is passed" not in text
        return
    raised, *calls = truth_locations(version)
    assert result["status"] == "fail", result["summary"]
    (finding,) = [e for e in result["evidence"] if "raises whatever it is passed" in e["observed"]]
    assert at(finding) == raised and finding["location"]["symbol"] == "_deprecated_platform_cp"
    for location in calls:  # the shim's def and call, the backend's call into it, forward_extend's call
        assert location in finding["observed"], (location, finding["observed"])
    assert "always raises ValueError" in result["summary"]
    assert "AscendAttnBackend.forward_extend calls _cp_allgather_and_save_kv_npu" in result["summary"]


@pytest.mark.parametrize("version", sweep(LIVE, quick=("0.5.20", "0.5.23")))
def test_live_verdict_matches_the_truths(cli, release, tmp_path, version):
    """The whole CP prefill layer on every CP rank: where the gather is a stub, sglang's own raise;
    where it keeps the CP-v2 pad rows, its own split by the logical lengths fails; either at the
    truth's file:line, reached from the backend's forward through the NPU K/V save. Elsewhere every
    output row equals causal attention over K/V that the layer itself gathered and saved."""
    result = npd004(cli, release(version), deployment(tmp_path, version), depth="live")
    assert result["depth"] == "live", result["summary"]
    if version not in PRESENT:
        assert result["status"] == "pass", result["summary"]
        assert "every output row of every rank matches" in json.dumps(result["evidence"])
        assert "the K/V all-gather and save into the KV pool, then do_cp_attn_fia" in result["summary"]
        return
    raised, *calls = truth_locations(version)
    assert result["status"] == "fail", result["summary"]
    (finding,) = [e for e in result["evidence"] if e["location"] and at(e) == raised]
    observed = finding["observed"]
    if version in LIVE_ONLY:
        assert observed.startswith("RuntimeError: split_with_sizes expects split_sizes to sum exactly to")
        assert "metadata from prepare_cp_forward" in observed  # the CP-v2 preparation, which pads
    else:
        assert re.match(r"ValueError: Prefill CP on [\w/]+ is deprecated", observed), observed
    assert "rank 1 too" in observed
    for location in (c for c in calls if NPU_BACKEND in c):  # the backend's calls into the gather
        assert location in observed, (location, observed)
    assert "(AscendAttnBackend.forward_extend)" in observed and "(_cp_allgather_and_save_kv_npu)" in observed


# ----- the property: any call into code that can only raise; no false alarm where the raise may not run
def make_the_gather_raise(tree: Path, guard: str = "") -> int:
    """0.5.19's all-gather with its first step replaced by a call to a helper that only raises (a
    shape no release has: two calls deep, not the 0.5.20 shim), under ``guard`` if one is given;
    the line of the raise."""
    cp_utils = tree / CP_UTILS
    source = cp_utils.read_text()
    start = source.index("def cp_all_gather_rerange_kv_cache(")
    first = source.index("    output_tensor = cp_all_gather_reorganized_into_tensor_kv_cache(", start)
    call = (
        f"    if {guard}:\n        _no_kv_gather_here(cp_size)\n"
        if guard
        else "    _no_kv_gather_here(cp_size)\n"
    )
    replace_text(cp_utils, source[first : first + 70], call + source[first : first + 70])
    helper = (
        'def _no_kv_gather_here(cp_size):\n    raise RuntimeError(f"no K/V gather for {cp_size} ranks")\n\n\n'
    )
    replace_text(
        cp_utils, "def cp_all_gather_rerange_kv_cache(", helper + "def cp_all_gather_rerange_kv_cache("
    )
    return next(
        n for n, t in enumerate(cp_utils.read_text().splitlines(), 1) if 'raise RuntimeError(f"no K/V' in t
    )


def test_a_gather_that_always_raises_elsewhere_fails_at_that_raise(cli, release, overlay, tmp_path):
    tree = overlay(release("0.5.19"))
    line = make_the_gather_raise(tree)
    result = npd004(cli, tree, deployment(tmp_path, "0.5.19"))
    assert result["status"] == "fail", result["summary"]
    (finding,) = [e for e in result["evidence"] if "raises whatever it is passed" in e["observed"]]
    assert at(finding) == f"{CP_UTILS}:{line}" and finding["location"]["symbol"] == "_no_kv_gather_here"
    assert "always raises RuntimeError" in result["summary"]


def test_a_raise_under_a_condition_is_not_an_always_raising_call(cli, release, overlay, tmp_path):
    """The same helper behind an ``if`` the batch may not take: no finding (the raise may not run)."""
    tree = overlay(release("0.5.19"))
    make_the_gather_raise(tree, guard="cp_size > 64")
    result = npd004(cli, tree, deployment(tmp_path, "0.5.19"))
    assert result["status"] == "pass", result["summary"]


# each case walks every release; the default run takes the last (the indexer model, interleave)
MLA_CP = [
    (strategy, model) for model in ("deepseek-v3", "deepseek-v3.2") for strategy in ("zigzag", "interleave")
]


@pytest.mark.parametrize(("strategy", "model"), sweep(MLA_CP, quick=()))
def test_mla_cp_paths_have_no_always_raising_call_on_any_release(cli, release, tmp_path, model, strategy):
    """The MLA families walk their own CP readers: the stub shims 0.5.20+ keep in cp_utils
    (cp_all_gather_rerange_output, read by 0.5.20's NPU indexer only under its DSA CP switch, which
    is False on NPU there) are never an always-raising call on their path."""
    path = tmp_path / f"{model}-{strategy}.yaml"
    path.write_text(
        f"model: {{config: {MODELS / model / 'config.json'}}}\n"
        'env: {ASCEND_USE_FIA: "1"}\n'
        "roles:\n"
        "  prefill:\n"
        "    server_args: {disaggregation_mode: prefill, disaggregation_transfer_backend: ascend, "
        f"tp_size: 4, attn_cp_size: 2, enable_prefill_cp: true, cp_strategy: {strategy}}}\n"
    )
    for minor in range(8, 24):
        result = npd004(cli, release(f"0.5.{minor}"), path)
        assert "raises whatever it is passed" not in json.dumps(result["evidence"]), (
            minor,
            result["summary"],
        )


@pytest.mark.slow
def test_a_layer_that_does_not_save_its_kv_fails_live(cli, release, overlay, tmp_path):
    """0.5.23 with the K/V save skipped: the cache keeps garbage where the new tokens go, so the
    attention over it is wrong. The save is part of what the live probe runs, not pre-filled."""
    tree = overlay(release("0.5.23"))
    replace_text(
        tree / NPU_BACKEND,
        "    cp_strategy.materialize_full_kv(\n",
        "    return\n    cp_strategy.materialize_full_kv(\n",
    )
    result = npd004(cli, tree, deployment(tmp_path, "0.5.23"), depth="live")
    assert result["status"] == "fail" and result["depth"] == "live", result["summary"]
    assert "wrong attention for request" in result["summary"]


@pytest.mark.slow
def test_a_gather_in_the_wrong_order_fails_live(cli, release, overlay, tmp_path):
    """0.5.13's all-gather without its zigzag re-ordering (cp_reverse_index): every rank's K/V is in
    the pool, in the wrong slots. Only gathering what every rank really sent shows it."""
    tree = overlay(release("0.5.13"))
    cp_utils = tree / CP_UTILS
    source = cp_utils.read_text()
    start = source.index("def cp_all_gather_rerange_kv_cache(")
    body = source[start:].split("\ndef ", 1)[0]
    replace_text(
        cp_utils,
        body,
        body.replace(
            "for i in forward_batch.attn_cp_metadata.cp_reverse_index", "for i in range(len(outputs_list))"
        ),
    )
    result = npd004(cli, tree, EXAMPLES / "qwen3-cp-prefill.yaml", depth="live")
    assert result["status"] == "fail" and result["depth"] == "live", result["summary"]
    assert "wrong attention for request" in result["summary"]


# ----- no npudoctor fix cures it ----------------------------------------------------------------------
def test_the_npd004_fix_does_not_cure_the_stub_gather(cli, release, tmp_path):
    """NPD004's runtime fix replaces do_cp_attn_fia for the 0.5.13+cp-gap shape (sglang#26705); the
    stub gather runs before it, in another function: on 0.5.20 the check fails and the fix is
    refused, naming the sites whose shape differs."""
    code, out, err = cli(
        "fix", "--format", "json", "--unsafe", "--select", "NPD004", "--sglang-path", release("0.5.20"),
        "--config", deployment(tmp_path, "0.5.20"),
    )  # fmt: skip
    assert code == 1, err  # a fix refused where its check fails leaves the defect: exit 1
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "refused", entry
    assert "not a shape this fix was written for" in entry["reason"], entry
