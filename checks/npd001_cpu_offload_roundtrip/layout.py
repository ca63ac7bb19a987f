"""NPD001 static layout probe: which view of each KV buffer do ``get_cpu_copy``/``load_cpu_copy`` index
with the request's token slots, and is its first dimension the token slots?

The offload path hands a pool the request's token slots (``indices``, the same slot numbers
``set_kv_buffer`` writes at) and the pool's copy methods index a per-layer view of each buffer with
them: ``buffer[layer][indices]``. That copies the right elements only when the view's first
dimension *is* the token slots, one token per row. The NPU pools allocate page-major buffers,
``(layers, pages, page_size, heads, dim)``; indexing such a layer with token slots addresses pages
(``IndexError`` past the page count, whole wrong pages below it). A view taken with the wrong row
size (``v_buffer.view(-1, heads, head_dim)`` on a V buffer of ``v_head_dim`` per head) addresses the
wrong bytes or does not exist.

The probe runs the pool's construction on symbols (``npudoctor.static.shapes.LayoutEvaluator``: pages,
page size and layers are symbols; heads and head dims are the deployment's numbers; the role's
``ASCEND_USE_FIA`` decides the branch), then runs each copy method with ``indices`` bound to a
token-slot marker that follows slicing and the pool's own helper calls, and records every tensor a
token-slot marker indexes (reads and writes). A view addresses tokens when its first dimension
equals the token-slot count of its storage: the product of the dimensions built from the pool's
sizes (``size // page_size + 1`` pages times ``page_size``, or ``size + page_size``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from npudoctor.static import shapes
from npudoctor.static.shapes import UNKNOWN, LayoutEvaluator, Repeated, Seq, Sym, Tensor
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree


class _Tokens:
    """The token slots of the request being offloaded (``indices`` and slices of it)."""

    def __repr__(self) -> str:
        return "TOKENS"


TOKENS = _Tokens()
_COMPARE = {
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}


@dataclass(frozen=True)
class Access:
    """One ``view[token slots]`` in a copy method: where, and the view's symbolic shape (or UNKNOWN)."""

    method: FunctionRef
    line: int
    text: str
    view: Any
    taken_at: str | None = None  # where the view was taken (``.view``/``.reshape``/``.flatten``), if one was

    @property
    def where(self) -> str:
        return f"{self.method.relpath}:{self.line}"


def token_slots(tensor: Tensor) -> Sym | None:
    """The token-slot count of a per-layer view: the product of the dimensions built from the pool's
    sizes (atoms naming ``size``: ``size // page_size + 1``, ``page_size``, ``size + page_size``)."""
    total = Sym(Fraction(1), tuple((a, p) for a, p in tensor.numel.atoms if "size" in a))
    return total if total.atoms else None


def addresses_tokens(tensor: Tensor) -> bool:
    """Whether indexing the view's first dimension with token slots addresses one token per row; a
    zero-width buffer (a placeholder with nothing to copy) trivially does."""
    if tensor.numel.coef == 0:
        return True
    return bool(tensor.shape) and tensor.shape[0] == token_slots(tensor)


def describe(tensor: Any) -> str:
    if not isinstance(tensor, Tensor):
        return "a value npudoctor cannot evaluate"
    return "(" + ", ".join(str(d) for d in tensor.shape) + ")"


class OffloadEvaluator(LayoutEvaluator):
    """``LayoutEvaluator`` that also follows token slots through the copy methods and records where
    they index a tensor; ``for``/comprehensions over a list of buffers run once per distinct buffer."""

    def __init__(self, tree: SourceTree, cls: ClassInfo, env: dict[str, str], params: dict[str, Any]):
        super().__init__(tree, cls, env, params)
        self.accesses: list[Access] = []
        self._seen: set[tuple[int, str]] = set()
        self._taken: dict[Tensor, str] = {}  # view -> file:line of the call that took it

    def run_copy(self, name: str) -> FunctionRef | None:
        method = self.tree.lookup(self.mro, name)
        if method is not None:
            self._invoke(method, [], {"indices": TOKENS})
        return method

    def _environment(self, attrs: dict[str, Any], local: dict[str, Any]) -> _UnionEnv:
        """Branches join as a union: an offload reads whatever any branch may have built."""
        return _UnionEnv(attrs, local)

    # ----- statements ------------------------------------------------------------
    def _exec(self, stmt: ast.stmt, env, method: FunctionRef) -> None:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Subscript):
                    self._eval(target, env, method)  # buffer[slots] = ...: the write side
        if isinstance(stmt, ast.For):
            elements = _elements(self._eval(stmt.iter, env, method))
            if elements:
                for element in elements:
                    self._store(stmt.target, element, env)
                    self._run(stmt.body, env, method)
                return
        super()._exec(stmt, env, method)

    def _store(self, target: ast.expr, value: Any, env) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, Seq):
            value = tuple(_items(value))
        super()._store(target, value, env)

    # ----- expressions -----------------------------------------------------------
    def _eval(self, node: ast.expr, env, method: FunctionRef) -> Any:
        if isinstance(node, (ast.BoolOp, ast.UnaryOp)) and not isinstance(
            getattr(node, "op", None), ast.USub
        ):
            decided = self._decide(node, env, method)
            return UNKNOWN if decided is None else decided
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Is, ast.IsNot))
        ):
            decided = self._decide(node, env, method)
            return UNKNOWN if decided is None else decided
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            left, right = self._eval(node.left, env, method), self._eval(node.comparators[0], env, method)
            if isinstance(left, Sym) and isinstance(right, Sym) and not left.atoms and not right.atoms:
                return _COMPARE[type(node.ops[0])](left.coef, right.coef)
            return UNKNOWN
        if isinstance(node, ast.Subscript):
            base = self._eval(node.value, env, method)
            if base is None:
                return None  # None[...] never runs: sglang guards it; the branch is not taken
            if base is TOKENS:
                return TOKENS  # indices[i : i + chunk] is still token slots
            if not isinstance(node.slice, ast.Slice):
                index = self._eval(node.slice, env, method)
                if index is TOKENS:
                    if base is not None:
                        self._record(node, base, method)
                    return (
                        Tensor((Sym.atom("slots"),) + base.shape[1:]) if isinstance(base, Tensor) else UNKNOWN
                    )
                if isinstance(base, tuple) and isinstance(index, Sym) and not index.atoms:
                    position = int(index.coef)
                    return base[position] if 0 <= position < len(base) else UNKNOWN
            return super()._eval(node, env, method)
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            generator = node.generators[0]
            elements = _elements(self._eval(generator.iter, env, method))
            if elements:
                results = []
                for element in elements:
                    inner = env.copy()
                    self._store(generator.target, element, inner)
                    if any(self._decide(test, inner, method) is False for test in generator.ifs):
                        continue
                    results.append(self._eval(node.elt, inner, method))
                return Seq(tuple(results))
        return super()._eval(node, env, method)

    def _eval_call(self, node: ast.Call, env, method: FunctionRef) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "len" and len(node.args) == 1:
            return Sym.atom(ast.unparse(node))  # a count (of layers, of indexer layers): a size symbol
        if isinstance(func, ast.Name) and func.id in ("zip", "list", "tuple") and node.args:
            first = self._eval(node.args[0], env, method)
            if func.id != "zip":
                return first if isinstance(first, Seq) else UNKNOWN
            items = _items(first) if isinstance(first, Seq) else None
            return Seq(tuple((item, UNKNOWN) for item in items)) if items else UNKNOWN
        if isinstance(func, ast.Attribute) and isinstance(func.value, (ast.Name, ast.Subscript)):
            receiver = self._eval(func.value, env, method)
            if receiver is None:
                return None
            view = UNKNOWN
            if isinstance(receiver, Tensor) and func.attr in ("view", "reshape") and node.args:
                view = shapes.view(receiver, node.args, [self._eval(a, env, method) for a in node.args])
            elif isinstance(receiver, Tensor) and func.attr == "flatten":
                view = _flatten(receiver, [self._eval(a, env, method) for a in node.args])
            if isinstance(view, Tensor):
                self._taken[view] = f"{method.relpath}:{node.lineno}"
                return view
        result = super()._eval_call(node, env, method)
        if (
            isinstance(func, ast.Attribute)
            and func.attr not in ("to", "view", "reshape", "contiguous", "clone")
            and result in (UNKNOWN, None)
            and any(self._eval(a, env, method) is TOKENS for a in node.args)
        ):
            return TOKENS  # a helper that maps token slots (to rank-local ones) returns token slots
        return result

    def _record(self, node: ast.Subscript, base: Any, method: FunctionRef) -> None:
        key = (id(node), describe(base))
        if key in self._seen:
            return
        self._seen.add(key)
        taken = self._taken.get(base) if isinstance(base, Tensor) else None
        self.accesses.append(Access(method, node.lineno, ast.unparse(node), base, taken))


def _items(seq: Seq) -> list[Any]:
    """A list's items in order; a ``Repeated`` run counts once."""
    return [p.element if isinstance(p, Repeated) else p for p in seq.parts]


def _elements(value: Any) -> list[Any]:
    """The distinct things a ``for`` over ``value`` binds, when ``value`` is a list npudoctor knows."""
    if not isinstance(value, Seq):
        return []
    distinct: list[Any] = []
    for item in _items(value):
        if item not in distinct:
            distinct.append(item)
    return distinct


class _UnionEnv(shapes._Env):
    """Branches that npudoctor cannot decide join as the union of what they build: a list that one
    branch extends keeps the extra buffers, a buffer that one branch leaves ``None`` keeps its
    tensor. The copy methods are checked on every buffer either branch could index."""

    def copy(self) -> _UnionEnv:
        return _UnionEnv(dict(self.attrs), dict(self.local))

    def merge(self, a, b) -> None:
        for target, left, right in ((self.attrs, a.attrs, b.attrs), (self.local, a.local, b.local)):
            target.clear()
            for key in left.keys() | right.keys():
                target[key] = _union(left.get(key, UNKNOWN), right.get(key, UNKNOWN))


def _union(left: Any, right: Any) -> Any:
    if left == right:
        return left
    if isinstance(left, Seq) and isinstance(right, Seq):
        items = _items(left)
        items += [item for item in _items(right) if item not in items]
        return Seq(tuple(items))
    if left is None and isinstance(right, Tensor):
        return right
    if right is None and isinstance(left, Tensor):
        return left
    return UNKNOWN


def _flatten(tensor: Tensor, values: list[Any]) -> Any:
    """``tensor.flatten(start, end)`` on symbols."""
    if not all(isinstance(v, Sym) and not v.atoms for v in values) or len(values) > 2:
        return UNKNOWN
    rank = len(tensor.shape)
    start, end = (int(v.coef) for v in (values + [Sym.const(0), Sym.const(-1)][len(values) :]))
    start, end = start % rank if rank else 0, end % rank if rank else 0
    merged = Sym.const(1)
    for dim in tensor.shape[start : end + 1]:
        merged = merged * dim
    return Tensor(tensor.shape[:start] + (merged,) + tensor.shape[end + 1 :])
