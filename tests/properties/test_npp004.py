"""NPP004 (every call on the NPU path binds) on real wheels and on overlays of the newest.

The known instances come from the triage file (``tests/data/properties/NPP004.yaml``), read in the
wheels by a person:

* sglang#27802 / #29146: 0.5.13's paged allocator passes ``mamba_indices=`` to its pool on every
  retraction, and the NPU pools' overrides were written as ``get_cpu_copy(self, indices)``. NPD005
  checks that chain by name; this property must find it by the general rule, at the allocator's call,
  naming the NPU pool's definition (the lines ``tests/data/known.yaml`` has for NPD005).
* 0.5.21 .. 0.5.23: ``NPUGraphRunner.execute``'s DFlash replay branch (sglang#37565, gated by #39879)
  calls ``build_replay_fb_view`` without ``global_num_tokens_cpu``, which the CUDA runner added; only
  a deployment that speculates with DFlash takes the branch.

Most tests judge a path picked by hand in the real tree (the classes built, the entry methods), so
they cost no walk of a whole model; one slow test runs the check on an example deployment through
the real NPU path. On 0.5.23 the property must stay silent when a signature is refactored without
changing what binds (a keyword made keyword-only, ``**kwargs`` added) and fail when an NPU override
or ``forward_npu`` is narrowed below what its callers pass (the shape of sglang#27802, and of a
``forward_npu(self, x)`` whose ``forward_native(self, x, residual=None)`` callers pass
``residual=``), and when an NPU ``*_prepare_npu`` helper returns fewer values than its
``*_core_npu`` partner takes (Ascend/sglang#135: ``forward_dsa_core_npu() missing 1 required
positional argument: 'v'``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from npudoctor.checks.npp004_call_signatures.static import judge
from npudoctor.deployment.facts import ASSUMED_MLA, Facts, RoleFacts, role_facts
from npudoctor.deployment.load import from_yaml
from npudoctor.engine.check import Check
from npudoctor.engine.registry import discover as discover_checks
from npudoctor.results import Status
from npudoctor.static.npupath import RolePath
from npudoctor.static.signatures import CallShape, bind_errors
from npudoctor.static.source import SourceTree
from npudoctor.static.walker import Frame, method_on
from npudoctor.target.discovery import discover

from support.repo import REPO
from support.trees import replace_text
from support.truths import truth_locations

TRIAGE = yaml.safe_load((REPO / "tests/data/properties/NPP004.yaml").read_text())
KNOWN = {entry["name"]: entry for entry in TRIAGE["known"]}
OFFLOAD = KNOWN["npu-pool-offload-keywords"]
DFLASH = KNOWN["npu-graph-dflash-replay"]
NPU_POOLS = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
LAYERNORM = "sglang/srt/layers/layernorm.py"
MLA_NPU = "sglang/srt/hardware_backend/npu/modules/deepseek_v2_attention_mla_npu.py"


# a release's tree, indexed once for the tests that judge it (an overlay, edited between two
# judgements, is read afresh each time)
_TREES: dict[Path, SourceTree] = {}


@pytest.fixture
def release_tree(release):
    """``release_tree(version)`` -> the release's directory, its SourceTree kept for the module."""

    def tree(version: str) -> Path:
        directory = release(version)
        _TREES.setdefault(directory, SourceTree(directory / "sglang"))
        return directory

    return tree


def ends(sites: dict) -> list[str]:
    """The first and the last release a known instance ships in (the sweep covers the rest)."""
    versions = sorted(sites, key=lambda v: [int(p) for p in re.findall(r"\d+", v)])
    return sorted({versions[0], versions[-1]})


def decode_role(**server_args) -> RoleFacts:
    args = {"disaggregation_mode": "decode", "disaggregation_transfer_backend": "ascend", **server_args}
    return role_facts("decode", args, {}, ASSUMED_MLA, (), "test", ())


def judged(
    tree_dir: Path,
    classes: list[str],
    entries: list[tuple[str, str]],
    role: RoleFacts | None = None,
    callees: list[tuple[str, str]] = (),
    facts: Facts | None = None,
):
    """The probe over a path picked by hand: ``classes`` built, ``entries`` (class, method) walked
    from, ``callees`` (class, method) reached from them."""
    role = role or (facts.roles[-1] if facts else decode_role())
    tree = _TREES.get(tree_dir) or SourceTree(tree_dir / "sglang")
    built = {name: tree.find_classes(name, under="srt")[0] for name in classes}
    frames = [Frame(method_on(tree, built[c], m), built[c]) for c, m in entries]
    frames += [Frame(method_on(tree, built[c], m), built[c], depth=1) for c, m in callees]
    path = RolePath(role, role.name, roots=list(built.values()), classes=list(built.values()), frames=frames)
    return judge(tree, facts or Facts(model=ASSUMED_MLA, roles=(role,), source="test"), [path])


def locations(probe) -> list[str]:
    return [f"{e.location.path}:{e.location.line}" for e in probe.evidence if e.location]


def offload_path(tree_dir: Path):
    return judged(
        tree_dir,
        OFFLOAD["path"]["classes"],
        [(OFFLOAD["path"]["classes"][0], m) for m in OFFLOAD["path"]["entries"]],
    )


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the first occurrence of ``text`` in ``path``."""
    source = path.read_text()
    assert text in source, f"{text!r} not in {path}"
    return source[: source.index(text)].count("\n") + 1


# ----- the known instances ------------------------------------------------------------------------
@pytest.mark.parametrize("version", ends(OFFLOAD["sites"]))
def test_the_npu_pool_refuses_the_offload_keyword_its_allocator_passes(release_tree, version):
    """sglang#27802/#29146 where the wheel ships it: fail at the allocator's call, naming the NPU pool's
    override; both lines are the ones the team verified for NPD005 (tests/data/known.yaml)."""
    probe = offload_path(release_tree(version))
    assert probe.status is Status.FAIL, probe.summary
    assert OFFLOAD["sites"][version] in locations(probe)
    observed = " ".join(e.observed for e in probe.evidence)
    assert OFFLOAD["callees"][version] in observed and "mamba_indices" in observed
    truth = truth_locations(version.partition(".post")[0], "NPD005")
    assert any(OFFLOAD["sites"][version].endswith(t) for t in truth)
    assert any(OFFLOAD["callees"][version].endswith(t) for t in truth)


@pytest.mark.parametrize("version", OFFLOAD["fixed"])
def test_releases_whose_npu_pools_take_the_keywords_pass(release_tree, version):
    probe = offload_path(release_tree(version))
    assert probe.status is Status.PASS, (probe.summary, locations(probe))


@pytest.mark.slow
def test_the_deployment_path_reaches_the_offload_instance(release):
    """The whole check on an example PD deployment (the real NPU path of both roles): the decode
    role retracts, so the allocator's call is on its path."""
    version = sorted(OFFLOAD["sites"])[0]
    check = next(c for c in discover_checks("npudoctor.checks", "CHECK", Check) if c.id == "NPP004")
    target = discover(release(version) / "sglang")
    try:
        probe = check.static(target, from_yaml(REPO / "examples" / "deepseek-v3-pd.yaml").facts)
    finally:
        target.release()
    assert probe.status is Status.FAIL, probe.summary
    assert OFFLOAD["sites"][version] in locations(probe)


@pytest.mark.parametrize("version", ends(DFLASH["sites"]))
def test_the_dflash_replay_misses_an_argument_the_cuda_runner_added(release_tree, version):
    """Unreported: the NPU graph runner's DFlash branch calls build_replay_fb_view without
    global_num_tokens_cpu. A decode role speculating with DFlash fails there; one that does not
    speculate never takes the branch."""
    classes, entries = (
        DFLASH["path"]["classes"],
        [(DFLASH["path"]["classes"][0], m) for m in DFLASH["path"]["entries"]],
    )
    dflash = judged(release_tree(version), classes, entries, decode_role(speculative_algorithm="DFLASH"))
    assert dflash.status is Status.FAIL, dflash.summary
    assert DFLASH["sites"][version] in locations(dflash)
    assert DFLASH["callees"][version] in dflash.evidence[0].observed
    assert "global_num_tokens_cpu" in dflash.evidence[0].observed
    plain = judged(release_tree(version), classes, entries)
    assert plain.status is Status.PASS, (plain.summary, locations(plain))


@pytest.mark.parametrize("version", DFLASH["fixed"])
def test_the_dflash_replay_binds_before_the_cuda_runner_grew(release_tree, version):
    classes, entries = (
        DFLASH["path"]["classes"],
        [(DFLASH["path"]["classes"][0], m) for m in DFLASH["path"]["entries"]],
    )
    probe = judged(release_tree(version), classes, entries, decode_role(speculative_algorithm="DFLASH"))
    assert probe.status is Status.PASS, (probe.summary, locations(probe))


# ----- overlays of the newest release: refactors stay silent, narrowing fails -----------------------
NEWEST = "0.5.23"
VISION_BLOCK = (["Qwen2_5_VisionBlock", "RMSNorm"], [("Qwen2_5_VisionBlock", "forward")])
RMSNORM_NPU = """    def forward_npu(
        self,
        x: torch.Tensor,
        residual: Optional[torch.Tensor] = None,
        post_residual_addition: Optional[torch.Tensor] = None,
        quant_linear: Optional[nn.Module] = None,
    )"""


def test_refactors_that_keep_what_binds_stay_silent(release, overlay):
    """Keyword-only parameters of the same names, ``**kwargs`` added: every caller still binds."""
    tree = overlay(release(NEWEST))
    pools = tree / NPU_POOLS
    replace_text(
        pools,
        "def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):",
        "def get_cpu_copy(self, indices, *, mamba_indices=None, req_pool_index=None, **kwargs):",
        count=2,
    )
    replace_text(
        pools,
        "self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None\n",
        "self, kv_cache_cpu, indices, *, mamba_indices=None, req_pool_index=None\n",
        count=2,
    )
    replace_text(
        tree / LAYERNORM,
        RMSNORM_NPU,
        RMSNORM_NPU.replace("x: torch.Tensor,\n", "x: torch.Tensor,\n        *,\n").replace(
            "Optional[nn.Module] = None,\n", "Optional[nn.Module] = None,\n        **kwargs,\n"
        ),
    )
    assert offload_path(tree).status is Status.PASS
    assert judged(tree, *VISION_BLOCK).status is Status.PASS


def test_an_npu_pool_override_narrowed_below_its_callers_fails(release_tree, overlay):
    assert offload_path(release_tree(NEWEST)).status is Status.PASS
    tree = overlay(release_tree(NEWEST))
    pools = tree / NPU_POOLS
    replace_text(
        pools,
        "def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):",
        "def get_cpu_copy(self, indices):",
        count=2,
    )
    probe = offload_path(tree)
    assert probe.status is Status.FAIL, probe.summary
    allocator = tree / "sglang/srt/mem_cache/allocator/paged.py"
    call = line_of(allocator, "return self._kvcache.get_cpu_copy(")
    assert f"sglang/srt/mem_cache/allocator/paged.py:{call}" in locations(probe)
    assert "unexpected keyword argument 'mamba_indices'" in probe.evidence[0].observed


def test_a_forward_npu_narrowed_below_its_twins_fails_where_a_caller_passes_more(release_tree, overlay):
    """``RMSNorm.forward_npu(self, x)`` while ``forward_native(self, x, residual=None, ...)`` stays: the
    Qwen2.5-VL vision block passes ``residual=``, sglang's platform dispatch sends it to forward_npu."""
    assert judged(release_tree(NEWEST), *VISION_BLOCK).status is Status.PASS
    tree = overlay(release_tree(NEWEST))
    replace_text(tree / LAYERNORM, RMSNORM_NPU, "    def forward_npu(self, x: torch.Tensor)")
    probe = judged(tree, *VISION_BLOCK)
    assert probe.status is Status.FAIL, probe.summary
    vision = tree / "sglang/srt/models/qwen2_5_vl.py"
    assert (
        f"sglang/srt/models/qwen2_5_vl.py:{line_of(vision, 'self.norm2(x2d, residual=attn2d)')}"
        in locations(probe)
    )
    assert "forward_npu() got an unexpected keyword argument 'residual'" in probe.evidence[0].observed


def test_a_prepare_helper_returning_fewer_values_than_its_core_takes_fails(release_tree, overlay):
    """Ascend/sglang#135: the DSA core is called with ``*`` what its prepare helper returned, through
    the layer's intermediate state; one value fewer is a missing positional argument."""
    path = (["DeepseekV2AttentionMLA"], [("DeepseekV2AttentionMLA", "forward_core")])
    assert judged(release_tree(NEWEST), *path).status is Status.PASS
    tree = overlay(release_tree(NEWEST))
    source = (tree / MLA_NPU).read_text()
    prepare = source[source.index("def forward_dsa_prepare_npu(") : source.index("def forward_dsa_core_npu(")]
    returned = re.findall(r"\n    return \(\n((?:        .*\n)+?)    \)\n", prepare)
    assert len(returned) == 1, "one tuple returned by forward_dsa_prepare_npu"
    last = returned[0].rstrip("\n").rsplit("\n", 1)[1]
    replace_text(tree / MLA_NPU, returned[0], returned[0].replace(last + "\n", ""))
    probe = judged(tree, *path)
    assert probe.status is Status.FAIL, probe.summary
    model = tree / "sglang/srt/models/deepseek_v2.py"
    assert (
        f"sglang/srt/models/deepseek_v2.py:{line_of(model, 'return forward_dsa_core_npu(self, *inner_state)')}"
        in locations(probe)
    )
    assert "forward_dsa_core_npu() missing 1 required argument" in probe.evidence[0].observed


# ----- what the walk over-approximates, and receivers that may hold several classes -----------------
def test_a_helper_called_only_for_a_dispatch_value_npu_never_has_is_left_out(release_tree):
    """0.5.13 DeepSeek: ``forward_normal_prepare`` passes ``return_indices=`` to the indexer, whose
    forward_npu does not take it; the layer calls it only under ``attn_forward_method ==
    AttnForwardMethod.MHA``, and the Ascend handler returns the enum's NPU members (MHA_NPU, MLA_NPU,
    DSA_NPU). Walked from the layer it is left out; judged on its own it does not bind."""
    classes = ["DeepseekV2AttentionMLA", "Indexer"]
    helper = [("DeepseekV2AttentionMLA", "forward_normal_prepare")]
    walked = judged(
        release_tree("0.5.13"), classes, [("DeepseekV2AttentionMLA", "forward_prepare")], callees=helper
    )
    assert walked.status is Status.PASS, (walked.summary, locations(walked))
    assert any("AttnForwardMethod" in a for a in walked.assumptions)
    alone = judged(release_tree("0.5.13"), classes, helper)
    assert alone.status is Status.FAIL and "return_indices" in alone.evidence[0].observed


def test_a_receiver_typed_by_annotation_is_claimed_only_when_every_class_fails(release_tree):
    """0.5.13 ``HybridLinearAttnBackend.forward_decode`` calls ``self.full_attn_backend.forward_decode(q,
    k, v, layer, ...)``; the attribute is annotated ``AttentionBackend``, which the GDN backend the
    role builds also is, and GDN's forward_decode does not take that call. The full-attention
    backend does: nothing is claimed."""
    classes = ["AscendHybridLinearAttnBackend", "AscendAttnBackend", "AscendGDNAttnBackend"]
    probe = judged(release_tree("0.5.13"), classes, [("AscendHybridLinearAttnBackend", "forward_decode")])
    assert probe.status is Status.PASS, (probe.summary, locations(probe))
    tree = _TREES[release_tree("0.5.13")]
    hybrid = tree.find_classes("AscendHybridLinearAttnBackend", under="srt")[0]
    caller = method_on(tree, hybrid, "forward_decode").node
    call = next(
        n
        for n in ast.walk(caller)
        if isinstance(n, ast.Call) and ast.unparse(n.func).startswith("self.full_attn_backend.")
    )
    for name, binds in (("AscendGDNAttnBackend", False), ("AscendAttnBackend", True)):
        callee = method_on(tree, tree.find_classes(name, under="srt")[0], "forward_decode").node
        assert (not bind_errors(callee, CallShape.of(call))) == binds, name


def test_a_hybrid_model_allocator_holds_the_composite_pool(release_tree):
    """0.5.13 Qwen3-Next: the allocator's pool is the HybridLinearKVPool around the NPU MHA pool
    (which calls the NPU pool without keywords, NPD005's warn), so the allocator's call binds; the
    same path for a GQA model reaches the NPU pool and fails."""
    classes = ["NPUPagedTokenToKVPoolAllocator", "NPUMHATokenToKVPool"]
    entries = [("NPUPagedTokenToKVPoolAllocator", "get_cpu_copy")]
    hybrid = from_yaml(REPO / "examples" / "qwen3-next-decode.yaml").facts
    assert judged(release_tree("0.5.13"), classes, entries, facts=hybrid).status is Status.PASS
    gqa = from_yaml(REPO / "examples" / "qwen3-moe-pd.yaml").facts
    assert judged(release_tree("0.5.13"), classes, entries, facts=gqa).status is Status.FAIL


def test_super_with_an_explicit_class_starts_after_it(release_tree):
    """0.5.13 ``NPUMLATokenToKVPool.__init__`` calls ``super(MLATokenToKVPool, self).__init__(...)``:
    KVCache's constructor, not MLATokenToKVPool's (which requires kv_lora_rank)."""
    probe = judged(release_tree("0.5.13"), ["NPUMLATokenToKVPool"], [("NPUMLATokenToKVPool", "__init__")])
    assert probe.status is Status.PASS, (probe.summary, locations(probe))
