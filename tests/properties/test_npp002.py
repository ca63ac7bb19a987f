"""NPP002 on real releases: the known CUDA-only imports on Ascend are found at the file:line a person read
in the wheel (tests/data/properties/NPP002.yaml), their fixed releases pass, and refactors that keep an
import off NPU (a guard in a helper, ``try/except ImportError``, ``if not _is_npu:``) stay silent.

The import closure and the function scan are tested on the model's module and on the function, cheaply;
the deployment-level tests (a tiny config.json naming the architecture) run the whole check and are slow.
Instances: BailingMoeV2_5/V3 import vllm at module level (unreported), GLM-4.7-Flash imports sgl_kernel
(Ascend/sglang#324), the DSA indexer's CuTeDSL import reaches cutlass (sglang#25220, guarded for ROCm only
by #30374), and the rotary embedding imports vllm for Qwen3-VL's vision head size (sglang#17453, #17478).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from npudoctor.checks.npp002_cuda_only_code.dispatch import cuda_reaches
from npudoctor.checks.npp002_cuda_only_code.imports import import_failures
from npudoctor.static.source import FunctionRef, SourceTree
from npudoctor.static.walker import Frame

from support.reports import json_report, result_of
from support.trees import replace_text

TRUTH = yaml.safe_load((Path(__file__).parents[1] / "data" / "properties" / "NPP002.yaml").read_text())
KNOWN = {k["name"]: k for k in TRUTH["known"]}
ROPE = TRUTH["function_level"][0]
SITES = [(k["name"], version) for k in TRUTH["known"] for version in k["sites"]]
FIXED = [(k["name"], version) for k in TRUTH["known"] for version in k["fixed"]]


_TREES: dict[Path, SourceTree] = {}


@pytest.fixture(scope="module", autouse=True)
def _release_trees():
    """Free the parsed trees when the module is done (their ASTs are cyclic: freed now, not at exit)."""
    yield
    for tree in _TREES.values():
        tree.release()
    _TREES.clear()


def source_tree(root: Path) -> SourceTree:
    """One tree per release for the whole file: what it parses is shared by the tests on it."""
    if root not in _TREES:
        _TREES[root] = SourceTree(root / "sglang")
    return _TREES[root]


def closure_sites(root: Path, module: str) -> set[str]:
    """file:line of every module-level import of an absent package that importing ``module`` runs on NPU."""
    tree = source_tree(root)
    start = tree.module_path(module)
    if start is None:
        return set()
    return {f"{tree.relpath(f.site.path)}:{f.site.line}" for f in import_failures(tree, [start])}


@pytest.mark.parametrize(("name", "version"), SITES)
def test_known_import_found_at_its_line(release, name, version):
    known = KNOWN[name]
    assert known["sites"][version] in closure_sites(release(version), known["root"])


@pytest.mark.parametrize(("name", "version"), FIXED)
def test_fixed_release_has_no_import_there(release, name, version):
    known = KNOWN[name]
    failing_file = next(iter(known["sites"].values())).rpartition(":")[0]
    found = closure_sites(release(version), known["root"])
    assert not {s for s in found if s.startswith(failing_file + ":")}, found


def test_chain_names_the_path_from_the_model(release):
    """The DSA instance is two imports away from the model: the chain says how it is reached."""
    known = KNOWN["dsa-indexer-cutlass"]
    version = next(iter(known["sites"]))
    tree = source_tree(release(version))
    failures = import_failures(tree, [tree.module_path(known["root"])])
    failure = next(
        f for f in failures if f"{tree.relpath(f.site.path)}:{f.site.line}" == known["sites"][version]
    )
    chain = [tree.relpath(s.path) for s in failure.chain]
    assert chain[0] == "sglang/srt/models/deepseek_v2.py"
    assert "sglang/srt/layers/attention/dsa/dsa_indexer.py" in chain
    assert failure.package == "cutlass"


BAILING = "sglang/srt/models/bailing_moe_linear.py"
VLLM_IMPORT = "else:\n    from vllm._custom_ops import awq_dequantize\n"
# the same module-level import of 0.5.22, kept off NPU in three shapes that do not change what CUDA runs
MODULE_GUARDS = {
    "try": "else:\n    try:\n        from vllm._custom_ops import awq_dequantize\n    except ImportError:\n        pass\n",
    "not-npu": "elif not _is_npu:\n    from vllm._custom_ops import awq_dequantize\n",
    "helper": "elif _wants_vllm_kernels():\n    from vllm._custom_ops import awq_dequantize\n",
}
HELPER = "\n\ndef _wants_vllm_kernels():\n    return not _is_npu\n\n\n"


def test_overlay_module_guards_keep_it_silent(release, overlay):
    """One overlay of 0.5.22 holding the unchanged module (the control) and a copy per guard shape."""
    root = overlay(release(KNOWN["bailing-moe-linear-vllm"]["releases"].partition("..")[2]))
    original = (root / BAILING).read_text()
    assert VLLM_IMPORT in original
    for name, guard in MODULE_GUARDS.items():
        text = original.replace(VLLM_IMPORT, guard)
        if name == "helper":
            text = text.replace("\n_is_npu = is_npu()\n", "\n_is_npu = is_npu()" + HELPER, 1)
        (root / BAILING.replace(".py", f"_{name.replace('-', '_')}.py")).write_text(text)
    tree = source_tree(root)
    for name in ("", *MODULE_GUARDS):
        module = "sglang.srt.models.bailing_moe_linear" + (f"_{name.replace('-', '_')}" if name else "")
        failures = import_failures(tree, [tree.module_path(module)])
        own = [f for f in failures if f.site.path == tree.module_path(module)]
        assert bool(own) == (not name), (name, [(f.site.line, f.site.text) for f in own])


POST_LOAD = "                else:\n                    from vllm._custom_ops import awq_dequantize\n"
FUNCTION_GUARDS = {
    "try": "                else:\n                    try:\n                        from vllm._custom_ops import "
    "awq_dequantize\n                    except ImportError:\n                        awq_dequantize = None\n",
    "not-npu": "                elif not _is_npu:\n                    from vllm._custom_ops import awq_dequantize\n",
}


@pytest.mark.parametrize("guard", ["", *FUNCTION_GUARDS])
def test_overlay_function_guards_keep_it_silent(release, overlay, guard):
    """0.5.23 moved the import into post_load_weights (AWQ checkpoints only: a condition the source cannot
    settle); kept off NPU there as well, the function scan is silent."""
    root = overlay(release("0.5.23"))
    if guard:
        replace_text(root / BAILING, POST_LOAD, FUNCTION_GUARDS[guard])
    tree = source_tree(root)
    cls = next(
        c
        for c in tree.classes_in(tree.module_path("sglang.srt.models.bailing_moe_linear"))
        if "post_load_weights" in c.methods
    )
    frame = Frame(FunctionRef.method(cls, cls.methods["post_load_weights"]), cls)
    reaches = [r for r in cuda_reaches(tree, [frame]) if r.kind == "import" and r.package == "vllm"]
    if guard:
        assert not reaches
    else:
        assert reaches and all(r.conditions for r in reaches)  # a warn: only for AWQ weights


def test_glm4_overlay_guard_in_helper_is_silent(release, overlay):
    """0.5.10's unguarded sgl_kernel import, guarded the way 0.5.11 does it but through a module helper."""
    tree = overlay(release("0.5.10"))
    path = tree / "sglang/srt/models/glm4_moe_lite.py"
    replace_text(
        path,
        "from sgl_kernel import dsv3_router_gemm\n",
        "from sglang.srt.utils import is_cuda as _probe\n\n\ndef _cuda():\n    return _probe()\n\n\n"
        "if _cuda():\n    from sgl_kernel import dsv3_router_gemm\n",
    )
    assert not {
        s for s in closure_sites(tree, KNOWN["glm4-moe-lite-sgl-kernel"]["root"]) if "glm4_moe_lite" in s
    }


def rope_frame(root: Path) -> Frame:
    tree = source_tree(root)
    cls = next(c for c in tree.classes_in(tree.module_path(ROPE["module"])) if c.name == ROPE["class"])
    return Frame(FunctionRef.method(cls, cls.methods[ROPE["method"]]), cls)


@pytest.mark.parametrize("version", list(ROPE["sites"]))
def test_rope_imports_vllm_for_the_vision_head_size(release, version):
    frame = rope_frame(release(version))
    reaches = cuda_reaches(frame.function.tree, [frame], frozenset(ROPE["head_sizes"]["bites"]))
    sites = {f"{r.function.relpath}:{r.line}": r for r in reaches if r.kind == "import"}
    assert ROPE["sites"][version] in sites
    assert not sites[ROPE["sites"][version]].conditions  # definite for this deployment: a fail


@pytest.mark.parametrize("version", list(ROPE["sites"]))
def test_rope_import_depends_on_the_head_size(release, version):
    frame = rope_frame(release(version))
    untouched = cuda_reaches(frame.function.tree, [frame], frozenset(ROPE["head_sizes"]["untouched"]))
    assert not [r for r in untouched if r.kind == "import"]
    unknown = [r for r in cuda_reaches(frame.function.tree, [frame]) if r.kind == "import"]  # no model given
    assert unknown and all("head_size" in " ".join(r.conditions) for r in unknown)  # a warn, naming it


@pytest.mark.parametrize("version", ROPE["fixed"])
def test_rope_fixed_release(release, version):
    frame = rope_frame(release(version))
    reaches = cuda_reaches(frame.function.tree, [frame], frozenset(ROPE["head_sizes"]["bites"]))
    assert not [r for r in reaches if r.kind == "import"]


# ----- the whole check, for a deployment of the architecture (slow: builds the NPU path) --------------------
def deployment(tmp_path: Path, architecture: str, **extra) -> Path:
    config = {
        "architectures": [architecture],
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "hidden_size": 2048,
        "head_dim": 128,
        **extra,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = tmp_path / "deploy.yaml"
    spec.write_text("model: {config: config.json}\nroles:\n  server: {server_args: {tp_size: 1}}\n")
    return spec


def npp002(cli, root: Path, spec: Path) -> dict:
    report = json_report(cli, "--sglang-path", str(root), "--select", "NPP002", "--config", str(spec))
    return result_of(report, "NPP002")


def locations(result: dict) -> set[str]:
    return {
        f"{e['location']['path']}:{e['location']['line']}" for e in result["evidence"] if e.get("location")
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bailing-moe-linear-vllm", "glm4-moe-lite-sgl-kernel"])
def test_deployment_fails_at_the_import(cli, release, tmp_path, name):
    known = KNOWN[name]
    version = next(iter(known["sites"]))
    extra = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192} if "glm4" in name else {}
    result = npp002(cli, release(version), deployment(tmp_path, known["architecture"], **extra))
    assert result["status"] == "fail", result
    assert known["sites"][version] in locations(result)


@pytest.mark.slow
def test_qwen3_vl_deployment_fails_in_the_rope(cli, release, tmp_path):
    version = next(iter(ROPE["sites"]))
    spec = deployment(
        tmp_path, ROPE["architecture"], vision_config={"hidden_size": 1152, "num_heads": 16, "depth": 27}
    )
    result = npp002(cli, release(version), spec)
    assert result["status"] == "fail", result
    assert ROPE["sites"][version] in locations(result)


@pytest.mark.slow
def test_fixed_release_deployment_passes(cli, release, tmp_path):
    known = KNOWN["glm4-moe-lite-sgl-kernel"]
    extra = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192}
    result = npp002(cli, release(known["fixed"][-1]), deployment(tmp_path, known["architecture"], **extra))
    assert result["status"] == "pass", result


# ----- what torch_npu's transfer_to_npu maps, and what it does not (part b, on a real function) ----------
ASCEND_BACKEND = "sglang/srt/hardware_backend/npu/attention/ascend_backend.py"
CALLS = {
    "torch.cuda.synchronize()": False,  # torch.npu.synchronize
    "torch.cuda.nvtx.range_push('x')": True,  # torch.npu has no nvtx
    "torch.distributed.init_process_group(backend='nccl')": False,  # rewritten to hccl
    "torch.distributed.new_group([0, 1], backend='nccl')": True,  # not wrapped
    "torch.zeros(4, device='cuda')": False,  # device rewritten
    "torch.cuda.is_available()": False,
}


def test_transfer_to_npu_decides_what_a_call_on_the_path_reaches(release, overlay):
    """One overlay of 0.5.23: each call on its own line at the top of AscendAttnBackend.__init__ (a
    constructor on every path, so what it reaches is a fail)."""
    root = overlay(release("0.5.23"))
    path = root / ASCEND_BACKEND
    before = SourceTree(root / "sglang")
    first = backend_init(before).node.body[0]
    before.release()
    lines = path.read_text().splitlines(keepends=True)
    for call in reversed(CALLS):
        lines.insert(first.lineno - 1, " " * first.col_offset + call + "\n")
    path.unlink()
    path.write_text("".join(lines))
    tree = source_tree(root)
    init = backend_init(tree)
    reaches = [r for r in cuda_reaches(tree, [Frame(init, init.owner)]) if r.kind not in ("call", "lazy")]
    by_line = {r.line: r for r in reaches}
    for offset, (call, found) in enumerate(CALLS.items()):
        reach = by_line.get(first.lineno + offset)
        assert (reach is not None) == found, (call, reach)
        assert reach is None or not reach.conditions


def backend_init(tree: SourceTree) -> FunctionRef:
    module = tree.module_path("sglang.srt.hardware_backend.npu.attention.ascend_backend")
    cls = next(c for c in tree.classes_in(module) if c.name == "AscendAttnBackend")
    return FunctionRef.method(cls, cls.methods["__init__"])
