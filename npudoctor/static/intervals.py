"""What an integer expression in sglang's source is worth for a deployment at a token count T: the
interval interpreter of the static toolkit, over integer intervals, tensors known by their first
dimension and the model's config.

A size in the source (a Triton grid's dimensions, a buffer's rows, a loop's bound) is an
expression over shapes, constants, the model's config and the parallel sizes. Each expression is
evaluated to an interval ``[lo, hi]`` of the values it can take on an Ascend host, with ``tok``
set when it follows the token count (NPP003 bounds the product of a Triton grid's dimensions,
which Ascend launches only while it is at most 65535):

* numbers: literals, module constants, ``triton.cdiv``/``next_power_of_2``/``min``/``max``, the
  model's ``config.<key>`` (config.json, a multimodal wrapper's text_config merged in), the TP
  and attention-TP sizes (``get_attention_tp_size()`` and the like);
* tensors (``Tensor``) by their first dimension: a parameter of a layer's or backend's
  ``forward*`` method holding activations (annotated ``torch.Tensor`` or named like one) has T
  rows; ``x.shape[0]``, ``x.size(0)``, ``len(x)``, ``x.shape`` unpacked give it back; a module
  call, ``view(-1, ...)``, ``contiguous()``, ``torch.empty((n, ...))``, ``empty_like``, a split
  along the last dimension keep it; the return value of a function of the tree is evaluated with
  the caller's arguments bound;
* ``self.<attr>``: the one value the class's constructor assigns, evaluated in the constructor;
* anything else is unknown: a positive integer, ``[1, inf)``.

Products of lower bounds are lower bounds, so a product whose ``lo`` exceeds a limit exceeds it
for certain; one whose ``hi`` exceeds it while ``lo`` does not is not known.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from npudoctor.static.expressions import ExpressionEvaluator, compare_known
from npudoctor.static.npuguards import dotted, module_binding, value_on_npu
from npudoctor.static.npupath import live_nodes
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree
from npudoctor.static.walker import method_on

INF = math.inf
MAX_DEPTH = 4


@dataclass(frozen=True)
class Iv:
    """An integer known to lie in ``[lo, hi]``; ``tok``: it follows the token count."""

    lo: float
    hi: float
    tok: bool = False

    @property
    def exact(self) -> bool:
        return self.lo == self.hi


UNKNOWN = Iv(1, INF)


@dataclass(frozen=True)
class Tensor:
    """A tensor of which the first dimension is known."""

    dim0: Iv


@dataclass(frozen=True)
class Shape:
    """``x.shape`` of a tensor: the first dimension known, the others not."""

    dim0: Iv


@dataclass(frozen=True)
class Seq:
    """A tuple or list of values; ``uniform``: any number of items, each ``items[0]``."""

    items: tuple
    uniform: bool = False

    def item(self, index: int):
        if self.uniform:
            return self.items[0]
        return self.items[index] if -len(self.items) <= index < len(self.items) else None


@dataclass(frozen=True)
class Config:
    """The model's config (``config.json`` keys)."""

    data: tuple  # sorted items, hashable


@dataclass(frozen=True)
class Const:
    """A non-integer Python constant (a string, a bool, None)."""

    value: object


@dataclass(frozen=True)
class Meta:
    """The ``META`` mapping a grid callable receives: the kernel's constexpr values."""

    values: tuple  # (name, Iv) pairs


@dataclass
class Env:
    """The deployment's numbers every evaluation shares, and the token count T."""

    tree: SourceTree
    config: dict
    tp: int
    attn_tp: int
    dp: int
    tokens: int
    memo: dict = field(default_factory=dict)


@dataclass
class Scope:
    """One function as it runs: its arguments (``bound``), the class it runs on, whether its
    unbound parameters may be read as activations (``guess``)."""

    ref: FunctionRef
    self_cls: ClassInfo | None
    env: Env
    bound: dict = field(default_factory=dict)
    guess: bool = False
    depth: int = 0
    meta: Meta | None = None  # inside a grid callable


# the names of activations (one row per token) and of token counts, for parameters nothing binds
ACTIVATION = re.compile(
    r"(hidden_states?|x|q|k|v|query|key|value|qkv|mixed_qkvz?|mixed_ba|z|a|b|gate|input|inputs|"
    r"input_ids|positions|attn_output|router_logits|topk_ids|topk_weights|residual|out_cache_loc|"
    r"projected_states_\w+|\w*_hidden_states)"
)
TOKEN_COUNT = re.compile(r"(num_tokens|n_tokens|num_token|ntokens|total_tokens|token_num|num_tokens_\w+)")
NOT_ACTIVATION = re.compile(
    r".*(lens?|len_\w*|indices|index|idx|start|offset|page|table|state|cache|slot|mask)s?$"
)
_CDIV = {"cdiv", "ceil_div", "div_up", "ceildiv", "triton.cdiv", "ceil_divide"}
_POW2 = {"next_power_of_2", "triton.next_power_of_2", "next_pow2"}
_KEEPS_ROWS = {
    "contiguous", "to", "float", "half", "bfloat16", "clone", "detach", "view_as", "reshape_as",
    "type_as", "sigmoid", "exp", "mul", "add", "sub", "div", "mul_", "add_", "neg", "squeeze",
}  # fmt: skip
_TORCH_FACTORIES = {"empty", "zeros", "ones", "full", "randn", "rand", "empty_strided"}
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "randn_like"}


def as_iv(value) -> Iv:
    if isinstance(value, Iv):
        return value
    if isinstance(value, Const) and isinstance(value.value, bool):
        return Iv(int(value.value), int(value.value))
    return UNKNOWN


# ----- arithmetic -----------------------------------------------------------------------------
def mul(a: Iv, b: Iv) -> Iv:
    corners = [_times(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Iv(min(corners), max(corners), a.tok or b.tok)


def _times(x: float, y: float) -> float:
    return 0 if x == 0 or y == 0 else x * y


def _floordiv(a: Iv, b: Iv, ceil: bool = False) -> Iv:
    if b.lo <= 0:
        return Iv(-INF if a.lo < 0 else 0, INF, a.tok or b.tok)

    def div(x: float, y: float) -> float:
        if math.isinf(y):
            return (1 if ceil and x > 0 else 0) if not math.isinf(x) else INF
        if math.isinf(x):
            return x
        return -(-x // y) if ceil else x // y

    values = [div(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Iv(min(values), max(values), a.tok or b.tok)


def _next_pow2(a: Iv) -> Iv:
    def up(x: float) -> float:
        return x if math.isinf(x) or x <= 1 else 1 << (int(x) - 1).bit_length()

    return Iv(up(a.lo), up(a.hi), a.tok)


def binop(op: ast.operator, a: Iv, b: Iv) -> Iv:
    tok = a.tok or b.tok
    if isinstance(op, ast.Add):
        return Iv(a.lo + b.lo, a.hi + b.hi, tok)
    if isinstance(op, ast.Sub):
        return Iv(a.lo - b.hi, a.hi - b.lo, tok)
    if isinstance(op, ast.Mult):
        return mul(a, b)
    if isinstance(op, ast.FloorDiv):
        return _floordiv(a, b)
    if isinstance(op, ast.Mod):
        return Iv(0, max(b.hi - 1, 0), tok)
    if isinstance(op, ast.Pow) and a.exact and b.exact and 0 <= b.lo < 64:
        return Iv(a.lo**b.lo, a.hi**b.hi, tok)
    if isinstance(op, ast.LShift) and b.exact and 0 <= b.lo < 64:
        return Iv(a.lo * 2**b.lo, a.hi * 2**b.lo, tok)
    if isinstance(op, ast.RShift) and b.exact and 0 <= b.lo < 64:
        return _floordiv(a, Iv(2**b.lo, 2**b.lo), False)
    return Iv(-INF, INF, tok)


# ----- the evaluator --------------------------------------------------------------------------
def evaluate(node: ast.AST | None, scope: Scope, line: int | None = None):
    """The abstract value of ``node`` in ``scope`` just before ``line`` (its own line by default)."""
    if node is None:
        return None
    line = getattr(node, "lineno", 0) if line is None else line
    try:
        return _eval(node, scope, line)
    except RecursionError:
        return None


def _eval(node: ast.AST, scope: Scope, line: int):
    return _Intervals(scope, line).interpret(node)


def truth(test: ast.AST, scope: Scope, line: int | None = None) -> bool | None:
    """A branch test: True/False where the device (``npuguards``) or the numbers decide, else None."""
    return _Intervals(scope, getattr(test, "lineno", 0) if line is None else line).truth(test)


class _Intervals(ExpressionEvaluator):
    """An expression of one function as it runs (``scope``), just before ``line``, in this module's
    domain (the shared evaluator's policy): ints are exact intervals, other constants ``Const``,
    arithmetic is interval arithmetic (``/`` only inside ``math.ceil``/``int``: a ceiling
    division), a test in a value's place its ``Const`` truth, a conditional expression not decided
    the hull of both sides; names, attributes, subscripts and calls as the functions below read
    them. A test is decided by the device (``npuguards``) first, at every level, then by the
    numbers: a name, attribute or call whose value is a bool or an exact interval, a comparison of
    exact intervals, ``in`` a sequence of them."""

    def __init__(self, scope: Scope, line: int):
        self.scope, self.line = scope, line

    def evaluate(self, node: ast.expr):
        return _eval(node, self.scope, self.line)

    def truth(self, test: ast.expr) -> bool | None:
        on_npu = value_on_npu(self.scope.env.tree, self.scope.ref.path, test)
        return on_npu if on_npu is not None else self.decide(test)

    def constant(self, node: ast.Constant):
        if isinstance(node.value, int) and not isinstance(node.value, bool):
            return Iv(node.value, node.value)
        return Const(node.value)

    def sequence(self, node: ast.Tuple | ast.List, items: list):
        return Seq(tuple(items))

    def name(self, node: ast.Name):
        return _name(node.id, self.scope, self.line)

    def attribute(self, node: ast.Attribute):
        return _attribute(node, self.scope, self.line)

    def subscript(self, node: ast.Subscript):
        return _subscript(node, self.scope, self.line)

    def call(self, node: ast.Call):
        return _call(node, self.scope, self.line)

    def binop(self, node: ast.BinOp, left, right):
        if isinstance(node.op, ast.Div):  # true division: only inside math.ceil / int
            return _floordiv(as_iv(left), as_iv(right), True)
        return binop(node.op, as_iv(left), as_iv(right))

    def unary(self, node: ast.UnaryOp):
        if not isinstance(node.op, ast.USub):
            return None
        value = as_iv(self.evaluate(node.operand))
        return Iv(-value.hi, -value.lo, value.tok)

    def condition(self, node: ast.expr):
        value = self.truth(node)
        return None if value is None else Const(value)

    def join(self, body, orelse) -> Iv:
        a, b = as_iv(body), as_iv(orelse)
        return Iv(min(a.lo, b.lo), max(a.hi, b.hi), a.tok or b.tok)

    def truthiness(self, operand: ast.expr) -> bool | None:
        if not isinstance(operand, (ast.Name, ast.Attribute, ast.Call)):
            return None
        value = evaluate(operand, self.scope, self.line)
        if isinstance(value, Const) and isinstance(value.value, bool):
            return value.value
        if isinstance(value, Iv) and value.exact:
            return bool(value.lo)
        return None

    def compare(self, node: ast.Compare) -> bool | None:
        left = evaluate(node.left, self.scope, self.line)
        right = evaluate(node.comparators[0], self.scope, self.line)
        if not (isinstance(left, Iv) and left.exact):
            return None
        if isinstance(node.ops[0], (ast.In, ast.NotIn)) and isinstance(right, Seq):
            if right.uniform or not all(isinstance(i, Iv) and i.exact for i in right.items):
                return None
            return compare_known(node.ops[0], left.lo, tuple(i.lo for i in right.items))
        if isinstance(right, Iv) and right.exact:
            return compare_known(node.ops[0], left.lo, right.lo)
        return None


def _name(name: str, scope: Scope, line: int):
    if scope.meta is not None and name in ("META", "meta"):
        return scope.meta
    assigned = last_assignment(scope.ref, name, line)
    if assigned is not None:
        target_path, value, at = assigned
        if value is None or scope.depth > 40:
            return None
        inner = Scope(
            scope.ref, scope.self_cls, scope.env, scope.bound, scope.guess, scope.depth + 1, scope.meta
        )
        result = _eval(value, inner, at)
        for index in target_path:
            result = _unpack(result, index, value, inner, at)
        return result
    if name in scope.bound:
        return scope.bound[name]
    param = next((p for p in scope.ref.parameters if p.arg == name), None)
    if param is not None:
        return _guess(param, scope) if scope.guess else None
    if name == "config":
        return None
    return _module_value(scope.env, scope.ref.path, name)


def _guess(param: ast.arg, scope: Scope):
    """An unbound parameter of a ``forward*`` method: an activation has T rows, a token count is T."""
    name = param.arg
    tokens = Iv(scope.env.tokens, scope.env.tokens, True)
    if TOKEN_COUNT.fullmatch(name):
        return tokens
    if ACTIVATION.fullmatch(name):
        return Tensor(tokens)
    if NOT_ACTIVATION.match(name) or name in ("self", "forward_batch", "layer"):
        return None
    annotation = ast.unparse(param.annotation) if param.annotation is not None else ""
    if re.fullmatch(r"(Optional\[)?torch\.Tensor\]?", annotation):
        return Tensor(tokens)
    return None


def _module_value(env: Env, path: Path, name: str):
    memo = env.memo.setdefault("module", {})
    key = (path, name)
    if key not in memo:
        memo[key] = None
        bound = module_binding(env.tree, path, name)
        if bound is not None and isinstance(bound[1], (ast.Constant, ast.BinOp)):
            module_scope = Scope(
                FunctionRef(ast.FunctionDef(name="<module>", args=_NO_ARGS), bound[0], env.tree), None, env
            )
            memo[key] = evaluate(bound[1], module_scope)
    return memo[key]


_NO_ARGS = ast.arguments(
    posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]
)


def _unpack(value, index: int, node: ast.AST, scope: Scope, line: int):
    if isinstance(value, Seq):
        return value.item(index)
    if isinstance(value, Shape):
        return value.dim0 if index == 0 else None
    if isinstance(value, Tensor):  # ``out, _ = self.proj(x)``: a layer returns (output, bias)
        return value if index == 0 else None
    return None


def _attribute(node: ast.Attribute, scope: Scope, line: int):
    if isinstance(node.value, ast.Name) and node.value.id == "self" and scope.self_cls is not None:
        return instance_value(scope.env, scope.self_cls, node.attr)
    if isinstance(node.value, ast.Call) and dotted(node.value.func).rpartition(".")[2] == "get_parallel":
        # 0.5.2x's runtime context: get_parallel().attn_tp_size
        sizes = {"attn_tp_size": scope.env.attn_tp, "tp_size": scope.env.tp, "attn_dp_size": scope.env.dp}
        return Iv(sizes[node.attr], sizes[node.attr]) if node.attr in sizes else None
    base = _eval(node.value, scope, line)
    if isinstance(base, Tensor) and node.attr == "shape":
        return Shape(base.dim0)
    if isinstance(base, Config):
        value = dict(base.data).get(node.attr)
        if isinstance(value, int) and not isinstance(value, bool):
            return Iv(value, value)
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            return Seq(tuple(Iv(v, v) for v in value))
        return Const(value) if value is not None else None
    return None


def _subscript(node: ast.Subscript, scope: Scope, line: int):
    if (
        _is_kwargs(node.value, scope)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return _keyword_argument(node.slice.value, scope)
    base = _eval(node.value, scope, line)
    if isinstance(base, Meta) and isinstance(node.slice, ast.Constant):
        return dict(base.values).get(node.slice.value, UNKNOWN)
    index = node.slice
    if isinstance(index, ast.Constant) and isinstance(index.value, int):
        if isinstance(base, (Shape, Seq)):
            return _unpack(base, index.value, node, scope, line)
        if isinstance(base, Tensor):
            return None  # a row
    if (
        isinstance(base, Tensor)
        and isinstance(index, ast.Slice)
        and index.lower is None
        and index.upper is None
    ):
        return base
    if isinstance(base, Tensor) and isinstance(index, ast.Tuple) and index.elts:
        first = index.elts[0]
        if isinstance(first, ast.Slice) and first.lower is None and first.upper is None:
            return base
    return None


def _is_kwargs(node: ast.AST, scope: Scope) -> bool:
    kwarg = scope.ref.node.args.kwarg
    return kwarg is not None and isinstance(node, ast.Name) and node.id == kwarg.arg


def _keyword_argument(name: str, scope: Scope):
    """``kwargs["a"]`` of a function taking ``**kwargs``: what the call binds, else read as a parameter."""
    kwarg = scope.ref.node.args.kwarg
    bound = scope.bound.get(kwarg.arg) if kwarg is not None else None
    if isinstance(bound, dict) and name in bound:
        return bound[name]
    return _guess(ast.arg(arg=name), scope) if scope.guess else None


def instance_value(env: Env, cls: ClassInfo, attr: str):
    """The value ``cls``'s constructor assigns to ``self.<attr>``, if it assigns one value."""
    memo = env.memo.setdefault("instance", {})
    key = (id(cls), attr)
    if key in memo:
        return memo[key]
    memo[key] = None
    found = _constructor_assignments(env.tree, cls).get(attr, [])
    bound = {"config": Config(tuple(sorted(env.config.items(), key=lambda kv: kv[0])))}
    if len({ast.dump(v) for _, v in found}) == 1:
        ref, value = found[0]
        memo[key] = evaluate(value, Scope(ref, cls, env, bound))
    elif 1 < len(found) <= 4:  # assigned on several branches: known if every branch agrees
        values = [evaluate(value, Scope(ref, cls, env, bound)) for ref, value in found]
        agreed = all(isinstance(v, (Const, Iv)) for v in values) and len(set(values)) == 1
        if agreed and (not isinstance(values[0], Iv) or values[0].exact):
            memo[key] = values[0]
    return memo[key]


def _constructor_assignments(tree: SourceTree, cls: ClassInfo) -> dict[str, list]:
    """``self.<attr> = value`` of every method building a ``cls`` runs: attr -> [(method, value)]
    (memoised per tree)."""
    memo = tree.memo.setdefault("intervals.constructor", {})
    if id(cls) in memo:
        return memo[id(cls)]
    table: dict[str, list] = {}
    for ref in tree.construction_methods(cls):
        for node in ast.walk(ref.node):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign) and node.value is not None
                else []
            )
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    table.setdefault(target.attr, []).append((ref, node.value))
    memo[id(cls)] = table
    return table


def _call(node: ast.Call, scope: Scope, line: int):
    func = node.func
    name = dotted(func)
    args = node.args
    env = scope.env
    short = name.rpartition(".")[2] if name else ""
    if (name in _CDIV or short in ("cdiv", "ceil_div", "div_up")) and len(args) == 2:
        return _floordiv(as_iv(_eval(args[0], scope, line)), as_iv(_eval(args[1], scope, line)), True)
    if name in _POW2 or short == "next_power_of_2":
        return _next_pow2(as_iv(_eval(args[0], scope, line))) if args else UNKNOWN
    if name in ("min", "max") and args and not node.keywords:
        values = [as_iv(_eval(a, scope, line)) for a in args]
        pick = min if name == "min" else max
        return Iv(pick(v.lo for v in values), pick(v.hi for v in values), any(v.tok for v in values))
    if name in ("int", "math.ceil", "math.floor", "abs") and len(args) == 1:
        return _eval(args[0], scope, line)
    if name == "divide" and len(args) == 2:
        return _floordiv(as_iv(_eval(args[0], scope, line)), as_iv(_eval(args[1], scope, line)))
    if name == "len" and len(args) == 1:
        value = _eval(args[0], scope, line)
        if isinstance(value, Tensor):
            return value.dim0
        if isinstance(value, Seq) and not value.uniform:
            return Iv(len(value.items), len(value.items))
        return None
    if short in ("get_attention_tp_size", "get_attn_tp_size"):
        return Iv(env.attn_tp, env.attn_tp)
    if short in ("get_tensor_model_parallel_world_size", "get_tp_size"):
        return Iv(env.tp, env.tp)
    if short in ("get_attention_dp_size",):
        return Iv(env.dp, env.dp)
    if isinstance(func, ast.Attribute):
        if name and name.startswith("torch.") and name.count(".") == 1:
            return _torch(short, node, scope, line)
        receiver = func.value
        if isinstance(receiver, ast.Name) and receiver.id == "self" and scope.self_cls is not None:
            method = method_on(env.tree, scope.self_cls, func.attr)
            if method is not None:
                return call_return(method, scope.self_cls, node, scope, line, bound_receiver=True)
            first = _eval(args[0], scope, line) if args else None
            return first if isinstance(first, Tensor) else None  # self.<module>(x): a layer keeps the rows
        if func.attr == "get" and _is_kwargs(receiver, scope) and args and isinstance(args[0], ast.Constant):
            return _keyword_argument(str(args[0].value), scope)
        base = _eval(receiver, scope, line)
        if isinstance(base, Tensor):
            return _tensor_method(base, func.attr, node, scope, line)
        return None
    if isinstance(func, ast.Name):
        callee = resolve_function(env.tree, scope.ref.path, func.id)
        if isinstance(callee, FunctionRef):
            return call_return(callee, None, node, scope, line, bound_receiver=False)
    return None


def _torch(short: str, node: ast.Call, scope: Scope, line: int):
    args = node.args
    if short in _TORCH_FACTORIES and args:
        first = _eval(args[0], scope, line)
        if isinstance(first, (Seq, Shape)):
            first = first.item(0) if isinstance(first, Seq) else first.dim0
        return Tensor(as_iv(first)) if isinstance(first, Iv) else None
    if short in _LIKE and args:
        value = _eval(args[0], scope, line)
        return value if isinstance(value, Tensor) else None
    if short in ("split", "chunk") and args:
        value = _eval(args[0], scope, line)
        if isinstance(value, Tensor) and _last_dim(node, default_last=False):
            return Seq((value,), uniform=True)
        return None
    if short == "cat" and args:
        parts = _eval(args[0], scope, line)
        first = parts.items[0] if isinstance(parts, Seq) and parts.items else None
        if isinstance(first, Tensor) and _last_dim(node, default_last=False):
            return first
        return None
    if short in _KEEPS_ROWS and args:
        value = _eval(args[0], scope, line)
        return value if isinstance(value, Tensor) else None
    return None


def _last_dim(node: ast.Call, default_last: bool) -> bool:
    for keyword in node.keywords:
        if keyword.arg == "dim":
            return isinstance(keyword.value, ast.UnaryOp) or (
                isinstance(keyword.value, ast.Constant) and keyword.value.value not in (0,)
            )
    if len(node.args) >= 3:
        dim = node.args[2] if node.func.attr in ("split", "chunk") else node.args[1]
        return isinstance(dim, ast.UnaryOp) or (isinstance(dim, ast.Constant) and dim.value != 0)
    if node.func.attr == "cat" and len(node.args) == 2:
        dim = node.args[1]
        return isinstance(dim, ast.UnaryOp) or (isinstance(dim, ast.Constant) and dim.value != 0)
    return default_last


def _tensor_method(base: Tensor, method: str, node: ast.Call, scope: Scope, line: int):
    args = node.args
    if method in ("size",) and len(args) == 1:
        index = _eval(args[0], scope, line)
        return base.dim0 if isinstance(index, Iv) and index.exact and index.lo == 0 else None
    if method == "size" and not args:
        return Shape(base.dim0)
    if method == "numel":
        return Iv(base.dim0.lo, INF, base.dim0.tok)
    if method in ("view", "reshape") and args:
        first = args[0]
        if isinstance(first, (ast.Tuple, ast.List)) and first.elts:
            first = first.elts[0]
        if isinstance(first, ast.UnaryOp) and isinstance(first.operand, ast.Constant):
            return base  # view(-1, ...): at least the rows it had
        value = _eval(first, scope, line)
        return Tensor(value) if isinstance(value, Iv) else None
    if method in ("new_empty", "new_zeros", "new_ones", "new_full") and args:
        first = _eval(args[0], scope, line)
        if isinstance(first, (Seq, Shape)):
            first = first.item(0) if isinstance(first, Seq) else first.dim0
        return Tensor(first) if isinstance(first, Iv) else None
    if method in ("split", "chunk", "unbind") and _last_dim(node, default_last=False):
        return Seq((base,), uniform=True)
    if method in _KEEPS_ROWS:
        return base
    return None


def call_return(callee: FunctionRef, self_cls, node: ast.Call, scope: Scope, line: int, bound_receiver: bool):
    """What ``callee`` returns when ``node`` calls it from ``scope`` (its last ``return``)."""
    if scope.depth >= MAX_DEPTH * 10 or scope.env.memo.get("calls", 0) > 20000:
        return None
    scope.env.memo["calls"] = scope.env.memo.get("calls", 0) + 1
    inner = bind(callee, self_cls, node, scope, line, bound_receiver)
    if inner is None:
        return None
    last = last_return(callee)
    return None if last is None else evaluate(last.value, inner)


def last_return(ref: FunctionRef) -> ast.Return | None:
    """The last ``return <value>`` of ``ref``'s own body (None when a nested function returns too:
    which return is whose is not worth telling apart here)."""
    memo = ref.tree.memo.setdefault("intervals.returns", {})
    key = id(ref.node)
    if key not in memo:
        returns = [n for n in ast.walk(ref.node) if isinstance(n, ast.Return) and n.value is not None]
        nested = any(
            n is not ref.node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in ast.walk(ref.node)
        )
        if returns and nested and any(_nested(ref.node, r) for r in returns):
            memo[key] = None
        else:
            memo[key] = max(returns, key=lambda r: r.lineno) if returns else None
    return memo[key]


def bind(callee: FunctionRef, self_cls, node: ast.Call, scope: Scope, line: int, bound_receiver: bool):
    """The scope of ``callee`` called by ``node`` from ``scope``: its parameters bound to the values of
    the arguments (defaults where an argument is left out)."""
    if scope.depth >= MAX_DEPTH * 10:
        return None
    params = [*callee.node.args.posonlyargs, *callee.node.args.args]
    if bound_receiver and params and params[0].arg in ("self", "cls"):
        params = params[1:]
    bound: dict = {}
    defaults = callee.node.args.defaults
    for param, default in zip(params[len(params) - len(defaults) :], defaults):
        bound[param.arg] = evaluate(default, Scope(callee, self_cls, scope.env))
    for param, default in zip(callee.node.args.kwonlyargs, callee.node.args.kw_defaults):
        if default is not None:
            bound[param.arg] = evaluate(default, Scope(callee, self_cls, scope.env))
    for param, arg in zip(params, node.args):
        if isinstance(arg, ast.Starred):
            break
        bound[param.arg] = evaluate(arg, scope, line)
    names = {p.arg for p in [*params, *callee.node.args.kwonlyargs]}
    extra: dict = {}
    for keyword in node.keywords:
        if keyword.arg in names:
            bound[keyword.arg] = evaluate(keyword.value, scope, line)
        elif keyword.arg is not None:
            extra[keyword.arg] = evaluate(keyword.value, scope, line)
    if callee.node.args.kwarg is not None:
        bound[callee.node.args.kwarg.arg] = extra
    for param in [*params, *callee.node.args.kwonlyargs]:
        bound.setdefault(param.arg, None)
    return Scope(callee, self_cls, scope.env, bound, False, scope.depth + 10)


def _nested(func: ast.AST, node: ast.AST) -> bool:
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    return any(
        inner is not func and isinstance(inner, scopes) and any(n is node for n in ast.walk(inner))
        for inner in ast.walk(func)
    )


# ----- local assignments ----------------------------------------------------------------------
def last_assignment(
    ref: FunctionRef, name: str, line: int
) -> tuple[tuple[int, ...], ast.AST | None, int] | None:
    """The last assignment to ``name`` in ``ref`` before ``line``: (position in the target, the
    value, its line); the value is None when it cannot be followed (a loop, ``+=``, ``with``)."""
    table = _assignments(ref)
    found = None
    for at, path, value in table.get(name, ()):
        if at < line:
            found = (path, value, at)
    return found


def _assignments(ref: FunctionRef) -> dict[str, list]:
    memo = ref.tree.memo.setdefault("intervals.assign", {})
    key = id(ref.node)
    if key in memo:
        return memo[key]
    table: dict[str, list] = {}

    def record(target: ast.AST, value: ast.AST | None, at: int, path: tuple[int, ...] = ()) -> None:
        if isinstance(target, ast.Name):
            table.setdefault(target.id, []).append((at, path, value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for index, element in enumerate(target.elts):
                if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                    record(element, value.elts[index], at, path)
                elif isinstance(element, ast.Starred):
                    record(element.value, None, at)
                else:
                    record(element, value, at, (*path, index))
        elif isinstance(target, ast.Starred):
            record(target.value, None, at)

    live = {id(n) for n in live_nodes(ref)} if ref.node.name != "<module>" else None
    for node in ast.walk(ref.node):
        if live is not None and isinstance(node, ast.stmt) and id(node) not in live and node is not ref.node:
            continue
        if node is not ref.node and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                table.setdefault(node.name, []).append((node.lineno, (), node))
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                record(target, node.value, node.lineno)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            record(node.target, node.value, node.lineno)
        elif isinstance(node, ast.AugAssign):
            record(node.target, None, node.lineno)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            record(node.target, None, getattr(node, "lineno", getattr(node.iter, "lineno", 0)))
        elif isinstance(node, ast.NamedExpr):
            record(node.target, node.value, node.lineno)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    record(item.optional_vars, None, node.lineno)
    for entries in table.values():
        entries.sort(key=lambda e: e[0])
    memo[key] = table
    return table


# ----- names on NPU ---------------------------------------------------------------------------
def resolve_function(tree: SourceTree, path: Path, name: str) -> FunctionRef | None:
    """The function ``name`` denotes in the module at ``path`` on an Ascend host, if exactly one
    (see ``npu_bindings``)."""
    found = npu_bindings(tree, path, name)
    return found[0] if len(found) == 1 and isinstance(found[0], FunctionRef) else None


def npu_bindings(tree: SourceTree, path: Path, name: str, _depth: int = 0) -> list:
    """What the module-level ``name`` of the module at ``path`` can be bound to on an Ascend host,
    statements taken in order, the branches ``npuguards`` proves dead on NPU left out and both
    sides of an undecided one kept: FunctionRefs of the tree, and ``"external"`` for anything
    else (a package outside the tree, a value). ``if _is_npu: f = f_npu`` after an import of the
    Triton ``f`` leaves only ``f_npu`` (sglang 0.5.10's gdn_backend.py, 0.5.11's qwen3_next.py)."""
    memo = tree.memo.setdefault("intervals.bindings", {})
    key = (path, name)
    if key in memo:
        return memo[key]
    memo[key] = ["external"]
    module = tree.parse(path) if _depth < 8 else None
    if module is None:
        return memo[key]
    state = _bind_block(tree, path, module.body, name, [])
    result: list = []
    for entry in state:
        for value in _follow(tree, path, entry, _depth):
            if isinstance(value, str):
                if value not in result:
                    result.append(value)
            elif not any(isinstance(r, FunctionRef) and r.node is value.node for r in result):
                result.append(value)
    memo[key] = result or ["external"]
    return memo[key]


def _bind_block(tree: SourceTree, path: Path, body: list[ast.stmt], name: str, state: list) -> list:
    for stmt in body:
        if isinstance(stmt, ast.If):
            value = value_on_npu(tree, path, stmt.test)
            taken = _bind_block(tree, path, stmt.body, name, list(state)) if value is not False else None
            other = _bind_block(tree, path, stmt.orelse, name, list(state)) if value is not True else None
            if taken is None:
                state = other
            elif other is None:
                state = taken
            else:
                state = taken + [e for e in other if not any(e is t for t in taken)]
        elif isinstance(stmt, ast.Try):
            tried = _bind_block(tree, path, stmt.body + stmt.orelse, name, list(state))
            handled = list(tried)
            for handler in stmt.handlers:
                alternative = _bind_block(tree, path, handler.body, name, list(state))
                handled += [e for e in alternative if not any(e is h for h in handled)]
            state = _bind_block(tree, path, stmt.finalbody, name, handled)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            state = [("def", stmt)]
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    state = [("import", stmt, alias.name)]
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    state = [("external", None)]
        elif isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in stmt.targets
        ):
            state = [("alias", stmt.value)]
        elif isinstance(stmt, ast.ClassDef) and stmt.name == name:
            state = [("external", None)]
    return state


def _follow(tree: SourceTree, path: Path, entry, depth: int) -> list:
    kind = entry[0]
    if kind == "def":
        return [FunctionRef(entry[1], path, tree)]
    if kind == "import":
        stmt, original = entry[1], entry[2]
        target = tree.module_path(tree.absolute_module(path, stmt))
        if target is None or target == path:
            return ["external"]
        return npu_bindings(tree, target, original, depth + 1)
    if kind == "alias" and isinstance(entry[1], ast.Name):
        return npu_bindings(tree, path, entry[1].id, depth + 1) if entry[1].id else ["external"]
    return ["external"]
