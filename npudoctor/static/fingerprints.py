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
import functools
import os
import re
import textwrap
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


def definitions(
    tree: SourceTree, symbol: str, under: str = "", names: frozenset[str] = frozenset()
) -> list[Definition]:
    """Every definition of ``symbol`` (``A.b``: method ``b`` of a class ``A``; nested classes and
    functions are not followed) in the target, in file order. ``names``: every top-level name the
    caller will ask about (the whole catalog's): the files defining them are found in one pass."""
    memo = tree.memo.setdefault("fingerprints.definitions", {})
    key = (symbol, under)
    if key not in memo:
        parts = symbol.split(".")
        found = []
        for path, offsets in _defining_files(tree, parts[0], names | {parts[0]}, under):
            for node in _top_level(tree, path, offsets, parts[0]):
                for hit in _resolve([node], parts):
                    found.append(Definition(path, tree.relpath(path), hit, ast.unparse(hit)))
        memo[key] = found
    return memo[key]  # type: ignore[return-value]


# A line that defines a name at any indentation (a top-level name under ``if``/``try`` is indented).
_DEFINES = r"(?m)^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+({names})\b"
# sglang.multimodal_gen, the diffusion server (a third of 0.5.23's source), runs no NPU LLM path:
# never searched
_ELSEWHERE = os.sep + "multimodal_gen" + os.sep


def _defining_files(
    tree: SourceTree, name: str, names: frozenset[str], under: str
) -> list[tuple[Path, list[int]]]:
    """The files that define ``name`` and the offsets of those lines, from one regex pass over
    the tree for all of ``names`` (a pass per name would read the tree dozens of times)."""
    memo = tree.memo.setdefault("fingerprints.index", {})
    if name not in memo.get("names", ()):
        wanted = sorted(names | set(memo.get("names", ())))
        pattern = re.compile(_DEFINES.format(names="|".join(map(re.escape, wanted))).encode())
        index: dict[str, list[tuple[Path, list[int]]]] = {n: [] for n in wanted}
        for path in tree.files:
            if _ELSEWHERE in path:
                continue
            hits: dict[str, list[int]] = {}
            data = tree.read(path)
            if b"def " not in data and b"class " not in data:
                continue
            for match in pattern.finditer(data):
                hits.setdefault(match.group(1).decode(), []).append(match.start())
            for hit, offsets in hits.items():
                index[hit].append((Path(path), offsets))
        memo["names"] = frozenset(wanted)
        memo["index"] = index
    found = memo["index"].get(name, [])  # type: ignore[union-attr]
    if under:
        sub = os.path.join(tree.package_dir, under.removeprefix("sglang").strip("/"), "")
        return [(p, o) for p, o in found if str(p).startswith(sub)]
    return found


def _top_level(tree: SourceTree, path: Path, offsets: list[int], name: str) -> list[_Definition]:
    """The definitions of ``name`` that start at ``offsets`` in ``path``, each parsed from its own
    block of lines (a large module is not parsed whole for one function); the whole module when a
    block does not parse on its own."""
    data = tree.read(path)
    found: list[_Definition] = []
    for offset in offsets:
        block, first_line = _block(data, offset)
        try:
            module = ast.parse(textwrap.dedent(block))
        except SyntaxError:
            module = None
        if module is None or not module.body:
            whole = tree.parse(path)
            return [n for n in _defined(whole.body) if n.name == name] if whole else []
        ast.increment_lineno(module, first_line - 1)
        found += [n for n in _defined(module.body) if n.name == name]
    return found


def _block(data: bytes, offset: int) -> tuple[str, int]:
    """The source of the definition whose ``def``/``class`` line starts at ``offset`` (decorators
    above it included) up to the next line indented no deeper, and its first line number."""
    lines = _lines(data)
    line = data.count(b"\n", 0, offset)
    indent = len(lines[line]) - len(lines[line].lstrip())
    start = line
    while start > 0 and lines[start - 1].strip().startswith("@"):
        start -= 1
    end = line + 1
    while end < len(lines):
        text = lines[end]
        stripped = text.strip()
        shallow = stripped and len(text) - len(text.lstrip()) <= indent
        # a comment, or the closing line of a multi-line signature (``) -> int:``), ends nothing
        if shallow and not stripped.startswith(("#", ")", "]", "}")):
            break
        end += 1
    return "".join(lines[start:end]), start + 1


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


@functools.lru_cache(maxsize=64)
def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", "replace").splitlines(keepends=True)


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
