"""Where the NPU KV-cache pool classes of a release live, found by inheritance, not by path.

On Ascend, sglang builds an ``NPU*`` subclass of its generic pools
(``MHATokenToKVPool`` for MHA/GQA models, ``MLATokenToKVPool`` for MLA models, with
or without the NSA indexer buffer). Releases move these classes between files, so
they are found as the classes under ``srt/`` whose file is in an NPU/Ascend backend
directory (or whose name says NPU) and whose MRO contains the generic pool.
"""

from __future__ import annotations

from npudoctor.facts import AttentionKind
from npudoctor.source import ClassInfo, SourceTree

GENERIC_POOL = {"mla": "MLATokenToKVPool", "mha": "MHATokenToKVPool"}


def pool_family(kind: AttentionKind) -> str:
    return "mla" if kind.is_mla else "mha"


def npu_pool_classes(tree: SourceTree, family: str) -> list[ClassInfo]:
    """The NPU pool classes that subclass the generic pool of ``family`` ("mla" or "mha")."""
    base = GENERIC_POOL[family]
    found = []
    for path in tree.files_containing(base, under="srt"):
        rel = tree.relpath(path).lower()
        npu_file = "npu" in rel or "ascend" in rel
        if not npu_file and not any(marker in tree.read(path) for marker in (b"class NPU", b"class Ascend")):
            continue  # parse only files that can hold an NPU class
        for cls in tree.classes_in(path):
            is_npu = npu_file or cls.name.startswith(("NPU", "Ascend"))
            if is_npu and cls.name != base and tree.is_subclass(cls, base):
                found.append(cls)
    return found
