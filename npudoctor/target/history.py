"""Where each check's property holds in sglang's release history: the truth behind "upgrade to X".

A check's class cannot know which release fixes a defect *for a given deployment*: upstream
fixed NPD001 for MLA pools in 0.5.13, and the MHA pool without FIA the same release, but NPD005
came back for MLA in 0.5.14 only, and some defects are in every release so far. So the advice
comes from data: ``scripts/release_history.py`` runs ``npudoctor check --depth auto`` on every
release of the release cache for a few witness deployments (the examples: MLA, MLA with the
indexer, MHA with and without FIA, CP prefill) and writes ``npudoctor/data/history.json``. For a
finding, the witnesses of the same attention kind and FIA setting (every witness when the
deployment is not described) tell the first release after the target's where the property holds
from there on in every release checked; when the newest release checked still fails, the finding
says "not fixed upstream as of" it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from npudoctor.deployment.facts import Facts

DATA = Path(__file__).parent.parent / "data" / "history.json"
_HOLDS = ("pass", "skip")


@dataclass(frozen=True)
class Upstream:
    """What the release history says about one finding."""

    fixed_in: str | None  # the first release after the target's from which the property holds
    newest_checked: str | None  # the newest release the history checked (None: no history)


def version_key(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits or not part[0].isdigit():
            break
        parts.append(int(digits))
    return tuple(parts)


@functools.lru_cache(maxsize=1)
def _load() -> dict:
    if not DATA.is_file():
        return {}
    return json.loads(DATA.read_text(encoding="utf-8"))


def upstream(check_id: str, facts: Facts, version: str | None, data: dict | None = None) -> Upstream:
    """The release history's answer for ``check_id``'s finding on ``version`` for ``facts``
    (``data``: a history document; by default the bundled one)."""
    return deployment_upgrade([check_id], facts, version, data)


def deployment_upgrade(
    check_ids: list[str],
    facts: Facts,
    version: str | None,
    data: dict | None = None,
    extra_tables: Sequence[dict[str, str]] = (),
) -> Upstream:
    """The first release after ``version`` from which every check of ``check_ids`` holds for
    ``facts`` in every later release checked: one answer for the whole deployment, so that no
    finding recommends a release where another check of the same deployment fails (NPD005 came
    back for MLA in 0.5.13 and 0.5.14, after NPD001 was fixed in 0.5.13). ``fixed_in`` None with
    ``newest_checked`` set: some check still fails on the newest release; both None: the history
    cannot tell (no witness of the deployment's kind runs these checks, or no later release).
    ``extra_tables``: more ``{release: status}`` tables that must hold too (the catalog records in
    the deployment's scope, their ranges derived from the wheels)."""
    data = _load() if data is None else data
    releases = sorted(data.get("releases", []), key=version_key)
    if not releases:
        return Upstream(None, None)
    newest = releases[-1]
    after = version_key(version) if version else ()
    if after and version_key(newest) <= after:
        return Upstream(None, None)  # no later release checked: the history cannot tell
    tables = [table for check_id in check_ids for table in deployment_tables(check_id, facts, data)]
    tables += [t for t in extra_tables if t]
    if not tables:
        return Upstream(None, None)
    holds = {
        r: all(t.get(r, "skip") in _HOLDS for t in tables) for r in releases if any(r in t for t in tables)
    }
    fixed = holds_from(holds, after)
    return Upstream(fixed, newest)


def deployment_tables(check_id: str, facts: Facts, data: dict | None = None) -> list[dict[str, str]]:
    """``{release: status}`` of ``check_id`` on each witness deployment that builds ``facts``'s
    code path (every witness when the deployment is not described), leaving out witnesses the
    check skips on every release: the per-deployment history ``check``, ``list``, ``explain``
    and ``advise`` read."""
    data = _load() if data is None else data
    if not any(check_id in w.get("results", {}) for w in data.get("witnesses", {}).values()):
        return []  # a check the history has not run yet (a new one): it cannot tell
    witnesses = _witnesses(data, check_id)
    if facts.described and facts.model is not None:  # else nothing to match on: every witness speaks
        witnesses = [w for w in witnesses if _matches(w, facts)]
    return [w["results"][check_id] for w in witnesses]


def holds_from(holds: dict[str, bool], after: tuple[int, ...] = ()) -> str | None:
    """The first release after ``after`` from which every later release of ``holds`` (release ->
    whether the property, or the whole deployment, holds there) holds: what "upgrade to X or later"
    promises. The one rule for ``check``'s advice and ``advise``'s recommendation."""
    fixed = None
    for release in sorted((r for r in holds if version_key(r) > after), key=version_key, reverse=True):
        if not holds[release]:
            break
        fixed = release
    return fixed


def witness_deployments(check_id: str, facts: Facts | None = None, data: dict | None = None) -> list[str]:
    """The example deployments on which the history ran ``check_id`` (not ``skip`` everywhere) and
    that speak for ``facts`` (``deployment_tables``; every one for no deployment)."""
    witnesses = _witnesses(_load() if data is None else data, check_id)
    if facts is not None and facts.described and facts.model is not None:
        witnesses = [w for w in witnesses if _matches(w, facts)]
    return [w["deployment"] for w in witnesses]


def _witnesses(data: dict, check_id: str) -> list[dict]:
    """The witness deployments the check applies to (not ``skip`` on every release)."""
    return [
        w
        for w in data.get("witnesses", {}).values()
        if any(status != "skip" for status in w["results"].get(check_id, {}).values())
    ]


def _matches(witness: dict, facts: Facts) -> bool:
    """Whether the witness builds the deployment's code path: the same attention kind (MHA and GQA
    share their pools), FIA setting, and V head dim against K's (an MHA pool whose V is not as wide as
    K gets buffers of its own: NPD001 on 0.5.14+ is wrong for it only)."""
    fia = any(role.use_fia for role in facts.roles)
    attention = facts.model.attention.value
    same_kind = witness["attention"] == attention or {witness["attention"], attention} <= {"mha", "gqa"}
    v_differs = witness.get("v_head_dim_differs", False) == v_head_dim_differs(
        attention, facts.model.head_dim, facts.model.v_head_dim
    )
    return same_kind and witness["fia"] == fia and v_differs


def v_head_dim_differs(attention: str, head_dim: int | None, v_head_dim: int | None) -> bool:
    """An MHA/GQA model whose V head dim is not K's (MLA's always differ: its latent layout is its own)."""
    return attention in ("mha", "gqa") and v_head_dim not in (None, head_dim)
