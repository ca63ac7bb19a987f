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

from npudoctor.static.source import SourceTree, flatten_conditional

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
    absent: bool = False  # matches when the target defines no ``symbol`` at all (a feature not there yet)

    @classmethod
    def from_data(cls, data: dict, where: str) -> Fingerprint:
        unknown = set(data) - {"symbol", "contains", "lacks", "under", "absent"}
        if unknown or not isinstance(data.get("symbol"), str):
            raise ValueError(
                f"{where}: a fingerprint is symbol + contains/lacks/under/absent, got {sorted(data)}"
            )
        patterns = {key: _patterns(data.get(key), f"{where}.{key}") for key in ("contains", "lacks")}
        absent = data.get("absent", False)
        if not isinstance(absent, bool) or (absent and (patterns["contains"] or patterns["lacks"])):
            raise ValueError(f"{where}: absent is true or false, and an absent symbol has no patterns")
        return cls(
            data["symbol"], patterns["contains"], patterns["lacks"], str(data.get("under", "")), absent
        )

    def __str__(self) -> str:
        return self.symbol


@dataclass(frozen=True)
class Site:
    """Where a symbol is defined in the target, and the line that decided a match."""

    path: str  # relative to the directory holding sglang/
    line: int
    symbol: str


@dataclass(eq=False)
class Definition:
    """One definition of a fingerprint's symbol in the target; its normalised text is made when a
    pattern first needs it (a fingerprint that only asks whether a class exists needs none)."""

    path: Path
    relpath: str
    node: _Definition

    @functools.cached_property
    def text(self) -> str:
        return ast.unparse(self.node)

    def site(self, symbol: str, line: int | None = None) -> Site:
        return Site(self.relpath, line or _first_line(self.node), symbol)


def definitions(
    tree: SourceTree, symbol: str, under: str = "", names: frozenset[str] = frozenset()
) -> list[Definition]:
    """Every definition of ``symbol`` (``A.b``: method ``b`` of a class ``A``; ``A.B.c`` nested)
    in the target, in file order. ``names``: every top-level name the caller will ask about (the
    whole catalog's): the files defining them are found in one pass over the tree. Only the
    definition's own lines are parsed (sglang's attention backend is 3,500 lines)."""
    memo = tree.memo.setdefault("fingerprints.definitions", {})
    key = (symbol, under)
    if key not in memo:
        parts = symbol.split(".")
        found = []
        for path, offsets in _defining_files(tree, parts[0], names | {parts[0]}, under):
            data = tree.read(path)
            if len(parts) == 2:  # a method: its own block, inside the class's block
                offsets = [o for start in offsets for o in _member_offsets(data, start, parts[1])]
            for offset in offsets:
                for node in _parse_definition(tree, path, offset, parts[-1] if len(parts) <= 2 else parts[0]):
                    for hit in _resolve([node], parts[-1:] if len(parts) <= 2 else parts):
                        found.append(Definition(path, tree.relpath(path), hit))
        memo[key] = found
    return memo[key]  # type: ignore[return-value]


# ``def`` or ``class`` then one of the names, one pattern each (a literal first word lets the regex
# engine skip ahead; ``(?:def|class)`` or a line anchor in front made the pass 4-10 times slower
# over 40 MB of source); that the keyword starts its line is checked after the match
_DEFINES = (r"def[ \t]+({names})\b", r"class[ \t]+({names})\b")
_LINE_START = re.compile(rb"[ \t]*(?:async[ \t]+)?$")
# sglang.multimodal_gen, the diffusion server (a third of 0.5.23's source), runs no NPU LLM path:
# never searched
_ELSEWHERE = os.sep + "multimodal_gen" + os.sep


def _defining_files(
    tree: SourceTree, name: str, names: frozenset[str], under: str
) -> list[tuple[Path, list[int]]]:
    """The files that define ``name`` (at any indentation: under ``if``/``try`` too) and the
    offsets of those lines, from one regex pass over the tree for all of ``names``."""
    memo = tree.memo.setdefault("fingerprints.index", {})
    if name not in memo.get("names", ()):
        wanted = sorted(names | set(memo.get("names", ())))
        alternatives = "|".join(map(re.escape, wanted))
        patterns = [re.compile(p.format(names=alternatives).encode()) for p in _DEFINES]
        index: dict[str, list[tuple[Path, list[int]]]] = {n: [] for n in wanted}
        for path in tree.files:
            if _ELSEWHERE in path:
                continue
            data = tree.read(path)
            hits: dict[str, list[int]] = {}
            for pattern in patterns:
                for match in pattern.finditer(data):
                    line_start = data.rfind(b"\n", 0, match.start()) + 1
                    if _LINE_START.match(data, line_start, match.start()):
                        hits.setdefault(match.group(1).decode(), []).append(line_start)
            for hit, offsets in hits.items():
                index[hit].append((Path(path), sorted(offsets)))
        memo["names"] = frozenset(wanted)
        memo["index"] = index
    found = memo["index"].get(name, [])  # type: ignore[union-attr]
    if under:
        sub = os.path.join(tree.package_dir, under.removeprefix("sglang").strip("/"), "")
        return [(p, o) for p, o in found if str(p).startswith(sub)]
    return found


def _member_offsets(data: bytes, class_offset: int, member: str) -> list[int]:
    """Offsets of the lines defining ``member`` directly in the body of the class whose line
    starts at ``class_offset`` (the body's indentation, not deeper)."""
    lines = _lines(data)
    first = data.count(b"\n", 0, class_offset)
    start, end = _block_lines(lines, first)
    body_indent = next(
        (
            _indent(line)
            for line in lines[first + 1 : end]
            if line.strip() and not line.lstrip().startswith("#")
        ),
        None,
    )
    pattern = re.compile(rf"(?:async\s+)?(?:def|class)\s+{re.escape(member)}\b")
    offsets = []
    position = sum(len(line.encode()) for line in lines[:first])  # the decoded lines' byte offsets
    for number in range(first, end):
        line = lines[number]
        if number > first and _indent(line) == body_indent and pattern.match(line.lstrip()):
            offsets.append(position)
        position += len(line.encode())
    return offsets


def _parse_definition(tree: SourceTree, path: Path, offset: int, name: str) -> list[_Definition]:
    """The definition of ``name`` whose line starts at ``offset``, parsed from its own lines with
    its line numbers kept; from the whole module when those lines do not parse on their own."""
    data = tree.read(path)
    lines = _lines(data)
    line = data.count(b"\n", 0, offset)
    start, end = _block_lines(lines, line)
    try:
        module = ast.parse("\n" * start + textwrap.dedent("".join(lines[start:end])))
    except SyntaxError:
        module = None
    found = [n for n in _defined(module.body) if n.name == name] if module is not None else []
    if found:
        return found
    whole = tree.parse(path)
    return (
        [n for n in ast.walk(whole) if isinstance(n, _Definition) and n.name == name and n.lineno == line + 1]
        if whole
        else []
    )


def _block_lines(lines: list[str], line: int) -> tuple[int, int]:
    """The first line (decorators included) and the end of the definition whose ``def``/``class``
    is on line index ``line``: up to the next line indented no deeper."""
    indent = _indent(lines[line])
    start = line
    while start > 0 and lines[start - 1].strip().startswith("@"):
        start -= 1
    end = line + 1
    while end < len(lines):
        text = lines[end]
        stripped = text.strip()
        # a comment, or the closing line of a multi-line signature (``) -> int:``), ends nothing
        if stripped and _indent(text) <= indent and not stripped.startswith(("#", ")", "]", "}")):
            break
        end += 1
    return start, end


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def matches(definition: Definition, fingerprint: Fingerprint) -> bool:
    if not fingerprint.contains and not fingerprint.lacks:
        return True
    return all(re.search(p, definition.text) for p in fingerprint.contains) and not any(
        re.search(p, definition.text) for p in fingerprint.lacks
    )


def deciding_line(definition: Definition, fingerprint: Fingerprint) -> int:
    """The line of the innermost statement whose own text matches the fingerprint's first
    ``contains`` pattern (the code that shows the shape); the definition's line without one."""
    if not fingerprint.contains:
        return _first_line(definition.node)
    pattern = re.compile(fingerprint.contains[0])
    line, node = _first_line(definition.node), definition.node
    while True:  # a statement's text holds its children's: narrow from the outside in
        hits = [
            c
            for c in ast.iter_child_nodes(node)
            if isinstance(c, ast.stmt) and pattern.search(ast.unparse(c))
        ]
        if not hits:
            return line
        node = hits[-1]  # the last of several (the order ``ast.walk`` would meet them last)
        line = node.lineno


@functools.lru_cache(maxsize=64)
def _lines(data: bytes) -> list[str]:
    """The file's lines, split at ``\\n`` only (as line numbers count; ``str.splitlines`` also
    splits at form feeds and other separators)."""
    return [line + "\n" for line in data.decode("utf-8", "replace").split("\n")]


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
    return (node for node in flatten_conditional(body) if isinstance(node, _Definition))


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
