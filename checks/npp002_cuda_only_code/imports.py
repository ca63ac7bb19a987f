"""The module import closure of a set of sglang modules, as an Ascend host runs it.

Importing a module runs its top level: the packages on its way (``sglang/__init__.py``,
``sglang/srt/__init__.py``, ...) first, then every module-level ``import``/``from ... import``
that an Ascend host reaches (``npuguards.guarded_statements``: branches false on NPU left out,
``TYPE_CHECKING`` blocks never run, a ``try`` whose handler catches ``ImportError`` handles what
fails inside it). Each sglang module imported that way is followed in turn (``from sglang.x import
y`` also imports the submodule ``sglang.x.y`` when there is one; relative imports are resolved
against the importing package). An import of a top-level package an Ascend host lacks
(``ABSENT_ON_ASCEND``) that no ``try`` catches is where importing the root raises
``ModuleNotFoundError``: the finding, with the chain of imports from the root that reaches it.

Also at import: a module-level call of a CUDA-only ``torch.cuda`` function (``CUDA_AT_IMPORT``)
that an Ascend host reaches.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from npudoctor.static.npuguards import ABSENT_ON_ASCEND, TopLevelView, guarded_statements, value_on_npu
from npudoctor.static.source import SourceTree

# Why an Ascend host lacks each package of ``npuguards.ABSENT_ON_ASCEND`` (the check's docstring
# has the reasoning): the evidence line of a finding names it.
WHY_ABSENT: dict[str, str] = {
    "sgl_kernel": "sglang-kernel, sglang's CUDA kernels (Ascend has sgl_kernel_npu instead)",
    "vllm": "vllm, not a dependency of sglang on any device",
    "flashinfer": "flashinfer-python, CUDA attention kernels",
    "deep_gemm": "sgl-deep-gemm, CUDA FP8 GEMM",
    "flash_attn": "flash-attn, CUDA",
    "flash_attn_interface": "flash-attn 3, CUDA",
    "flash_mla": "sgl-flash-mla, CUDA MLA kernels",
    "cutlass": "nvidia-cutlass-dsl, CUDA",
    "cuda": "cuda-python, the CUDA driver and runtime bindings",
    "nvshmem": "nvshmem4py, CUDA",
    "quack": "quack-kernels, CUDA",
    "humming": "humming-kernels, CUDA",
    "tilelang": "tilelang, CUDA build only in sglang's CUDA wheel",
    "triton_kernels": "triton_kernels, CUDA Triton kernels from the triton repository",
    "fast_hadamard_transform": "fast-hadamard-transform, CUDA",
    "aiter": "aiter, ROCm",
    "wave_lang": "wave-lang, ROCm",
    "petit_kernel": "petit-kernel, ROCm",
    "mori": "mori, ROCm",
}
assert set(WHY_ABSENT) == ABSENT_ON_ASCEND

# torch.cuda functions that need a CUDA device when called (at import: a crash on a host without one)
CUDA_AT_IMPORT = frozenset(
    {
        "get_device_capability",
        "get_device_properties",
        "get_device_name",
        "current_device",
        "set_device",
        "mem_get_info",
        "Stream",
        "Event",
        "current_stream",
        "synchronize",
    }
)


@dataclass(frozen=True)
class Site:
    """One statement at a module's top level: the module, its line and the statement."""

    path: Path
    line: int
    node: ast.AST | str  # the statement, or what stands for it ("(package)": the package's __init__)

    @property
    def text(self) -> str:
        return self.node if isinstance(self.node, str) else ast.unparse(self.node)


@dataclass(frozen=True)
class ImportFailure:
    """A module-level import (or CUDA call) that fails on an Ascend host, and how the root reaches it."""

    package: str  # the missing top-level package ("" for a CUDA call)
    site: Site
    chain: tuple[Site, ...]  # from the root module down to the import of ``site.path``
    conditions: tuple[str, ...] = ()  # tests on the way that the source cannot settle (none: it surely runs)

    @property
    def root(self) -> Path:
        return self.chain[0].path if self.chain else self.site.path


@dataclass(frozen=True)
class _Edge:
    module: Path | None  # an sglang module imported here
    package: str  # the external top-level package imported here ("" when internal)
    site: Site
    conditions: tuple[str, ...] = ()  # the unsettled tests around the statement in its module


_Parents = dict[Path, "tuple[Path, _Edge] | None"]


def import_failures(
    tree: SourceTree, roots: list[Path], known: set[Path] | None = None
) -> list[ImportFailure]:
    """Every import of an absent package (and CUDA call) that importing ``roots`` runs on an Ascend
    host, each once, with the shortest chain from the first root (in order) that reaches it: first
    along the imports that surely run, then along those under a test the source cannot settle (the
    failure then carries that test). ``known``: modules whose closure was judged already (not read
    again); the modules visited are added to it."""
    view = tree.memo.setdefault("npp002.view", TopLevelView(tree))
    skip = set(known or ())
    surely: _Parents = dict.fromkeys(skip - set(roots))
    _walk(view, roots, surely, surely_only=True)
    maybe: _Parents = dict(surely)
    _walk(view, [p for p in surely if p not in skip], maybe, surely_only=False)
    if known is not None:
        known.update(maybe)
    found: dict[tuple[Path, int], ImportFailure] = {}
    for path in maybe:
        if path in skip:
            continue
        for edge in _edges(view, path):
            if edge.module is not None:
                continue
            key = (edge.site.path, edge.site.line)
            if key in found or not _confirmed(tree, edge):
                continue
            conditions = (
                edge.conditions if path in surely else (*_chain_conditions(maybe, path), *edge.conditions)
            )
            found[key] = ImportFailure(edge.package, edge.site, _chain(maybe, path), conditions)
    return list(found.values())


def _walk(view: TopLevelView, start: list[Path], parent: _Parents, surely_only: bool) -> None:
    queue: deque[Path] = deque()
    for root in start:
        if root not in parent:
            parent[root] = None
        queue.append(root)
    while queue:
        path = queue.popleft()
        for edge in _edges(view, path):
            if edge.module is None or edge.module in parent or (surely_only and edge.conditions):
                continue
            parent[edge.module] = (path, edge)
            queue.append(edge.module)


def _chain_conditions(parent: _Parents, path: Path) -> tuple[str, ...]:
    conditions: list[str] = []
    link = parent.get(path)
    while link is not None:
        path, edge = link
        conditions[:0] = edge.conditions
        link = parent.get(path)
    return tuple(conditions)


def _confirmed(tree: SourceTree, edge: _Edge) -> bool:
    """The finding is a statement of the module's real top level (the view reads a stripped copy)."""
    path, line = edge.site.path, edge.site.line
    if edge.package:
        return any(
            not caught and isinstance(stmt, (ast.Import, ast.ImportFrom)) and stmt.lineno == line
            for stmt, caught in guarded_statements(tree, path)
        )
    module = tree.parse(path)
    conditions = _statement_conditions(tree, path, module.body if module is not None else [])
    return any(
        (call := _cuda_call(tree, path, stmt)) is not None and call.lineno == line
        for stmt in _flat(module.body if module is not None else [])
        if id(stmt) in conditions and not conditions[id(stmt)]
    )


def _chain(parent: _Parents, path: Path) -> tuple[Site, ...]:
    steps: list[Site] = []
    while True:
        link = parent.get(path)
        if link is None:
            steps.append(Site(path, 0, ""))
            break
        path, edge = link
        steps.append(edge.site)
    return tuple(reversed(steps))


def _edges(tree: TopLevelView, path: Path) -> list[_Edge]:
    """What importing ``path`` runs (memoised per tree): its package ``__init__``, the sglang
    modules it imports and the absent packages it imports, uncaught, on an Ascend host, each with
    the unsettled tests around it. A statement that surely runs and surely raises (an absent
    package, a CUDA call) ends the module: nothing after it is imported."""
    memo = tree.full.memo.setdefault("npp002.edges", {})
    if path in memo:
        return memo[path]
    memo[path] = edges = []
    package = _package_init(tree, path)
    if package is not None:
        edges.append(_Edge(package, "", Site(path, 0, "(package)")))
    module = tree.parse(path)
    conditions = _statement_conditions(tree, path, module.body if module is not None else [])
    cuda = b"torch.cuda." in tree.read(path)
    for stmt, caught in guarded_statements(tree, path):
        if caught:
            continue
        around = conditions.get(id(stmt), ())
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found = [replace(e, conditions=around) for e in _import_edges(tree, path, stmt)]
            edges.extend(found)
            if not around and any(e.package for e in found):
                break  # the import raises there: nothing after it runs
        elif cuda and not around and id(stmt) in conditions:
            call = _cuda_call(tree, path, stmt)
            if call is not None:
                edges.append(_Edge(None, "", Site(path, call.lineno, call)))
                break
    return edges


def _statement_conditions(tree: SourceTree, path: Path, body: list[ast.stmt]) -> dict[int, tuple[str, ...]]:
    """For each module-level statement an Ascend host may run (by ``id``), the tests around it that
    ``value_on_npu`` cannot settle (a ``try`` body runs; its handlers only when something raised)."""
    found: dict[int, tuple[str, ...]] = {}

    def walk(block: list[ast.stmt], around: tuple[str, ...]) -> None:
        for stmt in block:
            if isinstance(stmt, ast.If):
                value = value_on_npu(tree, path, stmt.test)
                text = ast.unparse(stmt.test)
                if value is not False:
                    walk(stmt.body, around if value else (*around, text))
                if value is not True:
                    walk(stmt.orelse, around if value is False else (*around, f"not ({text})"))
            elif isinstance(stmt, ast.Try):
                walk(stmt.body + stmt.orelse + stmt.finalbody, around)
                for handler in stmt.handlers:
                    walk(handler.body, (*around, "an exception was raised"))
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                walk(stmt.body, around)
            elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[id(stmt)] = around

    walk(body, ())
    return found


def _flat(body: list[ast.stmt]):
    for stmt in body:
        yield stmt
        for block in ("body", "orelse", "finalbody"):
            yield from _flat(
                getattr(stmt, block, []) if isinstance(stmt, (ast.If, ast.Try, ast.With)) else []
            )
        if isinstance(stmt, ast.Try):
            for handler in stmt.handlers:
                yield from _flat(handler.body)


def _import_edges(tree: SourceTree, path: Path, stmt: ast.Import | ast.ImportFrom) -> list[_Edge]:
    site = Site(path, stmt.lineno, stmt)
    edges: list[_Edge] = []
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            edges.extend(_module_edges(tree, alias.name, site))
        return edges
    module = tree.absolute_module(path, stmt)
    edges.extend(_module_edges(tree, module, site))
    if module.split(".")[0] == "sglang":
        for alias in stmt.names:
            sub = _module_path(tree, f"{module}.{alias.name}") if alias.name != "*" else None
            if sub is not None:
                edges.append(_Edge(sub, "", site))
    return edges


def _module_edges(tree: SourceTree, module: str, site: Site) -> list[_Edge]:
    top = module.split(".")[0]
    if top != "sglang":
        return [_Edge(None, top, site)] if top in ABSENT_ON_ASCEND else []
    target = _module_path(tree, module)
    return [] if target is None else [_Edge(target, "", site)]


def _module_path(tree: SourceTree, module: str) -> Path | None:
    memo = tree.memo.setdefault("npp002.module_paths", {})
    if module not in memo:
        memo[module] = tree.module_path(module)
    return memo[module]


def _package_init(tree: SourceTree, path: Path) -> Path | None:
    """The ``__init__.py`` of the package holding ``path`` (Python imports it first)."""
    folder = path.parent if path.name != "__init__.py" else path.parent.parent
    init = folder / "__init__.py"
    if init == path or not init.is_file():
        return None
    try:
        init.relative_to(tree.package_dir)
    except ValueError:
        return None
    return init


def _cuda_call(tree: SourceTree, path: Path, stmt: ast.stmt) -> ast.Call | None:
    """A ``torch.cuda.<f>(...)`` call (``f`` one that needs a CUDA device) that a module-level
    statement certainly makes: not behind a short-circuit (``is_nvidia and torch.cuda...``) or a
    conditional expression whose other side an Ascend host may take, nor in a lambda or
    comprehension."""
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(
            node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.comprehension)
        ):
            continue
        if isinstance(node, ast.BoolOp):
            stack.append(node.values[0])  # later operands run only if the earlier ones let them
            continue
        if isinstance(node, ast.IfExp):
            stack.append(node.test)
            value = value_on_npu(tree, path, node.test)
            if value is not None:
                stack.append(node.body if value else node.orelse)
            continue
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CUDA_AT_IMPORT
            and ast.unparse(node.func.value) == "torch.cuda"
        ):
            return node
        stack.extend(ast.iter_child_nodes(node))
    return None
