"""NPD005 fix (the keywords of sglang#24026 on the NPU pools) beyond the generic fix tests.

On real releases, in a fresh interpreter per release: NPD005's live probe (the real NPU
allocator -> NPU pool chain on CPU, called with the installed callers' keywords, offloaded
slots overwritten and reloaded) fails, passes with the fix for the MLA (DeepSeek) and the GQA
(Qwen3-MoE) deployment, fails again after the revert with the original objects back. 0.5.14,
where upstream widened only the MHA pool, gets only the MLA pool replaced: Qwen3-MoE needs no
fix there and its pool is left as it is. The sites installed, the keywords the replacements
take, and the releases that need nothing are read from the code; a caller that passes a
keyword this fix was not written for is refused.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from npudoctor.deployment.load import from_yaml
from npudoctor.patching.fixbase import fix_by_id
from npudoctor.service.planning import Action, plan
from npudoctor.target.discovery import discover

from conftest import fixprobe
from support.repo import EXAMPLES
from support.trees import replace_text

DEEPSEEK = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA: NPUMLATokenToKVPool
QWEN_MOE = EXAMPLES / "qwen3-moe-pd-fia.yaml"  # GQA with FIA: NPUMHATokenToKVPool
DEEPSEEK_V32 = EXAMPLES / "deepseek-v3.2-pd.yaml"  # MLA with the indexer K buffer
POOLS = "sglang.srt.hardware_backend.npu.memory_pool_npu"
MLA = (f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy", f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy")
MHA = (f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy", f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy")
FIXED = ("0.5.9", "0.5.11", "0.5.12", "0.5.15", "0.5.23")
ROUND_TRIP = "every bit came back"  # NPD005 live: offloaded slots overwritten, reloaded, compared


@pytest.fixture(scope="module")
def probe(release):
    """``probe(version)``: NPD005's live probe for DeepSeek-V3, Qwen3-MoE and DeepSeek-V3.2
    unpatched, with the fix as ``decide`` accepts it for the first deployment that needs it, and
    after the revert; which replaced attributes changed, and what their signatures say. Results
    by config file name; one fresh interpreter per release, run once per module."""
    reports: dict[str, dict] = {}

    def run(version: str) -> dict:
        if version not in reports:
            report = fixprobe(
                release(version), "compare", "NPD005", DEEPSEEK, QWEN_MOE, DEEPSEEK_V32, options=("--revert",)
            )
            reports[version] = {
                key: {Path(c).name: r for c, r in value.items()} if key in BY_CONFIG else value
                for key, value in report.items()
            }
        return reports[version]

    return run


BY_CONFIG = ("plain", "decisions", "fixed", "reverted")


@pytest.mark.slow
def test_0513_both_pool_families_fail_pass_with_the_fix_and_fail_after_revert(probe):
    report = probe("0.5.13")
    for name in (DEEPSEEK.name, QWEN_MOE.name, DEEPSEEK_V32.name):
        assert report["decisions"][name]["action"] == "apply", report["decisions"][name]
        assert report["plain"][name]["status"] == "fail", report["plain"][name]
        assert "TypeError (mamba_indices=)" in report["plain"][name]["summary"]
        fixed = report["fixed"][name]
        assert fixed["status"] == "pass", fixed
        assert any(ROUND_TRIP in observed for observed in fixed["observed"]), fixed  # data came back
        assert report["reverted"][name]["status"] == "fail", report["reverted"][name]
    assert report["outcome"] == "applied" and report["restored"]
    assert report["patched"] == sorted(MLA + MHA)  # both pools refuse the keyword in 0.5.13
    assert "NPUMLATokenToKVPool" in report["fixed"][DEEPSEEK.name]["summary"]
    assert "NPUMHATokenToKVPool" in report["fixed"][QWEN_MOE.name]["summary"]
    # DeepSeek-V3.2's pool also holds the indexer K: K, V and indexer K came back through the fix
    assert any(
        "of 3 buffer(s)" in o and ROUND_TRIP in o for o in report["fixed"][DEEPSEEK_V32.name]["observed"]
    )


@pytest.mark.slow
def test_0514_only_the_mla_pool_is_replaced(probe):
    """Upstream widened the MHA pool in 0.5.14 and the MLA pool in 0.5.15: DeepSeek fails and is
    cured, Qwen3-MoE needs nothing and its pool methods stay the original objects."""
    report = probe("0.5.14")
    deepseek, qwen = report["decisions"][DEEPSEEK.name], report["decisions"][QWEN_MOE.name]
    assert deepseek["action"] == "apply" and deepseek["installs"] == list(MLA), deepseek
    assert "replaces only NPUMLATokenToKVPool.get_cpu_copy" in deepseek["reason"]
    assert qwen["action"] == "not needed" and "NPD005 pass" in qwen["reason"], qwen
    assert report["plain"][DEEPSEEK.name]["status"] == "fail"
    assert report["plain"][QWEN_MOE.name]["status"] == "pass"
    assert report["patched"] == sorted(MLA), report["patched"]
    for name in (DEEPSEEK.name, QWEN_MOE.name, DEEPSEEK_V32.name):
        fixed = report["fixed"][name]
        assert fixed["status"] == "pass", fixed
        assert any(ROUND_TRIP in observed for observed in fixed["observed"]), fixed
    assert report["reverted"][DEEPSEEK.name]["status"] == "fail" and report["restored"]
    # what introspection (and NPD005's live binding) sees: the MLA pool widened, the MHA pool as shipped
    signatures = report["signatures"]
    for site in MLA:
        assert "mamba_indices" not in signatures["before"][site]
        assert signatures["with_fix"][site].endswith("mamba_indices=None)"), signatures["with_fix"][site]
    for site in MHA:
        assert signatures["with_fix"][site] == signatures["before"][site]


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14"])
def test_replacements_take_every_keyword_the_installed_callers_pass_to_a_pool(version, release):
    """The keyword set is NPD005's own reading of the installed source (every call that can reach
    a KV pool), not a list in the fix."""
    from npudoctor.checks.npd005_offload_signatures.static import POOL, OffloadGraph

    graph = OffloadGraph(discover(release(version)).tree)
    passed = {k for site in graph.sites if site.family == POOL for k in site.shape.keywords}
    assert passed == {"mamba_indices"}, passed
    fix = fix_by_id("NPD005")
    for site, replacement in fix.implementations().items():
        visible = list(inspect.signature(replacement).parameters)[1:]  # without `original`
        assert visible[0] == "self" and passed <= set(visible), (site, visible)


@pytest.mark.parametrize("version", FIXED)
def test_releases_where_the_check_passes_need_no_fix(version, release):
    fix = fix_by_id("NPD005")
    target = discover(release(version))
    for config in (DEEPSEEK, QWEN_MOE):
        decision = _decision(fix, target, config)
        assert decision.action is Action.NOT_NEEDED and "NPD005 pass" in decision.reason, (config, decision)
    assert fix.installs_in_source(target.tree) == ()  # nothing there refuses the allocator's call


def test_record_lists_the_sites_installed_on_0514(release):
    from npudoctor.service.planning import Planned, record_document

    fix = fix_by_id("NPD005")
    target = discover(release("0.5.14"))
    decision = _decision(fix, target, DEEPSEEK)
    (entry,) = record_document([Planned(fix, decision)], target)["fixes"].values()
    assert entry["replaces"] == list(MLA) and entry["release"] == "0.5.14" and entry["safety"] == "safe"


def test_a_caller_passing_a_keyword_it_was_not_written_for_is_refused(cli, release, overlay):
    """sglang later passes req_pool_index= as well: code with such a caller is another shape, and
    the replacements (explicit mamba_indices= only) must not be installed there."""
    tree = overlay(release("0.5.13"))
    paged = tree / "sglang/srt/mem_cache/allocator/paged.py"
    replace_text(
        paged,
        "    def get_cpu_copy(self, indices, mamba_indices=None):\n"
        "        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)",
        "    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):\n"
        "        return self._kvcache.get_cpu_copy(\n"
        "            indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index\n"
        "        )",
    )
    code, out, err = cli(
        "fix", "--format", "json", "--select", "NPD005", "--sglang-path", tree, "--config", DEEPSEEK
    )
    assert code == 1, err  # a fix refused where its check fails leaves the defect: exit 1
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "refused", entry
    assert "not a shape this fix was written for" in entry["reason"]
    assert "NPUPagedTokenToKVPoolAllocator.get_cpu_copy" in entry["reason"]
    assert (
        "NPUMLATokenToKVPool" not in entry["reason"]
    )  # the pools are as written for: only the caller differs


def test_installs_follows_the_code_not_the_release_name(release, overlay):
    """0.5.13 with the MHA pool's two methods widened as 0.5.14 did: the MLA pool alone is installed."""
    tree = overlay(release("0.5.13"))
    pool = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    text = pool.read_text()
    mha_end = text.index("class NPUMLATokenToKVPool")
    widened = (
        text[:mha_end]
        .replace("def get_cpu_copy(self, indices):", "def get_cpu_copy(self, indices, mamba_indices=None):")
        .replace(
            "def load_cpu_copy(self, kv_cache_cpu, indices):",
            "def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None):",
        )
    )
    pool.unlink()  # hard-linked to the cached release
    pool.write_text(widened + text[mha_end:])
    fix = fix_by_id("NPD005")
    assert fix.installs_in_source(discover(tree).tree) == MLA
    assert fix.installs_in_source(discover(release("0.5.13")).tree) == MLA + MHA


def _decision(fix, target, config: Path):
    """``npudoctor fix --depth static``'s decision for ``config`` (the cases here: both depths agree)."""
    [planned] = plan([fix], target, from_yaml(config).facts, False, depth="static")
    return planned.decision
