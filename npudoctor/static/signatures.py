"""Call sites and function signatures, read with ``ast``: would this call bind?

Some properties are about calls meeting definitions: a caller passes ``mamba_indices=``
and the override it reaches must take it, or Python raises ``TypeError`` before the
override runs a line. This module answers the generic half of such questions for any
source, without importing it:

* which calls of a method name a module makes, with the class and function they sit in
  (``method_calls``), and the *shape* of each call: how many positional arguments, which
  keywords, whether ``*args``/``**kwargs`` are spread into it (``CallShape``);
* whether a call of that shape binds to a ``def`` the way CPython would bind it, and if
  not, the ``TypeError`` CPython would raise (``bind_errors``);
* what a function does with its parameters: the names it reads (``names_read``), whether
  it accepts a keyword (``accepts_keyword``), whether its body only raises
  (``only_raises``), whether it is a one-statement forwarder (``is_single_call_body``).

Which calls can reach which definition is a question about the program, not about
``ast``; the checks decide it and use these helpers for the rest.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass

from npudoctor.static.source import FunctionNode, body_without_docstring


@dataclass(frozen=True)
class CallShape:
    """What a call passes, as far as binding is concerned (values do not matter)."""

    positional: int
    keywords: tuple[str, ...] = ()
    star_args: bool = False  # f(*xs): the positional count is unknown
    star_kwargs: bool = False  # f(**kw): further keywords are unknown

    @classmethod
    def of(cls, call: ast.Call, skip_first: bool = False) -> CallShape:
        """The shape of ``call``; ``skip_first`` drops an explicit ``self`` (``Base.m(self, ...)``)."""
        args = call.args[1:] if skip_first else call.args
        return cls(
            positional=sum(1 for a in args if not isinstance(a, ast.Starred)),
            keywords=tuple(k.arg for k in call.keywords if k.arg is not None),
            star_args=any(isinstance(a, ast.Starred) for a in args),
            star_kwargs=any(k.arg is None for k in call.keywords),
        )

    def describe(self) -> str:
        parts = [f"{self.positional} positional"]
        parts += [f"{k}=" for k in self.keywords]
        parts += ["*args"] if self.star_args else []
        parts += ["**kwargs"] if self.star_kwargs else []
        return ", ".join(parts)


@dataclass(frozen=True)
class ScopedCall:
    """A call found in a module, with the class and function it is written in."""

    call: ast.Call
    class_node: ast.ClassDef | None
    function: FunctionNode | None

    @property
    def line(self) -> int:
        return self.call.lineno

    @property
    def method(self) -> str:
        return self.call.func.attr  # type: ignore[union-attr]

    @property
    def receiver(self) -> ast.expr:
        return self.call.func.value  # type: ignore[union-attr]

    @property
    def receiver_text(self) -> str:
        return ast.unparse(self.receiver)


def method_calls(
    module: ast.Module, names: tuple[str, ...] | frozenset[str], lines: list[int] | None = None
) -> list[ScopedCall]:
    """Every ``<expr>.<name>(...)`` call in ``module`` whose name is in ``names``, in source order,
    with its innermost enclosing class and function. ``lines`` (sorted line numbers where the names
    occur in the text) lets the walk skip every subtree that spans none of them."""
    found: list[ScopedCall] = []
    stack: list[tuple[ast.AST, ast.ClassDef | None, FunctionNode | None]] = [(module, None, None)]
    while stack:
        node, class_node, function = stack.pop()
        for child in ast.iter_child_nodes(node):
            if lines is not None and not _spans_a_line(child, lines):
                continue
            if isinstance(child, ast.ClassDef):
                stack.append((child, child, None))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stack.append((child, class_node, child))
            else:
                if (
                    isinstance(child, ast.Call)
                    and isinstance(child.func, ast.Attribute)
                    and child.func.attr in names
                ):
                    found.append(ScopedCall(child, class_node, function))
                stack.append((child, class_node, function))
    found.sort(key=lambda c: (c.call.lineno, c.call.col_offset))
    return found


def lines_mentioning(data: bytes, word: str) -> list[int]:
    """Sorted 1-based numbers of the lines of ``data`` where ``word`` occurs as a whole word."""
    pattern = re.compile(rb"\b" + re.escape(word.encode()) + rb"\b")
    numbers: list[int] = []
    newline_count, position = 0, 0
    for match in pattern.finditer(data):
        newline_count += data.count(b"\n", position, match.start())
        position = match.start()
        if not numbers or numbers[-1] != newline_count + 1:
            numbers.append(newline_count + 1)
    return numbers


def _spans_a_line(node: ast.AST, lines: list[int]) -> bool:
    """Whether ``node`` (a node without a position: yes) covers one of the sorted ``lines``."""
    first = getattr(node, "lineno", None)
    if first is None:
        return True
    at = bisect.bisect_left(lines, first)
    return at < len(lines) and lines[at] <= (getattr(node, "end_lineno", None) or first)


def iter_references(
    module: ast.Module, name: str, lines: list[int] | None = None
) -> Iterator[tuple[ast.expr, tuple[ast.AST, ...]]]:
    """Every ``name`` (a Name, or the attribute of ``mod.name``) in ``module``, with its ancestors
    (outermost first); ``lines`` as for ``method_calls``."""
    stack: list[tuple[ast.AST, tuple[ast.AST, ...]]] = [(module, ())]
    while stack:
        node, ancestors = stack.pop()
        chain = (*ancestors, node)
        for child in ast.iter_child_nodes(node):
            if lines is not None and not _spans_a_line(child, lines):
                continue
            if (isinstance(child, ast.Name) and child.id == name) or (
                isinstance(child, ast.Attribute) and child.attr == name
            ):
                yield child, chain
            stack.append((child, chain))


def is_super_call(node: ast.expr) -> bool:
    """``super()`` or ``super(Klass, self)``."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def self_attribute(node: ast.expr) -> str | None:
    """``attr`` for ``self.attr``, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def signature_text(func: FunctionNode) -> str:
    """``name(params)`` as written, e.g. ``get_cpu_copy(self, indices)``."""
    return f"{func.name}({ast.unparse(func.args)})"


def _positional_params(func: FunctionNode, bound: bool) -> list[ast.arg]:
    params = [*func.args.posonlyargs, *func.args.args]
    return params[1:] if bound and params else params


def _defaults_from(func: FunctionNode, bound: bool) -> int:
    """Index (into ``_positional_params``) of the first positional parameter with a default."""
    params = [*func.args.posonlyargs, *func.args.args]
    first_default = len(params) - len(func.args.defaults)
    return max(first_default - (1 if bound and params else 0), 0)


def accepts_keyword(func: FunctionNode, name: str, bound: bool = True) -> bool:
    """Whether ``func(..., name=x)`` binds the keyword: a named parameter or ``**kwargs``."""
    if func.args.kwarg is not None:
        return True
    named = [a.arg for a in func.args.args] + [a.arg for a in func.args.kwonlyargs]
    if bound and func.args.args and not func.args.posonlyargs:
        named = named[1:]
    return name in named


def bind_errors(func: FunctionNode, shape: CallShape, bound: bool = True) -> list[str]:
    """The ``TypeError`` messages CPython would raise binding a call of ``shape`` to ``func``
    (empty when it binds). ``bound``: called through an instance, so the first parameter is
    ``self``. Spread arguments (``*xs``, ``**kw``) make the check give the benefit of the doubt."""
    errors: list[str] = []
    positional = _positional_params(func, bound)
    names = [a.arg for a in positional]
    posonly = {a.arg for a in func.args.posonlyargs}
    kwonly = [a.arg for a in func.args.kwonlyargs]
    if not shape.star_args and func.args.vararg is None and shape.positional > len(positional):
        errors.append(
            f"{func.name}() takes {len(positional)} positional argument"
            f"{'' if len(positional) == 1 else 's'} but {shape.positional} were given"
        )
    receiver = func.args.args[0].arg if bound and func.args.args and not func.args.posonlyargs else None
    for keyword in shape.keywords:
        if keyword == receiver or (keyword in names[: shape.positional] and keyword not in posonly):
            errors.append(f"{func.name}() got multiple values for argument '{keyword}'")
        elif (keyword in names and keyword not in posonly) or keyword in kwonly:
            continue
        elif func.args.kwarg is None:
            errors.append(f"{func.name}() got an unexpected keyword argument '{keyword}'")
    if not shape.star_args and not shape.star_kwargs:
        first_default = _defaults_from(func, bound)
        missing = [  # a keyword never fills a positional-only parameter
            n
            for i, n in enumerate(names)
            if shape.positional <= i < first_default and (n not in shape.keywords or n in posonly)
        ]
        missing += [
            a.arg
            for a, default in zip(func.args.kwonlyargs, func.args.kw_defaults, strict=True)
            if default is None and a.arg not in shape.keywords
        ]
        if missing:
            errors.append(
                f"{func.name}() missing {len(missing)} required argument{'' if len(missing) == 1 else 's'}: "
                + ", ".join(f"'{m}'" for m in missing)
            )
    return errors


def names_read(func: FunctionNode) -> set[str]:
    """Every name the function body loads, nested scopes included (a closure that reads a
    parameter uses it)."""
    return {
        node.id
        for stmt in func.body
        for node in ast.walk(stmt)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def only_raises(func: FunctionNode) -> bool:
    """The body (docstring and ``pass`` aside) is a single ``raise``: the method refuses the
    operation whatever it is passed."""
    body = [s for s in body_without_docstring(func) if not isinstance(s, ast.Pass)]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def is_single_call_body(func: FunctionNode, call: ast.Call) -> bool:
    """The body is just ``return <call>`` or ``<call>``: a pure forwarder."""
    body = body_without_docstring(func)
    return len(body) == 1 and isinstance(body[0], (ast.Return, ast.Expr)) and body[0].value is call
