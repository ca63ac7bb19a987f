"""npudoctor.static.expressions: the one walk over an expression, on small policies."""

from __future__ import annotations

import ast

import pytest

from npudoctor.static.expressions import ExpressionEvaluator, compare_known, truth

# the operands' values: a (True), b (False), u (not known)
FACTS = {"a": True, "b": False}


def _truth(text: str) -> bool | None:
    return truth(ast.parse(text, mode="eval").body, lambda node: FACTS.get(getattr(node, "id", "")))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a and b", False),
        ("b and u", False),  # one False decides an and, whatever the other operands
        ("u and b", False),
        ("a and u", None),
        ("a or u", True),  # one True decides an or
        ("b or u", None),
        ("not u", None),
        ("not (b or b)", True),
        ("a and not (u and b)", True),
        ("a < b", None),  # a comparison is the operand callback's to decide
    ],
)
def test_truth_is_kleene_logic(text, expected):
    assert _truth(text) is expected


def test_every_operand_is_decided_even_after_the_decisive_one():
    seen = []
    truth(ast.parse("b and a and u", mode="eval").body, lambda node: seen.append(node.id))
    assert seen == ["b", "a", "u"]


@pytest.mark.parametrize(
    ("op", "left", "right", "expected"),
    [
        (ast.Lt(), 1, 2, True),
        (ast.GtE(), 1, 2, False),
        (ast.In(), 64, (64, 128), True),
        (ast.NotIn(), 96, (64, 128), True),
        (ast.Lt(), None, 1, None),  # Python raises: nothing known
        (ast.Is(), None, None, None),  # identity is no comparison of values
    ],
)
def test_compare_known(op, left, right, expected):
    assert compare_known(op, left, right) is expected


class _Numbers(ExpressionEvaluator):
    """Python numbers, names from a table, + and *: the smallest policy."""

    unknown = "unknown"

    def __init__(self, names: dict[str, object]):
        self.names = names

    def name(self, node):
        return self.names.get(node.id, self.unknown)

    def binop(self, node, left, right):
        if self.unknown in (left, right) or not isinstance(node.op, (ast.Add, ast.Mult)):
            return self.unknown
        return left + right if isinstance(node.op, ast.Add) else left * right


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2 * n + 1", 7),
        ("(n, 2)", (3, 2)),
        ("n if flag else 0", 3),
        ("n if u else 0", "unknown"),  # the test not known: both sides, and they differ
        ("4 if u else 2 * 2", 4),  # both sides agree
        ("n if n > 2 else 0", 3),
        ("n if n > 2 and u else 0", "unknown"),
        ("n if n > 5 or not flag else 0", 0),
        ("f(n)", "unknown"),
    ],
)
def test_a_policy_gives_only_what_its_domain_knows(text, expected):
    evaluator = _Numbers({"n": 3, "flag": True})
    assert evaluator.evaluate(ast.parse(text, mode="eval").body) == expected
