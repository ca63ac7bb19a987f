"""NPP003 on real releases: every Triton kernel launched on the deployment's NPU path keeps the
product of its grid dimensions within 65535 (Ascend's coreDim is 16 bits) for the most tokens one
forward of the role carries.

The known instances are upstream's: Qwen3.5's fused_qkvzba_split_reshape_cat_contiguous
(sglang#23815), Qwen3-Next's fused_qkvzba_split_reshape_cat and the GDN backend's fused_gdn_gating
(sglang#19756), and the fused gates of sglang#28293 (in no wheel: the overlay below takes the NPU
guard out). Each is judged where the NPU path enters the Triton code (the layer or backend method
the deployment builds, found by name in the release), with the deployment of the triage file
(tests/data/properties/NPP003.yaml): fail on the releases that ship it, at the file:line, naming the
kernel, the grid, the tokens and the flag value that keeps it under; pass with that flag, on the
releases that fixed it, and on overlays that rewrite the grid or the NPU rebinding in an
equivalent form. Static only: no sglang import.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from npudoctor.checks.npp003_kernel_grid_limits import CHECK
from npudoctor.checks.npp003_kernel_grid_limits.static import probe_paths
from npudoctor.checks.npp003_kernel_grid_limits.tokens import role_budget
from npudoctor.deployment.load import from_yaml
from npudoctor.results import Status
from npudoctor.static.npupath import RolePath
from npudoctor.static.source import SourceTree
from npudoctor.static.walker import Frame, method_on
from npudoctor.target.discovery import discover

from support.repo import REPO, fetch_sglang
from support.trees import replace_text

TRIAGE_FILE = REPO / "tests" / "data" / "properties" / "NPP003.yaml"
TRIAGE = yaml.safe_load(TRIAGE_FILE.read_text())
KNOWN = {entry["id"]: entry for entry in TRIAGE["known"]}
SHIPPED = [(known, version) for known, entry in KNOWN.items() for version in entry["ships"]]
FIXED = [(known, version) for known, entry in KNOWN.items() for version in entry["fixed"]]


def facts_for(known: dict, tmp_path: Path, **server_args):
    """The known instance's deployment (one colocated server), with ``server_args`` on top."""
    model = dict(known["model"])
    if "config" in model:
        model["config"] = str((TRIAGE_FILE.parent / model["config"]).resolve())
    document = {"model": model, "roles": {"server": {"server_args": {**known["server_args"], **server_args}}}}
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(document))
    return from_yaml(path).facts


_TREES: dict[str, SourceTree] = {}  # a release's parsed source, shared by the tests (never an overlay's)


def judge_entry(tree_dir: Path, known: dict, facts):
    """NPP003's probe over the function the known instance's NPU path enters, as the deployment
    builds it (``Class.method`` found by name in the release)."""
    package = Path(tree_dir) / "sglang"
    if package.resolve().is_relative_to(fetch_sglang.cache_dir().resolve()):
        tree = _TREES.setdefault(str(package), SourceTree(package))
    else:
        tree = SourceTree(package)
    class_name, method = known["enters"].split(".")
    frames = [
        Frame(found, cls)
        for cls in tree.find_classes(class_name, under="srt")
        if (found := method_on(tree, cls, method)) is not None
    ]
    assert frames, f"{known['enters']} not in {tree_dir}"
    role = facts.roles[0]
    return probe_paths(tree, facts, [RolePath(role, role.name, frames=frames)])


def flag_args(flag: str) -> dict:
    """``--chunked-prefill-size 8064`` -> {"chunked_prefill_size": 8064}."""
    name, value = flag.split()
    return {name.lstrip("-").replace("-", "_"): int(value)}


@pytest.mark.parametrize(("known", "version"), SHIPPED)
def test_known_instance_fails_at_its_line(release, tmp_path, known, version):
    entry = KNOWN[known]
    result = judge_entry(release(version), entry, facts_for(entry, tmp_path))
    assert result.status is Status.FAIL, result
    [evidence] = result.evidence
    assert str(evidence.location).startswith(entry["ships"][version] + " "), evidence.location
    observed = evidence.observed
    assert entry["kernel"] in observed
    assert f"grid {entry['grid']}: {entry['dims']}" in observed
    assert f"at {entry['tokens']} tokens" in observed
    assert entry["keeps_under"] in observed
    assert entry["keeps_under"] in result.summary


@pytest.mark.parametrize("known", KNOWN)
def test_the_flag_value_it_names_keeps_it_under(release, tmp_path, known):
    entry = KNOWN[known]
    version = next(iter(entry["ships"]))
    facts = facts_for(entry, tmp_path, **flag_args(entry["keeps_under"]))
    result = judge_entry(release(version), entry, facts)
    assert result.status is Status.PASS, result


@pytest.mark.parametrize(("known", "version"), FIXED)
def test_fixed_release_passes(release, tmp_path, known, version):
    entry = KNOWN[known]
    result = judge_entry(release(version), entry, facts_for(entry, tmp_path))
    assert result.status is Status.PASS, result


def test_equivalent_grid_keeps_the_failure(release, overlay, tmp_path):
    """0.5.10 with the grid of the Qwen3.5 split written as a ``lambda META`` over the input's rows
    and a ceil division by 1: the same kernel, the same grid, the same failure."""
    entry = KNOWN["D42"]
    tree = overlay(release("0.5.10"))
    replace_text(
        tree / "sglang/jit_kernel/triton/gdn_fused_proj.py",
        "grid = (batch * seq_len, num_heads_qk)\n    fused_qkvzba_split_reshape_cat_contiguous_kernel[grid](",
        "launch_grid = lambda META: (mixed_qkvz.shape[0], triton.cdiv(num_heads_qk, 1))\n"
        "    fused_qkvzba_split_reshape_cat_contiguous_kernel[launch_grid](",
    )
    result = judge_entry(tree, entry, facts_for(entry, tmp_path))
    assert result.status is Status.FAIL, result
    [evidence] = result.evidence
    assert str(evidence.location).startswith(entry["ships"]["0.5.10"] + " ")
    assert "(8192, 8), product 65536 at 8192 tokens" in evidence.observed


def test_0_5_23_rewritten_grid_still_passes(release, overlay, tmp_path):
    """0.5.23 routes Qwen3.5's split to sgl_kernel_npu on NPU (a module-level import under
    ``if _is_npu:``); rewriting the Triton grid changes nothing, and neither does writing the guard
    as ``if is_npu():``."""
    entry = KNOWN["D42"]
    tree = overlay(release("0.5.23"))
    kernels = tree / "sglang/kernels/ops/attention/triton_gdn_fused_proj.py"
    replace_text(
        kernels, "grid = (batch * seq_len, num_heads_qk)", "grid = (mixed_qkvz.shape[0] * 1, num_heads_qk)"
    )
    model = tree / "sglang/srt/models/qwen3_5.py"
    replace_text(
        model,
        "if _is_npu:\n    from sgl_kernel_npu.activation",
        "if is_npu():\n    from sgl_kernel_npu.activation",
    )
    result = judge_entry(tree, entry, facts_for(entry, tmp_path, chunked_prefill_size=131072))
    assert result.status is Status.PASS, result


def test_0_5_23_without_the_npu_rebinding_fails(release, overlay, tmp_path):
    """The same overlay with the NPU rebinding taken out (a regression no release has): the split
    is sglang's Triton kernel again, reached through 0.5.23's ``split_fn`` alias, and fails."""
    entry = KNOWN["D42"]
    tree = overlay(release("0.5.23"))
    model = tree / "sglang/srt/models/qwen3_5.py"
    replace_text(
        model, "    from sgl_kernel_npu.fla.utils import fused_qkvzba_split_reshape_cat_contiguous\n", ""
    )
    # 0.5.23 sizes the layer's heads by its linear-attention parallel group, which the probe does
    # not evaluate (at least 1 key head per rank): the tokens alone must overflow
    result = judge_entry(tree, entry, facts_for(entry, tmp_path, chunked_prefill_size=131072))
    assert result.status is Status.FAIL, result
    [evidence] = result.evidence
    assert re.match(
        r"sglang/srt/models/qwen3_5\.py:\d+ \(Qwen3_5GatedDeltaNet\.forward\)", str(evidence.location)
    )
    assert "fused_qkvzba_split_reshape_cat_contiguous_kernel" in evidence.observed
    assert "at 131072 tokens" in evidence.observed
    assert "--chunked-prefill-size 65408" in evidence.observed


@pytest.mark.slow
def test_fused_gate_without_its_npu_guard_fails(release, overlay, tmp_path):
    """sglang#28293's kernels shipped guarded; 0.5.23's Qwen2-MoE block with ``and not is_npu()``
    taken out of ``use_fused_gate`` launches fused_gate_sigmoid_mul_add with one program per token,
    which fails once a forward carries more than 65535 tokens (chunked prefill off)."""
    entry = {**KNOWN["D42"], "enters": "Qwen2MoeSparseMoeBlock.forward"}
    facts = facts_for(entry, tmp_path, chunked_prefill_size=-1)
    assert judge_entry(release("0.5.23"), entry, facts).status is Status.PASS
    tree = overlay(release("0.5.23"))
    replace_text(tree / "sglang/srt/models/qwen2_moe.py", "\n            and not is_npu()\n", "\n")
    result = judge_entry(tree, entry, facts)
    assert result.status is Status.FAIL, result
    assert any(
        "fused_gate_sigmoid_mul_add" in e.observed and "262144 tokens" in e.observed for e in result.evidence
    )


@pytest.mark.parametrize(
    ("version", "where"),
    [
        ("0.5.10", "sglang/srt/hardware_backend/npu/utils.py:72"),
        ("0.5.23", "sglang/srt/hardware_backend/npu/utils.py:142"),
    ],
)
def test_tokens_per_forward_from_the_release(release, tmp_path, version, where):
    """The chunk an unset --chunked-prefill-size gets is the largest NPU default the release's own
    set_default_server_args may pick (8192 on 64 GB cards); -1 lets a whole prompt (the context
    length) into one forward; DP attention divides the chunk among the ranks; a PD decode role
    runs no prefill forward."""
    tree = SourceTree(release(version) / "sglang")
    entry = KNOWN["D42"]
    server = facts_for(entry, tmp_path).roles[0]
    budget = role_budget(tree, server, facts_for(entry, tmp_path).model)
    assert (budget.prefill, budget.chunk_given) == (8192, False)
    assert any(where in note for note in budget.notes)
    unchunked = facts_for(entry, tmp_path, chunked_prefill_size=-1)
    assert role_budget(tree, unchunked.roles[0], unchunked.model).prefill == 262144
    dp = facts_for(
        entry, tmp_path, tp_size=4, dp_size=4, enable_dp_attention=True, chunked_prefill_size=16384
    )
    assert role_budget(tree, dp.roles[0], dp.model).prefill == 4096
    decode = facts_for(entry, tmp_path, disaggregation_mode="decode")
    assert role_budget(tree, decode.roles[0], decode.model).prefill is None


@pytest.mark.slow
def test_check_on_the_deployment_path(release, tmp_path):
    """End to end: the check walks the deployment's NPU path (``npupath.role_paths``) and fails the
    Qwen3.5 deployment of D42 on 0.5.10 at the same line."""
    entry = KNOWN["D42"]
    result = CHECK.static(discover(release("0.5.10") / "sglang"), facts_for(entry, tmp_path))
    assert result.status is Status.FAIL, result
    assert any(str(e.location).startswith(entry["ships"]["0.5.10"] + " ") for e in result.evidence)
