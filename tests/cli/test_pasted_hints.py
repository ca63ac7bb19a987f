"""Every npudoctor command line that npudoctor prints works when pasted into a shell.

The hints (the fix command under a finding, the plan's ``fix --apply``, ``--apply``'s ``--status``
and ``--revert``, ``npudoctor run`` for a release that loads no plugins, ``--status``'s next step,
``advise``'s recommendation, ``explain``'s ``--full``, the Markdown and GitHub formats' fix lines)
repeat the user's own options. A launch command goes last,
after ``--``: an option a hint put after it would be read as a word of the launch command (``fix``
refuses an unknown flag of sglang's launcher with exit 2), so each hint is pasted into bash with the
venv's ``npudoctor`` first on PATH and must not end in a usage error. Three deployment forms, with
``--select``, ``--unsafe``, ``--sglang-path``, ``--depth`` and ``--isolated``, on real releases, a
model directory whose path holds a space (the hint must quote it for the shell)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.repo import EXAMPLES, REPO
from support.truths import truth_present

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
VENV_BIN = Path(sys.executable).parent  # holds the repo's npudoctor console script
OLD, NEW = "0.5.12", "0.5.23"
NO_PLUGINS = "0.5.9"  # before sglang.srt.plugins (0.5.11)
COMMANDS = ("check", "fix", "run", "advise", "explain", "list", "env")
# where a hint starts: at the start of a line, after a space, a colon, a parenthesis or a backtick
HINT = re.compile(r"(?:(?<=^)|(?<=[\s:(`]))npudoctor (?:" + "|".join(COMMANDS) + r")(?=[\s`]|$)")


def hints(output: str) -> list[str]:
    """Every npudoctor command line in ``output``: one in backticks ends at the matching run of
    backticks, any other at the end of its line. GitHub workflow commands are unescaped first."""
    output = output.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")
    found = []
    for line in output.splitlines():
        for match in HINT.finditer(line):
            start = match.start()
            fence = re.search(r"`+$", line[:start])
            if fence:
                end = line.find(fence.group(), start)
                found.append(line[start : end if end >= 0 else len(line)].strip())
            else:
                found.append(line[start:].strip())
    return found


@pytest.fixture
def model(tmp_path) -> Path:
    """The DeepSeek-V3 model directory at a path with a space in it."""
    directory = tmp_path / "my models" / "DeepSeek V3"
    shutil.copytree(EXAMPLES / "models" / "deepseek-v3", directory)
    return directory


def forms(model: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Each deployment form: (options, the launch command after ``--``)."""
    flags = ["--disaggregation-mode", "decode", "--tp-size", "16"]
    launch = ["python", "-m", "sglang.launch_server", "--model-path", str(model), *flags]
    launch += ["--disaggregation-transfer-backend", "ascend"]
    return {
        "config": (["--config", str(DEEPSEEK_PD)], []),
        "launch command": ([], launch),
        "model path": (["--model-path", str(model), *flags, "--env", "ASCEND_USE_FIA=0"], []),
    }


@pytest.fixture
def shell_env(tmp_path, monkeypatch) -> dict[str, str]:
    """The environment a hint is pasted in (and the commands that print them run in): the venv's
    npudoctor first on PATH, and fix records in a directory of the test's own, never beside the
    shared release trees."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("NPUDOCTOR_SITE", str(site))
    monkeypatch.delenv("COLUMNS", raising=False)
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def paste(hint: str, env: dict[str, str], launch: list[str]) -> None:
    """``hint`` pasted into bash: it parses (exit 2 is a usage error) and runs without a traceback;
    a launch command the deployment gave comes back whole after ``--``, nothing of npudoctor's own
    after it."""
    words = shlex.split(hint)
    assert words[0] == "npudoctor", hint
    if "..." in words:  # a template for the user's own launch command: npudoctor's options before it
        launched = words[words.index("--") + 1 :]
        assert launched[:3] == ["python", "-m", "sglang.launch_server"], hint
        return
    if launch and "--" in words:
        assert words[words.index("--") + 1 :] == launch, hint
    done = subprocess.run(
        ["bash", "-c", hint], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )
    assert done.returncode not in (2, 3), f"{hint}\nexit {done.returncode}: {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, done.stderr


def run(command: list[str], env: dict[str, str], expected: tuple[int, ...]) -> str:
    """``npudoctor COMMAND`` as a user runs it; its stdout and stderr."""
    done = subprocess.run(
        ["npudoctor", *command], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )
    assert done.returncode in expected, f"{command}\nexit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout + done.stderr


# the launch command is the form a misplaced option breaks; the others run in the slow tier
@pytest.mark.parametrize(
    "form", [pytest.param("config", marks=pytest.mark.slow), "launch command",
             pytest.param("model path", marks=pytest.mark.slow)],
)  # fmt: skip
def test_every_hint_a_command_prints_works_pasted_into_a_shell(release, model, shell_env, form):
    old, new = str(release(OLD)), str(release(NEW))
    options, launch = forms(model)[form]
    after = ["--", *launch] if launch else []
    common = ["--depth", "static", "--isolated", *options]
    outputs = {
        "check": run(["check", "--sglang-path", old, *common, *after], shell_env, (1,)),
        "check --format markdown": run(
            ["check", "-f", "markdown", "--sglang-path", old, "--select", "NPD001,NPD006", *common, *after],
            shell_env,
            (1,),
        ),
        "check --format github": run(
            ["check", "-f", "github", "--sglang-path", old, *common, *after], shell_env, (1,)
        ),
        "fix": run(
            ["fix", "--select", "NPD001", "--unsafe", "--sglang-path", old, *common, *after], shell_env, (0,)
        ),
        "fix --status, nothing recorded": run(
            ["fix", "--status", "--sglang-path", old, *common, *after], shell_env, (0, 1)
        ),
        "fix --apply": run(
            ["fix", "--apply", "--unsafe", "--sglang-path", old, *common, *after], shell_env, (0,)
        ),
        # recorded for the old release, asked on the new one: the next command
        "fix --status, another release": run(
            ["fix", "--status", "--sglang-path", new, *common, *after], shell_env, (0, 1)
        ),
        "advise": run(["advise", "--sglang-path", old, *common, *after], shell_env, (1,)),
        "explain": run(["explain", "NPD001"], shell_env, (0,)),
        # a release that loads no plugins (before 0.5.11): the record needs `npudoctor run`
        "fix --apply, no plugins": run(
            ["fix", "--apply", "--unsafe", "--sglang-path", str(release(NO_PLUGINS)), *common, *after],
            shell_env,
            (0,),
        ),
    }
    assert [h for h in hints(outputs["fix --apply, no plugins"]) if h.startswith("npudoctor run ")]
    present = [c for c in ("NPD001", "NPD006") if truth_present(OLD, c)]
    pasted = set()
    for name, output in outputs.items():
        found = hints(output)
        if present or name == "explain":
            assert found, f"{name}: no npudoctor command in\n{output}"
        for hint in dict.fromkeys(found):
            if hint not in pasted:  # the formats of one report name the same commands
                paste(hint, shell_env, launch)
                pasted.add(hint)
