"""What a condition in sglang's source is on an Ascend host: true, false, or not known from the source.

sglang keeps the code of every device in one tree and picks with conditions: ``if _is_npu:``,
``if is_cuda() and not _use_aiter:``, ``if not (_is_cuda or _is_hip): ...``, with the flags bound
once at module level (``_is_npu = is_npu()``). Whether a kernel, an import or an attribute read is
on the NPU path is decided by these conditions, so every property over the path
(``npudoctor.static.npupath``) asks the same question: is this test true on an Ascend host?

The answer comes from the device predicates of ``sglang.srt.utils`` (``is_npu()`` is true on
Ascend; ``is_cuda()``, ``is_hip()``, ``is_cpu()``, ``is_xpu()``, ``is_musa()``, the SM and gfx
probes and the CUDA-only library probes are false there, and so are ``torch.version.cuda`` and
``torch.version.hip``: an Ascend host runs a CPU build of torch with torch_npu), the module-level
names bound from them (followed through ``from ... import`` to the module that binds them), and
``and``/``or``/``not`` over those (in three-valued logic: ``expressions.truth``, this module
deciding each operand). Anything else (an env variable, a server argument, a
capability probe of the NPU itself such as ``is_npu_arch35()``) is ``None``: not known, so both
branches are kept. A property never prunes a branch it cannot prove dead.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from npudoctor.static.dataflow import imported_module
from npudoctor.static.expressions import truth
from npudoctor.static.source import SourceTree, flatten_conditional

# sglang.srt.utils' device predicates, by their value on an Ascend host
TRUE_ON_NPU = frozenset({"is_npu"})
FALSE_ON_NPU = re.compile(
    r"(is_(cuda|cuda_alike|hip|hip_runtime|cpu|xpu|musa|mps|hpu|sail|rocm|habana_available"
    r"|flashinfer_available|triton_kernels_available|fp8_fnuz|blackwell\w*|hopper\w*|sm\d+\w*"
    r"|gfx\d+\w*|nvidia\w*|mnnvl\w*|fi_a2a_supported)"
    r"|cpu_has_amx_support|use_aiter|_is_intel_amx_backend_available)"
)
# Top-level packages an Ascend host lacks: CUDA (or ROCm) kernel libraries and CUDA driver
# bindings that sglang's CUDA wheel requires and its Ascend install does not carry (sglang's
# ``pyproject_other.toml`` ``srt_npu`` extra, later ``pyproject_npu.toml``, plus torch_npu,
# triton-ascend and sgl-kernel-npu, which provides ``sgl_kernel_npu`` and ``deep_ep``). An
# import of one raises ``ImportError`` there. ``checks/npp002_cuda_only_code`` says why each.
ABSENT_ON_ASCEND = frozenset(
    {
        "sgl_kernel",
        "vllm",
        "flashinfer",
        "deep_gemm",
        "flash_attn",
        "flash_attn_interface",
        "flash_mla",
        "cutlass",
        "cuda",
        "nvshmem",
        "quack",
        "humming",
        "tilelang",
        "triton_kernels",
        "fast_hadamard_transform",
        "aiter",
        "wave_lang",
        "petit_kernel",
        "mori",
    }
)
# attribute chains with a known value on an Ascend host (CPU torch + torch_npu). Not
# ``torch.cuda.is_available()``: torch_npu's transfer_to_npu, which sglang installs when the model
# runner is imported (0.5.6.post1+), maps it to ``torch.npu.is_available()``, so its value depends
# on when it runs; both branches are kept.
_KNOWN_ATTRIBUTES = {"torch.version.cuda": False, "torch.version.hip": False, "typing.TYPE_CHECKING": False}


def value_on_npu(tree: SourceTree, path: Path, test: ast.expr, _depth: int = 0) -> bool | None:
    """``test`` (an expression in the module at ``path``) on an Ascend host: True, False or None."""
    if _depth > 6:
        return None
    if _depth:
        return truth(test, lambda operand: _operand_on_npu(tree, path, operand, _depth))
    # the walks ask each test several times; the entry holds the node, so its id is not reused
    memo = tree.memo.setdefault("npuguards.value_on_npu", {})
    entry = memo.get((path, id(test)))
    if entry is None or entry[0] is not test:
        entry = memo[(path, id(test))] = (test, truth(test, lambda o: _operand_on_npu(tree, path, o, 0)))
    return entry[1]


def ends_block(stmt: ast.stmt, test_value: Callable[[ast.expr], bool | None]) -> bool:
    """Whether ``stmt`` surely ends the block it sits in when it runs: a ``return``, ``raise``,
    ``break`` or ``continue``, or an ``if`` whose side the host takes (``test_value`` of its test
    known) ends, or both sides end. The statements after it in that block never run: the import
    after ``if not is_cuda(): return None`` is dead on NPU (sglang's ``DualGemm._select_mode``)."""
    if isinstance(stmt, (ast.Return, ast.Raise, ast.Break, ast.Continue)):
        return True
    if isinstance(stmt, ast.If):
        return all(any(ends_block(s, test_value) for s in side) for side in _sides_taken(stmt, test_value))
    return False


def may_return(stmt: ast.stmt, test_value: Callable[[ast.expr], bool | None], in_loop: bool = False) -> bool:
    """Whether ``stmt`` may leave its block early without an error: a ``return``, or a ``break``
    or ``continue`` of the block's own loop, on a side the host may take (not inside a nested
    function). What follows it in the block then runs only sometimes. A ``raise`` does not count:
    what follows it runs whenever the function does not fail, which is what a crash property asks."""
    if isinstance(stmt, ast.Return):
        return True
    if isinstance(stmt, (ast.Break, ast.Continue)):
        return not in_loop
    if isinstance(stmt, ast.If):
        return any(
            may_return(s, test_value, in_loop) for side in _sides_taken(stmt, test_value) for s in side
        )
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):  # its break/continue end only the loop
        return any(may_return(s, test_value, True) for block in _blocks(stmt) for s in block)
    if isinstance(stmt, (ast.With, ast.AsyncWith, ast.Try, ast.Match)):
        return any(may_return(s, test_value, in_loop) for block in _blocks(stmt) for s in block)
    return False


def _sides_taken(stmt: ast.If, test_value: Callable[[ast.expr], bool | None]) -> list[list[ast.stmt]]:
    """The branches of ``stmt`` the host may take: the one its known test picks, else both."""
    value = test_value(stmt.test)
    return [stmt.body] if value is True else [stmt.orelse] if value is False else [stmt.body, stmt.orelse]


def until_end(block: list[ast.stmt], ends: Callable[[ast.stmt], bool]) -> list[ast.stmt]:
    """The statements of ``block`` up to and including the first for which ``ends`` holds."""
    for index, stmt in enumerate(block):
        if ends(stmt):
            return block[: index + 1]
    return block


def _operand_on_npu(tree: SourceTree, path: Path, test: ast.expr, _depth: int) -> bool | None:
    """One operand of a condition (not an ``and``/``or``/``not``) on an Ascend host."""
    if isinstance(test, ast.Call):
        name = dotted(test.func)
        short = name.rpartition(".")[2] if name else ""
        if isinstance(test.func, ast.Name):  # ``from sglang.srt.utils import is_cuda as _probe``
            short = _imported_as(tree, path, short)
        if short in TRUE_ON_NPU:
            return True
        if short and FALSE_ON_NPU.fullmatch(short):
            return False
        if isinstance(test.func, ast.Name):
            return _returned_on_npu(tree, path, test.func.id, _depth + 1)
        return None
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.Attribute):
        text = dotted(test)
        if text in _KNOWN_ATTRIBUTES:
            return _KNOWN_ATTRIBUTES[text]
        # ``get_platform().is_sm100`` and the like: a CUDA capability read
        if FALSE_ON_NPU.fullmatch(test.attr):
            return False
        # ``deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM``: a name bound at the top of an imported sglang module
        if isinstance(test.value, ast.Name):
            module = imported_module(tree, path, test.value.id)
            bound = module_binding(tree, module, test.attr) if module is not None else None
            if bound is not None:
                return value_on_npu(tree, bound[0], bound[1], _depth + 1)
        return None
    if isinstance(test, ast.Name):
        if test.id == "TYPE_CHECKING":  # typing's: False whenever the code runs
            return False
        bound = module_binding(tree, path, test.id)
        if bound is None:
            return None
        bound_path, value = bound
        if isinstance(value, ast.Constant) and _declared_global(tree, bound_path, test.id):
            return None  # ``_ready = False`` that a function sets with ``global _ready``
        return value_on_npu(tree, bound_path, value, _depth + 1)
    return None


def _declared_global(tree: SourceTree, path: Path, name: str) -> bool:
    """Whether a function of the module at ``path`` rebinds ``name`` (``global name``)."""
    return (
        re.search(rb"\bglobal\s[\w\s,]*\b" + re.escape(name.encode()) + rb"\b", tree.read(path)) is not None
    )


def _imported_as(tree: SourceTree, path: Path, name: str) -> str:
    """The name ``name`` was imported under into the module at ``path`` (``from x import y as name``
    -> ``y``), else ``name``."""
    memo = tree.memo.setdefault("npuguards.aliases", {})
    if path not in memo:
        module = tree.parse(path)
        memo[path] = {
            alias.asname: alias.name
            for stmt in (flatten_conditional(module.body) if module is not None else ())
            if isinstance(stmt, ast.ImportFrom)
            for alias in stmt.names
            if alias.asname
        }
    return memo[path].get(name, name)


def _returned_on_npu(tree: SourceTree, path: Path, name: str, depth: int) -> bool | None:
    """What calling the sglang function ``name`` (defined at the top of ``path`` or imported from
    an sglang module) returns on an Ascend host, whatever its arguments, when every ``return`` it
    can reach there agrees (``ENABLE_JIT_DEEPGEMM = _compute_enable_deep_gemm()``, whose ``if not
    (_is_cuda or _is_musa): return False`` ends it on NPU; ``should_deepgemm_weight_requant_ue8m0(
    weight_block_size)`` returns ``ENABLE_JIT_DEEPGEMM and ...``); None otherwise. Its parameters
    and locals are not known."""
    found = _function_def(tree, path, name)
    if found is None:
        return None
    def_path, node = found
    memo = tree.memo.setdefault("npuguards.returns", {})
    key = id(node)
    if key not in memo:
        memo[key] = None  # recursion
        arguments = node.args
        local = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        local |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
        # a test or value naming a local (``x = probe(); return x``) is not the module-level ``x``
        local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        values: set[bool | None] = set()
        falls = _collect_returns(tree, def_path, node.body, values, depth, frozenset(local))
        if falls:
            values.add(False)  # the implicit ``return None``
        memo[key] = values.pop() if len(values) == 1 else None
    return memo[key]


def _collect_returns(
    tree: SourceTree, path: Path, body: list[ast.stmt], values: set, depth: int, local: frozenset[str]
) -> bool:
    """Adds the NPU values of the ``return``s an Ascend host can reach in ``body`` to ``values``;
    whether the block can end without returning (a ``try`` counts as both)."""
    for stmt in body:
        if isinstance(stmt, ast.Return):
            values.add(
                False if stmt.value is None else value_with_unknowns(tree, path, stmt.value, local, depth)
            )
            return False
        if isinstance(stmt, ast.Raise):
            return False
        if isinstance(stmt, ast.If):
            value = value_with_unknowns(tree, path, stmt.test, local, depth)
            falls = False
            if value is not False:
                falls |= _collect_returns(tree, path, stmt.body, values, depth, local)
            if value is not True:
                falls |= _collect_returns(tree, path, stmt.orelse, values, depth, local)
            if not falls:
                return False
        elif isinstance(stmt, ast.Try) and _fails_on_npu(stmt.body) is not None:
            # ``try: import deep_gemm`` / ``except ImportError: return False``: on an Ascend host
            # the import raises, so the statements before it and the handler run
            handler = next((h for h in stmt.handlers if _catches_import_error(h)), None)
            if handler is None:
                return False
            before = stmt.body[: _fails_on_npu(stmt.body) or 0]
            if not _collect_returns(tree, path, before, values, depth, local):
                return False
            if not _collect_returns(tree, path, handler.body, values, depth, local):
                return False
        elif isinstance(stmt, (ast.Try, ast.For, ast.While, ast.With, ast.Match)):
            for block in _blocks(stmt):
                _collect_returns(tree, path, block, values, depth, local)
    return True


def value_with_unknowns(
    tree: SourceTree, path: Path, expr: ast.expr, unknown: frozenset[str], _depth: int = 0
) -> bool | None:
    """``expr`` on an Ascend host inside a function whose names in ``unknown`` (its parameters and
    locals) are not known: an operand that reads one is not known, the others are decided as at the
    top of the module (``value_on_npu``)."""

    def operand_value(operand: ast.expr) -> bool | None:
        if any(isinstance(n, ast.Name) and n.id in unknown for n in ast.walk(operand)):
            return None
        return value_on_npu(tree, path, operand, _depth)

    return truth(expr, operand_value)


def _fails_on_npu(body: list[ast.stmt]) -> int | None:
    """The index in ``body`` of the first statement that imports a package an Ascend host lacks
    (``ABSENT_ON_ASCEND``), if any: that statement raises ``ImportError`` there."""
    for index, stmt in enumerate(body):
        if isinstance(stmt, ast.Import) and any(a.name.split(".")[0] in ABSENT_ON_ASCEND for a in stmt.names):
            return index
        if (
            isinstance(stmt, ast.ImportFrom)
            and not stmt.level
            and (stmt.module or "").split(".")[0] in ABSENT_ON_ASCEND
        ):
            return index
    return None


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(stmt, ast.Try):
        return [stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)]
    if isinstance(stmt, ast.Match):
        return [case.body for case in stmt.cases]
    return [stmt.body, getattr(stmt, "orelse", [])]


def _function_def(
    tree: SourceTree, path: Path, name: str, _depth: int = 0
) -> tuple[Path, ast.FunctionDef] | None:
    """The one top-level ``def name`` of the module at ``path``, or of the sglang module it is imported from."""
    full = tree.full if isinstance(tree, TopLevelView) else tree  # function bodies are needed here
    module = full.parse(path) if _depth < 4 else None
    if module is None:
        return None
    defs = [s for s in flatten_conditional(module.body) if isinstance(s, ast.FunctionDef) and s.name == name]
    if defs:
        return (path, defs[0]) if len(defs) == 1 else None
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, ast.ImportFrom) and stmt.module is not None:
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    source = tree.module_path(tree.absolute_module(path, stmt))
                    if source is not None and source != path:
                        return _function_def(tree, source, alias.name, _depth + 1)
    return None


def module_binding(tree: SourceTree, path: Path, name: str, _depth: int = 0) -> tuple[Path, ast.expr] | None:
    """The expression a module-level ``name = <expr>`` binds in ``path`` (or in the sglang module
    it is imported from), with the module it is written in; None when it is not bound that way
    (assigned twice with different values, a parameter, a function, outside sglang)."""
    memo = tree.memo.setdefault("npuguards.bindings", {})
    key = (path, name)
    if key in memo:
        return memo[key]
    memo[key] = None  # cycles
    found: tuple[Path, ast.expr] | None = None
    module = tree.parse(path) if _depth < 6 else None
    values: list[ast.expr] = []
    if module is not None:
        for stmt in flatten_conditional(module.body):
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == name
            ):
                values.append(stmt.value)
            elif isinstance(stmt, ast.ImportFrom) and stmt.module is not None:
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name or (alias.name == "*" and found is None):
                        source = tree.module_path(tree.absolute_module(path, stmt))
                        if source is not None and source != path:
                            found = module_binding(
                                tree, source, name if alias.name == "*" else alias.name, _depth + 1
                            )
    if values:  # bound once, or several times to the same expression (``_is_xpu = is_xpu()`` twice)
        found = (path, values[0]) if len({ast.dump(v) for v in values}) == 1 else None
    memo[key] = found
    return found


def guarded_statements(
    tree: SourceTree, path: Path, body: list[ast.stmt] | None = None
) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement of a block (the module's top level by default) that runs on an Ascend host,
    with whether a ``try`` around it catches ``ImportError`` (so a failed import there is handled).
    Branches whose test is False on NPU are left out, ``if``/``else`` whose test is not known are
    both kept, and nested functions and classes are not entered (their bodies run later, if ever)."""
    if body is None:
        module = tree.parse(path)
        body = module.body if module is not None else []
    yield from _walk_block(tree, path, body, caught=False)


def _walk_block(
    tree: SourceTree, path: Path, body: list[ast.stmt], caught: bool
) -> Iterator[tuple[ast.stmt, bool]]:
    for stmt in until_end(body, lambda stmt: ends_block(stmt, lambda test: value_on_npu(tree, path, test))):
        if isinstance(stmt, ast.If):
            value = value_on_npu(tree, path, stmt.test)
            if value is not False:
                yield from _walk_block(tree, path, stmt.body, caught)
            if value is not True:
                yield from _walk_block(tree, path, stmt.orelse, caught)
        elif isinstance(stmt, ast.Try):
            handles = caught or any(_catches_import_error(h) for h in stmt.handlers)
            yield from _walk_block(tree, path, stmt.body, handles)
            for handler in stmt.handlers:
                yield from _walk_block(tree, path, handler.body, caught)
            yield from _walk_block(tree, path, stmt.orelse, caught)
            yield from _walk_block(tree, path, stmt.finalbody, caught)
        elif isinstance(stmt, (ast.With,)):
            yield from _walk_block(tree, path, stmt.body, caught)
        else:
            yield stmt, caught


def off_npu_test(tree: SourceTree, path: Path, chain: list[tuple[ast.If, bool]]) -> ast.If | None:
    """The first test of an enclosing-``if`` chain (as ``dataflow.enclosing_tests`` gives it: the
    ``if`` and whether the node sits in its body) that makes the node unreachable on NPU, if any."""
    for test, taken in chain:
        value = value_on_npu(tree, path, test.test)
        if value is not None and value != taken:
            return test
    return None


def catches(handler: ast.ExceptHandler, *errors: str) -> bool:
    """Whether an ``except`` clause catches one of ``errors`` (a bare ``except``, ``Exception`` and
    ``BaseException`` catch everything)."""
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(dotted(n).rpartition(".")[2] in {*errors, "Exception", "BaseException"} for n in names)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    return catches(handler, "ImportError", "ModuleNotFoundError")


def dotted(node: ast.AST) -> str:
    """``a.b.c`` of a name or attribute chain (``f().x`` of a call's result); "" for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):  # get_platform().is_sm100
        inner = dotted(node.func)
        return f"{inner}().{'.'.join(reversed(parts))}" if inner else ""
    return ""


# ----- the top level of modules, cheaply -----------------------------------------------------------
_BODY_HEADER = re.compile(rb"(?:async\s+def|def|class)\s|@")


class TopLevelView:
    """A ``SourceTree`` whose ``parse`` gives a module's top level only: every ``def``, ``class``
    and decorator written at column 0 is replaced by ``pass`` before parsing (their bodies do not
    run at import), which makes reading the import statements of a whole release about ten times
    cheaper than parsing it. Statements nested in top-level ``if``/``try`` blocks are kept whole. A
    module whose top level does not parse that way (a string at column 0 inside a function body) is
    parsed whole. Everything else is the underlying tree's (``full``), except ``memo``: what the
    guards memoise here holds top-level nodes only. A caller reporting a line found this way should
    confirm it on ``full`` (``guarded_statements(view.full, path)``)."""

    def __init__(self, tree: SourceTree):
        self.full = tree
        self.memo: dict[str, object] = {}
        self._modules: dict[Path, ast.Module | None] = {}

    def parse(self, path: Path) -> ast.Module | None:
        if path not in self._modules:
            try:
                self._modules[path] = ast.parse(_top_level_source(self.full.read(path)), filename=str(path))
            except (SyntaxError, ValueError):
                self._modules[path] = self.full.parse(path)
        return self._modules[path]

    def __getattr__(self, name: str):
        return getattr(self.full, name)


def _top_level_source(source: bytes) -> bytes:
    """``source`` with the bodies of its column-0 ``def``/``class`` (and their decorators and
    multi-line headers) replaced by ``pass``, line numbers kept."""
    lines = source.split(b"\n")
    skipping = False
    for index, line in enumerate(lines):
        first = line[:1]
        if skipping:
            if not first or first in b" \t#)]}\r":
                lines[index] = b""
                continue
            skipping = False
        if _BODY_HEADER.match(line):
            lines[index] = b"pass"
            skipping = True
    return b"\n".join(lines)
