"""NPD002: PD transfer item lengths equal the bytes of one page of the NPU buffer layout.

PD disaggregation moves KV page by page: the transfer engine copies ``item_len`` bytes
per page index, with ``item_len`` taken from the pool's ``get_contiguous_buf_infos``.
With ``ASCEND_USE_FIA=1`` the NPU MHA pool exposes each layer as a token-major view
``(pages * page_size, 1, heads, dim)``, so ``buffer[0]`` is one *token*; sglang 0.5.9
still reported ``buffer[0].nbytes`` and every transfer moved 1/page_size of each page,
leaving decode with garbage KV. The fix multiplies by ``page_size`` under FIA
(https://github.com/sgl-project/sglang/pull/15852).

Static probe (the property, not the diff): run the deployment's NPU pool construction
and its ``get_contiguous_buf_infos`` on symbols (``npudoctor.shapes``) with the role's
environment, and require every item length to equal the layer buffer's bytes divided by
its page count, i.e. exactly one page, whatever the layout.

Live probe: build each NPU pool of the deployment's family for every PD role, in the
role's environment (``ASCEND_USE_FIA`` decides the layout at construction), with the
role's real dimensions and a few pages, call the real ``get_contiguous_buf_infos`` and
require every item length to be the registered buffer's bytes divided by the pool's
page count (``size / page_size`` pages plus the padded page 0, the count every sglang
pool allocates).
"""

from __future__ import annotations

import ast
import re

from npudoctor import livepools
from npudoctor.check import Check, Probe
from npudoctor.facts import Facts, RoleFacts
from npudoctor.livecode import code_location, exception_evidence
from npudoctor.pools import npu_pool_classes, pool_family
from npudoctor.results import Evidence, Location, Status
from npudoctor.shapes import LayoutEvaluator, Sym, flatten
from npudoctor.source import ClassInfo, SourceTree
from npudoctor.target import Target

FIA_ENV = "ASCEND_USE_FIA"
_POOL_SIZE = re.compile(r"(?<![A-Za-z_])size\b")  # `self.size` (tokens), not page_size or itemsize


class TransferItemLengths(Check):
    id = "NPD002"
    title = "PD transfer item lengths match the NPU KV buffer layout"
    upstream = ("https://github.com/sgl-project/sglang/pull/15852",)
    fixed_in = "0.5.10"
    why = (
        "With ASCEND_USE_FIA=1 the NPU MHA buffer is token-major; if get_contiguous_buf_infos "
        "reports one token per transfer item instead of one page, PD transfer copies a fraction "
        "of each page and decode silently reads garbage KV."
    )
    bites_when = "PD disaggregation with an MHA/GQA model (Qwen3, Qwen3-MoE) and ASCEND_USE_FIA=1."
    how_to_fix = "Upgrade sglang, or apply the npudoctor runtime override for NPD002 (item length = one page under FIA)."

    def live_imports(self) -> None:
        livepools.import_pool_modules()

    def live(self, target: Target, facts: Facts) -> Probe:
        roles, families, assumptions = _scope(facts)
        if not roles:
            return Probe(Status.SKIP, "not a PD disaggregated deployment: no KV cache is transferred")
        evidence: list[Evidence] = []
        failing, unbuilt, checked = [], [], []
        for family in families:
            classes = livepools.npu_pool_classes(family)
            if not classes:
                return Probe(
                    Status.WARN,
                    f"no NPU {family.upper()} pool class is loaded from sglang",
                    assumptions=assumptions,
                    roles=tuple(r.name for r in roles),
                )
            for cls in classes:
                for role in roles:
                    label = f"{cls.__name__} ({role.name}, {FIA_ENV}={'1' if role.use_fia else '0'})"
                    outcome, item = livepools.in_role(
                        role, lambda cls=cls, role=role: _live_items(cls, facts, role)
                    )
                    evidence.append(item)
                    {"fail": failing, "unknown": unbuilt, "pass": checked}[outcome].append(label)
        return _verdict(roles, evidence, assumptions, failing, unbuilt)

    def static(self, target: Target, facts: Facts) -> Probe:
        roles, families, assumptions = _scope(facts)
        if not roles:
            return Probe(Status.SKIP, "not a PD disaggregated deployment: no KV cache is transferred")
        tree = target.tree
        evidence: list[Evidence] = []
        failing, unknown, checked, fia_independent = [], [], [], []
        for family in families:
            classes = npu_pool_classes(tree, family)
            if not classes:
                unknown.append(f"no NPU {family.upper()} pool class")
                evidence.append(
                    Evidence(
                        expected=f"an NPU subclass of the generic {family.upper()} KV pool under sglang/srt",
                        observed="none found: this release's layout is not one npudoctor recognises",
                    )
                )
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
        return _verdict(roles, evidence, assumptions, failing, unknown)


def _verdict(
    roles: list[RoleFacts],
    evidence: list[Evidence],
    assumptions: tuple[str, ...],
    failing: list[str],
    unknown: list[str],
) -> Probe:
    """The verdict both depths give from the pools they judged (labels of failing and undecided ones)."""
    names = tuple(r.name for r in roles)
    if failing:
        return Probe(
            Status.FAIL,
            f"{', '.join(failing)}: PD transfer items are not one page; decode would receive partial pages",
            tuple(evidence),
            assumptions,
            names,
        )
    if unknown:
        return Probe(Status.WARN, "cannot tell: " + "; ".join(unknown), tuple(evidence), assumptions, names)
    if not any(r.use_fia for r in roles):
        return Probe(
            Status.SKIP,
            f"{FIA_ENV} is off for every PD role: the page-major layout is in use (its items are one page)",
            tuple(evidence),
            assumptions,
        )
    return Probe(
        Status.PASS,
        "every PD transfer item is one page of its layer buffer",
        tuple(evidence),
        assumptions,
        names,
    )


def _scope(facts: Facts) -> tuple[list[RoleFacts], list[str], tuple[str, ...]]:
    if not facts.described:
        worst = RoleFacts(
            name="prefill/decode (assumed)", disaggregation_mode="decode", use_fia=True, env={FIA_ENV: "1"}
        )
        return (
            [worst],
            ["mha", "mla"],
            (f"no deployment given: assumed PD disaggregation with {FIA_ENV}=1, MHA and MLA models",),
        )
    roles = [r for r in facts.roles if r.disaggregation_mode in ("prefill", "decode")]
    if facts.model is None:
        return roles, ["mha", "mla"], ("no model config given: checked both MHA and MLA pools",)
    return roles, [pool_family(facts.model.attention)], ()


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


def _live_items(cls: type, facts: Facts, role: RoleFacts) -> tuple[str, Evidence]:
    """Build ``cls`` for ``role`` and compare each transfer item length with one page of its buffer."""
    flag = f"{FIA_ENV}={'1' if role.use_fia else '0'}"
    where = code_location(cls, "get_contiguous_buf_infos")
    try:
        pool = livepools.build_pool(cls, facts.model, role)
    except livepools.CannotBuild as reason:
        return "unknown", Evidence(
            expected=f"a {cls.__name__} for this deployment ({flag})",
            observed=str(reason),
            location=code_location(cls, "__init__"),
        )
    try:
        ptrs, lens, items = pool.get_contiguous_buf_infos()[:3]
    except Exception as error:
        return "fail", exception_evidence(
            f"{cls.__name__}.get_contiguous_buf_infos() to describe the buffers", error
        )
    pages = (pool.size + pool.page_size) // pool.page_size
    if not items or not len(ptrs) == len(lens) == len(items):
        return "fail", Evidence(
            expected=f"{cls.__name__}.get_contiguous_buf_infos(): one pointer, length and item length per buffer",
            observed=f"{len(ptrs)} pointers, {len(lens)} lengths, {len(items)} item lengths (live, CPU)",
            location=where,
        )
    for entry, (data_len, item) in enumerate(zip(lens, items)):
        page, rest = divmod(int(data_len), pages)
        if rest:
            return "unknown", Evidence(
                expected=f"buffer entry {entry} of {cls.__name__} to hold {pages} pages ({flag})",
                observed=f"{data_len} bytes is not a multiple of {pages} pages (live, CPU)",
                location=where,
            )
        if int(item) != page:
            wrong = sum(1 for d, i in zip(lens, items) if int(i) * pages != int(d))
            return "fail", Evidence(
                expected=(
                    f"kv_item_lens[{entry}] = one page of the registered buffer = {data_len} bytes / "
                    f"{pages} pages = {page} bytes ({cls.__name__}, {role.name}, {flag})"
                ),
                observed=(
                    f"get_contiguous_buf_infos() returned kv_item_lens[{entry}] = {item} bytes "
                    f"({_fraction(int(item), page)} of a page); {wrong} of {len(items)} entries are not one page "
                    "(live, CPU)"
                ),
                location=where,
            )
    return "pass", Evidence(
        expected=f"kv_item_lens = one page of each registered buffer ({cls.__name__}, {role.name}, {flag})",
        observed=(
            f"all {len(items)} entries of get_contiguous_buf_infos() are one page "
            f"(entry 0: {items[0]} bytes x {pages} pages = {lens[0]} bytes) (live, CPU)"
        ),
        location=where,
    )


def _fraction(item: int, page: int) -> str:
    if item and page % item == 0:
        return f"1/{page // item}"
    return f"{item / page:.3g}x"


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


CHECK = TransferItemLengths()
