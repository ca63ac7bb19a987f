"""``npudoctor env`` says whether the live depth can run here, and what to install when it cannot.

The live depth imports sglang's modules with torch and npudoctor's CPU dependency set
(``npudoctor/data/requirements-live.txt``). A host with npudoctor, torch and ``pip install --no-deps
sglang`` lacks the rest: there the live child used to start, fail on the first missing module
(numpy, imported by ``sglang/srt/utils/common.py`` from ``sglang/__init__.py``) and report
"sglang imported in 0.1 s". ``env`` is where an operator asks first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from support.repo import REPO


def install_paths(command: str) -> list[Path]:
    """The files of a ``pip install -r R -c C`` command."""
    words = command.split()
    assert words[:2] == ["pip", "install"], command
    return [Path(words[i + 1]) for i, word in enumerate(words) if word in ("-r", "-c")]


def test_env_says_the_live_depth_runs_here(cli):
    code, out, _ = cli("env")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("live-depth "))
    assert line.split(None, 1)[1].startswith("runs here"), line
    code, out, _ = cli("env", "-f", "json")
    live = json.loads(out)["live-depth"]
    assert (live["runs"], live["missing"], live["reason"]) == (True, [], None), live
    assert [p.name for p in install_paths(live["install"])] == [
        "requirements-live.txt",
        "constraints-live.txt",
    ]
    assert all(p.is_file() for p in install_paths(live["install"])), live


def site_without(module: str, directory: Path) -> Path:
    """Links to every entry of this interpreter's site-packages but ``module``'s: on ``sys.path``
    instead of site-packages (``python -S``), ``module`` is not installed."""
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(module) and entry.suffix != ".pth":
            (directory / entry.name).symlink_to(entry)
    return directory


def test_env_names_what_a_minimal_install_lacks(tmp_path):
    """torch installed, numpy not (a minimal install): the live depth does not run here, and the
    one line names numpy first and the install command of files that exist."""
    overlay = tmp_path / "site"
    overlay.mkdir()
    path = [str(site_without("numpy", overlay)), str(REPO)]
    script = f"""
        import sys
        sys.path[:0] = {path!r}
        from npudoctor.cli import main
        sys.exit(main(sys.argv[1:]))
    """
    runs = [
        subprocess.run(
            [sys.executable, "-S", "-c", textwrap.dedent(script), "env", *form],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=600,
        )
        for form in ((), ("-f", "json"))
    ]
    assert [done.returncode for done in runs] == [0, 0], [done.stderr[-2000:] for done in runs]
    live = json.loads(runs[1].stdout)["live-depth"]
    assert live["runs"] is False and live["missing"][0] == "numpy", live
    assert live["reason"].startswith("numpy is not installed in this interpreter"), live
    assert live["reason"].endswith(live["install"]), live
    assert all(p.is_file() for p in install_paths(live["install"])), live
    line = next(line for line in runs[0].stdout.splitlines() if line.startswith("live-depth "))
    assert line.split(None, 1)[1] == f"does not run here: {live['reason']}", line
