"""Fingerprints: the shape of one function or class in a release's source, found wherever it lives.

A catalog record (``npudoctor.engine.catalog``) tells a defective release from a fixed one by the
code, never by its version string: each of its fingerprints names a symbol (``Class.method``,
``function`` or ``Class``) and regular expressions its code must contain (``contains``) and must
not contain (``lacks``). Code moves between files across releases, so the symbol is looked up in
every file whose text defines its last name (``def name`` / ``class Name``), optionally only below
``under``; a source state between releases or a vendor fork is judged from what it defines.

The text a pattern is matched against is ``ast.unparse`` of the symbol: comments, docstrings,
line breaks and quoting are normalised (strings are single-quoted, one space around binary
operators, no trailing commas), so a pattern survives reformatting. The evidence line is that of
the innermost statement whose own text matches the first pattern that decided.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from npudoctor.static.source import SourceTree

_Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class Fingerprint:
    """One shape: ``symbol`` defined somewhere (below ``under``, a path relative to the tree's
    root such as ``sglang/srt/hardware_backend``), whose code matches every ``contains`` pattern
    and none of the ``lacks`` patterns."""

    symbol: str
    contains: tuple[str, ...] = ()
    lacks: tuple[str, ...] = ()
    under: str = ""

    @classmethod
    def from_data(cls, data: dict, where: str) -> Fingerprint:
        unknown = set(data) - {"symbol", "contains", "lacks", "under"}
        if unknown or not isinstance(data.get("symbol"), str):
            raise ValueError(f"{where}: a fingerprint is symbol + contains/lacks/under, got {sorted(data)}")
        patterns = {key: _patterns(data.get(key), f"{where}.{key}") for key in ("contains", "lacks")}
        return cls(data["symbol"], patterns["contains"], patterns["lacks"], str(data.get("under", "")))

    def __str__(self) -> str:
        return self.symbol


@dataclass(frozen=True)
class Site:
    """Where a symbol is defined in the target, and the line that decided a match."""

    path: str  # relative to the directory holding sglang/
    line: int
    symbol: str


@dataclass(frozen=True)
class Definition:
    """One definition of a fingerprint's symbol in the target, and its normalised text."""

    path: Path
    relpath: str
    node: _Definition
    text: str

    def site(self, symbol: str, line: int | None = None) -> Site:
        return Site(self.relpath, line or _first_line(self.node), symbol)


def definitions(tree: SourceTree, symbol: str, under: str = "") -> list[Definition]:
    """Every definition of ``symbol`` (``A.b``: method ``b`` of a class ``A``; nested classes
    and functions are not followed) in the target, in file order."""
    parts = symbol.split(".")
    memo = tree.memo.setdefault("fingerprints.definitions", {})
    key = (symbol, under)
    if key in memo:
        return memo[key]  # type: ignore[return-value]
    last = parts[-1]
    needles = (f"def {last}(", f"class {last}")
    sub = under.removeprefix("sglang/").removeprefix("sglang")
    candidates = {path for needle in needles for path in tree.files_containing(needle, sub.strip("/"))}
    found = []
    for path in sorted(candidates):
        module = tree.parse(path)
        if module is None:
            continue
        for node in _resolve(module.body, parts):
            found.append(Definition(path, tree.relpath(path), node, ast.unparse(node)))
    memo[key] = found
    return found


def matches(definition: Definition, fingerprint: Fingerprint) -> bool:
    return all(re.search(p, definition.text) for p in fingerprint.contains) and not any(
        re.search(p, definition.text) for p in fingerprint.lacks
    )


def deciding_line(definition: Definition, fingerprint: Fingerprint) -> int:
    """The line of the innermost statement whose own text matches the fingerprint's first
    ``contains`` pattern (the code that shows the shape); the definition's line without one."""
    if not fingerprint.contains:
        return _first_line(definition.node)
    pattern = re.compile(fingerprint.contains[0])
    line = _first_line(definition.node)
    for node in _statements(definition.node):
        if pattern.search(ast.unparse(node)):
            line = node.lineno  # walked outermost first: the last hit is the innermost
    return line


def _statements(node: ast.AST) -> Iterator[ast.AST]:
    """Statements below ``node``, each before those nested in it; only into a statement that can
    still contain the match (``deciding_line`` narrows from the outside in)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            yield child
            yield from _statements(child)


def _resolve(body: list[ast.stmt], parts: list[str]) -> Iterator[_Definition]:
    for node in _defined(body):
        if node.name != parts[0]:
            continue
        if len(parts) == 1:
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from _resolve(node.body, parts[1:])


def _defined(body: list[ast.stmt]) -> Iterator[_Definition]:
    """Definitions in a body, also under ``if``/``try`` at that level (``if _is_npu: def ...``)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
        elif isinstance(node, ast.If):
            yield from _defined(node.body)
            yield from _defined(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _defined(block)


def _first_line(node: _Definition) -> int:
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def _patterns(value, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(p, str) for p in items):
        raise ValueError(f"{where}: a regular expression or a list of them")
    for pattern in items:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{where}: {pattern!r}: {error}") from None
    return tuple(items)
