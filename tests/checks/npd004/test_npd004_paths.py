"""NPD004 over the whole NPU CP prefill path, not only ``do_cp_attn_fia`` where sglang#26705 was
seen (the property, not the diff): every NPU reader of CP metadata
for the deployment's attention family (MHA/GQA with FIA, MLA, MLA with the DSA/NSA indexer) and
the CP strategy it selects, on real releases with the flags each release accepts.

The per-strategy truths are in tests/data/known.yaml (``cp_strategies``): Qwen3-MoE with
``--cp-strategy interleave`` fails on every release that has the flag (0.5.14-0.5.23), with
the file:line of the first read the interleave metadata does not define (or, on 0.5.23, the
strategy step that only raises); the zigzag layout passes. The coverage witnesses break one reader
at a time (the NPU indexer, the KV all-gather helper) in a real tree and expect that reader's
file:line, only for the family that runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import TRUTH

MODELS = EXAMPLES / "models"
STRATEGIES = TRUTH["cp_strategies"]["NPD004"]
INTERLEAVE = STRATEGIES["interleave"]
ZIGZAG = STRATEGIES["zigzag"]
# The static runs the quick tier keeps: the newest release (the others are slow).
QUICK = ("0.5.23",)


def deployment(tmp_path: Path, model: str, strategy: str | None, legacy: bool = False) -> Path:
    """A prefill CP deployment of ``model`` with the flags of the releases it is meant for:
    ``enable_prefill_cp``/``cp_strategy`` (0.5.14+) or the legacy
    ``enable_prefill_context_parallel``/``prefill_cp_mode`` (0.5.10-0.5.19)."""
    if legacy:
        flags = "enable_prefill_context_parallel: true, prefill_cp_mode: in-seq-split"
    else:
        flags = f"enable_prefill_cp: true, cp_strategy: {strategy}"
    path = tmp_path / f"{model}-{strategy or 'legacy'}.yaml"
    path.write_text(
        f"model: {{config: {MODELS / model / 'config.json'}}}\n"
        'env: {ASCEND_USE_FIA: "1"}\n'
        "roles:\n"
        "  prefill:\n"
        "    server_args: {disaggregation_mode: prefill, disaggregation_transfer_backend: ascend, "
        f"tp_size: 4, attn_cp_size: 2, {flags}}}\n"
    )
    return path


def npd004(cli, tree: Path, config: Path, depth: str = "static") -> dict:
    return result_of(
        json_report(cli, "--sglang-path", tree, "--config", config, "--select", "NPD004", "--depth", depth),
        "NPD004",
    )


def locations(result: dict) -> list[str]:
    return [
        f"{e['location']['path'].split('sglang/srt/', 1)[-1]}:{e['location']['line']}"
        for e in result["evidence"]
        if e.get("location")
    ]


# ----- every strategy the release offers ----------------------------------------------------
@pytest.mark.parametrize("version", sweep(INTERLEAVE["present"], quick=QUICK))
def test_interleave_fails_with_the_truths_file_line(cli, release, tmp_path, version):
    """The interleave strategy's metadata lacks what the FIA CP path reads (0.5.14-0.5.22), or the
    strategy does not implement the step (0.5.23): fail, at the truth's file:line."""
    result = npd004(cli, release(version), deployment(tmp_path, "qwen3-30b-a3b", "interleave"))
    assert result["status"] == "fail", result["summary"]
    assert "(MHA/GQA with FIA, interleave strategy)" in result["summary"]
    first = INTERLEAVE["evidence"][version].split()[0]
    assert first in locations(result), (first, locations(result))


@pytest.mark.parametrize("version", sweep(["0.5.14", "0.5.17", "0.5.20", "0.5.23"], quick=QUICK))
def test_zigzag_with_the_new_flags_matches_the_truths(cli, release, tmp_path, version):
    """Its metadata reads are right on every release; 0.5.20-0.5.22 still fail, at the K/V
    all-gather stub the path calls before the attention (known.yaml kv_all_gather; 0.5.16-0.5.19's
    gather fails on sizes, which only the live probe sees)."""
    result = npd004(cli, release(version), deployment(tmp_path, "qwen3-30b-a3b", "zigzag"))
    if version in ZIGZAG["present"] and version not in ZIGZAG["static_misses"]:
        assert result["status"] == "fail", result["summary"]
        assert ZIGZAG["evidence"][version].split()[0] in locations(result), locations(result)
    else:
        assert result["status"] == "pass", result["summary"]
    assert "(MHA/GQA with FIA, zigzag strategy)" in result["summary"]
    assert any("checked against it" in a for a in result["assumptions"]), result["assumptions"]


@pytest.mark.parametrize(
    ("model", "family", "version", "legacy"),
    [
        pytest.param("deepseek-v3", "MLA", "0.5.12", True, marks=pytest.mark.slow),
        ("deepseek-v3", "MLA", "0.5.23", False),
        pytest.param("deepseek-v3.2", "MLA with the DSA/NSA indexer", "0.5.12", True, marks=pytest.mark.slow),
        ("deepseek-v3.2", "MLA with the DSA/NSA indexer", "0.5.17", True),
    ],
)
def test_mla_families_walk_their_own_readers(cli, release, tmp_path, model, family, version, legacy):
    """MLA deployments are judged on their own CP readers (no longer skipped), and never on the FIA
    CP attention, which the backend calls under `not self.use_mla`."""
    result = npd004(cli, release(version), deployment(tmp_path, model, "zigzag", legacy=legacy))
    assert result["status"] == "pass", result["summary"]
    assert f"({family}, zigzag strategy)" in result["summary"]
    assert "do_cp_attn_fia" not in json.dumps(result["evidence"])


# ----- coverage witnesses: one broken reader at a time ----------------------------------------
def test_a_broken_npu_indexer_read_fails_the_indexer_family_only(cli, release, overlay, tmp_path):
    """0.5.17's NPU indexer reads the CP metadata in its own CP branch: misname one read; the
    DeepSeek-V3.2 deployment fails at that line, Qwen3 (no indexer) does not run it."""
    tree = overlay(release("0.5.17"))
    indexer = tree / "sglang/srt/layers/attention/dsa/dsa_npu_indexer.py"
    replace_text(
        indexer, "attn_cp_metadata.actual_seq_q_prev_tensor,", "attn_cp_metadata.actual_seq_q_prev_tensr,"
    )
    line = next(
        n for n, t in enumerate(indexer.read_text().splitlines(), 1) if "actual_seq_q_prev_tensr" in t
    )

    v32 = npd004(cli, tree, deployment(tmp_path, "deepseek-v3.2", None, legacy=True))
    assert v32["status"] == "fail", v32["summary"]
    assert f"layers/attention/dsa/dsa_npu_indexer.py:{line}" in locations(v32)
    assert "actual_seq_q_prev_tensor" in json.dumps(v32["evidence"])  # the field it does define

    qwen3 = npd004(cli, tree, deployment(tmp_path, "qwen3-30b-a3b", None, legacy=True))
    assert qwen3["status"] == "pass", qwen3["summary"]


def test_a_broken_kv_all_gather_read_fails(cli, release, overlay, tmp_path):
    """0.5.15's KV all-gather (cp_utils.cp_all_gather_rerange_kv_cache, called from the NPU
    _cp_allgather_and_save_kv_npu before the FIA attention) is on the MHA path too."""
    tree = overlay(release("0.5.15"))
    cp_utils = tree / "sglang/srt/layers/utils/cp_utils.py"
    source = cp_utils.read_text()
    start = source.index("def cp_all_gather_rerange_kv_cache(")
    body = source[start:].split("\ndef ", 1)[0]
    replace_text(
        cp_utils, body, body.replace("attn_cp_metadata.reverse_split_len", "attn_cp_metadata.reverse_split")
    )
    line = next(
        n
        for n, t in enumerate(cp_utils.read_text().splitlines(), 1)
        if "attn_cp_metadata.reverse_split," in t
    )

    result = npd004(cli, tree, deployment(tmp_path, "qwen3-30b-a3b", "zigzag"))
    assert result["status"] == "fail", result["summary"]
    assert f"layers/utils/cp_utils.py:{line}" in locations(result)
    assert "on the CP path of AscendAttnBackend.forward_extend" in json.dumps(result["evidence"])


# ----- live: sglang's own code raises on the interleave path --------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "raised"),
    [
        ("0.5.15", "NotImplementedError: Interleave hidden-state sharding"),
        ("0.5.23", "NotImplementedError: interleave strategy does not support dense K/V materialization"),
    ],
)
def test_interleave_fails_live(cli, release, tmp_path, version, raised):
    result = npd004(cli, release(version), deployment(tmp_path, "qwen3-30b-a3b", "interleave"), depth="live")
    assert result["status"] == "fail" and result["depth"] == "live", result["summary"]
    assert raised in result["summary"]
    where = INTERLEAVE["evidence"][version].split("live: ", 1)[1]
    assert any(loc in where for loc in locations(result)), (where, locations(result))


# ----- live on the releases whose CP settings live in the parallel namespace (0.5.20-0.5.22) -----
NAMESPACED = ("0.5.20", "0.5.21", "0.5.22")
# zigzag with the new flags on every release that has them; interleave where its metadata gap is
# what live reaches (0.5.15's and 0.5.23's own failures are test_interleave_fails_live's)
# 0.5.19 is left out: publishing its dataclass ServerArgs runs sglang's resolution pipeline
# (runtime_context.publish -> ServerArgs.resolve_once), which asks the accelerator and reads the
# model's files; live cannot tell there (a known gap of the probe, not a verdict).
LIVE_STRATEGIES = [(v, "zigzag") for v in INTERLEAVE["present"] if v != "0.5.19"] + [
    (v, "interleave") for v in NAMESPACED
]


@pytest.mark.parametrize(
    ("version", "strategy"),
    [
        pytest.param(v, s, marks=() if (v, s) == ("0.5.20", "zigzag") else pytest.mark.slow)
        for v, s in LIVE_STRATEGIES
    ],
)
def test_live_runs_the_cp_strategy_the_deployment_selects(cli, release, tmp_path, version, strategy):
    """0.5.20's get_cp_strategy reads enable_prefill_cp/cp_strategy from the published `parallel`
    bag, which its scoped override cannot set: the live probe publishes them (liveprocess
    published_parallel_leaves), so sglang builds the strategy and the CP prefill layer really runs
    (not 'cannot tell'): it passes where the truths say absent, and fails where present at the
    truth's file:line (the live one where the truth names it: on 0.5.20-0.5.22 the K/V all-gather
    stub raises before the attention reads the metadata)."""
    result = npd004(cli, release(version), deployment(tmp_path, "qwen3-30b-a3b", strategy), depth="live")
    assert result["depth"] == "live", result["summary"]
    truth = STRATEGIES[strategy]
    if version in truth["present"]:
        where = truth["evidence"][version]
        where = where.split("live: ", 1)[1] if "live: " in where else where
        assert result["status"] == "fail", result["summary"]
        head = " ".join(where.split()[:4])  # the file:line the truth names first
        assert any(re.search(rf"{re.escape(loc)}\b", head) for loc in locations(result)), (
            where,
            locations(result),
        )
        if "live: " in truth["evidence"][version]:
            assert where.split()[0] in result["summary"], (where, result["summary"])
    else:
        assert result["status"] == "pass", result["summary"]
        assert "every output row of every rank matches" in json.dumps(result["evidence"])


# ----- DeepSeek-V3.2 with interleave: the NPU indexer's DSA CP branch (0.5.17-0.5.19, 0.5.21, 0.5.22) -----
DSA_INTERLEAVE = STRATEGIES["interleave_dsa_indexer"]


@pytest.mark.slow
@pytest.mark.parametrize("version", DSA_INTERLEAVE["present"])
def test_dsa_indexer_with_interleave_fails_at_the_truths_file_line(cli, release, tmp_path, version):
    """Interleave is V3.2's CP-v2 strategy (0.5.17-0.5.19 switch CP-v2 on for it; 0.5.21+ reject
    zigzag), and on NPU the indexer's DSA CP branch (is_dsa_enable_prefill_cp true there; 0.5.20
    returns False on NPU) reads actual_seq_q_*_tensor, which the interleave metadata the model
    runner's prepare_cp_forward builds does not define (known.yaml: the path, file:line)."""
    result = npd004(cli, release(version), deployment(tmp_path, "deepseek-v3.2", "interleave"))
    assert result["status"] == "fail", result["summary"]
    assert "(MLA with the DSA/NSA indexer, interleave strategy)" in result["summary"]
    first = DSA_INTERLEAVE["evidence"][version].split()[0]
    assert first in locations(result), (first, locations(result))
    assert "actual_seq_q_prev_tensor" in result["summary"]
