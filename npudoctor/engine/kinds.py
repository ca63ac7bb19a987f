"""The kinds of check, as data: what each kind is, and every decision that depends on it.

npudoctor judges a deployment with three kinds of check. Each check names its kind
(``Check.kind``), the registry (``npudoctor.engine.registry.all_checks``) refuses a check whose id
does not carry its kind's prefix, and every place that treats the kinds differently (the default
selection, ``--select NPC``, the folded ``NPC*`` row of the text report and the ``advise`` matrix,
``list --format json``'s ``kind``) reads it here, never from an id literal of its own.

Only a ``Result`` (a report's line, which names no check object) and a fix (which has the id of
the check it cures) are mapped back to a kind, by their id (``CheckKind.of``), so that mapping
too lives here.
"""

from __future__ import annotations

import re
from enum import Enum


class CheckKind(Enum):
    """A kind of check: its id prefix (also the ``--select`` prefix that selects all of them, as
    ruff's rule selectors), whether a plain run includes it, its name in ``list --format json``
    and what ``--help`` calls the group."""

    # the checks proven with static and live probes, one module each under checks/, most with a
    # runtime fix
    DEEP = ("NPD", True, "check", "the deep checks")
    # the generic properties: they walk the deployment's whole NPU path, several seconds cold, so
    # they run when selected (--select NPP, or ALL), as ruff's rules outside its default set
    PROPERTY = (
        "NPP",
        False,
        "check",
        "the generic properties, not run by default: they walk the whole NPU path",
    )
    # the known-defect catalog: one data record per upstream defect (npudoctor.engine.catalog)
    CATALOG = ("NPC", True, "catalog", "the catalog")

    def __init__(self, prefix: str, default_selected: bool, listed_as: str, described: str):
        self.prefix = prefix  # every id of the kind is this and three digits
        self.default_selected = default_selected  # run when no --select is given
        self.listed_as = listed_as  # ``list --format json``'s ``kind``
        self.described = described  # the group, as ``--select``'s help names it

    @property
    def heading(self) -> str:
        """The one row (text report) or column (``advise``) the compact listings fold the catalog's
        records into."""
        return f"{self.prefix}*"

    def owns(self, check_id: str) -> bool:
        """Whether ``check_id`` is an id of this kind (its prefix and three digits)."""
        return re.fullmatch(rf"{self.prefix}[0-9]{{3}}", check_id) is not None

    @classmethod
    def of(cls, result_id: str) -> CheckKind:
        """The kind of the check a result's id names (a report's ``Result`` names only its id): a
        check's own id, or an expired ignore entry's ``<id>-ignore-expired``
        (``npudoctor.deployment.ignores``), by the prefix it starts with."""
        for kind in cls:
            if result_id.startswith(kind.prefix):
                return kind
        raise ValueError(f"{result_id!r} names no kind of check ({', '.join(k.prefix for k in cls)})")


def selector_help() -> str:
    """What each kind's prefix selects, for ``--select``'s help: derived, so it never goes stale."""
    return ", ".join(f"{kind.prefix} ({kind.described})" for kind in CheckKind)
