"""Symbolic evaluation of a pool class's tensor layouts, straight from its source.

Some properties are about sizes: a PD transfer item must be one page of the buffer the
pool really allocates. Reading that from the code means running the pool's
construction and its ``get_contiguous_buf_infos`` on symbols instead of numbers:
``torch.zeros((self.layer_num, self.size // self.page_size + 1, self.page_size, ...))``
becomes a tensor whose dimensions are products of named atoms, ``.view(-1, 1, h, d)``
divides them out again, ``x[0].nbytes`` multiplies the remaining dimensions by an
``itemsize`` atom. Conditions are decided where the deployment fixes them
(``get_bool_env_var("ASCEND_USE_FIA")`` from the role's environment, constructor
parameters from the model config); where not, both branches run and values that differ
become ``UNKNOWN``. Anything the evaluator does not understand is ``UNKNOWN`` too, so a
caller can say "cannot tell" instead of guessing.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from npudoctor.static.expressions import ExpressionEvaluator
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree, is_self


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()
_MAX_DEPTH = 12


@dataclass(frozen=True)
class Sym:
    """``coef * prod(atom ** power)``: a size built from named quantities."""

    coef: Fraction
    atoms: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def atom(name: str) -> Sym:
        return Sym(Fraction(1), ((name, 1),))

    @staticmethod
    def const(value: int) -> Sym:
        return Sym(Fraction(value))

    def __mul__(self, other: Sym) -> Sym:
        powers = Counter(dict(self.atoms))
        powers.update(dict(other.atoms))
        return Sym(self.coef * other.coef, tuple(sorted((a, p) for a, p in powers.items() if p)))

    def __truediv__(self, other: Sym) -> Sym:
        inverse = Sym(1 / other.coef, tuple((a, -p) for a, p in other.atoms))
        return self * inverse

    def is_integral(self) -> bool:
        return self.coef.denominator == 1 and all(p > 0 for _, p in self.atoms)

    def __str__(self) -> str:
        parts = [str(self.coef)] if self.coef != 1 or not self.atoms else []
        for atom, power in self.atoms:
            name = f"({atom})" if any(c in atom for c in " +-*/") else atom
            parts.append(name if power == 1 else f"{name}^{power}")
        return "*".join(parts)


@dataclass(frozen=True)
class Tensor:
    shape: tuple[Sym, ...]

    @property
    def numel(self) -> Sym:
        total = Sym.const(1)
        for dim in self.shape:
            total = total * dim
        return total


@dataclass(frozen=True)
class Repeated:
    """A list built by a comprehension or an append loop: every element is like ``element``."""

    element: Any


@dataclass(frozen=True)
class Seq:
    """A Python list as a concatenation of parts (``Repeated`` runs or single values)."""

    parts: tuple[Any, ...]


_SHAPE_PRESERVING = {"contiguous", "to", "clone", "detach", "float", "half", "bfloat16", "cpu", "npu", "cuda"}
_FACTORIES = {"zeros", "empty", "ones", "full", "randn", "rand"}


class _Env:
    def __init__(self, attrs: dict[str, Any], local: dict[str, Any]):
        self.attrs = attrs
        self.local = local

    def copy(self) -> _Env:
        return _Env(dict(self.attrs), dict(self.local))

    def merge(self, a: _Env, b: _Env) -> None:
        for target, left, right in ((self.attrs, a.attrs, b.attrs), (self.local, a.local, b.local)):
            target.clear()
            for key in left.keys() | right.keys():
                lv, rv = left.get(key, UNKNOWN), right.get(key, UNKNOWN)
                target[key] = lv if lv == rv else UNKNOWN


class _Return:
    def __init__(self, value: Any):
        self.value = value


class LayoutEvaluator:
    """Runs one pool class's methods on symbols.

    ``env`` is the role's environment (for ``get_bool_env_var``); ``params`` binds the
    names the deployment decides, as method parameters and as ``self`` attributes
    (``index_head_dim=None`` for a model without an indexer, ``is_quantized_kv_cache=False``
    for an unquantized KV cache). Every other parameter becomes an atom named after itself.
    """

    def __init__(self, tree: SourceTree, cls: ClassInfo, env: dict[str, str], params: dict[str, Any]):
        self.tree = tree
        self.cls = cls
        self.mro = tree.mro(cls)
        self.env = env
        self.params = params
        self.self_attrs: dict[str, Any] = {}
        self._depth = 0

    # ----- entry points ------------------------------------------------------------
    def construct(self) -> None:
        init = self.tree.lookup(self.mro, "__init__")
        if init is not None:
            self._invoke(init, [], {})

    def call(self, name: str) -> Any:
        method = self.tree.lookup(self.mro, name)
        return UNKNOWN if method is None else self._invoke(method, [], {})

    # ----- execution ---------------------------------------------------------------
    def _environment(self, attrs: dict[str, Any], local: dict[str, Any]) -> _Env:
        """The environment a method runs in (an evaluator that joins branches differently
        overrides it)."""
        return _Env(attrs, local)

    def _invoke(self, method: FunctionRef, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if self._depth >= _MAX_DEPTH:
            return UNKNOWN
        env = self._environment(self.self_attrs, self._bind(method.node.args, args, kwargs))
        self._depth += 1
        try:
            outcome = self._run(method.node.body, env, method)
        finally:
            self._depth -= 1
        self.self_attrs = env.attrs
        return outcome.value if isinstance(outcome, _Return) else None

    def _bind(self, spec: ast.arguments, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Arguments passed win; then deployment-decided ``params``; then constant defaults; else an atom."""
        positional = spec.posonlyargs + spec.args
        defaults = dict(
            zip([a.arg for a in positional[len(positional) - len(spec.defaults) :]], spec.defaults)
        )
        defaults.update({a.arg: d for a, d in zip(spec.kwonlyargs, spec.kw_defaults) if d is not None})
        local: dict[str, Any] = {}
        for arg in positional[1:] + spec.kwonlyargs:  # [1:] drops self
            name = arg.arg
            default = defaults.get(name)
            if name in self.params:
                local[name] = self.params[name]
            elif isinstance(default, ast.Constant) and not isinstance(default.value, (int, float)):
                local[name] = default.value  # None / bool / str: the caller relies on the default
            else:
                local[name] = Sym.atom(name)
        names = [a.arg for a in positional[1:]]
        for name, value in list(zip(names, args)) + list(kwargs.items()):
            if name in local and value is not UNKNOWN:
                local[name] = value
        return local

    def _run(self, body: list[ast.stmt], env: _Env, method: FunctionRef) -> _Return | None:
        for index, stmt in enumerate(body):
            if isinstance(stmt, ast.Return):
                return _Return(self._eval(stmt.value, env, method) if stmt.value else None)
            if isinstance(stmt, ast.If):
                decided = self._decide(stmt.test, env, method)
                if decided is not None:
                    outcome = self._run(stmt.body if decided else stmt.orelse, env, method)
                    if outcome is not None:
                        return outcome
                    continue
                left, right = env.copy(), env.copy()
                out_left = self._run(stmt.body, left, method)
                out_right = self._run(stmt.orelse, right, method)
                if out_left is None and out_right is None:
                    env.merge(left, right)
                    continue
                rest = body[index + 1 :]  # a branch returned: finish the other path, then join
                if out_left is None:
                    out_left = self._run(rest, left, method)
                if out_right is None:
                    out_right = self._run(rest, right, method)
                env.merge(left, right)
                lv = out_left.value if out_left else None
                rv = out_right.value if out_right else None
                return _Return(lv if lv == rv else UNKNOWN)
            self._exec(stmt, env, method)
        return None

    def _exec(self, stmt: ast.stmt, env: _Env, method: FunctionRef) -> None:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            value = self._eval(stmt.value, env, method)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                self._store(target, value, env)
        elif isinstance(stmt, ast.AugAssign):
            current = self._eval(stmt.target, env, method)
            value = self._eval(stmt.value, env, method)
            self._store(stmt.target, _binop(stmt.op, current, value), env)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            self._eval(stmt.value, env, method)
        elif isinstance(stmt, (ast.With, ast.Try)):
            for block in [stmt.body] + ([stmt.finalbody] if isinstance(stmt, ast.Try) else []):
                outcome = self._run(block, env, method)
                if outcome is not None:
                    return
        elif isinstance(stmt, ast.For):
            self._store(stmt.target, Sym.atom(ast.unparse(stmt.target)), env)
            self._run(stmt.body, env, method)

    def _store(self, target: ast.expr, value: Any, env: _Env) -> None:
        if isinstance(target, ast.Attribute) and is_self(target.value):
            env.attrs[target.attr] = value
        elif isinstance(target, ast.Name):
            env.local[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = value if isinstance(value, tuple) and len(value) == len(target.elts) else None
            for i, element in enumerate(target.elts):
                self._store(element, values[i] if values else UNKNOWN, env)

    # ----- expressions -------------------------------------------------------------
    def _decide(self, test: ast.expr, env: _Env, method: FunctionRef) -> bool | None:
        return _LayoutExpression(self, env, method).decide(test)

    def _eval(self, node: ast.expr, env: _Env, method: FunctionRef) -> Any:
        return _LayoutExpression(self, env, method).interpret(node)

    def _self_attribute(self, name: str, env: _Env) -> Any:
        """A deployment-decided value, an assigned attribute, a property's result, or an atom."""
        if name in self.params:
            return self.params[name]
        if name in env.attrs:
            return env.attrs[name]
        prop = self.tree.lookup(self.mro, name)
        if prop is not None and any(ast.unparse(d) == "property" for d in prop.node.decorator_list):
            return self._invoke(prop, [], {})
        return Sym.atom(name)

    def _eval_call(self, node: ast.Call, env: _Env, method: FunctionRef) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "get_bool_env_var" and node.args:
            name = self._eval(node.args[0], env, method)
            default = self._eval(node.args[1], env, method) if len(node.args) > 1 else "false"
            if isinstance(name, str):
                raw = self.env.get(name, default if isinstance(default, str) else "false")
                return str(raw).strip().lower() in ("true", "1")
            return UNKNOWN
        if not isinstance(func, ast.Attribute):
            return UNKNOWN
        receiver = func.value
        if isinstance(receiver, ast.Name) and receiver.id == "torch" and func.attr in _FACTORIES:
            return self._factory(node, env, method)
        args = [self._eval(a, env, method) for a in node.args]
        kwargs = {k.arg: self._eval(k.value, env, method) for k in node.keywords if k.arg}
        if is_self(receiver):
            target = self.tree.lookup(self.mro, func.attr)
            return UNKNOWN if target is None else self._invoke(target, args, kwargs)
        if (
            isinstance(receiver, ast.Call)
            and isinstance(receiver.func, ast.Name)
            and receiver.func.id == "super"
        ):
            position = next((i for i, c in enumerate(self.mro) if c is method.owner), None)
            if receiver.args:
                named = self.tree.resolve_name(method.owner.path, ast.unparse(receiver.args[0]))
                position = next(
                    (i for i, c in enumerate(self.mro) if named is not None and c is named), position
                )
            target = None if position is None else self.tree.lookup(self.mro, func.attr, position + 1)
            return UNKNOWN if target is None else self._invoke(target, args, kwargs)
        value = self._eval(receiver, env, method)
        if func.attr == "append" and isinstance(value, Seq) and args:
            self._store(receiver, Seq(value.parts + (Repeated(args[0]),)), env)
            return None
        if isinstance(value, Tensor):
            if func.attr in _SHAPE_PRESERVING:
                return value
            if func.attr in ("view", "reshape"):
                return view(value, node.args, args)
        return UNKNOWN

    def _factory(self, node: ast.Call, env: _Env, method: FunctionRef) -> Any:
        shape_node = (
            node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "size"), None)
        )
        if shape_node is None:
            return UNKNOWN
        if isinstance(shape_node, (ast.Tuple, ast.List)):
            dims = [self._eval(e, env, method) for e in shape_node.elts]
        else:
            dims = [self._eval(a, env, method) for a in node.args]
        if not all(isinstance(d, Sym) for d in dims):
            return UNKNOWN
        return Tensor(tuple(dims))


class _LayoutExpression(ExpressionEvaluator):
    """An expression of a pool's method on symbols (``LayoutEvaluator``'s policy for the shared
    evaluator): ints are sizes, a name is its local or an atom named after itself, ``self.<attr>``
    what the class assigned, a test is decided only by ``is None`` / ``is not None`` and booleans.
    Sub-expressions and sub-tests go back through the ``LayoutEvaluator``, whose subclasses refine
    them."""

    unknown = UNKNOWN

    def __init__(self, layout: LayoutEvaluator, env: _Env, method: FunctionRef):
        self.layout, self.env, self.method = layout, env, method

    def evaluate(self, node: ast.expr) -> Any:
        return self.layout._eval(node, self.env, self.method)

    def truth(self, test: ast.expr) -> bool | None:
        return self.layout._decide(test, self.env, self.method)

    def constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, bool) or node.value is None or isinstance(node.value, str):
            return node.value
        if isinstance(node.value, int):
            return Sym.const(node.value)
        return UNKNOWN

    def sequence(self, node: ast.Tuple | ast.List, items: list) -> Any:
        return Seq(tuple(items)) if isinstance(node, ast.List) else tuple(items)

    def name(self, node: ast.Name) -> Any:
        return self.env.local.get(node.id, Sym.atom(node.id))

    def attribute(self, node: ast.Attribute) -> Any:
        if is_self(node.value):
            return self.layout._self_attribute(node.attr, self.env)
        base = self.evaluate(node.value)
        if node.attr == "nbytes" and isinstance(base, Tensor):
            return base.numel * Sym.atom("itemsize")
        return UNKNOWN

    def subscript(self, node: ast.Subscript) -> Any:
        return _index(self.evaluate(node.value), node.slice)

    def binop(self, node: ast.BinOp, left: Any, right: Any) -> Any:
        result = _binop(node.op, left, right)
        if result is UNKNOWN and isinstance(left, Sym) and isinstance(right, Sym):
            return Sym.atom(ast.unparse(node))  # size // page_size + 1 and the like
        return result

    def call(self, node: ast.Call) -> Any:
        return self.layout._eval_call(node, self.env, self.method)

    def other(self, node: ast.expr) -> Any:
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            inner = self.env.copy()
            target = node.generators[0].target
            self.layout._store(target, Sym.atom(ast.unparse(target)), inner)
            return Seq((Repeated(self.layout._eval(node.elt, inner, self.method)),))
        return UNKNOWN

    def compare(self, node: ast.Compare) -> bool | None:
        if not isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            return self.truthiness(node)  # what a subclass's evaluation makes of it
        left, right = self.evaluate(node.left), self.evaluate(node.comparators[0])
        if right is None and left is not UNKNOWN:
            result = left is None
            return result if isinstance(node.ops[0], ast.Is) else not result
        return None


def _binop(op: ast.operator, left: Any, right: Any) -> Any:
    if isinstance(op, ast.Mult) and isinstance(left, Sym) and isinstance(right, Sym):
        return left * right
    if isinstance(op, ast.Add) and isinstance(left, Seq) and isinstance(right, Seq):
        return Seq(left.parts + right.parts)
    return UNKNOWN


def _index(value: Any, index: ast.expr) -> Any:
    if isinstance(value, Seq):
        kinds = {type(p) for p in value.parts}
        elements = [p.element if isinstance(p, Repeated) else p for p in value.parts]
        return elements[0] if elements and all(e == elements[0] for e in elements) and kinds else UNKNOWN
    if isinstance(value, Tensor):
        if isinstance(index, ast.Slice):
            return UNKNOWN if index.lower or index.upper else value
        if isinstance(index, ast.Tuple):
            return UNKNOWN
        return Tensor(value.shape[1:]) if value.shape else UNKNOWN
    return UNKNOWN


def view(tensor: Tensor, nodes: list[ast.expr], values: list[Any]) -> Any:
    """``tensor.view(...)``/``.reshape(...)`` on symbols (``nodes`` as written, ``values`` evaluated).

    ``.view(dtype)`` keeps the shape; a shape given as one tuple, a non-size argument, or more
    than one ``-1`` is ``UNKNOWN``, and so is a ``-1`` next to a zero-width dimension (a placeholder
    buffer: nothing determines it). An inferred dimension that does not divide evenly
    (``view(-1, h, d)`` of a buffer whose rows hold ``h * d'`` elements) is kept as the fraction it
    is: torch raises or the view reads the wrong bytes, and NPD001 must see a view that addresses
    no token rows rather than one it cannot evaluate."""
    if len(nodes) == 1:
        if isinstance(nodes[0], (ast.Tuple, ast.List)):
            return UNKNOWN
        text = ast.unparse(nodes[0])
        if "dtype" in text or text.startswith("torch."):
            return tensor  # .view(dtype): same shape, another element type
    dims: list[Sym | None] = []
    for node, value in zip(nodes, values):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            dims.append(None)
        elif isinstance(value, Sym):
            dims.append(value)
        else:
            return UNKNOWN
    if dims.count(None) > 1:
        return UNKNOWN
    if None in dims:
        known = Sym.const(1)
        for dim in dims:
            if dim is not None:
                known = known * dim
        if known.coef == 0:
            return UNKNOWN
        dims[dims.index(None)] = tensor.numel / known
    return Tensor(tuple(dims))


def flatten(seq: Any) -> list[Any]:
    """The element kinds of a ``Seq`` in order, one per part (a ``Repeated`` counts once)."""
    if not isinstance(seq, Seq):
        return []
    return [p.element if isinstance(p, Repeated) else p for p in seq.parts]
