"""The static toolkit has one expression evaluator (``npudoctor.static.expressions``): the checks and
the other analyses of ``npudoctor/static`` keep only their policy (what a name, an attribute, a
call is worth in their domain), never a walk of their own over ``and``/``or``/``not`` or over the
operator kinds. A second copy drifts: the three-valued ``and`` was written five times, in three
ways, before it was written once."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from support.repo import REPO

# the analyses that evaluate sglang's expressions, each through the one evaluator
CALLERS = (
    "npudoctor.static.npuguards",  # a condition on an Ascend host
    "npudoctor.static.shapes",  # a pool's tensor layouts on symbols
    "npudoctor.static.intervals",  # integer intervals at a token count
    "npudoctor.checks.npp002_cuda_only_code.dispatch",  # rotary head sizes, self attributes
    "npudoctor.checks.npp004_call_signatures.static",  # the role's speculative algorithm
)
SCANNED = [*sorted((REPO / "checks").rglob("*.py")), *sorted((REPO / "npudoctor" / "static").glob("*.py"))]
EVALUATOR = REPO / "npudoctor" / "static" / "expressions.py"
OPERATORS = frozenset({"BinOp", "BoolOp", "Compare", "UnaryOp", "IfExp"})
# a policy that decides more than its base in a value's place, written before the evaluator was
# shared: NPD001's offload evaluator (a deep check's own layer over ``shapes.LayoutEvaluator``)
KNOWN = {("checks/npd001_cpu_offload_roundtrip/layout.py", "OffloadEvaluator._eval")}


def _functions(path: Path):
    """(qualified name, node) of every function in the module at ``path``."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{prefix}{child.name}", child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def _ast_names(function: ast.AST) -> set[str]:
    """The ``ast.<X>`` names a function refers to."""
    return {
        node.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ast"
    }


def _recursive(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function calls itself (by name, or as ``self.<name>``): it walks a tree."""
    return any(
        isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == function.name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == function.name)
        )
        for node in ast.walk(function)
    )


def _evaluators() -> list[tuple[str, str, str]]:
    """(file, function, what it walks) of every function outside the evaluator that walks an
    expression itself: combines ``and``/``or``/``not``, or dispatches on three operator kinds."""
    found = []
    for path in SCANNED:
        if path == EVALUATOR:
            continue
        for name, function in _functions(path):
            if not _recursive(function):
                continue
            names = _ast_names(function)
            relpath = str(path.relative_to(REPO))
            if "Not" in names and names & {"And", "Or"}:
                found.append((relpath, name, "and/or/not"))
            elif len(names & OPERATORS) >= 3 and (relpath, name) not in KNOWN:
                found.append((relpath, name, f"the operators {sorted(names & OPERATORS)}"))
    return found


def test_no_analysis_walks_expressions_of_its_own():
    assert _evaluators() == []


@pytest.mark.parametrize("module", CALLERS)
def test_every_caller_uses_the_one_evaluator(module):
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} not found"
    tree = ast.parse(Path(spec.origin).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert "npudoctor.static.expressions" in imported


def test_the_known_exceptions_still_exist():
    """An exception that no longer names a function is taken out of the list."""
    present = {(str(path.relative_to(REPO)), name) for path in SCANNED for name, _ in _functions(path)}
    assert present >= KNOWN
