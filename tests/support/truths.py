"""The team's verified truths (``tests/data/known.yaml``) and how the tests read them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

TRUTH_FILE = Path(__file__).resolve().parents[1] / "data" / "known.yaml"

# The team's verified truths (shared/truth/known.yaml), copied here and extended with every truth
# verified since, each with file:line evidence: a fresh clone tests with nothing beside it.
TRUTH = yaml.safe_load(TRUTH_FILE.read_text())
RELEASES = sorted(TRUTH["releases"], key=lambda v: tuple(int(p) for p in v.split(".")))

# The pool family (a truth's ``families``) of each deployment kind the tests probe: MLA models
# (DeepSeek) use the MLA pool, GQA models (Qwen, Llama) the MHA pool.
KIND_FAMILY = {"mla": "mla", "gqa": "mha"}


def truth_verdict(version: str, check_id: str) -> str:
    return TRUTH["releases"][version][check_id]["verdict"]


def truth_present(version: str, check_id: str, family: str | None = None) -> bool:
    """The defect ships in ``version`` and bites the pool ``family`` ("mla"/"mha"; any if None)."""
    truth = TRUTH["releases"][version][check_id]
    return truth["verdict"] == "present" and (family is None or family in truth.get("families", [family]))


def expected_status(version: str, check_id: str, family: str | None = None) -> str:
    """The status the check must give on ``version`` by the truths: fail where the defect bites."""
    return "fail" if truth_present(version, check_id, family) else "pass"


def truth_locations(version: str, check_id: str) -> list[str]:
    """``path:line`` references in a truth's evidence; a bare ``:N`` refers to the file before it."""
    text = TRUTH["releases"][version][check_id].get("evidence", "")
    found, current = [], None
    for path, line in re.findall(r"([\w/]+\.py)?:(\d+)", text):
        current = path or current
        if current:
            found.append(f"{current}:{line}")
    return found
