"""NPD002 live probe: build each NPU pool class of the deployment's family on CPU for every PD role,
in the role's environment (``ASCEND_USE_FIA`` decides the layout at construction), call the real
``get_contiguous_buf_infos`` and require every item length to be one page of its registered buffer.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.live import livepools, processstate
from npudoctor.live.locations import code_location, exception_evidence
from npudoctor.results import Evidence

from .verdict import FIA_ENV, verdict


def live_probe(
    facts: Facts, roles: list[RoleFacts], families: list[str], assumptions: tuple[str, ...]
) -> Probe:
    """The verdict over every NPU pool class of ``families`` built for every PD role."""
    evidence: list[Evidence] = []
    failing, unbuilt, checked = [], [], []
    for family in families:
        classes = livepools.npu_pool_classes(family)
        if not classes:
            return livepools.no_pool_loaded(family, assumptions, tuple(r.name for r in roles))
        for cls in classes:
            for role in roles:
                label = f"{cls.__name__} ({role.name}, {FIA_ENV}={'1' if role.use_fia else '0'})"
                outcome, item = processstate.in_role(
                    role, lambda cls=cls, role=role: _live_items(cls, facts, role)
                )
                evidence.append(item)
                {"fail": failing, "unknown": unbuilt, "pass": checked}[outcome].append(label)
    return verdict(roles, evidence, assumptions, failing, unbuilt)


def _live_items(cls: type, facts: Facts, role: RoleFacts) -> tuple[str, Evidence]:
    """Build ``cls`` for ``role`` and compare each transfer item length with one page of its buffer."""
    flag = f"{FIA_ENV}={'1' if role.use_fia else '0'}"
    where = code_location(cls, "get_contiguous_buf_infos")
    try:
        pool = livepools.build_pool(cls, livepools.probed_model(facts.model), role)
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
            + livepools.sampled_note(facts.model)
        ),
        location=where,
    )


def _fraction(item: int, page: int) -> str:
    if item and page % item == 0:
        return f"1/{page // item}"
    return f"{item / page:.3g}x"
