"""Where the NPU KV-cache pool classes of a release live, found by inheritance, not by path.

On Ascend, sglang builds an ``NPU*`` subclass of its generic pools
(``MHATokenToKVPool`` for MHA/GQA models, ``MLATokenToKVPool`` for MLA models, with
or without the NSA indexer buffer). Releases move these classes between files, so
they are found as the classes under ``srt/`` whose file is in an NPU/Ascend backend
directory (or whose name says NPU) and whose MRO contains the generic pool.
"""

from __future__ import annotations

from npudoctor.deployment.facts import AttentionKind, Facts
from npudoctor.results import Evidence
from npudoctor.static.source import ClassInfo, SourceTree

GENERIC_POOL = {"mla": "MLATokenToKVPool", "mha": "MHATokenToKVPool"}
# What the retract path calls on a KV pool to offload a request's KV to the CPU and bring it back.
OFFLOAD_METHODS = ("get_cpu_copy", "load_cpu_copy")


def pool_family(kind: AttentionKind) -> str:
    return "mla" if kind.is_mla else "mha"


def no_npu_pool(family: str) -> Evidence:
    """What a static probe reports for a family whose NPU pool class it cannot find."""
    return Evidence(
        expected=f"an NPU subclass of the generic {family.upper()} KV pool under sglang/srt",
        observed="none found: this release's layout is not one npudoctor recognises",
    )


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


def offload_scope(facts: Facts) -> tuple[tuple[str, ...], list[str], tuple[str, ...]]:
    """Roles that offload KV to CPU, the pool families they build, and what had to be assumed.

    Only a PD decode server retracts to host memory (``ScheduleBatch.release_req``); with no
    deployment, or no roles, a decode server is assumed, and with no model both families.
    """
    if not facts.described:
        return (
            ("decode (assumed)",),
            ["mla", "mha"],
            ("no deployment given: assumed a PD decode server, with an MLA and with an MHA model",),
        )
    assumptions: list[str] = []
    roles = tuple(r.name for r in facts.roles if r.can_offload_kv)
    if not facts.roles:
        assumptions.append("no server args given: assumed a PD decode server")
        roles = ("decode (assumed)",)
    if facts.model is None:
        assumptions.append("no model config given: checked both MLA and MHA pools")
        return roles, ["mla", "mha"], tuple(assumptions)
    return roles, [pool_family(facts.model.attention)], tuple(assumptions)
