"""NPD005 live: the real allocator -> NPU pool offload chain of real releases, built on CPU and
called with the keywords the installed callers pass; every level's received keywords recorded.

Verdicts match the known truths for an MLA and a GQA deployment; overlays of fixed releases whose
chain refuses or drops a keyword in a way no release did show the property decides, not the diff.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import sweep
from npd005_support import NPD005_POOL_DEFS
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import (
    KIND_FAMILY,
    RELEASES,
    TRUTH,
    expected_status,
    truth_locations,
    truth_present,
    truth_verdict,
)

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA: NPUMLATokenToKVPool
QWEN_PD = EXAMPLES / "qwen3-moe-pd-fia.yaml"  # GQA with FIA: NPUMHATokenToKVPool
QWEN_NEXT = EXAMPLES / "qwen3-next-decode.yaml"  # hybrid: HybridLinearKVPool over NPUMHATokenToKVPool
DEPLOYMENTS = {"mla": DEEPSEEK_PD, "gqa": QWEN_PD}
NPU_POOL = {"mla": "NPUMLATokenToKVPool", "gqa": "NPUMHATokenToKVPool"}
NPU_POOL_FILE = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
PAGED_ALLOCATOR = "sglang/srt/mem_cache/allocator/paged.py"
LIVE = "(live, CPU)"
# "<caller> passes k=, ...; delivered at each level: <level> received k=v, ...; <level> ... (live, CPU)"
DELIVERED = re.compile(r"passes (?P<passes>.*?); delivered at each level: (?P<levels>.*) \(live, CPU\)")


def npd005(report: dict) -> dict:
    return result_of(report, "NPD005")


def live_npd005(cli, tree, config) -> dict:
    return npd005(
        json_report(cli, "--sglang-path", tree, "--config", config, "--select", "NPD005", "--depth", "live")
    )


def delivered(result: dict) -> list[tuple[list[str], list[str]]]:
    """(keywords the installed caller passes, what each level received) per exercised call."""
    found = []
    for evidence in result["evidence"]:
        match = DELIVERED.search(evidence["observed"])
        if match:
            keywords = re.findall(r"(\w+)=", match["passes"])
            found.append((keywords, match["levels"].split("; ")))
    return found


@pytest.mark.parametrize(
    ("version", "kind"),
    sweep([(v, k) for v in RELEASES for k in DEPLOYMENTS], quick=(("0.5.9", "mla"), ("0.5.13", "mla"))),
)
def test_live_verdict_matches_truth(live_report, version, kind):
    result = npd005(live_report(version, DEPLOYMENTS[kind]))
    assert result["depth"] == "live", result
    assert result["roles"] == ["decode"]
    assert result["status"] == expected_status(version, "NPD005", KIND_FAMILY[kind]), result
    if result["status"] == "pass":
        assert NPU_POOL[kind] in result["summary"]


@pytest.mark.parametrize(
    ("version", "kind"),
    sweep(
        [(v, k) for v in RELEASES for k in DEPLOYMENTS if truth_present(v, "NPD005", KIND_FAMILY[k])],
        quick=(("0.5.13", "mla"),),
    ),
)
def test_fail_evidence_names_the_type_error_keyword_and_lines(live_report, version, kind):
    """The live TypeError is raised at the allocator line the truth names, for the keyword the truth
    says the allocator passes, against the deployment's own NPU pool override."""
    result = npd005(live_report(version, DEPLOYMENTS[kind]))
    keywords = re.findall(r"(\w+)= ", TRUTH["releases"][version]["NPD005"]["evidence"])
    assert keywords, "the truth should name the keyword the callers pass"
    locations = truth_locations(version, "NPD005")
    assert NPD005_POOL_DEFS[version][kind] in " ".join(locations)
    live = [e for e in result["evidence"] if LIVE in e["observed"] and "TypeError" in e["observed"]]
    assert len(live) == 2, result  # get_cpu_copy and load_cpu_copy both refuse it
    for evidence in live:
        observed = evidence["observed"]
        assert any(f"unexpected keyword argument '{k}'" in observed for k in keywords), observed
        assert NPU_POOL[kind] in observed and NPU_POOL_FILE in observed
        assert evidence["location"]["path"] == PAGED_ALLOCATOR
    raised = [f"{e['location']['path']}:{e['location']['line']}" for e in live]
    allocator_lines = [loc for loc in locations if "allocator" in loc]
    assert any(r.endswith(line) for r in raised for line in allocator_lines), (raised, allocator_lines)
    defs = [
        f"memory_pool_npu.py:{line}"
        for e in live
        for line in re.findall(r"memory_pool_npu\.py:(\d+): def ", e["observed"])
    ]
    assert NPD005_POOL_DEFS[version][kind] in defs, defs


@pytest.mark.parametrize(
    ("version", "kind"),
    sweep(
        [(v, k) for v in RELEASES for k in DEPLOYMENTS if not truth_present(v, "NPD005", KIND_FAMILY[k])],
        quick=(("0.5.9", "mla"),),
    ),
)
def test_pass_evidence_lists_the_keywords_delivered_at_each_level(live_report, version, kind):
    result = npd005(live_report(version, DEPLOYMENTS[kind]))
    calls = delivered(result)
    assert {len(calls)} == {2}, result  # get_cpu_copy and load_cpu_copy
    for keywords, levels in calls:
        assert len(levels) >= 2, levels  # the allocator and the NPU pool below it
        assert NPU_POOL[kind] in levels[-1]
        for level in levels:
            received = re.findall(r"(\w+)=", level.split(" received ", 1)[1])
            assert received == keywords, (level, keywords)
    text = json.dumps(result["evidence"])
    if version == "0.5.23":  # the truth: callers also pass req_pool_index
        assert "req_pool_index=0" in text
    copied, raised = "every bit came back" in text, "NPD001's property" in text
    assert copied != raised, text  # the slots came back, or the copy itself raised (and says so)
    if kind == "mla":  # the truths of NPD001 are about the MLA pool
        assert raised == (truth_verdict(version, "NPD001") == "present"), text


@pytest.mark.slow
def test_no_deployment_assumes_a_decode_server_with_both_pool_families(live_report):
    result = npd005(live_report("0.5.13", None))
    assert result["depth"] == "live" and result["status"] == "fail", result
    assert result["roles"] == ["decode (assumed)"] and result["assumptions"]
    assert "NPUMLATokenToKVPool" in result["summary"] and "NPUMHATokenToKVPool" in result["summary"]


@pytest.mark.parametrize("version", sweep(["0.5.9", "0.5.13", "0.5.23"], quick=()))
def test_hybrid_pool_is_built_and_both_depths_agree(live_report, version):
    """Qwen3-Next: the allocator holds HybridLinearKVPool (its MambaPool shaped by sglang's own
    config class), which holds the NPU MHA pool. 0.5.9's hybrid pool has no offload at all, 0.5.13's
    NPU pool refuses mamba_indices= but is only called without keywords here, 0.5.23 reads its
    parallel widths from a runtime context: in each, live and static say the same."""
    result = npd005(live_report(version, QWEN_NEXT, depth="auto"))
    assert result["depth"] == "live", result
    assert "disagree" not in result["summary"] and not result["assumptions"], result
    text = json.dumps(result["evidence"])
    assert "HybridLinearKVPool.get_cpu_copy" in text
    if version == "0.5.13":
        assert result["status"] == "warn" and "not on the calls this deployment makes" in result["summary"]
    else:
        assert result["status"] == "pass", result
    if version == "0.5.23":  # the request's mamba slot went down the chain and came back
        assert "mamba_indices=tensor(" in text and "and mamba slot" in text and "every bit came back" in text


@pytest.mark.slow
# ----- general, not tuned: chains broken in ways no release had --------------------------------------
def test_pool_that_loses_req_pool_index_fails_live(cli, release, overlay):
    """0.5.23's NPU pools without ``req_pool_index`` (they keep ``mamba_indices``): the allocator passes
    it, so the first retraction would raise. No release had this signature; the callers' keywords
    decide."""
    tree = overlay(release("0.5.23"))
    replace_text(
        tree / NPU_POOL_FILE,
        "def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):",
        "def get_cpu_copy(self, indices, mamba_indices=None):",
        count=2,
    )
    result = live_npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "fail" and result["depth"] == "live", result
    live = [e for e in result["evidence"] if LIVE in e["observed"] and "TypeError" in e["observed"]]
    assert len(live) == 1, result  # load_cpu_copy still takes it
    assert "unexpected keyword argument 'req_pool_index'" in live[0]["observed"]
    assert live[0]["location"]["path"] == PAGED_ALLOCATOR
    assert "NPUMLATokenToKVPool" in result["summary"] and "req_pool_index=" in result["summary"]


@pytest.mark.slow
def test_allocator_that_swallows_a_keyword_the_pool_reads_fails_live(cli, release, overlay):
    """An allocator that takes ``**kwargs`` and forwards only ``mamba_indices``, over an NPU pool
    whose ``load_cpu_copy`` uses ``req_pool_index``: every call binds, so only the record of what
    each level received shows the pool never got it."""
    tree = overlay(release("0.5.23"))
    paged = tree / PAGED_ALLOCATOR
    replace_text(
        paged,
        """    def load_cpu_copy(
        self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None
    ):
        return self._kvcache.load_cpu_copy(
            kv_cache_cpu,
            indices,
            mamba_indices=mamba_indices,
            req_pool_index=req_pool_index,
        )""",
        """    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, **kwargs):
        return self._kvcache.load_cpu_copy(
            kv_cache_cpu, indices, mamba_indices=mamba_indices
        )""",
    )
    replace_text(
        tree / NPU_POOL_FILE,
        """        self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None
    ):
        torch.npu.synchronize()""",
        """        self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None
    ):
        self.last_loaded_req = req_pool_index
        torch.npu.synchronize()""",
        count=2,
    )
    result = live_npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "fail" and result["depth"] == "live", result
    drops = [
        e for e in result["evidence"] if LIVE in e["observed"] and "req_pool_index= dropped" in e["observed"]
    ]
    assert len(drops) == 1, result
    observed = drops[0]["observed"]
    assert "received mamba_indices=None, req_pool_index=0" in observed
    assert "NPUMLATokenToKVPool.load_cpu_copy reads req_pool_index" in observed
    assert drops[0]["location"]["path"] == PAGED_ALLOCATOR
    assert "drops req_pool_index=" in result["summary"]


@pytest.mark.slow
def test_allocator_that_swallows_mamba_indices_fails_live_on_a_hybrid_model(cli, release, overlay):
    """0.5.15's paged allocator rewritten to take ``**kwargs`` and call its pool with the indices
    only: every call binds, but HybridLinearKVPool, which reads mamba_indices to copy the mamba
    state, never gets it, and the request's mamba state does not come back."""
    tree = overlay(release("0.5.15"))
    replace_text(
        tree / PAGED_ALLOCATOR,
        """    def get_cpu_copy(self, indices, mamba_indices=None):
        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)""",
        """    def get_cpu_copy(self, indices, **kwargs):
        return self._kvcache.get_cpu_copy(indices)""",
    )
    result = live_npd005(cli, tree, QWEN_NEXT)
    assert result["status"] == "fail" and result["depth"] == "live", result
    drops = [e for e in result["evidence"] if "mamba_indices= dropped" in e["observed"]]
    assert len(drops) == 1, result
    assert "HybridLinearKVPool.get_cpu_copy reads mamba_indices" in drops[0]["observed"]
    assert drops[0]["location"]["path"] == PAGED_ALLOCATOR
    lost = [e for e in result["evidence"] if "MambaPool.mamba_cache" in e["observed"]]
    assert lost and "other bits" in lost[0]["observed"], result


# ----- the recorder itself, on plain Python objects (no sglang) ----------------------------------------
class _Pool:
    def get_cpu_copy(self, indices, mamba_indices=None):
        return list(indices)


class _NarrowPool:
    def get_cpu_copy(self, indices):
        return list(indices)


class _Allocator:
    def __init__(self, pool):
        self._kvcache = pool

    def get_cpu_copy(self, indices, **kwargs):
        return self._kvcache.get_cpu_copy(indices, **kwargs)


def test_recording_notes_each_level_and_leaves_nothing_behind():
    from npudoctor.checks.npd005_offload_signatures import live

    allocator = _Allocator(_Pool())
    with live.recording(allocator) as calls:
        assert allocator.get_cpu_copy([3, 4], mamba_indices=None) == [3, 4]
    assert [(c.qualname, c.keywords, c.parent) for c in calls] == [
        ("_Allocator.get_cpu_copy", {"mamba_indices": None}, None),
        ("_Pool.get_cpu_copy", {"mamba_indices": None}, 0),
    ]
    assert calls[0].children == [1] and not any(c.bind_error for c in calls)
    assert "get_cpu_copy" not in vars(allocator) and "get_cpu_copy" not in vars(allocator._kvcache)


def test_recording_sees_the_call_that_does_not_bind():
    from npudoctor.checks.npd005_offload_signatures import live
    from npudoctor.live import calls as live_calls

    allocator = _Allocator(_NarrowPool())
    with live.recording(allocator) as calls, pytest.raises(TypeError) as raised:
        allocator.get_cpu_copy([3], mamba_indices=None)
    assert calls[1].bind_error and "mamba_indices" in calls[1].bind_error
    assert live_calls.binding_keyword(raised.value) == (True, "mamba_indices")
    assert not live_calls.accepts(_NarrowPool.get_cpu_copy, "mamba_indices")
    assert live_calls.accepts(_Allocator.get_cpu_copy, "mamba_indices")  # through **kwargs
    assert live_calls.reads(_Allocator.get_cpu_copy, "mamba_indices") is True  # it forwards kwargs
    assert live_calls.reads(_Pool.get_cpu_copy, "mamba_indices") is False
