"""``npudoctor env`` says whether the live depth can run here, in which interpreter, and the one
command that prepares npudoctor's own live environment when it cannot.

The live depth imports sglang's modules with torch and npudoctor's CPU dependency set
(``npudoctor/data/requirements-live.txt``). A host with npudoctor, torch and ``pip install --no-deps
sglang`` lacks the rest: there the live child used to start, fail on the first missing module
(numpy, imported by ``sglang/srt/utils/common.py`` from ``sglang/__init__.py``) and report
"sglang imported in 0.1 s". ``env`` is where an operator asks first.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from npudoctor.formatters import NAMES as FORMAT_NAMES

from support.repo import EXAMPLES


def entry(lines: list[str], key: str) -> str:
    """The value of ``key`` in ``env``'s text: word-wrapped under its column at the terminal's width
    (a path is never split), read back as one line."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{key} "))
    column = len(lines[start]) - len(lines[start].split(None, 1)[1])
    words = [lines[start][column:]]
    for line in lines[start + 1 :]:
        if not line.startswith(" " * column) or not line.strip():
            break
        words.append(line.strip())
    return " ".join(words)


def test_env_says_the_live_depth_runs_here(cli, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no npudoctor on it: the command names this interpreter
    code, out, _ = cli("env")
    assert code == 0
    line = entry(out.splitlines(), "live-depth")
    assert line == f"runs in {sys.executable}: every live requirement is installed", line
    code, out, _ = cli("env", "-f", "json")
    live = json.loads(out)["live-depth"]
    assert (live["runs"], live["uses"], live["missing"], live["reason"]) == (True, "host", [], None), live
    assert shlex.split(live["prepare"]) == [sys.executable, "-m", "npudoctor", "env", "--prepare"], live


def test_prepare_builds_nothing_where_the_live_depth_runs_in_the_host(cli, static_cache):
    code, out, err = cli("env", "--prepare")
    assert (code, out) == (0, ""), err
    assert (
        err
        == f"npudoctor: the live depth runs in {sys.executable} (torch and numpy import there): nothing to prepare\n"
    )
    assert not (static_cache / "live-env").exists()


def without(module: str, tmp_path: Path):
    """``run(*args)``: npudoctor run in this interpreter as if ``module`` were not installed
    (``python -S``, then a copy of site-packages that lacks it added as a site directory, its
    ``.pth`` files too: the editable install's), its cache in ``tmp_path``, the terminal 80
    columns wide, no ``npudoctor`` on ``PATH``."""
    overlay = tmp_path / "site"
    overlay.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(module):
            (overlay / entry.name).symlink_to(entry)
    script = f"""
        import site, sys
        site.addsitedir({str(overlay)!r})
        from npudoctor.cli import main
        sys.exit(main(sys.argv[1:]))
    """
    env = {
        **os.environ,
        "NPUDOCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "COLUMNS": "80",
        "PATH": "/usr/bin:/bin",
    }
    env.pop("GITHUB_STEP_SUMMARY", None)

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-S", "-c", textwrap.dedent(script), *map(str, args)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=600,
        )

    return run


def test_env_names_what_a_minimal_install_lacks(tmp_path):
    """torch installed, numpy not (a minimal install): the live depth does not run here, the line
    names numpy and npudoctor's own live environment, not prepared; the one hint is the command
    that prepares it, with this interpreter, never an install into this environment."""
    run = without("numpy", tmp_path)
    runs = [run("env", *form) for form in ((), ("-f", "json"))]
    assert [done.returncode for done in runs] == [0, 0], [done.stderr[-2000:] for done in runs]
    live = json.loads(runs[1].stdout)["live-depth"]
    assert live["runs"] is False and live["missing"][0] == "numpy", live
    assert live["reason"].startswith(f"numpy is not installed for {sys.executable}"), live
    assert live["reason"].endswith("is not prepared"), live
    assert live["live-env"] in live["reason"] and live["live-env-state"] == "not prepared", live
    assert shlex.split(live["prepare"]) == [sys.executable, "-m", "npudoctor", "env", "--prepare"], live
    lines = runs[0].stdout.splitlines()
    line = entry(lines, "live-depth")
    assert line == f"does not run: {live['reason']}", line
    assert next(line for line in lines if line.startswith("prepare ")).split(None, 1)[1] == live["prepare"]


def test_no_hint_says_pip_install(tmp_path, release):
    """Where the live depth cannot run, no command and no format prints an install command
    (followed in the environment sglang serves from, it pinned a CPU torch over sglang's and
    torch_npu's): the text report's one hint is the prepare command, whole on its line at 80
    columns, and it runs as printed."""
    run = without("numpy", tmp_path)
    tree = ["--sglang-path", release("0.5.12"), "--config", EXAMPLES / "deepseek-v3-pd.yaml"]
    forms = [("env",), ("env", "-f", "json")]
    forms += [("check", *tree, "-f", f) for f in FORMAT_NAMES]
    forms += [("check", *tree, "--depth", "live"), ("fix", *tree), ("fix", *tree, "-f", "json")]
    prepare = shlex.join([sys.executable, "-m", "npudoctor", "env", "--prepare"])
    for form in forms:
        done = run(*form)
        assert done.returncode in (0, 1), (form, done.stderr[-2000:])
        assert "pip install" not in done.stdout + done.stderr, (form, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, (form, done.stderr)
        if form[0] == "check" and ("-f" not in form or "text" in form):
            lines = done.stdout.splitlines()
            assert f"prepare it: {prepare}" in [line.strip() for line in lines], done.stdout
            reason = next(i for i, line in enumerate(lines) if line.startswith("live depth not run: "))
            assert lines[reason].startswith("live depth not run: numpy is not installed for"), lines[reason]
        if form[0] == "check" and "json" in form:
            assert json.loads(done.stdout)["live"]["prepare"] == prepare
    help_of = subprocess.run(
        [*shlex.split(prepare)[:-1], "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert help_of.returncode == 0 and "--prepare" in help_of.stdout, help_of.stderr
