"""What a live function does with a call: whether it binds, which keywords it takes and reads.

A defect sglang ships again and again is a call its callee cannot take (a keyword the callee
does not declare, one passed twice, a required one left out), or a keyword the callee takes and
ignores. The live probes call the imported functions, so the answer is Python's own: the
signature (``accepts``), the source of the function that runs (``reads``), and the message
CPython raises when a call does not bind (``binding_keyword``), before the callee runs a line.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

from npudoctor.static.signatures import names_read

# The messages CPython raises when a call does not bind (the callee never ran a line).
_BINDING = re.compile(
    r"got an unexpected keyword argument '(?P<unexpected>\w+)'"
    r"|got multiple values for argument '(?P<multiple>\w+)'"
    r"|missing \d+ required (?:positional |keyword-only )?arguments?: (?P<missing>.+)"
    r"|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but \d+ (?:was|were) given"
)


def accepts(function: Callable[..., Any], keyword: str) -> bool:
    """Python would bind ``keyword=`` to ``function``: a named parameter or ``**kwargs``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return True  # a builtin or C function: nothing to tell
    named = parameters.get(keyword)
    if named is not None:
        return named.kind in (named.POSITIONAL_OR_KEYWORD, named.KEYWORD_ONLY)
    return any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def reads(function: Callable[..., Any], keyword: str) -> bool | None:
    """The function's body uses the value of ``keyword=`` (the parameter, or the ``**kwargs``
    dict that would hold it); None when its source cannot be read."""
    node = _function_node(function)
    if node is None:
        return None
    arguments = node.args
    named = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    if keyword in named:
        local = keyword
    elif arguments.kwarg is not None:
        local = arguments.kwarg.arg
    else:
        return False
    return local in names_read(node)


def _function_node(function: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    try:
        module = ast.parse(source)
    except SyntaxError:
        return None
    node = module.body[0] if module.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def signature_of(function: Callable[..., Any]) -> str:
    name = getattr(function, "__name__", "?")
    try:
        return f"{name}{inspect.signature(function)}"
    except (TypeError, ValueError):
        return f"{name}(...)"


def binding_keyword(error: BaseException) -> tuple[bool, str | None]:
    """Whether ``error`` is CPython refusing to bind a call, and the keyword it names, if any."""
    if not isinstance(error, TypeError):
        return False, None
    match = _BINDING.search(str(error))
    if match is None:
        return False, None
    keyword = match.group("unexpected") or match.group("multiple")
    return True, keyword
