"""The repository the tests run from: its root, its example deployments, and
``scripts/fetch_sglang.py`` (real sglang releases from PyPI, cached) loaded as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

_spec = importlib.util.spec_from_file_location("fetch_sglang", REPO / "scripts" / "fetch_sglang.py")
fetch_sglang = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_sglang)
