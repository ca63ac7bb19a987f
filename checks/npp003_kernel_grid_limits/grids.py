"""Triton launches on a function's NPU path and their grids at a token count.

* **Kernels**: ``k[grid](...)`` where ``k`` denotes, on an Ascend host (``intervals.npu_bindings``:
  module-level rebindings under ``if _is_npu:`` followed), a function of the tree decorated with
  ``triton.jit`` / ``triton.autotune`` / ``triton.heuristics`` (or their bare imported names).
* **Where**: in the function itself and, with the arguments it passes bound, in the functions it
  calls (module functions through their NPU binding, ``self.m(...)`` through the MRO), at most
  ``MAX_CALLS`` calls deep, in the branches ``npuguards`` keeps on NPU and whose tests the
  deployment's numbers do not decide against (``intervals.truth``: ``num_v_heads // num_k_heads in
  [1, 2, 4]`` for the model's config).
* **Grid**: a tuple, a ``lambda META: (...)`` or a nested ``def grid(meta)``, or a local name
  bound to one of them before the launch; ``META`` holds the launch's constexpr arguments (by
  keyword or position), else the kernel's defaults, else, for an autotuned kernel, the smallest
  value of its configs (the largest grid: the worst case, said in the evidence).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from npudoctor.static.dataflow import imported_module
from npudoctor.static.intervals import (
    ACTIVATION,
    INF,
    TOKEN_COUNT,
    UNKNOWN,
    Env,
    Iv,
    Meta,
    Scope,
    Seq,
    as_iv,
    bind,
    evaluate,
    last_assignment,
    mul,
    npu_bindings,
    truth,
)
from npudoctor.static.npupath import live_nodes
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree
from npudoctor.static.walker import Frame, method_on

LIMIT = 65535  # Ascend coreDim: the product of a Triton grid's dimensions is a uint16
MAX_CALLS = 3
_DECORATORS = re.compile(r"(triton\.)?(jit|autotune|heuristics)|libentry")
_FORWARD = re.compile(r"_?forward\w*")
_DECODE_TEST = re.compile(r"is_decode\(|is_target_verify\(|is_decode_or_idle\(")
_GRAPH_TEST = re.compile(r"is_cuda_graph\b|get_is_capture_mode\(|is_capture_mode\b")


@dataclass(frozen=True)
class Kernel:
    ref: FunctionRef
    meta: tuple  # (name, Iv): constexpr defaults, then the autotune configs' smallest values
    autotuned: tuple  # names whose value is the smallest autotune config's


@dataclass(frozen=True)
class Step:
    """One call on the way from the path's function to the launch."""

    call: ast.Call
    callee: FunctionRef
    self_cls: ClassInfo | None
    bound_receiver: bool
    caller: FunctionRef


@dataclass
class Launch:
    frame: Frame
    steps: tuple[Step, ...]
    call: ast.Call
    kernel: Kernel
    function: FunctionRef  # the function holding the launch
    ambiguous: str | None = None  # why the call may reach another function on NPU
    phase: str = "any"


@dataclass
class Grid:
    """A launch's grid at one token count."""

    text: str
    dims: list[Iv] = field(default_factory=list)
    product: Iv = UNKNOWN
    resolved: bool = False
    notes: list[str] = field(default_factory=list)


# ----- kernels --------------------------------------------------------------------------------
def kernel_at(tree: SourceTree, path: Path, func: ast.expr) -> Kernel | None:
    """The Triton kernel ``func`` (the subscripted name of a launch) denotes on NPU, if one."""
    found: list = []
    if isinstance(func, ast.Name):
        found = npu_bindings(tree, path, func.id)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module = _module_named(tree, path, func.value.id)
        if module is not None:
            found = npu_bindings(tree, module, func.attr)
    refs = [f for f in found if isinstance(f, FunctionRef)]
    if len(refs) != 1 or len(found) != 1:
        return None
    return kernel_of(refs[0])


def kernel_of(ref: FunctionRef) -> Kernel | None:
    memo = ref.tree.memo.setdefault("npp003.kernels", {})
    key = id(ref.node)
    if key not in memo:
        memo[key] = _kernel_of(ref)
    return memo[key]


def _kernel_of(ref: FunctionRef) -> Kernel | None:
    names = [_decorator_name(d) for d in ref.node.decorator_list]
    if not any(_DECORATORS.fullmatch(n) for n in names) or b"triton" not in ref.tree.read(ref.path):
        return None
    meta: dict[str, Iv] = {}
    args = ref.node.args
    params = [*args.posonlyargs, *args.args]
    for param, default in zip(params[len(params) - len(args.defaults) :], args.defaults):
        if (
            isinstance(default, ast.Constant)
            and isinstance(default.value, int)
            and not isinstance(default.value, bool)
        ):
            meta[param.arg] = Iv(default.value, default.value)
    autotuned: list[str] = []
    for decorator in ref.node.decorator_list:
        if _decorator_name(decorator) in ("triton.autotune", "autotune") and isinstance(decorator, ast.Call):
            for name, value in _smallest_configs(ref, decorator).items():
                meta.setdefault(name, value)
                autotuned.append(name)
    return Kernel(ref, tuple(meta.items()), tuple(autotuned))


def _smallest_configs(ref: FunctionRef, decorator: ast.Call) -> dict[str, Iv]:
    configs = next((k.value for k in decorator.keywords if k.arg == "configs"), None)
    if configs is None and decorator.args:
        configs = decorator.args[0]
    if isinstance(configs, ast.Name):
        bound = _module_assignment(ref.tree, ref.path, configs.id)
        configs = bound
    smallest: dict[str, Iv] = {}
    if not isinstance(configs, (ast.List, ast.Tuple)):
        return smallest
    for element in configs.elts:
        if isinstance(element, ast.Call) and element.args and isinstance(element.args[0], ast.Dict):
            for key, value in zip(element.args[0].keys, element.args[0].values):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, int)
                ):
                    current = smallest.get(key.value)
                    if current is None or value.value < current.lo:
                        smallest[key.value] = Iv(value.value, value.value)
    return smallest


def _module_assignment(tree: SourceTree, path: Path, name: str) -> ast.expr | None:
    module = tree.parse(path)
    for stmt in module.body if module is not None else ():
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in stmt.targets
        ):
            return stmt.value
    return None


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target)


# ----- launches on a path function ------------------------------------------------------------
def launches(frame: Frame) -> Iterator[Launch]:
    """The Triton launches ``frame``'s function makes on NPU, directly or through its calls."""
    if not _has_launch(frame.function, frame.self_cls, MAX_CALLS):
        return
    yield from _search(frame, frame.function, frame.self_cls, (), None)


def _search(
    frame: Frame, ref: FunctionRef, self_cls, steps: tuple, ambiguous: str | None
) -> Iterator[Launch]:
    tree = ref.tree
    for node in live_nodes(ref):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Subscript):
            kernel = kernel_at(tree, ref.path, node.func.value)
            if kernel is not None:
                yield Launch(frame, steps, node, kernel, ref, ambiguous)
            continue
        if len(steps) >= MAX_CALLS:
            continue
        for callee, callee_cls, receiver, why in _callees(tree, ref, self_cls, node):
            if not _has_launch(callee, callee_cls, MAX_CALLS - len(steps) - 1):
                continue
            step = Step(node, callee, callee_cls, receiver, ref)
            yield from _search(frame, callee, callee_cls, (*steps, step), ambiguous or why)


def _callees(tree: SourceTree, ref: FunctionRef, self_cls, call: ast.Call):
    func = call.func
    if isinstance(func, ast.Name) and last_assignment(ref, func.id, call.lineno) is not None:
        # a local alias: ``split_fn = a if cond else b; split_fn(...)`` (0.5.23 qwen3_5.py)
        for name in _aliased(tree, ref, self_cls, func.id, call.lineno):
            yield from _callees(
                tree,
                ref,
                self_cls,
                ast.Call(func=ast.Name(id=name), args=call.args, keywords=call.keywords, lineno=call.lineno),
            )
        return
    if isinstance(func, ast.Name):
        found = npu_bindings(tree, ref.path, func.id)
        refs = [f for f in found if isinstance(f, FunctionRef)]
        why = None
        if refs and len(found) > 1:
            why = f"{func.id} is bound on NPU under a condition npudoctor cannot decide ({ref.relpath})"
        for callee in refs:
            yield callee, None, False, why
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id == "self" and self_cls is not None:
            method = method_on(tree, self_cls, func.attr)
            if method is not None:
                yield method, self_cls, True, None
            return
        module = _module_named(tree, ref.path, func.value.id)
        if module is not None:
            found = npu_bindings(tree, module, func.attr)
            refs = [f for f in found if isinstance(f, FunctionRef)]
            why = f"{func.value.id}.{func.attr} may be rebound on NPU" if refs and len(found) > 1 else None
            for callee in refs:
                yield callee, None, False, why


def _aliased(tree: SourceTree, ref: FunctionRef, self_cls, name: str, line: int) -> list[str]:
    """The module-level names a local ``name`` may hold at ``line``, branches of a conditional
    expression the device decides against left out."""
    assigned = last_assignment(ref, name, line)
    if assigned is None or assigned[0] or assigned[1] is None:
        return []
    value, at = assigned[1], assigned[2]
    if isinstance(value, ast.Name):
        return [] if last_assignment(ref, value.id, at) is not None else [value.id]
    if isinstance(value, ast.IfExp):
        decided = truth(value.test, Scope(ref, self_cls, _static_env(tree)), at)
        sides = (
            [value.body]
            if decided is True
            else [value.orelse]
            if decided is False
            else [value.body, value.orelse]
        )
        return [
            side.id
            for side in sides
            if isinstance(side, ast.Name) and last_assignment(ref, side.id, at) is None
        ]
    return []


def _static_env(tree: SourceTree) -> Env:
    """The numbers a device test needs none of (a branch decided by ``_is_npu`` and the like)."""
    memo = tree.memo.setdefault("npp003.static_env", {})
    if "env" not in memo:
        memo["env"] = Env(tree, {}, 1, 1, 1, 0)
    return memo["env"]


def _module_named(tree: SourceTree, path: Path, name: str) -> Path | None:
    memo = tree.memo.setdefault("npp003.modules", {})
    key = (path, name)
    if key not in memo:
        memo[key] = imported_module(tree, path, name)
    return memo[key]


def _has_launch(ref: FunctionRef, self_cls, depth: int) -> bool:
    memo = ref.tree.memo.setdefault("npp003.has_launch", {})
    key = (id(ref.node), id(self_cls), depth)
    if key in memo:
        return memo[key]
    memo[key] = False
    found = False
    for node in live_nodes(ref):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Subscript):
            if kernel_at(ref.tree, ref.path, node.func.value) is not None:
                found = True
                break
        elif depth > 0 and any(
            _has_launch(c, k, depth - 1) for c, k, _, _ in _callees(ref.tree, ref, self_cls, node)
        ):
            found = True
            break
    memo[key] = found
    return found


# ----- evaluating a launch --------------------------------------------------------------------
def replay(launch: Launch, env: Env) -> tuple[Scope | None, str | None]:
    """The scope of the launching function at ``env``'s token count, the path function's
    parameters read as activations where it is a ``forward*`` method, each call's arguments
    bound; and why a step is not taken (a branch test the numbers decide against)."""
    frame = launch.frame
    guess = frame.self_cls is not None and bool(_FORWARD.fullmatch(frame.function.name))
    scope = Scope(frame.function, frame.self_cls, env, _defaults(frame, env), guess)
    for step in launch.steps:
        if _decided_against(scope, step.call):
            return (
                None,
                f"the call at {step.caller.where(step.call.lineno)} is on a branch this deployment does not take",
            )
        inner = bind(step.callee, step.self_cls, step.call, scope, step.call.lineno, step.bound_receiver)
        if inner is None:
            return None, "too deep"
        scope = inner
    if _decided_against(scope, launch.call):
        return None, "the launch is on a branch this deployment does not take"
    return scope, None


def _defaults(frame: Frame, env: Env) -> dict:
    """The path function's parameters that have a default and do not hold activations: bound to
    it (nothing on the path is known to pass them; an opt-in flag such as ``defer_finalize=False``
    stays off)."""
    args = frame.function.node.args
    params = [*args.posonlyargs, *args.args]
    pairs = list(zip(params[len(params) - len(args.defaults) :], args.defaults))
    pairs += [(p, d) for p, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    scope = Scope(frame.function, frame.self_cls, env)
    return {
        p.arg: evaluate(d, scope)
        for p, d in pairs
        if not ACTIVATION.fullmatch(p.arg) and not TOKEN_COUNT.fullmatch(p.arg)
    }


def tests_around(ref: FunctionRef, node: ast.AST) -> list[tuple[ast.If, bool]]:
    """The ``if`` statements around ``node`` in ``ref``, outermost first, each with True when the
    node is in its body and False in its ``else`` (``dataflow.enclosing_tests``, memoised per
    function: one walk of its body for every node in it)."""
    memo = ref.tree.memo.setdefault("npp003.tests", {})
    key = id(ref.node)
    if key not in memo:
        chains: dict[int, tuple] = {}

        def visit(stmts: list[ast.stmt], chain: tuple) -> None:
            for stmt in stmts:
                if isinstance(stmt, ast.If):
                    for inner in ast.walk(stmt.test):
                        chains[id(inner)] = chain
                    visit(stmt.body, (*chain, (stmt, True)))
                    visit(stmt.orelse, (*chain, (stmt, False)))
                    continue
                blocks = [getattr(stmt, f, None) for f in ("body", "orelse", "finalbody")]
                blocks += [h.body for h in getattr(stmt, "handlers", ())]
                blocks += [c.body for c in getattr(stmt, "cases", ())]
                nested = [b for b in blocks if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    nested = []
                own = (
                    [stmt]
                    if not nested
                    else [getattr(stmt, f) for f in ("test", "iter", "target") if hasattr(stmt, f)]
                )
                own += [i for i in getattr(stmt, "items", ())]
                for part in own:
                    for inner in ast.walk(part):
                        chains[id(inner)] = chain
                for block in nested:
                    visit(block, chain)

        visit(ref.node.body, ())
        memo[key] = chains
    return list(memo[key].get(id(node), ()))


def phase(launch: Launch) -> str:
    """``graph`` when the way to the launch runs only in a graph replay (under ``is_cuda_graph``,
    capture mode), ``decode`` when only in a decode (or verify) forward, else ``any``."""
    sites = [(s.caller, s.call) for s in launch.steps] + [(launch.function, launch.call)]
    tests = [
        ast.unparse(test.test)
        for function, call in sites
        for test, taken in tests_around(function, call)
        if taken
    ]
    if any(_GRAPH_TEST.search(t) for t in tests):
        return "graph"
    functions = [launch.frame.function] + [s.callee for s in launch.steps]
    if any("decode" in f.name for f in functions) or any(_DECODE_TEST.search(t) for t in tests):
        return "decode"
    return "any"


def _decided_against(scope: Scope, call: ast.Call) -> bool:
    for test, taken in tests_around(scope.ref, call):
        value = truth(test.test, scope, call.lineno)
        if value is not None and value != taken:
            return True
    return False


def grid_of(launch: Launch, scope: Scope) -> Grid:
    """The launch's grid dimensions in ``scope``."""
    call = launch.call
    node = call.func.slice
    grid = Grid(ast.unparse(node))
    meta = _meta(launch, scope)
    value = _grid_value(node, scope, meta, call.lineno, grid)
    if value is None:
        return grid
    items = value.items if isinstance(value, Seq) and not value.uniform else (value,)
    grid.dims = [as_iv(v) for v in items]
    product = Iv(1, 1)
    for dim in grid.dims:
        product = mul(product, dim)
    grid.product = product
    grid.resolved = True
    autotuned = [n for n in launch.kernel.autotuned if n not in _given(launch)]
    if autotuned and any(n in grid.text or n in _lambda_text(node, scope, call.lineno) for n in autotuned):
        grid.notes.append(
            f"{', '.join(autotuned)} from the smallest autotune config of {launch.kernel.ref.name} (the largest grid)"
        )
    return grid


def _lambda_text(node: ast.expr, scope: Scope, line: int) -> str:
    if isinstance(node, ast.Name):
        assigned = last_assignment(scope.ref, node.id, line)
        if assigned is not None and assigned[1] is not None:
            return ast.unparse(assigned[1])
    return ""


def _grid_value(node: ast.expr, scope: Scope, meta: Meta, line: int, grid: Grid, depth: int = 0):
    if depth > 3:
        return None
    if isinstance(node, ast.Name):
        assigned = last_assignment(scope.ref, node.id, line)
        if assigned is not None and not assigned[0] and assigned[1] is not None:
            grid.text = f"{node.id} = {_short(assigned[1])}"
            return _grid_value(assigned[1], scope, meta, assigned[2] + 1, grid, depth + 1)
        value = evaluate(node, scope, line)
        return value
    if isinstance(node, ast.Lambda):
        params = [a.arg for a in node.args.args]
        inner = replace(scope, bound={**scope.bound, **{p: meta for p in params}}, meta=meta)
        return evaluate(node.body, inner, line)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        returns = [n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
        if len(returns) != 1:
            return None
        params = [a.arg for a in node.args.args]
        inner = replace(scope, bound={**scope.bound, **{p: meta for p in params}}, meta=meta)
        return evaluate(returns[0].value, inner, line)
    return evaluate(node, replace(scope, meta=meta), line)


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 100 else text[:97] + "..."


def _given(launch: Launch) -> set[str]:
    kernel = launch.kernel.ref.node
    params = [a.arg for a in [*kernel.args.posonlyargs, *kernel.args.args]]
    given = {k.arg for k in launch.call.keywords if k.arg}
    given.update(params[: len(launch.call.args)])
    return given


def _meta(launch: Launch, scope: Scope) -> Meta:
    kernel = launch.kernel.ref.node
    params = [a.arg for a in [*kernel.args.posonlyargs, *kernel.args.args]]
    values: dict[str, Iv] = dict(launch.kernel.meta)
    for param, arg in zip(params, launch.call.args):
        if isinstance(arg, ast.Starred):
            break
        value = evaluate(arg, scope, launch.call.lineno)
        if isinstance(value, Iv):
            values[param] = value
        else:
            values.pop(param, None)
    for keyword in launch.call.keywords:
        if keyword.arg:
            value = evaluate(keyword.value, scope, launch.call.lineno)
            if isinstance(value, Iv):
                values[keyword.arg] = value
            else:
                values.pop(keyword.arg, None)
    return Meta(tuple(values.items()))


def fmt(value: Iv) -> str:
    def text(x: float) -> str:
        return ("inf" if x > 0 else "-inf") if x in (INF, -INF) else str(int(x))

    if value.exact:
        return text(value.lo)
    return f">= {text(value.lo)}" if value.hi == INF else f"{text(value.lo)}..{text(value.hi)}"
