"""NPD005 static probe on real releases: every get_cpu_copy/load_cpu_copy call binds to the
overrides it reaches, and wrappers pass keywords on. Verdicts match the known truths for an MLA
and a GQA deployment; overlays of fixed releases show the property, not the known diff, decides."""

from __future__ import annotations

import json

import pytest

from conftest import sweep
from npd005_support import NPD005_POOL_DEFS
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import replace_text
from support.truths import KIND_FAMILY, RELEASES, truth_locations, truth_present

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA
QWEN_PD = EXAMPLES / "qwen3-moe-pd-fia.yaml"  # GQA: the NPU MHA pool
QWEN_NEXT = EXAMPLES / "qwen3-next-decode.yaml"  # hybrid linear attention: HybridLinearKVPool on top
DEPLOYMENTS = {"mla": DEEPSEEK_PD, "gqa": QWEN_PD}
NPU_POOL = {"mla": "NPUMLATokenToKVPool", "gqa": "NPUMHATokenToKVPool"}
NPU_POOL_FILE = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
PAGED_ALLOCATOR = "sglang/srt/mem_cache/allocator/paged.py"

# Siblings the property finds beyond known.yaml: CUDA-only DSA/NSA pools that lack mamba_indices=
# while the allocator passes it. Off the NPU path: reported in the evidence, never counted (so is
# the other family's NPU pool where the truth says only one family refuses the keyword).
OFF_PATH_SIBLINGS = {"0.5.12": "NSATokenToKVPool", "0.5.13": "DSATokenToKVPool"}
OFF_PATH_NOTE = "[not on this deployment's NPU path]"


def evidence_text(result: dict) -> str:
    return json.dumps(result["evidence"])


def npd005(cli, tree, config=None) -> dict:
    args = ["--sglang-path", tree, "--select", "NPD005", "--depth", "static"]
    if config is not None:
        args += ["--config", config]
    return result_of(json_report(cli, *args), "NPD005")


@pytest.mark.parametrize("kind", DEPLOYMENTS)
@pytest.mark.parametrize("version", sweep(RELEASES))
def test_verdict_matches_truth(cli, release, version, kind):
    result = npd005(cli, release(version), DEPLOYMENTS[kind])
    assert result["roles"] == ["decode"]
    if truth_present(version, "NPD005", KIND_FAMILY[kind]):
        assert result["status"] == "fail", result
        assert NPU_POOL[kind] in result["summary"]
        return
    assert result["status"] == "pass", result
    resolved = [e["observed"] for e in result["evidence"] if e["observed"].startswith(NPU_POOL[kind] + ".")]
    assert len(resolved) == 2, result  # get_cpu_copy and load_cpu_copy of the deployment's pool
    assert all("which binds all" in text for text in resolved)
    other = "gqa" if kind == "mla" else "mla"
    off_path = [
        OFF_PATH_SIBLINGS.get(version),
        truth_present(version, "NPD005", KIND_FAMILY[other]) and NPU_POOL[other],
    ]
    off_path = [name for name in off_path if name]
    if off_path:  # found, reported, not counted against this deployment
        also = result["summary"].split("also, off this deployment's NPU path:")[1]
        noted = [e["observed"] for e in result["evidence"] if e["observed"].startswith(OFF_PATH_NOTE)]
        assert noted and all(any(name in text for name in off_path) for text in noted)
        for name in off_path:
            assert name in also and any(name in text for text in noted), name


@pytest.mark.parametrize(
    ("version", "kind"),
    [(v, k) for v in RELEASES for k in DEPLOYMENTS if truth_present(v, "NPD005", KIND_FAMILY[k])],
)
def test_failure_evidence_names_the_truths_files_and_lines(cli, release, version, kind):
    result = npd005(cli, release(version), DEPLOYMENTS[kind])
    text = evidence_text(result)
    locations = truth_locations(version, "NPD005")
    assert locations, "the truth file should name locations"
    for location in locations:
        assert location in text, f"{location} missing from {text}"
    # The first piece of evidence is the deployment's own NPU pool, called from the paged allocator.
    first = result["evidence"][0]
    assert first["location"]["path"] == NPU_POOL_FILE
    assert f"{first['location']['path']}:{first['location']['line']}".endswith(
        NPD005_POOL_DEFS[version][kind]
    )
    assert f"{PAGED_ALLOCATOR}:" in first["observed"] and "mamba_indices" in first["observed"]
    assert "TypeError" in first["observed"] and "on the first retraction" in first["observed"]
    # The other family's NPU pool (where it refuses too) and the CUDA DSA pool are reported, as
    # non-deciding evidence.
    other = "gqa" if kind == "mla" else "mla"
    noted = " ".join(e["observed"] for e in result["evidence"] if e["observed"].startswith(OFF_PATH_NOTE))
    assert (NPU_POOL[other] in noted) == truth_present(version, "NPD005", KIND_FAMILY[other]), noted
    assert OFF_PATH_SIBLINGS.get(version, "") in noted
    assert NPU_POOL[other] not in result["summary"]
    assert result["remediation"]["fix_id"] == "NPD005"


def test_evidence_reads_the_callers_keywords(cli, release):
    """No keyword list in npudoctor: the keywords come from the installed scheduler."""
    old = npd005(cli, release("0.5.9"), DEEPSEEK_PD)
    assert "callers pass no keywords" in evidence_text(old)
    assert "managers/schedule_batch.py:1139" in evidence_text(old)
    new = npd005(cli, release("0.5.23"), DEEPSEEK_PD)
    assert "mamba_indices=, req_pool_index=" in evidence_text(new)
    assert "managers/schedule_batch.py:2118" in evidence_text(new)


def test_narrowing_the_fixed_npu_signature_brings_the_defect_back(cli, release, overlay):
    tree = overlay(release("0.5.15"))
    pool_file = tree / NPU_POOL_FILE
    source = pool_file.read_text()
    start = source.index("class NPUMLATokenToKVPool")
    method = source.index("    def get_cpu_copy(self, indices, mamba_indices=None):", start)
    line = source.count("\n", 0, method) + 1
    replace_text(
        pool_file,
        source[method:],
        source[method:].replace(
            "def get_cpu_copy(self, indices, mamba_indices=None):", "def get_cpu_copy(self, indices):", 1
        ),
    )
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "fail"
    first = result["evidence"][0]
    assert first["location"] == {
        "path": NPU_POOL_FILE,
        "line": line,
        "symbol": "NPUMLATokenToKVPool.get_cpu_copy",
    }
    assert "no parameter mamba_indices" in first["observed"]
    # the MHA deployment does not build the MLA pool: evidence there, not a finding
    other = npd005(cli, tree, QWEN_PD)
    assert other["status"] == "pass"
    assert f"{OFF_PATH_NOTE} NPUMLATokenToKVPool.get_cpu_copy(self, indices)" in evidence_text(other)


def test_a_new_keyword_the_npu_pool_lacks_is_caught(cli, release, overlay):
    """The allocator starts passing a keyword that no pool takes: the NPU pool on the path fails."""
    tree = overlay(release("0.5.23"))
    paged = tree / PAGED_ALLOCATOR
    replace_text(
        paged,
        "            req_pool_index=req_pool_index,\n        )",
        "            req_pool_index=req_pool_index,\n            trace_id=None,\n        )",
    )
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "fail"
    assert result["summary"].startswith("NPUMLATokenToKVPool")
    first = result["evidence"][0]
    assert first["location"]["symbol"] == "NPUMLATokenToKVPool.get_cpu_copy"
    assert "unexpected keyword argument 'trace_id'" in first["observed"]
    assert f"{PAGED_ALLOCATOR}:" in first["observed"]


def test_a_scheduler_keyword_the_allocator_lacks_is_caught(cli, release, overlay):
    tree = overlay(release("0.5.15"))
    batch = tree / "sglang/srt/managers/schedule_batch.py"
    replace_text(
        batch,
        "token_indices, mamba_indices=self.mamba_pool_idx\n",
        "token_indices, mamba_indices=self.mamba_pool_idx, req_pool_index=self.req_pool_idx\n",
    )
    result = npd005(cli, tree, QWEN_PD)
    assert result["status"] == "fail"
    first = result["evidence"][0]
    assert first["location"]["symbol"] == "PagedTokenToKVPoolAllocator.get_cpu_copy"
    assert "NPUPagedTokenToKVPoolAllocator" in first["expected"]
    assert "req_pool_index" in first["observed"] and "managers/schedule_batch.py:" in first["observed"]


@pytest.mark.parametrize(("config", "status"), [(QWEN_NEXT, "fail"), (DEEPSEEK_PD, "warn")])
def test_an_allocator_that_drops_a_keyword_is_caught(cli, release, overlay, config, status):
    """The paged allocator accepts mamba_indices= but stops passing it on. With a hybrid model the
    pool it holds (HybridLinearKVPool) reads it, so the mamba state would not be offloaded: fail.
    With DeepSeek the NPU MLA pool accepts and ignores it: a warning."""
    tree = overlay(release("0.5.15"))
    replace_text(
        tree / PAGED_ALLOCATOR,
        "return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)",
        "return self._kvcache.get_cpu_copy(indices)",
    )
    result = npd005(cli, tree, config)
    assert result["status"] == status, result
    first = result["evidence"][0]
    assert first["location"]["symbol"] == "PagedTokenToKVPoolAllocator.get_cpu_copy"
    assert "receives mamba_indices=" in first["observed"] and "never reads it" in first["observed"]
    if status == "fail":
        assert "HybridLinearKVPool.get_cpu_copy" in first["observed"]
        assert result["summary"].startswith("PagedTokenToKVPoolAllocator: drops mamba_indices=")
    else:
        assert (
            "PagedTokenToKVPoolAllocator: drops mamba_indices= (the next level ignores it today)"
            in result["summary"]
        )


def test_a_hybrid_model_reaches_the_npu_pool_through_its_composite(cli, release):
    """0.5.13 with Qwen3-Next: the allocator holds HybridLinearKVPool (which takes mamba_indices=)
    and that calls the NPU MHA pool without keywords, so the narrow NPU signature does not bite."""
    result = npd005(cli, release("0.5.13"), QWEN_NEXT)
    assert result["status"] == "warn", result
    assert result["summary"].startswith(
        "in classes this deployment builds: NPUMHATokenToKVPool: TypeError (not on the calls this deployment makes)"
    )
    assert "on this deployment's path none of these calls reaches it" in result["evidence"][0]["observed"]


def test_a_composite_passing_a_keyword_its_npu_sub_pool_lacks_fails(cli, release, overlay):
    """HybridLinearKVPool (the pool a hybrid model's allocator holds) starts passing req_pool_index=
    to its full-attention sub-pool, the NPU MHA pool, which does not take it in 0.5.15."""
    tree = overlay(release("0.5.15"))
    replace_text(
        tree / "sglang/srt/mem_cache/memory_pool.py",
        "kv_cpu = self.full_kv_pool.get_cpu_copy(indices)",
        "kv_cpu = self.full_kv_pool.get_cpu_copy(indices, req_pool_index=None)",
    )
    result = npd005(cli, tree, QWEN_NEXT)
    assert result["status"] == "fail", result
    first = result["evidence"][0]
    assert first["location"]["symbol"] == "NPUMHATokenToKVPool.get_cpu_copy"
    assert "memory_pool.py:2568 in HybridLinearKVPool.get_cpu_copy" in first["observed"]
    # a plain GQA deployment's allocator holds the NPU pool itself: the composite is not on its path
    assert npd005(cli, tree, QWEN_PD)["status"] == "warn"


@pytest.mark.parametrize(
    "delegation",
    [
        "super().get_cpu_copy(indices, mamba_indices=mamba_indices, trace_id=None)",
        "MLATokenToKVPool.get_cpu_copy(self, indices, mamba_indices=mamba_indices, trace_id=None)",
    ],
)
def test_an_npu_override_delegating_to_its_base_with_a_keyword_it_lacks_fails(
    cli, release, overlay, delegation
):
    """The NPU pool hands the copy to its generic base (super() or explicitly): that call runs on
    the path too, and binds to exactly MLATokenToKVPool.get_cpu_copy, which takes no trace_id."""
    tree = overlay(release("0.5.15"))
    pool_file = tree / NPU_POOL_FILE
    source = pool_file.read_text()
    start = source.index("class NPUMLATokenToKVPool")
    method = source.index("    def get_cpu_copy(self, indices, mamba_indices=None):", start)
    replace_text(
        pool_file,
        source[method:],
        "    def get_cpu_copy(self, indices, mamba_indices=None):\n"
        f"        return {delegation}\n\n"
        + source[method:].replace("def get_cpu_copy", "def _old_get_cpu_copy", 1),
    )
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "fail", result
    first = result["evidence"][0]
    assert first["location"]["symbol"] == "MLATokenToKVPool.get_cpu_copy"
    how = "super()" if delegation.startswith("super") else "MLATokenToKVPool"
    assert f"NPUMLATokenToKVPool via {how}" in first["expected"]
    assert "unexpected keyword argument 'trace_id'" in first["observed"]
    assert f"{NPU_POOL_FILE}:{source.count(chr(10), 0, method) + 2}" in first["observed"]


def test_a_method_that_only_raises_is_not_a_signature_defect(cli, release, overlay):
    """Pools that refuse offload (HiSparse: "does not support get_cpu_copy") raise whatever they are
    passed; a narrow signature there is not this defect (NPD001 reports missing offload support)."""
    tree = overlay(release("0.5.15"))
    pool_file = tree / NPU_POOL_FILE
    source = pool_file.read_text()
    start = source.index("class NPUMLATokenToKVPool")
    method = source.index("    def get_cpu_copy(self, indices, mamba_indices=None):", start)
    replace_text(
        pool_file,
        source[method:],
        "    def get_cpu_copy(self, indices):\n        raise NotImplementedError('no offload')\n\n"
        + source[method:].replace("def get_cpu_copy", "def _old_get_cpu_copy", 1),
    )
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "pass", result
    assert "only raises" in evidence_text(result)


def test_a_component_pool_is_judged_by_its_holder_only_while_it_stays_one(cli, release, overlay):
    """0.5.23's MiniMaxM3Nvfp4IndexKPool.get_cpu_copy(self, indices) is only ever built into
    MiniMaxSparseKVPool.index_k_pool (via index_k_pool_cls=), which calls it without keywords.
    Register it where anything could build it as the top-level pool and it is reported."""
    tree = overlay(release("0.5.23"))
    before = npd005(cli, tree, DEEPSEEK_PD)
    assert before["status"] == "pass"
    assert "MiniMaxM3Nvfp4IndexKPool" not in before["summary"] + evidence_text(before)
    pool_file = tree / "sglang/srt/mem_cache/minimax_m3_nvfp4_pool.py"
    registry = "\n\nPOOL_CLASSES = {'index_k': MiniMaxM3Nvfp4IndexKPool}\n"
    replace_text(pool_file, "class MiniMaxM3Nvfp4KVPool(", registry + "\n\nclass MiniMaxM3Nvfp4KVPool(")
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "pass", result  # a CUDA pool: reported, not counted
    assert "MiniMaxM3Nvfp4IndexKPool" in result["summary"].split("also, off this deployment's NPU path:")[1]
    noted = [e for e in result["evidence"] if e["observed"].startswith(OFF_PATH_NOTE)]
    assert noted[0]["location"]["path"].endswith("minimax_m3_nvfp4_pool.py")
    assert noted[0]["location"]["line"] == 309


def test_unrecognised_layout_warns_instead_of_passing(cli, release, overlay):
    tree = overlay(release("0.5.23"))
    (tree / NPU_POOL_FILE).unlink()
    (tree / "sglang/srt/hardware_backend/npu/allocator_npu.py").unlink()
    result = npd005(cli, tree, DEEPSEEK_PD)
    assert result["status"] == "warn"
    assert "no NPU MLA pool class found" in result["summary"]
    assert "no NPU token-to-KV allocator class found" in result["summary"]
    assert "not one npudoctor recognises" in evidence_text(result)


def test_skips_when_no_role_offloads(cli, release, tmp_path):
    config = tmp_path / "colocated.yaml"
    model = (EXAMPLES / "models/deepseek-v3/config.json").resolve()
    config.write_text(f"model: {{config: {model}}}\nroles:\n  server: {{server_args: {{tp_size: 16}}}}\n")
    result = npd005(cli, release("0.5.13"), config)
    assert result["status"] == "skip"
    assert "decode" in result["summary"]
    assert result["evidence"] == []


@pytest.mark.parametrize(("version", "status"), [("0.5.13", "fail"), ("0.5.23", "pass")])
def test_no_deployment_assumes_the_worst_and_says_so(cli, release, version, status):
    result = npd005(cli, release(version))
    assert result["status"] == status
    assert any("no deployment given" in a for a in result["assumptions"])
    assert result["roles"] == ["decode (assumed)"]
    if status == "fail":  # both attention families are assumed, so both NPU pools fail
        assert "NPUMHATokenToKVPool" in result["summary"] and "NPUMLATokenToKVPool" in result["summary"]
