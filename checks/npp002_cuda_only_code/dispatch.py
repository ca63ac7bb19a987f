"""CUDA-only code in the functions of the deployment's NPU path: what the functions themselves run.

A function on the path (``npupath.RolePath.frames``) can still reach CUDA-only code after every
module imported: an ``import`` inside the function of a package an Ascend host lacks (sglang#17453:
``RotaryEmbedding.__init__`` imported ``vllm._custom_ops`` on NPU), a ``torch.cuda`` function the NPU
runtime does not provide, a ``"cuda"`` device handed to a torch function, a ``backend="nccl"``
process group. Whether the last three break depends on what the release installs at start-up:
every scheduler process of the releases this check was triaged on (0.5.8 .. 0.5.23) imports
``model_runner``, whose top level calls ``init_npu_backend()`` on NPU, which imports torch_npu's
``transfer_to_npu`` (``hardware_backend/npu/utils.py``). That module routes ``torch.cuda.*`` to
``torch.npu.*`` for every name ``torch.npu`` has, rewrites a ``"cuda"`` device to ``"npu"`` in the
torch factories, ``Tensor.to``/``new_*``/``pin_memory`` and ``Module.to``, and ``nccl`` to ``hccl``
in ``init_process_group`` only (``torch_npu/contrib/transfer_to_npu.py``). So with it installed, a
``torch.cuda.<f>`` call is a finding only for an ``f`` that ``torch.npu`` lacks, a ``"cuda"``
device only when handed to a torch function it does not rewrite, and ``backend="nccl"`` only
outside ``init_process_group`` (``new_group`` and the rest are not wrapped). Without it (a tree
whose ``model_runner`` does not install it on NPU), each of them is a finding.

Each finding carries the branch it is on: the conditions around it that the source cannot settle
(``npuguards.value_on_npu`` is None). A finding with no such condition is ``fail``; one under a
condition that depends on the data (``self.head_size not in [64, 128, 256, 512]``) is ``warn``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from npudoctor.static.dataflow import module_function
from npudoctor.static.expressions import compare_known, truth
from npudoctor.static.npuguards import (
    ABSENT_ON_ASCEND,
    catches,
    ends_block,
    guarded_statements,
    may_return,
    until_end,
    value_on_npu,
    value_with_unknowns,
)
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree
from npudoctor.static.walker import Frame

# torch_npu.npu's public names (``torch_npu/npu/__init__.py`` ``__all__``): with transfer_to_npu,
# ``torch.cuda.<name>`` is ``torch.npu.<name>`` for these
TORCH_NPU_NAMES = frozenset(
    [
        "is_initialized",
        "init",
        "set_dump",
        "synchronize",
        "device_count",
        "can_device_access_peer",
        "set_device",
        "current_device",
        "get_device_name",
        "get_device_properties",
        "get_device_capability",
        "mem_get_info",
        "is_available",
        "device",
        "device_of",
        "StreamContext",
        "stream",
        "set_stream",
        "current_stream",
        "default_stream",
        "set_sync_debug_mode",
        "get_sync_debug_mode",
        "init_dump",
        "utilization",
        "finalize_dump",
        "manual_seed",
        "manual_seed_all",
        "seed",
        "seed_all",
        "initial_seed",
        "caching_allocator_alloc",
        "caching_allocator_delete",
        "get_per_process_memory_fraction",
        "set_per_process_memory_fraction",
        "empty_cache",
        "empty_virt_addr_cache",
        "memory_stats",
        "memory_stats_as_nested_dict",
        "reset_accumulated_memory_stats",
        "reset_peak_memory_stats",
        "reset_max_memory_allocated",
        "reset_max_memory_cached",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "memory_cached",
        "max_memory_cached",
        "memory_snapshot",
        "memory_summary",
        "MemPool",
        "use_mem_pool",
        "get_allocator_backend",
        "change_current_allocator",
        "Stream",
        "Event",
        "get_rng_state",
        "set_rng_state",
        "get_rng_state_all",
        "set_rng_state_all",
        "is_autocast_enabled",
        "is_bf16_supported",
        "set_autocast_enabled",
        "get_autocast_dtype",
        "set_autocast_dtype",
        "BoolTensor",
        "ByteTensor",
        "CharTensor",
        "DoubleTensor",
        "FloatTensor",
        "HalfTensor",
        "IntTensor",
        "LongTensor",
        "ShortTensor",
        "BFloat16Tensor",
        "current_blas_handle",
        "graph",
        "graph_pool_handle",
        "is_current_stream_capturing",
        "make_graphed_callables",
        "ipc_collect",
        "amp",
        "random",
    ]
)
# torch.cuda functions that need no CUDA device (they answer False/0 on a host without one)
HARMLESS_CUDA = frozenset({"is_available", "device_count", "is_initialized", "is_current_stream_capturing"})
# what transfer_to_npu rewrites a "cuda" device in (its torch_fn_white_list, torch_tensor_fn_white_list,
# torch_module_fn_white_list and torch_cuda_fn_white_list), by the called name
DEVICE_REWRITTEN = frozenset(
    [
        "logspace",
        "randint",
        "hann_window",
        "rand",
        "full_like",
        "ones_like",
        "rand_like",
        "randperm",
        "arange",
        "frombuffer",
        "normal",
        "empty_strided",
        "empty_like",
        "scalar_tensor",
        "tril_indices",
        "bartlett_window",
        "ones",
        "sparse_coo_tensor",
        "randn",
        "kaiser_window",
        "tensor",
        "triu_indices",
        "as_tensor",
        "zeros",
        "randint_like",
        "full",
        "eye",
        "empty",
        "blackman_window",
        "zeros_like",
        "range",
        "sparse_csr_tensor",
        "randn_like",
        "from_file",
        "linspace",
        "hamming_window",
        "empty_quantized",
        "autocast",
        "load",
        "Generator",
        "set_default_device",
        "new_empty",
        "new_empty_strided",
        "new_full",
        "new_ones",
        "new_tensor",
        "new_zeros",
        "to",
        "pin_memory",
        "to_empty",
        "cuda",
    ]
)
_PROCESS_GROUP_CALLS = frozenset(
    {"new_group", "init_process_group", "new_subgroups", "new_subgroups_by_enumeration"}
)


@dataclass(frozen=True)
class Reach:
    """One CUDA-only thing a function on the path runs: what, where, and the unsettled conditions."""

    kind: str  # "import", "torch.cuda", "device", "nccl"; "call": a call of the function named ``what``;
    # "lazy": an import of the sglang module ``what`` inside the function
    what: str  # the statement or call, as written
    function: FunctionRef
    line: int
    package: str = ""  # the missing package, for an import
    conditions: tuple[str, ...] = ()  # tests on the branch that the source cannot settle


def transfer_to_npu_installed(tree: SourceTree) -> bool:
    """Whether the release's scheduler process installs torch_npu's ``transfer_to_npu`` on NPU: a
    module-level call in ``model_runner`` (run on NPU) of a function that imports it."""
    memo = tree.memo.setdefault("npp002.transfer", {})
    if "installed" not in memo:
        memo["installed"] = _installs_transfer(tree)
    return memo["installed"]


def _installs_transfer(tree: SourceTree) -> bool:
    runner = tree.module_path("sglang.srt.model_executor.model_runner")
    if runner is None:
        return False
    for stmt, _caught in guarded_statements(tree, runner):
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
        ):
            ref = module_function(tree, runner, stmt.value.func.id)
            if ref is not None and any(
                isinstance(node, ast.ImportFrom) and any(a.name == "transfer_to_npu" for a in node.names)
                for node in ast.walk(ref.node)
            ):
                return True
    return False


def cuda_reaches(
    tree: SourceTree, frames: list[Frame], head_sizes: frozenset[int] = frozenset()
) -> list[Reach]:
    """Every CUDA-only thing the functions of ``frames`` run on an Ascend host, each site once.
    ``head_sizes``: the rotary head sizes the deployment's model builds (``rope_head_sizes``).

    A reach with no unsettled condition in its own function is definite only when the function
    surely runs: a constructor (the path builds what it constructs), a function no call on the path
    names (an entry of the walk: a model's ``forward``, a root's public method), or one that some
    call on the path makes outside every unsettled condition from a function that surely runs. When
    every call on the path that names it sits under such a condition (``if should_use_mega_moe(...)``
    around ``_run_mega_routed(...)``), the first of those conditions is the reach's condition."""
    transfer = transfer_to_npu_installed(tree)
    context = _Context(tree, transfer, head_sizes)
    found: dict[tuple[Path, int, str], Reach] = {}
    calls: dict[str, list[Reach]] = {}
    functions: list[FunctionRef] = []
    seen: set[tuple[int, int]] = set()
    for frame in frames:
        ref = frame.function
        if (id(ref.node), id(frame.self_cls)) in seen:
            continue
        seen.add((id(ref.node), id(frame.self_cls)))
        functions.append(ref)
        for reach in _function_reaches(context, ref, frame.self_cls):
            if reach.kind == "call":
                calls.setdefault(reach.what, []).append(reach)
            else:
                found.setdefault((ref.path, reach.line, reach.what), reach)
    memo: dict[int, tuple[str, ...]] = {}
    result = []
    for reach in found.values():
        if not reach.conditions:
            reach = replace(reach, conditions=_caller_conditions(reach.function, calls, memo, 0))
        result.append(reach)
    return result


def _caller_conditions(
    ref: FunctionRef, calls: dict[str, list[Reach]], memo: dict[int, tuple[str, ...]], depth: int
) -> tuple[str, ...]:
    """() when ``ref`` surely runs on the path, else the condition under which it is called."""
    key = id(ref.node)
    if key in memo:
        return memo[key]
    memo[key] = ("a recursive call",)  # decided by the other callers
    if ref.name == "__init__":
        memo[key] = ()
        return ()
    sites = [c for c in calls.get(ref.name, ()) if c.function.node is not ref.node]
    if not sites:
        # no call on the path names it: an entry of the walk (a forward, a public method) runs; a
        # private helper whose only calls sit in branches an Ascend host never takes does not
        memo[key] = (
            (f"{ref.qualname} is called only from code the path does not run",) if _private(ref) else ()
        )
        return memo[key]
    if depth >= 4:
        memo[key] = (f"called from {sites[0].function.qualname} ({sites[0].function.where(sites[0].line)})",)
        return memo[key]
    for site in sites:
        if not site.conditions and not _caller_conditions(site.function, calls, memo, depth + 1):
            memo[key] = ()
            return ()
    first = next((s for s in sites if s.conditions), sites[0])
    inherited = first.conditions or _caller_conditions(first.function, calls, memo, depth + 1)
    memo[key] = (*inherited, f"the call in {first.function.qualname} ({first.function.where(first.line)})")
    return memo[key]


@dataclass(frozen=True)
class _Context:
    tree: SourceTree
    transfer: bool
    head_sizes: frozenset[int]

    def values(self, path: Path, test: ast.expr, cls: ClassInfo | None) -> set[bool | None]:
        """What ``test`` is on an Ascend host in a method of ``cls``: for each rotary head size the
        deployment builds when it compares one (``self.head_size not in [64, 128, 256, 512]``), else
        its one value; ``self.<name>`` is what the class assigns it (``_self_value``)."""
        # a test is asked by the scan and by its cut; the entry holds the node, so its id is not reused
        memo = self.tree.memo.setdefault("npp002.values", {})
        key = (path, id(test), id(cls), self.head_sizes)
        entry = memo.get(key)
        if entry is None or entry[0] is not test:
            sizes = self.head_sizes if self.head_sizes and _head_size_tests(test) else (None,)
            entry = memo[key] = (test, {_value(self.tree, path, test, size, cls) for size in sizes})
        return entry[1]


def rope_head_sizes(model) -> frozenset[int]:
    """The head sizes of the rotary embeddings the model builds, as far as config.json tells: the
    text model's (``qk_rope_head_dim`` for MLA, else ``head_dim``) and a vision tower's
    (``vision_config``: ``head_dim``, else ``hidden_size`` / ``num_heads``)."""
    if model is None:
        return frozenset()
    sizes = {model.qk_rope_head_dim if model.attention.is_mla else model.head_dim}
    vision = model.hf_config.get("vision_config")
    if isinstance(vision, dict):
        heads = vision.get("num_heads") or vision.get("num_attention_heads")
        size = vision.get("head_dim") or (
            vision["hidden_size"] // heads
            if isinstance(vision.get("hidden_size"), int) and isinstance(heads, int) and heads
            else None
        )
        if isinstance(size, int) and size > 0:
            sizes.add(size)
    return frozenset(s for s in sizes if isinstance(s, int))


def _head_size_tests(test: ast.expr) -> list[ast.Compare]:
    return [
        node
        for node in ast.walk(test)
        if isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], (ast.In, ast.NotIn))
        and _dotted(node.left).rpartition(".")[2] in ("head_size", "head_dim", "rotary_head_size")
        and isinstance(node.comparators[0], (ast.List, ast.Tuple, ast.Set))
        and all(isinstance(e, ast.Constant) and isinstance(e.value, int) for e in node.comparators[0].elts)
    ]


def _value(
    tree: SourceTree, path: Path, test: ast.expr, size: int | None, cls: ClassInfo | None
) -> bool | None:
    """``test`` on an Ascend host, in a method of ``cls``, for a rotary embedding of head size ``size``."""

    def operand_value(operand: ast.expr) -> bool | None:
        if size is not None and isinstance(operand, ast.Compare) and operand in _head_size_tests(operand):
            return compare_known(operand.ops[0], size, tuple(e.value for e in operand.comparators[0].elts))
        if cls is not None and isinstance(operand, ast.Attribute) and _is_self(operand.value):
            return _self_value(tree, cls, operand.attr)
        return value_on_npu(tree, path, operand)

    return truth(test, operand_value)


def _self_value(tree: SourceTree, cls: ClassInfo, name: str) -> bool | None:
    """``self.<name>`` on an Ascend host for an instance of ``cls``: the one expression its MRO assigns
    it (in any method, or in a class body), when that is settled there (``self.use_fused_clamp_act_mul
    = _is_hip``: False); None when it is assigned more than one way or from a method's data."""
    memo = tree.memo.setdefault("npp002.self_values", {})
    key = (id(cls), name)
    if key not in memo:
        memo[key] = None
        assigned = _assignments(tree, cls, name)
        if assigned and len({ast.dump(value) for _, value, _ in assigned}) == 1:
            path, value, local = assigned[0]
            value = _local_value(tree, path, value, local)
            # ``mlp._enable_silu_fp4_quant_fusion = True`` from another module (qwen3_5.py) also sets it
            memo[key] = None if value is None or _set_from_outside(tree, name) else value
    return memo[key]


def _set_from_outside(tree: SourceTree, name: str) -> bool:
    """Whether some module of ``sglang/srt`` assigns ``<x>.<name>`` on an object other than ``self``, or
    ``setattr``s it."""
    memo = tree.memo.setdefault("npp002.outside", {})
    if name not in memo:
        pattern = re.compile(rb"([\w)\]]+)\." + re.escape(name.encode()) + rb"\s*(?:=(?!=)|[-+*/|&]=)")
        literal = re.compile(rb"setattr\([^,]+,\s*[\"']" + re.escape(name.encode()) + rb"[\"']")
        memo[name] = any(
            any(m.group(1) != b"self" for m in pattern.finditer(tree.read(path)))
            or literal.search(tree.read(path))
            for path in tree.files_containing(name, under="srt")
        )
    return memo[name]


def _assignments(tree: SourceTree, cls: ClassInfo, name: str) -> list[tuple[Path, ast.expr, frozenset[str]]]:
    """(module, value, the method's locals) of every ``self.<name> = value`` in the methods of ``cls``'s
    MRO and every ``<name> = value`` in its class bodies; a binding of another kind (augmented,
    unpacked, ``setattr``) gets an unknown value."""
    return [entry for klass in tree.mro(cls) for entry in _class_assignments(tree, klass).get(name, ())]


_UNKNOWN = ast.Constant(value=None, kind="unknown")


def _class_assignments(
    tree: SourceTree, klass: ClassInfo
) -> dict[str, list[tuple[Path, ast.expr, frozenset[str]]]]:
    """What one class definition binds on ``self`` (its methods) and in its body (memoised per class)."""
    memo = tree.memo.setdefault("npp002.class_assignments", {})
    if id(klass) in memo:
        return memo[id(klass)]
    found: dict[str, list[tuple[Path, ast.expr, frozenset[str]]]] = {}
    for stmt in klass.node.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    value = stmt.value if len(stmt.targets) == 1 else _UNKNOWN
                    found.setdefault(target.id, []).append((klass.path, value, frozenset()))
    for method in klass.methods.values():
        nodes = list(ast.walk(method))
        stores = [
            n
            for n in nodes
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _is_self(n.value)
        ]
        setattrs = [
            n.args[1].value
            for n in nodes
            if isinstance(n, ast.Call)
            and _dotted(n.func) == "setattr"
            and len(n.args) >= 2
            and isinstance(n.args[1], ast.Constant)
            and isinstance(n.args[1].value, str)
        ]
        if not stores and not setattrs:
            continue
        arguments = method.args
        local = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        local |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        local_names = frozenset(local)
        values = {
            id(n.targets[0]): n.value for n in nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
        }
        values.update({id(n.target): n.value for n in nodes if isinstance(n, ast.AnnAssign) and n.value})
        for store in stores:
            found.setdefault(store.attr, []).append(
                (klass.path, values.get(id(store), _UNKNOWN), local_names)
            )
        for attr in setattrs:
            found.setdefault(attr, []).append((klass.path, _UNKNOWN, frozenset()))
    memo[id(klass)] = found
    return found


def _private(ref: FunctionRef) -> bool:
    return ref.name.startswith("_") and not (ref.name.startswith("__") and ref.name.endswith("__"))


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _local_value(tree: SourceTree, path: Path, expr: ast.expr, local: frozenset[str]) -> bool | None:
    """``expr`` on an Ascend host inside a method whose ``local`` names (and ``self``) are not known."""
    if expr is _UNKNOWN:
        return None
    return value_with_unknowns(tree, path, expr, local | {"self"})


def _function_reaches(context: _Context, ref: FunctionRef, cls: ClassInfo | None) -> Iterator[Reach]:
    memo = context.tree.memo.setdefault("npp002.reaches", {})
    key = (id(ref.node), id(cls), context.transfer, context.head_sizes)
    if key not in memo:
        memo[key] = list(_scan_block(_Scan(context, cls), ref, list(ref.node.body), (), False))
    yield from memo[key]


@dataclass(frozen=True)
class _Scan:
    """The context of one function's scan: the check's, and the class it runs on."""

    context: _Context
    cls: ClassInfo | None

    @property
    def tree(self) -> SourceTree:
        return self.context.tree

    @property
    def transfer(self) -> bool:
        return self.context.transfer

    def values(self, path: Path, test: ast.expr) -> set[bool | None]:
        return self.context.values(path, test, self.cls)


def _scan_block(
    context: _Scan, ref: FunctionRef, body: list[ast.stmt], conditions: tuple[str, ...], caught: bool
) -> Iterator[Reach]:
    def test_value(test: ast.expr) -> bool | None:
        values = context.values(ref.path, test)
        return next(iter(values)) if len(values) == 1 else None

    # the statements after one that surely leaves the block on NPU never run there; those after
    # one that may return early run only when it did not
    for stmt in until_end(body, lambda stmt: ends_block(stmt, test_value)):
        yield from _scan_statement(context, ref, stmt, conditions, caught)
        if _returned_before(stmt, test_value):
            conditions = (*conditions, _no_return(stmt))


def _scan_statement(
    context: _Scan, ref: FunctionRef, stmt: ast.stmt, conditions: tuple[str, ...], caught: bool
) -> Iterator[Reach]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return  # a closure runs when it is called; the walk follows that call
    if isinstance(stmt, ast.If):
        yield from _scan_expr(context, ref, stmt.test, conditions)
        values = context.values(ref.path, stmt.test)
        text = ast.unparse(stmt.test)
        if True in values:
            yield from _scan_block(context, ref, stmt.body, conditions, caught)
        elif None in values:
            yield from _scan_block(context, ref, stmt.body, (*conditions, text), caught)
        if False in values:
            yield from _scan_block(context, ref, stmt.orelse, conditions, caught)
        elif None in values:
            yield from _scan_block(context, ref, stmt.orelse, (*conditions, f"not ({text})"), caught)
    elif isinstance(stmt, ast.Try):
        handles = caught or any(catches(h, "ImportError", "ModuleNotFoundError") for h in stmt.handlers)
        yield from _scan_block(context, ref, stmt.body, conditions, handles)
        for handler in stmt.handlers:
            yield from _scan_block(
                context, ref, handler.body, (*conditions, "an exception was raised"), caught
            )
        yield from _scan_block(context, ref, stmt.orelse + stmt.finalbody, conditions, caught)
    elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
        head = stmt.iter if isinstance(stmt, (ast.For, ast.AsyncFor)) else stmt.test
        yield from _scan_expr(context, ref, head, conditions)
        yield from _scan_block(context, ref, stmt.body + stmt.orelse, conditions, caught)
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        for item in stmt.items:
            yield from _scan_expr(context, ref, item.context_expr, conditions)
        yield from _scan_block(context, ref, stmt.body, conditions, caught)
    elif isinstance(stmt, ast.Match):
        yield from _scan_expr(context, ref, stmt.subject, conditions)
        for case in stmt.cases:
            yield from _scan_block(context, ref, case.body, (*conditions, "a match case"), caught)
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
        if caught:
            return
        package = _absent_package(stmt)
        if package:
            yield Reach("import", ast.unparse(stmt), ref, stmt.lineno, package, conditions)
        for module in _sglang_modules(context.tree, ref.path, stmt):
            yield Reach("lazy", module, ref, stmt.lineno, conditions=conditions)
    else:
        yield from _scan_expr(context, ref, stmt, conditions)


def _returned_before(stmt: ast.stmt, test_value: Callable[[ast.expr], bool | None]) -> bool:
    """Whether ``stmt`` may return early (``may_return``), short of being the return itself."""
    return may_return(stmt, test_value) and not isinstance(stmt, (ast.Return, ast.Break, ast.Continue))


def _no_return(stmt: ast.stmt) -> str:
    """The condition under which the statements after ``stmt`` (which may return early) run."""
    if isinstance(stmt, ast.If):
        return f"not ({ast.unparse(stmt.test)})"
    return f"no early return in the block at line {stmt.lineno}"


def _scan_expr(
    context: _Scan, ref: FunctionRef, node: ast.AST, conditions: tuple[str, ...]
) -> Iterator[Reach]:
    """The calls in one statement or expression, outside lambdas and nested scopes, with the sides
    of ``and``/``or``/``x if c else y`` an Ascend host may not take as conditions."""
    if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    if isinstance(node, ast.IfExp):
        yield from _scan_expr(context, ref, node.test, conditions)
        values = context.values(ref.path, node.test)
        text = ast.unparse(node.test)
        if True in values or None in values:
            yield from _scan_expr(
                context, ref, node.body, conditions if True in values else (*conditions, text)
            )
        if False in values or None in values:
            other = conditions if False in values else (*conditions, f"not ({text})")
            yield from _scan_expr(context, ref, node.orelse, other)
        return
    if isinstance(node, ast.BoolOp):
        inner = conditions
        for operand in node.values:
            yield from _scan_expr(context, ref, operand, inner)
            values = context.values(ref.path, operand)
            if values == {not isinstance(node.op, ast.And)}:
                return  # the later operands never run on NPU
            if values != {isinstance(node.op, ast.And)}:
                text = ast.unparse(operand)
                inner = (*inner, text if isinstance(node.op, ast.And) else f"not ({text})")
        return
    if isinstance(node, ast.Call):
        name = _dotted(node.func).rpartition(".")[2] or (
            node.func.attr if isinstance(node.func, ast.Attribute) else ""
        )
        if name:
            yield Reach("call", name, ref, node.lineno, conditions=conditions)
        reach = _call_reach(context.tree, ref, node, conditions, context.transfer)
        if reach is not None:
            yield reach
    for child in ast.iter_child_nodes(node):
        yield from _scan_expr(context, ref, child, conditions)


def _call_reach(
    tree: SourceTree, ref: FunctionRef, call: ast.Call, conditions: tuple[str, ...], transfer: bool
) -> Reach | None:
    func = _dotted(call.func)
    parts = func.split(".")
    # torch.cuda.<f>(...) / torch.cuda.<sub>.<f>(...)
    if len(parts) >= 3 and parts[:2] == ["torch", "cuda"]:
        name = parts[2]
        if name in HARMLESS_CUDA or (transfer and name in TORCH_NPU_NAMES):
            return None
        return Reach("torch.cuda", ast.unparse(call), ref, call.lineno, conditions=conditions)
    short = (
        parts[-1] if parts and parts[-1] else (call.func.attr if isinstance(call.func, ast.Attribute) else "")
    )
    # backend="nccl" handed to a process-group constructor
    if short in _PROCESS_GROUP_CALLS and any(_is_nccl(v) for v in _backend_values(call)):
        if transfer and short == "init_process_group":
            return None
        return Reach("nccl", ast.unparse(call), ref, call.lineno, conditions=conditions)
    # tensor.cuda(): Tensor.npu with transfer_to_npu
    if short == "cuda" and isinstance(call.func, ast.Attribute) and not transfer:
        return Reach("device", ast.unparse(call), ref, call.lineno, conditions=conditions)
    # a "cuda" device handed to torch
    if any(_is_cuda_device(v) for v in _device_values(call, short)):
        torch_call = parts[0] == "torch" or short in DEVICE_REWRITTEN
        if not torch_call or (transfer and short in DEVICE_REWRITTEN):
            return None
        return Reach("device", ast.unparse(call), ref, call.lineno, conditions=conditions)
    return None


def _backend_values(call: ast.Call) -> list[ast.expr]:
    return [k.value for k in call.keywords if k.arg == "backend"]


def _device_values(call: ast.Call, short: str) -> list[ast.expr]:
    values = [k.value for k in call.keywords if k.arg in ("device", "device_type", "map_location")]
    if short in ("to", "cuda", "pin_memory") and call.args:
        values.append(call.args[0])
    return values


def _is_nccl(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and "nccl" in node.value


def _is_cuda_device(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value == "cuda" or node.value.startswith("cuda:")
    if isinstance(node, ast.Call) and _dotted(node.func) == "torch.device" and node.args:
        return _is_cuda_device(node.args[0])
    return False


def _sglang_modules(tree: SourceTree, path: Path, stmt: ast.Import | ast.ImportFrom) -> list[str]:
    """The sglang modules an import statement in the module at ``path`` loads (the names of
    ``from package import name`` that are submodules included)."""
    if isinstance(stmt, ast.Import):
        return [a.name for a in stmt.names if a.name.split(".")[0] == "sglang"]
    module = tree.absolute_module(path, stmt)
    if module.split(".")[0] != "sglang":
        return []
    found = [module]
    found += [
        f"{module}.{a.name}" for a in stmt.names if a.name != "*" and tree.module_path(f"{module}.{a.name}")
    ]
    return found


def _absent_package(stmt: ast.Import | ast.ImportFrom) -> str:
    if isinstance(stmt, ast.Import):
        return next(
            (a.name.split(".")[0] for a in stmt.names if a.name.split(".")[0] in ABSENT_ON_ASCEND), ""
        )
    if stmt.level:
        return ""
    top = (stmt.module or "").split(".")[0]
    return top if top in ABSENT_ON_ASCEND else ""


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""
