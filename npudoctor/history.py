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
from dataclasses import dataclass
from pathlib import Path

from npudoctor.facts import Facts

DATA = Path(__file__).parent / "data" / "history.json"
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
    data = _load() if data is None else data
    releases = sorted(data.get("releases", []), key=version_key)
    if not releases:
        return Upstream(None, None)
    newest = releases[-1]
    if not any(check_id in w.get("results", {}) for w in data.get("witnesses", {}).values()):
        return Upstream(None, None)  # a check the history has not run yet (a new one): it cannot tell
    every = _witnesses(data, check_id)
    witnesses = [w for w in every if _matches(w, facts)] or every
    if not witnesses:
        return Upstream(None, newest)
    after = version_key(version) if version else ()
    if after and version_key(newest) <= after:
        return Upstream(None, None)  # no later release checked: the history cannot tell
    fixes = [_fixed_from(w["results"][check_id], releases, after) for w in witnesses]
    if any(fix is None for fix in fixes):
        return Upstream(None, newest)
    return Upstream(max(fixes, key=version_key), newest)


def _witnesses(data: dict, check_id: str) -> list[dict]:
    """The witness deployments the check applies to (not ``skip`` on every release)."""
    return [
        w
        for w in data.get("witnesses", {}).values()
        if any(status != "skip" for status in w["results"].get(check_id, {}).values())
    ]


def _matches(witness: dict, facts: Facts) -> bool:
    if not facts.described or facts.model is None:
        return False  # nothing to match on: every witness of the check speaks
    fia = any(role.use_fia for role in facts.roles)
    attention = facts.model.attention.value
    same_kind = witness["attention"] == attention or {witness["attention"], attention} <= {"mha", "gqa"}
    return same_kind and witness["fia"] == fia


def _fixed_from(statuses: dict[str, str], releases: list[str], after: tuple[int, ...]) -> str | None:
    """The first release after ``after`` from which every release checked holds the property."""
    later = [r for r in releases if version_key(r) > after and r in statuses]
    fixed = None
    for release in reversed(later):
        if statuses[release] not in _HOLDS:
            break
        fixed = release
    return fixed
