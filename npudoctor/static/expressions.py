"""What an expression in sglang's source is worth from the facts an analysis knows: the expression
evaluator of the static toolkit.

Every reading of sglang's source asks it: whether ``if _is_npu and not use_fia:`` is taken on an
Ascend host (``npuguards``), whether ``self.head_size not in [64, 128]`` holds for the model's
rotary heads (NPP002), how many programs a Triton grid launches at T tokens (``intervals``), what
shape a pool allocates (``shapes``), whether a branch runs for the role's speculative algorithm
(NPP004). The walk over the expression is the same each time, and it is written here once:

* ``and``/``or``/``not`` combine in three-valued (Kleene) logic: one False decides an ``and`` and
  one True an ``or`` whatever the other operands are, otherwise one operand not known leaves the
  whole not known (``truth``); a test is True, False or None, and None keeps both branches;
* a comparison of two known values is decided (``compare_known``);
* a conditional expression takes the side its known test picks, else both sides joined;
* constants, tuples and lists, names, attribute chains, subscripts, calls and arithmetic are
  handed to the caller, which alone knows what they are worth.

What differs between callers is only that last part, their facts and their value domain (a truth
value, an integer interval, a symbolic size), so each keeps it as a small policy: an ``operand``
callback to ``truth`` when it decides tests alone, an ``ExpressionEvaluator`` subclass when it
evaluates values. Nothing unknown is guessed: a value the domain cannot express is its
``unknown``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

Truth = bool | None

# the comparisons decided between two known values
COMPARISONS: dict[type[ast.cmpop], Callable[[object, object], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def truth(
    test: ast.expr, operand: Callable[[ast.expr], Truth], subtest: Callable[[ast.expr], Truth] | None = None
) -> Truth:
    """``test`` in three-valued (Kleene) logic: its ``and``/``or``/``not`` combined here, every other
    operand decided by ``operand`` (True, False, or None for not known). ``subtest`` decides the
    operands of an ``and``/``or``/``not`` (by default this same rule), for a caller that decides a
    whole test before looking inside it.

    Every operand is decided, even after one that settles the result: a caller's operand may
    remember what it read."""
    subtest = subtest or (lambda inner: truth(inner, operand))
    if isinstance(test, ast.BoolOp):
        decisive = not isinstance(test.op, ast.And)  # what one operand decides: False for and, True for or
        values = [subtest(value) for value in test.values]
        if decisive in values:
            return decisive
        return (not decisive) if all(v is (not decisive) for v in values) else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = subtest(test.operand)
        return None if inner is None else not inner
    return operand(test)


def compare_known(op: ast.cmpop, left: object, right: object) -> Truth:
    """``left <op> right`` for two known values: an ordering or equality, or ``in``/``not in`` a tuple
    of known values; None for any other operator."""
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, tuple):
        found = left in right
        return found if isinstance(op, ast.In) else not found
    compare = COMPARISONS.get(type(op))
    try:
        return None if compare is None else bool(compare(left, right))
    except TypeError:  # ``None < 1``: Python raises, so nothing is known
        return None


class ExpressionEvaluator:
    """The one walk over an expression, in a domain of values a subclass (the policy) defines.

    ``interpret(node)`` dispatches on the node's kind; the walk into a sub-expression goes through
    ``evaluate`` and into a sub-test through ``truth``, which a policy may route through an entry of
    its own (a memo, a recursion guard, an override of a subclass). ``decide(test)`` is a test's
    truth: Kleene logic over ``and``/``or``/``not``, a one-operator comparison by ``compare``, any
    other operand by ``truthiness`` of its value.

    The hooks a policy overrides (each given the node, so it evaluates only what it needs: a
    sub-expression's evaluation may run code of the tree, a call, that changes what the policy
    knows): ``constant``, ``sequence`` (a tuple or list, its items evaluated), ``name``,
    ``attribute``, ``subscript``, ``call``, ``binop``, ``unary`` (``-x``, ``~x``, ``+x``),
    ``condition`` (a test in a value's place), ``join`` (the two sides of a conditional expression
    whose test is not known), ``other`` (any other kind), ``compare`` and ``truthiness``."""

    unknown: object = None

    # ----- the walk -------------------------------------------------------------------------------
    def evaluate(self, node: ast.expr) -> object:
        """What a sub-expression is worth (by default: ``interpret``)."""
        return self.interpret(node)

    def interpret(self, node: ast.expr) -> object:
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BinOp):
            return self.binop(node, self.evaluate(node.left), self.evaluate(node.right))
        if isinstance(node, (ast.Tuple, ast.List)):
            return self.sequence(node, [self.evaluate(element) for element in node.elts])
        if isinstance(node, (ast.BoolOp, ast.Compare)) or (
            isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
        ):
            return self.condition(node)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node)
        if isinstance(node, ast.IfExp):
            test = self.truth(node.test)
            if test is not None:
                return self.evaluate(node.body if test else node.orelse)
            return self.join(self.evaluate(node.body), self.evaluate(node.orelse))
        return self.other(node)

    def truth(self, test: ast.expr) -> Truth:
        """What a sub-test is (by default: ``decide``)."""
        return self.decide(test)

    def decide(self, test: ast.expr) -> Truth:
        return truth(test, self._operand_truth, self.truth)

    def _operand_truth(self, operand: ast.expr) -> Truth:
        if isinstance(operand, ast.Compare):
            return self.compare(operand) if len(operand.ops) == 1 else None
        return self.truthiness(operand)

    # ----- the policy -----------------------------------------------------------------------------
    def constant(self, node: ast.Constant) -> object:
        return node.value

    def sequence(self, node: ast.Tuple | ast.List, items: list) -> object:
        return tuple(items)

    def name(self, node: ast.Name) -> object:
        return self.unknown

    def attribute(self, node: ast.Attribute) -> object:
        return self.unknown

    def subscript(self, node: ast.Subscript) -> object:
        return self.unknown

    def call(self, node: ast.Call) -> object:
        return self.unknown

    def binop(self, node: ast.BinOp, left: object, right: object) -> object:
        return self.unknown

    def unary(self, node: ast.UnaryOp) -> object:
        return self.unknown

    def condition(self, node: ast.expr) -> object:
        return self.unknown

    def join(self, body: object, orelse: object) -> object:
        """The value of ``body if <not known> else orelse``: the one value both sides agree on."""
        return body if body == orelse else self.unknown

    def other(self, node: ast.expr) -> object:
        return self.unknown

    def compare(self, node: ast.Compare) -> Truth:
        """A one-operator comparison: decided when both sides are known (not ``unknown``)."""
        left, right = self.evaluate(node.left), self.evaluate(node.comparators[0])
        if left is self.unknown or right is self.unknown:
            return None
        return compare_known(node.ops[0], left, right)

    def truthiness(self, operand: ast.expr) -> Truth:
        """An operand that is neither a comparison nor ``and``/``or``/``not``: its value as a bool,
        when the value is one."""
        value = self.evaluate(operand)
        return value if isinstance(value, bool) else None
