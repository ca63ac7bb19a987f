"""The repository the tests run from: its root, its example deployments, the checks its folders
define, and ``scripts/fetch_sglang.py`` (real sglang releases from PyPI, cached) loaded as a module."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

_spec = importlib.util.spec_from_file_location("fetch_sglang", REPO / "scripts" / "fetch_sglang.py")
fetch_sglang = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_sglang)


def check_folder_ids(kind) -> list[str]:
    """The ids the check folders define for ``kind`` (a ``CheckKind``: ``checks/<id>_<name>/``), in
    order: what a test expects of the registry, read without it."""
    ids = (path.name.split("_")[0].upper() for path in (REPO / "checks").iterdir() if path.is_dir())
    return sorted(i for i in ids if kind.owns(i))


def default_check_ids(kind) -> list[str]:
    """``check_folder_ids(kind)`` that run without ``--select``: all but the opt-in checks (the dry
    run; ``tests/engine/test_kinds.py`` holds which they are)."""
    from npudoctor.engine.registry import all_checks

    opt_in = {c.id for c in all_checks() if getattr(c, "opt_in", False)}
    return [i for i in check_folder_ids(kind) if i not in opt_in]


def source_copy(destination: Path) -> Path:
    """A copy of the repository's source at ``destination``, to build or install from: a build in
    the repository itself writes ``build/`` and ``*.egg-info`` there, which two tests (or xdist
    workers) building at once would share. The venv, the release cache and git stay behind."""
    shutil.copytree(
        REPO, destination, ignore=shutil.ignore_patterns(".venv", ".cache", ".git", "build", "*.egg-info")
    )
    return destination
