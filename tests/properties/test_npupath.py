"""The walk every property shares (npudoctor/static/npupath.py) on a real function: what an Ascend
host runs of a function body, and what runs every time it runs.

0.5.23's ``DualGemm._select_mode`` (sglang/srt/layers/dual_gemm.py, built by every Qwen2 and Llama
MLP) imports a CuTeDSL kernel module that needs ``cuda.bindings``, after ``if not is_cuda(): return
None``. On NPU the import never runs: a property that walked past the early return failed every Qwen2
deployment on 0.5.23 (NPP002). Overlays of 0.5.23 change only that guard."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from npudoctor.checks.npp002_cuda_only_code.dispatch import cuda_reaches
from npudoctor.static.npupath import live_nodes, unconditional_nodes
from npudoctor.static.source import FunctionRef, SourceTree
from npudoctor.static.walker import Frame

from support.trees import replace_text

DUAL_GEMM = "sglang/srt/layers/dual_gemm.py"
GUARD = "        if not is_cuda():\n            return None\n"
KERNEL = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"
GUARDS = {
    "off NPU": GUARD,  # 0.5.23 as shipped: the host returns before the import
    "removed": "",  # the import runs every time
    "not known": "        if hidden_size > 8192:\n            return None\n",  # runs on some models only
}


def select_mode(root: Path) -> tuple[SourceTree, FunctionRef, ast.ImportFrom]:
    tree = SourceTree(root / "sglang")
    cls = next(
        c for c in tree.classes_in(tree.module_path("sglang.srt.layers.dual_gemm")) if c.name == "DualGemm"
    )
    ref = FunctionRef.method(cls, cls.methods["_select_mode"])
    kernel_import = next(
        n for n in ast.walk(ref.node) if isinstance(n, ast.ImportFrom) and n.module == KERNEL
    )
    return tree, ref, kernel_import


@pytest.mark.parametrize("guard", GUARDS)
def test_an_early_return_decides_what_runs_after_it(release, overlay, guard):
    root = overlay(release("0.5.23"))
    replace_text(root / DUAL_GEMM, GUARD, GUARDS[guard])
    tree, ref, kernel_import = select_mode(root)
    live = kernel_import in live_nodes(ref)
    always = kernel_import in unconditional_nodes(ref)
    init = FunctionRef.method(ref.owner, ref.owner.methods["__init__"])  # its caller, on the path
    frames = [Frame(init, ref.owner), Frame(ref, ref.owner)]
    lazy = [r for r in cuda_reaches(tree, frames) if r.kind == "lazy" and r.what == KERNEL]
    if guard == "off NPU":
        assert (live, always, lazy) == (False, False, [])
    elif guard == "removed":
        assert live and always
        assert lazy and not lazy[0].conditions, lazy
    else:  # reachable, but only when the test is false: never a `fail` of its own
        assert live and not always
        assert lazy and lazy[0].conditions, lazy
    tree.release()
