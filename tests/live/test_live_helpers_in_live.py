"""The live depth's general helpers live in ``npudoctor/live/``, once; a check's ``live.py`` keeps
only what is specific to its property.

Read with ``ast`` from the source: no check's live probe defines a function or class under a name a
``npudoctor/live/`` module already defines (a second copy of a helper), and none turns a file name
into an sglang ``file:line`` itself (``npudoctor.live.locations`` does, for every probe: ``relative``,
``code_location``, ``frame_location``, ``raising_location``, ``Raised``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBES = sorted((REPO / "checks").glob("*/live.py"))
LIVE = sorted((REPO / "npudoctor" / "live").glob("*.py"))


def top_level_names(path: Path) -> dict[str, int]:
    """The functions and classes ``path`` defines at module level -> their line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name: node.lineno
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def live_helpers() -> dict[str, str]:
    """Every public function and class of ``npudoctor/live/`` -> the module that defines it."""
    return {
        name: f"npudoctor.live.{path.stem}"
        for path in LIVE
        for name in top_level_names(path)
        if not name.startswith("_")
    }


def test_the_probes_and_live_are_found():
    assert len(PROBES) >= 6 and "code_location" in live_helpers()


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.parent.name)
def test_a_probe_does_not_define_a_helper_live_provides(probe: Path):
    helpers = live_helpers()
    again = {
        f"{probe.relative_to(REPO)}:{line} {name} (already {helpers[name]}.{name})"
        for name, line in top_level_names(probe).items()
        if name in helpers
    }
    assert not again


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.parent.name)
def test_a_probe_leaves_sglang_locations_to_live_locations(probe: Path):
    """A string with ``/sglang/`` in a probe is a file name cut into an sglang path by hand."""
    tree = ast.parse(probe.read_text(encoding="utf-8"))
    by_hand = [
        f"{probe.relative_to(REPO)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "/sglang/" in node.value
    ]
    assert not by_hand
