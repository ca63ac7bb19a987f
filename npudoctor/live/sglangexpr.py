"""Expressions of sglang's own source, evaluated live with the names their module's imports bind.

A probe that calls sglang code the way sglang calls it (a preparation call in a model's
``forward``, the ``if`` tests around it, the ``assert`` preconditions of a function) takes the
expressions from the source and evaluates them here, in the names the caller's module binds
(``import_bindings``: where each name comes from), without importing that module itself (a model
module's import chain pulls the model's kernels). A traceback through an evaluated expression
names the sglang file and line it came from.
"""

from __future__ import annotations

import ast
import builtins
import sys
from pathlib import Path
from typing import Any

from npudoctor.static.source import SourceTree


class NotLoaded(Exception):
    """A name the expression reads comes from a module that is not loaded, or that lacks it."""


def free_names(expressions: list[ast.expr]) -> set[str]:
    """Names the expressions read that are not builtins."""
    builtin = set(dir(builtins))
    return {
        node.id
        for expression in expressions
        for node in ast.walk(expression)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in builtin
    }


def import_bindings(tree: SourceTree, path: Path, names: set[str]) -> dict[str, tuple[str, str]]:
    """Where each name comes from in the module at ``path`` (name -> (module, attribute)): its
    ``from X import name`` (at any depth of the module body), or the module itself when it
    defines the name."""
    module = tree.parse(path)
    found: dict[str, tuple[str, str]] = {}
    for node in ast.walk(module) if module is not None else ():
        if isinstance(node, ast.ImportFrom):
            source = tree.absolute_module(path, node)
            for alias in node.names:
                bound = alias.asname or alias.name
                if bound in names:
                    found.setdefault(bound, (source, alias.name))
    for name in names - set(found):
        found[name] = (tree.module_name(path), name)
    return found


def renamed(expression: ast.expr, old: str, new: str) -> ast.expr:
    """``expression`` with the name ``old`` read as ``new`` (a parameter read as the caller's argument)."""
    copy = ast.parse(ast.unparse(expression), mode="eval").body
    for node in ast.walk(copy):
        if isinstance(node, ast.Name) and node.id == old:
            node.id = new
    return ast.copy_location(copy, expression)


def evaluate(
    expression: ast.expr,
    filename: str,
    bindings: dict[str, tuple[str, str]],
    names: dict[str, Any],
    import_errors: dict[str, str],
) -> Any:
    """Evaluate one expression of sglang's source (from ``filename``) with the names ``bindings``
    take from the loaded modules and the caller's local ``names``, as the caller would.
    ``import_errors`` says why a module is not loaded (``NotLoaded`` quotes it)."""
    scope: dict[str, Any] = {}
    for name, (module_name, attribute) in bindings.items():
        module = sys.modules.get(module_name)
        if module is None:
            note = import_errors.get(module_name, "not imported before the probe")
            raise NotLoaded(f"{name} comes from {module_name}, which is not loaded ({note})")
        if not hasattr(module, attribute):
            raise NotLoaded(f"{module_name} has no {attribute} once imported")
        scope[name] = getattr(module, attribute)
    code = compile(ast.fix_missing_locations(ast.Expression(expression)), filename, "eval")
    return eval(code, scope, names)  # noqa: S307 - sglang's own source, its modules already imported
