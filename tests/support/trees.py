"""Source trees the tests build from real releases: cheap overlay copies a test may edit, the
edits, and the synthetic states of ``tests/data/known.yaml`` that no wheel ships."""

from __future__ import annotations

import ast
import os
import shutil
import textwrap
from pathlib import Path

NPU_BACKEND = "sglang/srt/hardware_backend/npu/attention/ascend_backend.py"


def overlay_tree(tree: Path, destination: Path) -> Path:
    """A cheap copy of a release tree (hard links) under ``destination``, whose files a test may replace."""
    copy = destination / "tree"
    shutil.copytree(tree / "sglang", copy / "sglang", copy_function=os.link)
    return copy


def replace_text(path: Path, old: str, new: str, count: int = 1) -> None:
    """Rewrite one file of an overlay without touching the hard-linked original."""
    text = path.read_text()
    assert text.count(old) >= count, f"{old!r} not in {path}"
    path.unlink()
    path.write_text(text.replace(old, new, count))


def method_span(source: str, class_name: str, method: str) -> tuple[int, int, int]:
    """First line (decorators included), last line and indentation of ``class_name.method``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
                    start = min([item.lineno] + [d.lineno for d in item.decorator_list])
                    return start, item.end_lineno, item.col_offset
    raise AssertionError(f"{class_name}.{method} not found")


def cp_gap_tree(fetch, destination: Path) -> Path:
    """The synthetic "0.5.13+cp-gap" state of known.yaml under ``destination``: the 0.5.13 tree
    (hard-linked) with AscendAttnBackend.do_cp_attn_fia replaced by the 0.5.12 method (scalar
    fields, torch.chunk(q, 2)), spliced by ast line numbers. ``fetch`` is the ``release`` fixture."""
    old_source = (fetch("0.5.12") / NPU_BACKEND).read_text()
    start, end, _ = method_span(old_source, "AscendAttnBackend", "do_cp_attn_fia")
    old_method = textwrap.dedent("".join(old_source.splitlines(keepends=True)[start - 1 : end]))

    tree = overlay_tree(fetch("0.5.13"), destination)
    target = tree / NPU_BACKEND
    source = target.read_text()
    start, end, indent = method_span(source, "AscendAttnBackend", "do_cp_attn_fia")
    lines = source.splitlines(keepends=True)
    spliced = "".join(lines[: start - 1]) + textwrap.indent(old_method, " " * indent) + "".join(lines[end:])
    ast.parse(spliced)  # still valid Python
    target.unlink()  # hard-linked to the cached release: never write through the link
    target.write_text(spliced)
    return tree


# Source states of known.yaml's "synthetic" section that no wheel ships, and how to build them.
SYNTHETIC_BUILDERS = {"0.5.13+cp-gap": cp_gap_tree}


def drop_fia_page_factor(tree: Path) -> None:
    """Rewrite an overlay's NPU pool so its FIA branch of ``get_contiguous_buf_infos`` gives token
    item lengths again (0.5.9's formula: the NPD002 defect) on a fixed release's layout.

    NPD002's defect, here rather than beside tests/checks/npd002/ because tests/target/test_cache.py
    builds the same state (a module beside one check's tests is importable only from that folder)."""
    pool = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    source = pool.read_text()
    start = source.index("if self.use_fia:", source.index("def get_contiguous_buf_infos"))
    end = source.index("else:", start)
    replace_text(pool, source[start:end], source[start:end].replace(".nbytes * self.page_size", ".nbytes"))


def installed_beside_torch(wheel: Path, site: Path) -> Path:
    """``site``, a site-packages folder as a real environment has it: the sglang ``wheel`` installed
    by pip (``--no-deps --target``: the package and its ``.dist-info``) with torch beside it, the
    running interpreter's own (a link to its package folder). An unpacked release tree holds
    sglang alone, so a name that resolves into a dependency (``torch.cuda.graphs``) resolves to
    nothing there and to torch's file here: only this layout shows what npudoctor does with it."""
    import subprocess
    import sys

    import torch

    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet"]
        + ["--disable-pip-version-check", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    (site / "torch").symlink_to(Path(torch.__file__).parent, target_is_directory=True)
    return site
