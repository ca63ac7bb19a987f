"""A failed import attempt leaves ``sys.modules`` whole before the stand-in retry.

sglang 0.5.12's ``sglang/__init__.py`` imports ``sglang.srt.utils`` (line 29), whose ``common.py``
imports numpy (line 76). Where numpy is not installed the attempt fails inside ``sglang``'s own
import: the import system drops ``sglang`` and ``sglang.srt.utils`` but keeps the namespace
package ``sglang.srt`` it had imported by then. The retry (numpy stood in) then finds
``sglang.srt`` and computes its path from ``sys.modules["sglang"]``: ``KeyError: 'sglang'`` at
``<frozen importlib._bootstrap_external>``, and every live probe of a minimal install (npudoctor,
``pip install --no-deps sglang``, torch) ended "sglang does not import here".
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from support.repo import REPO

SCRIPT = """
    import importlib, json, sys
    from npudoctor.live import standins
    from npudoctor.live.npusim import simulated_npu

    outcome = {"raised": None}
    with simulated_npu():  # as the live child imports (the simulation takes every import away after)
        try:
            standins.import_with_stand_ins(
                lambda: importlib.import_module("sglang.srt.disaggregation.utils"), "NPD003"
            )
        except BaseException as error:
            outcome["raised"] = f"{type(error).__name__}: {error}"
        outcome["orphans"] = sorted(
            name for name in sys.modules
            if any(".".join(name.split(".")[:i]) not in sys.modules for i in range(1, name.count(".") + 1))
        )
        outcome["sglang"] = getattr(sys.modules.get("sglang"), "__file__", None)
        outcome["utils"] = "sglang.srt.disaggregation.utils" in sys.modules
    outcome["stood_in"] = sorted(standins.stood_in)
    print(json.dumps(outcome))
"""


def without(module: str, directory: Path) -> Path:
    """A directory of links to every entry of this interpreter's site-packages but ``module``'s:
    on ``sys.path`` instead of site-packages, ``module`` is not installed."""
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not entry.name.lower().startswith(module) and entry.suffix != ".pth":
            (directory / entry.name).symlink_to(entry)
    return directory


def test_a_failed_attempt_leaves_no_half_imported_package(release, tmp_path):
    """numpy made unavailable (not on the path at all), sglang 0.5.12's disaggregation utils import
    with numpy stood in, and no module is left whose package is not imported."""
    overlay = tmp_path / "site"
    overlay.mkdir()
    path = [str(release("0.5.12")), str(without("numpy", overlay)), str(REPO)]
    done = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {path!r}\n" + textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["raised"] is None, seen
    assert seen["orphans"] == [], seen["orphans"][:20]
    assert "numpy" in seen["stood_in"], seen["stood_in"]
    assert seen["sglang"] == str(release("0.5.12") / "sglang" / "__init__.py") and seen["utils"], seen
