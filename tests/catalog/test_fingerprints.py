"""A record's verdict comes from the code, wherever it lives, never from the version string:
source states no wheel ships (a function moved to another module, a guard removed again, a
function rewritten, a function gone) built as overlays of the real 0.5.23 tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npudoctor.deployment.facts import NO_DEPLOYMENT
from npudoctor.engine.catalog import CatalogRecord
from npudoctor.results import Status
from npudoctor.static import fingerprints
from npudoctor.static.fingerprints import Fingerprint
from npudoctor.target.discovery import discover

EMBEDDING = "sglang/srt/layers/vocab_parallel_embedding.py"
GUARD = r"if _is_npu:\s*\n\s*return False"
RECORD = {
    "id": "NPC900",
    "title": "test record: the Triton embedding kernel without its NPU guard",
    "impact": "runtime-crash",
    "summary": "VocabParallelEmbedding would launch the Triton embedding kernel on NPU (sglang PR #31636)",
    "upstream": {"fix": ["https://github.com/sgl-project/sglang/pull/31636"]},
    "bites_when": "tp > 1",
    "defective": {
        "says": "no NPU guard",
        "fingerprints": [
            {
                "symbol": "VocabParallelEmbedding._use_triton_embedding",
                "contains": ["tp_size == 1"],
                "lacks": [GUARD],
            }
        ],
    },
    "fixed": {
        "says": "returns False on NPU first",
        "fingerprints": [{"symbol": "VocabParallelEmbedding._use_triton_embedding", "contains": [GUARD]}],
    },
}


def record() -> CatalogRecord:
    return CatalogRecord(RECORD, "test")


def verdict(tree: Path):
    return record().run(discover(tree / "sglang"), NO_DEPLOYMENT, "static")


def edit(tree: Path, old: str, new: str) -> int:
    """Replace ``old`` in the overlay's embedding module; the line ``new`` starts on."""
    path = tree / EMBEDDING
    text = path.read_text()
    assert old in text
    path.unlink()  # hard-linked to the cached release
    path.write_text(text.replace(old, new, 1))
    return text[: text.index(old)].count("\n") + 1


def test_the_release_has_the_fixed_shape(release):
    result = verdict(release("0.5.23"))
    assert result.status is Status.PASS
    (evidence,) = result.evidence
    line = (release("0.5.23") / EMBEDDING).read_text().splitlines()[evidence.location.line - 1]
    assert line.strip() == "if _is_npu:"


def test_the_guard_removed_again_fails_at_the_line_that_shows_it(release, overlay):
    tree = overlay(release("0.5.23"))
    edit(
        tree,
        "        if _is_npu:\n            return False\n        if self.tp_size",
        "        if self.tp_size",
    )
    result = verdict(tree)
    assert result.status is Status.FAIL
    (evidence,) = result.evidence
    shown = (tree / EMBEDDING).read_text().splitlines()[evidence.location.line - 1]
    assert shown.strip() == "if self.tp_size == 1:"
    assert evidence.location.path == EMBEDDING and evidence.location.symbol.endswith("_use_triton_embedding")


def test_a_class_moved_to_another_module_is_found_there(release, overlay):
    """Code moves between files across releases: the fingerprint follows the class."""
    tree = overlay(release("0.5.23"))
    source = (tree / EMBEDDING).read_text()
    moved = tree / "sglang/srt/layers/moved_embedding.py"
    start = source.index("class VocabParallelEmbedding(")
    end = source.index("\nclass ", start + 1)
    moved.write_text("if True:\n" + re.sub(r"(?m)^(?=.)", "    ", source[start:end]))
    edit(tree, source[start:end], "")
    result = verdict(tree)
    assert result.status is Status.PASS
    assert result.evidence[0].location.path == "sglang/srt/layers/moved_embedding.py"


def test_a_rewritten_function_is_neither_shape_and_says_which(release, overlay):
    tree = overlay(release("0.5.23"))
    edit(
        tree,
        "        if _is_npu:\n            return False\n        if self.tp_size == 1:",
        "        if self.tp_size < 2:",
    )
    result = verdict(tree)
    assert result.status is Status.WARN
    assert "VocabParallelEmbedding._use_triton_embedding" in result.summary
    assert result.evidence[0].location.path == EMBEDDING


def test_a_release_without_the_function_passes_as_absent(release):
    result = verdict(release("0.5.12"))
    assert result.status is Status.PASS
    assert "not in this release" in result.summary


def test_an_absent_symbol_is_a_shape_of_its_own(release):
    """``absent: true`` matches a release that does not define the symbol at all (a feature not
    there yet): 0.5.12 has no VocabParallelEmbedding._use_triton_embedding, 0.5.23 has it."""
    data = {**RECORD, "fixed": {"says": "no Triton embedding path at all", "fingerprints": [
        {"symbol": "VocabParallelEmbedding._use_triton_embedding", "contains": [GUARD]},
        {"all": [{"symbol": "VocabParallelEmbedding"}, {"symbol": "VocabParallelEmbedding._use_triton_embedding", "absent": True}]},
    ]}}  # fmt: skip
    older = CatalogRecord(data, "test").source_verdict(discover(release("0.5.12") / "sglang"))
    assert older.kind == "fixed" and older.site.symbol == "VocabParallelEmbedding"
    assert CatalogRecord(data, "test").defective.symbols == ["VocabParallelEmbedding._use_triton_embedding"]
    with pytest.raises(ValueError):
        Fingerprint.from_data({"symbol": "f", "absent": True, "contains": ["x"]}, "test")


def test_names_are_found_in_one_pass_over_the_tree(release):
    """Every name the catalog asks about is indexed in one read of the tree: a name asked later
    is answered from the same index (no second pass) when it was in the first set."""
    target = discover(release("0.5.23") / "sglang")
    names = frozenset({"VocabParallelEmbedding", "AscendAttnBackend"})
    first = fingerprints.definitions(target.tree, "AscendAttnBackend.forward_extend", names=names)
    index = target.tree.memo["fingerprints.index"]["index"]
    fingerprints.definitions(target.tree, "VocabParallelEmbedding._use_triton_embedding", names=names)
    assert target.tree.memo["fingerprints.index"]["index"] is index
    assert [d.relpath for d in first] == ["sglang/srt/hardware_backend/npu/attention/ascend_backend.py"]


@pytest.mark.parametrize(
    "data",
    [
        {"symbol": "f", "contains": ["(unclosed"]},
        {"symbol": "f", "contain": ["x"]},
        {"contains": ["x"]},
    ],
)
def test_a_malformed_fingerprint_is_refused_when_the_catalog_loads(data):
    with pytest.raises(ValueError):
        Fingerprint.from_data(data, "test")
