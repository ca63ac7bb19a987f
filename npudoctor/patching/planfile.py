"""The fix plan as files carry it, read by the processes that patch and by ``npudoctor fix``.

A plan is ``{fix id: shape}`` (``npudoctor.service.planning.decide`` accepted each shape). It travels in a
*record document* (``npudoctor.service.planning.record_document``): in the ``npudoctor-fixes-activation``
distribution that ``npudoctor fix --apply`` writes (``npudoctor.patching.records``), read back by the
sglang plugin in every scheduler process, and in the plan file of ``npudoctor run``. Both readers
(``npudoctor.patching.activation`` in sglang's processes, ``npudoctor.patching.records`` for ``--status`` and
``--revert``) validate it here, so a damaged record is refused the same way everywhere.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# holds the sitecustomize.py of `npudoctor run`, put first on the PYTHONPATH of the command it runs
BOOTSTRAP_DIR = Path(__file__).parent / "bootstrap"

DIST_NAME = "npudoctor-fixes-activation"
PLAN_FILE = "npudoctor-fixes.json"

_IDENTIFIERS = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_SITE = re.compile(f"{_IDENTIFIERS}:{_IDENTIFIERS}")


def plan_of(document: object) -> dict[str, dict[str, str]]:
    """``{fix id: shape}`` of a record document.

    The one place a plan read from a file (``npudoctor fix --apply``'s record, the plan of
    ``npudoctor run``) is validated: ``ValueError`` names what is wrong, before anything is armed."""
    if not isinstance(document, dict) or not isinstance(document.get("fixes"), dict):
        raise ValueError("not a fix record (no 'fixes' mapping)")
    plan = {}
    for fix_id, entry in document["fixes"].items():
        if not isinstance(fix_id, str) or not re.fullmatch(r"NPD\d+", fix_id):
            raise ValueError(f"not a fix id: {fix_id!r}"[:120])
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, dict) or not shape:
            raise ValueError(f"{fix_id}: no 'shape' mapping")
        for key, value in shape.items():
            if not isinstance(key, str) or not _SITE.fullmatch(key) or not isinstance(value, str):
                raise ValueError(f"{fix_id}: not a 'module:Qual.name' site and its shape: {key!r}"[:160])
        for key, kind in (("replaces", list), ("release", str)):
            if entry.get(key) is not None and not isinstance(entry[key], kind):
                raise ValueError(f"{fix_id}: '{key}' is not a {kind.__name__}")
        if not all(isinstance(item, str) for item in entry.get("replaces") or ()):
            raise ValueError(f"{fix_id}: 'replaces' lists something that is not a site")
        plan[fix_id] = dict(shape)
    return plan


def read_file(path: str) -> dict[str, dict[str, str]]:
    """The plan of a record document stored as JSON at ``path`` (the plan of ``npudoctor run``)."""
    with open(path, encoding="utf-8") as handle:
        return plan_of(json.load(handle))


def installed_plan() -> dict[str, dict[str, str]]:
    """The plan of the record this interpreter's ``sglang.srt.plugins`` entry point comes from."""
    import importlib.metadata

    text = importlib.metadata.distribution(DIST_NAME).read_text(PLAN_FILE)
    if text is None:
        raise FileNotFoundError(f"{DIST_NAME} has no {PLAN_FILE}")
    return plan_of(json.loads(text))
