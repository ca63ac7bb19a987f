"""Unified diffs applied to an overlay copy of a release tree, strictly, in Python alone.

The dry run's hidden test set (``tests/data/dryrun/mutants/``) is a set of diffs against one
release; each must change exactly the lines it was written against, or it would test another
program than its README describes. So every hunk must match at the line its header states: no
offset, no fuzz, no whitespace leniency, no file created or deleted (``patch`` and ``git apply``
would search nearby lines, which hides a diff gone stale). Pure Python, because the CI images are
not promised ``patch`` or a work tree for ``git apply``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.trees import overlay_tree

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """A diff that cannot be applied exactly as written (malformed, or stale against the tree)."""


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based line of the first old line, as the header states it
    old_lines: tuple[str, ...]  # context and removed lines, each with its newline
    new_lines: tuple[str, ...]  # context and added lines


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative to the tree root: the ``b/`` side with its first component stripped
    hunks: tuple[Hunk, ...]


def _strip_prefix(header: str, marker: str) -> str:
    name = header[len(marker) :].split("\t")[0].rstrip("\n")
    if name == "/dev/null":
        raise PatchError("creating or deleting a file is not supported")
    return name.split("/", 1)[1]  # -p1


def parse_unified_diff(text: str) -> list[FilePatch]:
    """The file patches of ``text`` (git's or diff -u's format), hunk line counts checked."""
    lines = text.splitlines(keepends=True)
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1  # "diff --git", "index", free text between files
            continue
        old_path = _strip_prefix(lines[i], "--- ")
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"'--- {old_path}' without a '+++' line")
        path = _strip_prefix(lines[i + 1], "+++ ")
        if path != old_path:
            raise PatchError(f"renames are not supported: {old_path} -> {path}")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and (match := _HUNK_HEADER.match(lines[i])):
            old_count = int(match.group(2) or 1)
            new_count = int(match.group(4) or 1)
            old: list[str] = []
            new: list[str] = []
            i += 1
            while len(old) < old_count or len(new) < new_count:
                if i >= len(lines):
                    raise PatchError(f"{path}: hunk at line {match.group(1)} is cut short")
                line = lines[i]
                tag, body = line[:1], line[1:]
                if line.startswith("\\"):
                    raise PatchError(f"{path}: 'No newline at end of file' is not supported")
                if tag in (" ", "-"):
                    old.append(body)
                if tag in (" ", "+"):
                    new.append(body)
                if tag not in (" ", "-", "+"):
                    raise PatchError(f"{path}: unexpected line in a hunk: {line!r}")
                i += 1
            if len(old) != old_count or len(new) != new_count:
                raise PatchError(f"{path}: hunk at line {match.group(1)} does not match its header")
            hunks.append(Hunk(int(match.group(1)), tuple(old), tuple(new)))
        if not hunks:
            raise PatchError(f"{path}: no hunks")
        patches.append(FilePatch(path, tuple(hunks)))
    if not patches:
        raise PatchError("no file patches in the diff")
    return patches


def apply_file_patch(source: str, patch: FilePatch) -> str:
    """``source`` with every hunk of ``patch`` applied at exactly its stated line."""
    lines = source.splitlines(keepends=True)
    result: list[str] = []
    cursor = 0  # index into ``lines`` of the first line not yet copied
    for hunk in patch.hunks:
        start = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
        if start < cursor:
            raise PatchError(f"{patch.path}: hunks overlap or are out of order at line {hunk.old_start}")
        found = tuple(lines[start : start + len(hunk.old_lines)])
        if found != hunk.old_lines:
            raise PatchError(f"{patch.path}: the tree differs from the diff at line {hunk.old_start}")
        result.extend(lines[cursor:start])
        result.extend(hunk.new_lines)
        cursor = start + len(hunk.old_lines)
    result.extend(lines[cursor:])
    return "".join(result)


def mutated_tree(base: Path, patch: Path, dest: Path) -> Path:
    """An overlay copy of the release tree ``base`` (the directory holding ``sglang/``) under
    ``dest``, with the unified diff ``patch`` applied; returns the copy's root (it holds
    ``sglang/``, as ``base`` does). Every file is checked before one is written, and a patched file
    is unlinked and written anew, never written through its hard link to the cached release."""
    copy = overlay_tree(base, dest)
    patched = {}
    for file_patch in parse_unified_diff(patch.read_text()):
        target = copy / file_patch.path
        if target in patched:
            raise PatchError(f"{file_patch.path}: patched twice in one diff")
        if not target.is_file():
            raise PatchError(f"{file_patch.path}: not in {base}")
        patched[target] = apply_file_patch(target.read_text(), file_patch)
    for target, text in patched.items():
        target.unlink()
        target.write_text(text)
    return copy
