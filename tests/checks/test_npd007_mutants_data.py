"""The dry run's hidden test set (tests/data/dryrun/mutants/) is sound data: every diff applies
exactly to sglang 0.5.23 and leaves Python that compiles, the strict applier refuses a diff that no
longer fits, and the README's table describes exactly the diffs present, at lines they touch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.patches import PatchError, mutated_tree, parse_unified_diff
from support.repo import REPO

MUTANTS = REPO / "tests" / "data" / "dryrun" / "mutants"
PATCHES = sorted(MUTANTS.glob("*.patch"))
KINDS = ("regression", "refactor")
# | `name` | kind | `file:line` | ...
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<kind>\w+) \| `(?P<file>[^`:]+):(?P<line>\d+)` \|", re.M)


def readme_rows() -> dict[str, re.Match]:
    rows = {}
    for row in ROW.finditer((MUTANTS / "README.md").read_text()):
        assert row["name"] not in rows, f"{row['name']} is listed twice"
        rows[row["name"]] = row
    return rows


@pytest.mark.parametrize("patch", PATCHES, ids=lambda path: path.stem)
def test_applies_to_0_5_23_and_compiles(release, tmp_path, patch):
    base = release("0.5.23")
    tree = mutated_tree(base, patch, tmp_path)
    for file_patch in parse_unified_diff(patch.read_text()):
        mutated = (tree / file_patch.path).read_text()
        # Differs from the cached release: written anew, not through the overlay's hard link.
        assert mutated != (base / file_patch.path).read_text()
        compile(mutated, file_patch.path, "exec")  # SyntaxError fails the test
    with pytest.raises(PatchError, match="differs from the diff"):
        mutated_tree(tree, patch, tmp_path / "twice")  # already applied: the old lines are gone


def test_the_readme_table_lists_exactly_the_patches_present():
    rows = readme_rows()
    assert sorted(rows) == [path.stem for path in PATCHES]
    for name, row in rows.items():
        assert row["kind"] in KINDS and name.startswith(row["kind"] + "-"), row.group(0)
    for kind in KINDS:
        assert sum(row["kind"] == kind for row in rows.values()) >= 5, kind


@pytest.mark.parametrize("patch", PATCHES, ids=lambda path: path.stem)
def test_the_readme_cites_a_line_the_patch_touches(patch):
    row = readme_rows()[patch.stem]
    cited = int(row["line"])
    spans = [
        (hunk.old_start, hunk.old_start + len(hunk.old_lines) - 1)
        for file_patch in parse_unified_diff(patch.read_text())
        if file_patch.path == f"sglang/srt/{row['file']}"
        for hunk in file_patch.hunks
    ]
    assert any(start <= cited <= end for start, end in spans), (row.group(0), spans)


def test_a_diff_that_no_longer_fits_is_refused(release, tmp_path):
    """No offset, no fuzz: the same hunk one line lower is refused, where ``patch`` would apply it."""
    patch = MUTANTS / "regression-attr-typo-prepare-for-decode.patch"
    moved = re.sub(r"^@@ -(\d+)", lambda m: f"@@ -{int(m[1]) + 1}", patch.read_text(), flags=re.M)
    stale = tmp_path / "stale.patch"
    stale.write_text(moved)
    with pytest.raises(PatchError, match="differs from the diff"):
        mutated_tree(release("0.5.23"), stale, tmp_path / "copy")


def test_a_file_the_release_does_not_have_is_refused(release, tmp_path):
    patch = tmp_path / "absent.patch"
    text = (MUTANTS / "regression-attr-typo-chunked-req.patch").read_text()
    patch.write_text(text.replace("schedule_policy.py", "schedule_policy_v2.py"))
    with pytest.raises(PatchError, match="not in"):
        mutated_tree(release("0.5.23"), patch, tmp_path / "copy")


def test_every_patch_is_read_as_one_file_per_header():
    """The parser sees every ``+++`` header of every diff (a header it skipped would leave a file
    unpatched and the mutant silently absent)."""
    for patch in PATCHES:
        headers = [line for line in patch.read_text().splitlines() if line.startswith("+++ ")]
        assert [f"+++ b/{fp.path}" for fp in parse_unified_diff(patch.read_text())] == headers


def test_paths_are_relative_to_the_tree_root():
    for patch in PATCHES:
        assert all(
            Path(fp.path).parts[:2] == ("sglang", "srt") for fp in parse_unified_diff(patch.read_text())
        )
