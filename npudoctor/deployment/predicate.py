"""When a known defect bites: a predicate over one role's facts, written as a Python expression.

A catalog record says when its defect bites as an expression such as
``backend == 'ascend' and arg('page_size') in (16, 32, 64)``. It is parsed with ``ast`` and
evaluated by the small interpreter below, never by ``eval``: only literals, the names of
``role_namespace``, comparisons, ``and``/``or``/``not``, arithmetic, ``x if c else y`` and calls of
the namespace's functions are allowed, so a record cannot run anything else. Every record's
expression is checked when the catalog loads (``compile_predicate``), not when a deployment
first reaches it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from npudoctor.deployment.facts import Facts, RoleFacts

_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}

# The names an expression may use (documented for record authors in catalog/README.md).
NAMES = (
    "role",
    "backend",
    "tp",
    "pp",
    "dp",
    "page_size",
    "use_fia",
    "spec",
    "kv_dtype",
    "transfer_backend",
    "attention",
    "mla",
    "indexer",
    "arch",
    "model_type",
    "hybrid_linear",
    "sliding_window",
    "nextn_layers",
    "has_model",
)
FUNCTIONS = ("arg", "flag", "env", "config", "has_config", "matches", "any_arch", "lower")


class PredicateError(ValueError):
    """A record's expression uses something the interpreter does not allow."""


def compile_predicate(text: str, where: str) -> ast.Expression:
    """Parse ``text`` and check that it only uses what ``evaluate`` allows."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise PredicateError(f"{where}: {error.msg}: {text!r}") from None
    allowed = (
        ast.Expression,
        ast.BoolOp,
        ast.And,
        ast.Or,
        ast.UnaryOp,
        ast.Not,
        ast.USub,
        ast.Compare,
        ast.BinOp,
        ast.Name,
        ast.Load,
        ast.Constant,
        ast.Tuple,
        ast.List,
        ast.Set,
        ast.Call,
        ast.IfExp,
        *_COMPARE,
        *_BINARY,
    )
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise PredicateError(f"{where}: {type(node).__name__} is not allowed in {text!r}")
        if isinstance(node, ast.Name) and node.id not in NAMES + FUNCTIONS + ("true", "false", "none"):
            raise PredicateError(
                f"{where}: unknown name {node.id!r} in {text!r} (known: {', '.join(NAMES + FUNCTIONS)})"
            )
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
            raise PredicateError(f"{where}: only {', '.join(FUNCTIONS)} may be called in {text!r}")
        if isinstance(node, ast.Call) and node.keywords:
            raise PredicateError(f"{where}: keyword arguments are not allowed in {text!r}")
    return tree


def evaluate(expression: ast.Expression, names: Mapping[str, Any]) -> Any:
    return _eval(expression.body, names)


def _eval(node: ast.AST, names: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return tuple(_eval(e, names) for e in node.elts)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            value: Any = True
            for item in node.values:
                value = _eval(item, names)
                if not value:
                    return value
            return value
        value = False
        for item in node.values:
            value = _eval(item, names)
            if value:
                return value
        return value
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, names)
        return (not operand) if isinstance(node.op, ast.Not) else -operand
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, names)
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except TypeError:  # None < 4: an absent value satisfies no ordering
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, names), _eval(node.right, names)
        try:
            return _BINARY[type(node.op)](left, right)
        except (TypeError, ZeroDivisionError):
            return None
    if isinstance(node, ast.IfExp):
        return _eval(node.body, names) if _eval(node.test, names) else _eval(node.orelse, names)
    if isinstance(node, ast.Call):
        return names[node.func.id](*(_eval(a, names) for a in node.args))  # type: ignore[attr-defined]
    raise PredicateError(f"{type(node).__name__} is not allowed")


def truthy(value: Any) -> bool:
    """sglang's ``get_bool_env_var`` reading ("true"/"1"), also for YAML booleans."""
    if isinstance(value, bool):
        return value
    return value is not None and str(value).strip().lower() in ("true", "1")


def role_namespace(facts: Facts, role: RoleFacts, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The names and functions an expression sees for one role. ``defaults``: the record's values
    of server arguments the deployment does not pass (the NPU defaults of the releases it covers)."""
    model = facts.model
    config = model.hf_config if model is not None else {}

    def arg(name: str) -> Any:
        value = role.server_args.get(name)
        return defaults.get(name) if value is None else value

    def to_number(value: Any) -> Any:
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
        return value

    return {
        "true": True,
        "false": False,
        "none": None,
        "role": role.disaggregation_mode,
        "backend": role.attention_backend,
        "tp": role.tp_size,
        "pp": role.pp_size,
        "dp": role.dp_size,
        "page_size": role.page_size,
        "use_fia": role.use_fia,
        "spec": role.speculative_algorithm or "",
        "kv_dtype": role.kv_cache_dtype,
        "transfer_backend": role.transfer_backend or "",
        "attention": model.attention.value if model else "",
        "mla": bool(model and model.attention.is_mla),
        "indexer": bool(model and model.index_head_dim),
        "arch": model.architectures if model else (),
        "model_type": (model.model_type or "") if model else "",
        "hybrid_linear": model.hybrid_linear_layers if model else 0,
        "sliding_window": (model.sliding_window or 0) if model else 0,
        "nextn_layers": model.nextn_layers if model else 0,
        "has_model": model is not None,
        "arg": lambda name: to_number(arg(name)),
        "flag": lambda name: truthy(arg(name)),
        "env": lambda name: role.env.get(name, ""),
        "config": lambda key: config.get(key),
        "has_config": lambda key: key in config,
        "matches": lambda text, pattern: bool(re.search(pattern, str(text or ""))),
        "any_arch": lambda *names: bool(set(model.architectures) & set(names)) if model else False,
        "lower": lambda text: str(text or "").lower(),
    }
