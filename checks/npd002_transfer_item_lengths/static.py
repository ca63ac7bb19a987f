"""NPD002 static probe: run each NPU pool class's construction and its ``get_contiguous_buf_infos``
on symbols (``npudoctor.static.shapes``) in every PD role's environment, and require every item length to
be the layer buffer's bytes divided by its page count (one page), pointing at the ``kv_item_lens``
line when it is not.
"""

from __future__ import annotations

import ast
import re

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.poolclasses import no_npu_pool, npu_pool_classes
from npudoctor.static.shapes import LayoutEvaluator, Sym, flatten
from npudoctor.static.source import ClassInfo, SourceTree

from .verdict import FIA_ENV, verdict

_POOL_SIZE = re.compile(r"(?<![A-Za-z_])size\b")  # `self.size` (tokens), not page_size or itemsize


def static_probe(
    tree: SourceTree,
    facts: Facts,
    roles: list[RoleFacts],
    families: list[str],
    assumptions: tuple[str, ...],
) -> Probe:
    """The verdict over every NPU pool class of ``families`` whose layout follows ``ASCEND_USE_FIA``."""
    evidence: list[Evidence] = []
    failing, unknown, checked, fia_independent = [], [], [], []
    for family in families:
        classes = npu_pool_classes(tree, family)
        if not classes:
            unknown.append(f"no NPU {family.upper()} pool class")
            evidence.append(no_npu_pool(family))
            continue
        for cls in classes:
            if not _layout_follows_env(tree, cls, FIA_ENV):
                fia_independent.append(cls.name)
                continue
            for role in roles:
                outcome, item = _check_items(tree, cls, role, facts)
                evidence.append(item)
                label = f"{cls.name} ({role.name}, FIA {'on' if role.use_fia else 'off'})"
                {"fail": failing, "unknown": unknown, "pass": checked}[outcome].append(label)

    if not (failing or unknown or checked):
        return Probe(
            Status.SKIP,
            f"the deployment's NPU pools ({', '.join(fia_independent)}) keep one layout whatever "
            f"{FIA_ENV} says; their items are pages",
            tuple(evidence),
            assumptions,
        )
    return verdict(roles, evidence, assumptions, failing, unknown)


def _layout_follows_env(tree: SourceTree, cls: ClassInfo, name: str) -> bool:
    """Whether building ``cls`` reads environment variable ``name`` (FIA switches the layout)."""
    return any(
        isinstance(node, ast.Constant) and node.value == name
        for method in tree.construction_methods(cls)
        for node in ast.walk(method.node)
    )


def _check_items(tree: SourceTree, cls: ClassInfo, role: RoleFacts, facts: Facts) -> tuple[str, Evidence]:
    params = {"is_quantized_kv_cache": False} if role.kv_cache_dtype == "auto" else {}
    if facts.model is not None:
        params["index_head_dim"] = facts.model.index_head_dim
    env = dict(role.env)
    env[FIA_ENV] = "1" if role.use_fia else "0"
    evaluator = LayoutEvaluator(tree, cls, env, params)
    evaluator.construct()
    method = tree.lookup(evaluator.mro, "get_contiguous_buf_infos")
    where = (
        Location(method.relpath, method.line, method.qualname) if method else Location(cls.relpath, cls.line)
    )
    result = evaluator.call("get_contiguous_buf_infos")
    lens, items = (
        (flatten(result[1]), flatten(result[2]))
        if isinstance(result, tuple) and len(result) == 3
        else ([], [])
    )
    flag = f"{FIA_ENV}={'1' if role.use_fia else '0'}"
    if not items or len(lens) != len(items) or not all(isinstance(x, Sym) for x in lens + items):
        return "unknown", Evidence(
            expected=f"{cls.name}.get_contiguous_buf_infos item lengths that npudoctor can evaluate ({flag})",
            observed="the buffer layout or the item-length formula is not one the static evaluator understands",
            location=where,
        )
    item_line = _item_lens_line(method) if method else None
    at = f" ({method.relpath}:{item_line})" if item_line else ""
    for data_len, item in zip(lens, items):
        page = _one_page(data_len)
        if page is None:
            return "unknown", Evidence(
                expected=f"a layer buffer whose size has a page count ({flag})",
                observed=f"buffer bytes = {data_len}: no page-count factor found",
                location=where,
            )
        if item != page:
            ratio = page / item
            return "fail", Evidence(
                expected=f"kv_item_lens = one page of the layer buffer = {page} bytes ({cls.name}, {flag})",
                observed=(
                    f"{method.qualname} ({method.where()}) reports kv_item_lens{at} = {item} bytes, "
                    f"1/{ratio} of a page (the buffer per layer is {data_len} bytes)"
                ),
                location=Location(method.relpath, item_line or method.line, method.qualname),
            )
    return "pass", Evidence(
        expected=f"kv_item_lens = one page of each layer buffer ({cls.name}, {flag})",
        observed=f"{method.qualname} ({method.where()}) reports {items[0]} bytes per item = one page",
        location=where,
    )


def _one_page(buffer_bytes: Sym) -> Sym | None:
    """Bytes of one page: the buffer's bytes without its page-count factor (built from ``self.size``)."""
    pages = [atom for atom, power in buffer_bytes.atoms if power == 1 and _POOL_SIZE.search(atom)]
    return buffer_bytes / Sym.atom(pages[0]) if len(pages) == 1 else None


def _item_lens_line(method) -> int | None:
    lines = [
        node.lineno
        for node in ast.walk(method.node)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "kv_item_lens" for t in node.targets)
    ]
    return max(lines) if lines else None
