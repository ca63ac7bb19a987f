"""NPD005 over every call the offload path makes (the property, not the diff of sglang#24026): not only the two copy
methods, but every call the scheduler's offload functions and the allocator -> pool -> sub-pool
chain make on the way (``get_kvcache()``, flags read on the pool, the NPU pools' helpers, the
composite pools' sub-pool and mamba-pool calls), each bound to what the class the deployment
builds resolves it to.

On the real releases the widened property finds no sibling beyond the known one (the copy
methods of 0.5.13/0.5.14, judged as before): every other call binds on every release and every
deployment (GQA, MLA, MLA + indexer, SWA, hybrid mamba). Overlays of 0.5.23 that break one call
of the chain in a way no release did show the property decides, at both depths, with the
caller's and the callee's file:line; the fix refuses code it was not written for.
"""

from __future__ import annotations

import json

import pytest

from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import RELEASES, truth_present

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA
DEEPSEEK_V32 = EXAMPLES / "deepseek-v3.2-pd.yaml"  # MLA + indexer
QWEN_PD = EXAMPLES / "qwen3-moe-pd-fia.yaml"  # GQA
LLAMA4_SWA = EXAMPLES / "llama4-scout-swa-pd.yaml"  # SWAKVPool over the NPU MHA pool
QWEN_NEXT = EXAMPLES / "qwen3-next-decode.yaml"  # HybridLinearKVPool over the NPU MHA pool + MambaPool
DEPLOYMENTS = {
    "mla": DEEPSEEK_PD,
    "mla+indexer": DEEPSEEK_V32,
    "gqa": QWEN_PD,
    "swa": LLAMA4_SWA,
    "hybrid": QWEN_NEXT,
}
FAMILY = {"mla": "mla", "mla+indexer": "mla", "gqa": "mha", "swa": "mha", "hybrid": "mha"}
# (families, sliding, hybrid) of each deployment's path, as NPD005 derives it from the model
SCOPE = {
    "mla": (["mla"], False, False),
    "mla+indexer": (["mla"], False, False),
    "gqa": (["mha"], False, False),
    "swa": (["mha"], True, False),
    "hybrid": (["mha"], False, True),
}
NPU_POOL_FILE = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
MEMORY_POOL = "sglang/srt/mem_cache/memory_pool.py"
SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
CHAIN = "call(s) from "
COPY_METHODS = ("get_cpu_copy", "load_cpu_copy")


def npd005(cli, tree, config, depth="static") -> dict:
    args = ["--sglang-path", tree, "--config", config, "--select", "NPD005", "--depth", depth]
    return result_of(json_report(cli, *args), "NPD005")


def chain_lines(result: dict) -> list[str]:
    return [e["observed"] for e in result["evidence"] if CHAIN in e["observed"]]


# ----- real releases ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind", [k if k == "mla" else pytest.param(k, marks=pytest.mark.slow) for k in DEPLOYMENTS]
)
def test_newest_release_binds_every_call_of_the_offload_path(cli, release, kind):
    """0.5.23: the property holds for every deployment, and the evidence names the calls beyond the
    two copy methods that were bound (read from the source, so they differ per deployment)."""
    result = npd005(cli, release("0.5.23"), DEPLOYMENTS[kind])
    assert not truth_present("0.5.23", "NPD005", FAMILY[kind])
    assert result["status"] != "fail", result  # SWA: warn, SWAKVPool drops mamba_indices= (judged as before)
    lines = chain_lines(result)
    assert len(lines) == 1, result
    assert f"Req.offload_kv_cache ({SCHEDULE_BATCH}:" in lines[0]
    bound = lines[0].split(" bind: ")[1].split(", ")
    assert any(name.rpartition(".")[2] not in COPY_METHODS for name in bound), bound  # helpers too


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_every_release_and_deployment_binds_beyond_the_known_defect(release, version):
    """Every call of every deployment's offload path, on every release with truths: the only calls
    that do not bind are the copy methods the truths name (0.5.13/0.5.14), no sibling elsewhere."""
    from npudoctor.checks.npd005_offload_signatures.chain import walk
    from npudoctor.checks.npd005_offload_signatures.static import OffloadGraph
    from npudoctor.static.source import SourceTree

    graph = OffloadGraph(SourceTree(release(version) / "sglang"))
    for kind, (families, sliding, hybrid) in SCOPE.items():
        chain = walk(graph, graph.path(families, sliding, hybrid), hybrid)
        failing = chain.failing()
        for edge in failing:
            assert edge.method in COPY_METHODS, (kind, edge.where, edge.errors)
        assert bool(failing) == truth_present(version, "NPD005", FAMILY[kind]) or kind in ("swa", "hybrid"), (
            kind,
            [(e.where, e.errors) for e in failing],
        )


# ----- general, not tuned: chains broken in ways no release had --------------------------------------
def narrowed_helper(overlay, release):
    """0.5.23 whose NPU MLA pool's ``_copy_indices_for_buffer`` lost its second parameter, which its
    copy helpers (``_chunk_copy_npu_to_cpu``, ``load_cpu_copy``) still pass: no copy-method
    signature changed, the first retraction would still raise."""
    tree = overlay(release("0.5.23"))
    replace_text(
        tree / NPU_POOL_FILE,
        "    def _copy_indices_for_buffer(self, indices, uses_global_slots):",
        "    def _copy_indices_for_buffer(self, indices):\n        uses_global_slots = True",
    )
    return tree


def test_a_helper_the_npu_pool_narrowed_fails_static_with_caller_and_callee(cli, release, overlay):
    tree = narrowed_helper(overlay, release)
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "fail", result
    assert "TypeError (_copy_indices_for_buffer)" in result["summary"]
    found = [e for e in result["evidence"] if "_copy_indices_for_buffer()" in e["observed"]]
    assert len(found) == 2, result  # the get (via _chunk_copy_npu_to_cpu) and the load side
    for evidence in found:
        assert evidence["location"]["path"] == NPU_POOL_FILE
        assert evidence["location"]["symbol"] == "NPUMLATokenToKVPool._copy_indices_for_buffer"
        assert f"{NPU_POOL_FILE}:" in evidence["observed"].split(" calls ")[0]  # the caller's line
        assert "takes 1 positional argument but 2 were given" in evidence["observed"]
    # the GQA deployment builds the NPU MHA pool, whose copy never calls it
    assert npd005(cli, tree, QWEN_PD)["status"] == "pass"


@pytest.mark.slow
def test_a_helper_the_npu_pool_narrowed_fails_live(cli, release, overlay):
    tree = narrowed_helper(overlay, release)
    result = npd005(cli, tree, DEEPSEEK_PD, depth="live")
    assert result["status"] == "fail" and result["depth"] == "live", result
    text = json.dumps(result["evidence"])
    # the real chain raised in sglang's own code, and the bound signature says why
    assert "raised TypeError: NPUMLATokenToKVPool._copy_indices_for_buffer() takes 2 positional" in text
    bound = [e for e in result["evidence"] if "real signature" in e["observed"]]
    assert bound and all(
        e["location"]["symbol"] == "NPUMLATokenToKVPool._copy_indices_for_buffer" for e in bound
    )


@pytest.mark.slow
def test_the_fix_refuses_a_chain_it_was_not_written_for(cli, release, overlay):
    tree = narrowed_helper(overlay, release)
    code, out, err = cli(
        "fix", "--sglang-path", tree, "--config", DEEPSEEK_PD, "--select", "NPD005", "--format", "json"
    )
    assert code == 1, err  # refused where NPD005 fails: the defect stays
    plan = json.loads(out)["plan"]
    assert plan[0]["action"] == "refused" and "not a shape this fix was written for" in plan[0]["reason"]


@pytest.mark.slow
def test_a_composite_passing_its_mamba_pool_a_keyword_it_lacks_fails(cli, release, overlay):
    """The hybrid pool hands the request's mamba slot to its ``MambaPool`` (not a KV pool, so no
    copy-method override of the KV hierarchy): a keyword it starts passing there must bind too."""
    tree = overlay(release("0.5.23"))
    replace_text(
        tree / MEMORY_POOL,
        "self.mamba_pool.get_cpu_copy(self._mamba_translate(mamba_indices))",
        "self.mamba_pool.get_cpu_copy(self._mamba_translate(mamba_indices), req_pool_index=req_pool_index)",
    )
    result = npd005(cli, tree, QWEN_NEXT)
    assert result["status"] == "fail", result
    assert result["summary"].startswith("MambaPool: TypeError (get_cpu_copy)"), result["summary"]
    first = result["evidence"][0]
    assert first["location"]["symbol"] == "MambaPool.get_cpu_copy"
    assert f"{MEMORY_POOL}:" in first["observed"] and "HybridLinearKVPool.get_cpu_copy" in first["observed"]
    assert "unexpected keyword argument 'req_pool_index'" in first["observed"]
    # an MLA decode server never builds the hybrid pool
    assert npd005(cli, tree, DEEPSEEK_PD)["status"] == "pass"


@pytest.mark.slow
def test_a_flag_the_scheduler_reads_on_the_pool_must_exist(cli, release, overlay):
    """``Req._mamba_pool_needing_backup`` reads ``allocator.get_kvcache().cpu_copy_carries_mamba``
    before any copy: a pool without it raises AttributeError on the first retraction."""
    tree = overlay(release("0.5.23"))
    replace_text(tree / MEMORY_POOL, "    cpu_copy_carries_mamba: bool = False\n", "")
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "fail", result
    assert "AttributeError (cpu_copy_carries_mamba)" in result["summary"]
    first = result["evidence"][0]
    assert first["location"]["path"] == SCHEDULE_BATCH
    assert "'NPUMLATokenToKVPool' object has no attribute 'cpu_copy_carries_mamba'" in first["observed"]
    # the hybrid pool sets it itself
    assert npd005(cli, tree, QWEN_NEXT)["status"] == "pass"


NPU_ALLOCATOR_FILE = "sglang/srt/hardware_backend/npu/allocator_npu.py"


def narrowed_allocator(overlay, release):
    """0.5.23 whose NPU allocator's ``free`` override requires an argument no caller passes: the
    retraction frees the request's slots (through the tree cache and the allocator's own free
    group), so the first retraction would raise after its KV was copied out."""
    tree = overlay(release("0.5.23"))
    replace_text(
        tree / NPU_ALLOCATOR_FILE,
        "    def free(self, free_index: torch.Tensor):",
        "    def free(self, free_index: torch.Tensor, stream):",
    )
    return tree


def test_an_npu_allocator_override_its_callers_do_not_bind_fails_static(cli, release, overlay):
    tree = narrowed_allocator(overlay, release)
    result = npd005(cli, tree, QWEN_PD)
    assert result["status"] == "fail", result
    assert result["summary"].startswith("NPUPagedTokenToKVPoolAllocator: TypeError (free)"), result["summary"]
    found = [e for e in result["evidence"] if "missing 1 required argument: 'stream'" in e["observed"]]
    assert found, result
    assert all(e["location"]["path"] == NPU_ALLOCATOR_FILE for e in found)
    assert all(e["location"]["symbol"] == "NPUPagedTokenToKVPoolAllocator.free" for e in found)
    callers = {e["observed"].split(" (")[0] for e in found}  # each caller's file:line
    assert all(c.startswith("sglang/srt/") and c.rpartition(":")[2].isdigit() for c in callers), callers


@pytest.mark.slow
def test_an_npu_allocator_override_its_callers_do_not_bind_fails_live(cli, release, overlay):
    tree = narrowed_allocator(overlay, release)
    result = npd005(cli, tree, QWEN_PD, depth="live")
    assert result["status"] == "fail" and result["depth"] == "live", result
    bound = [e for e in result["evidence"] if "real signature" in e["observed"]]
    assert bound and all(e["location"]["symbol"] == "NPUPagedTokenToKVPoolAllocator.free" for e in bound)
    assert any("missing a required argument: 'stream'" in e["observed"] for e in bound), bound
