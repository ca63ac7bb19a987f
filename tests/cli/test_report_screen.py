"""The operator's screen (issue 34, items 4 and 7): ``npudoctor check`` fits an 80x40 terminal for a
deployment with a few findings and ends the way ruff does, with the verdict and the one command to
run next on the last screen; and every command's output at 80 columns is clean: no trailing
blanks, no blank-looking lines, each ``npudoctor ...`` command whole on its line (it parses as the
CLI reads it), no id cut to ``NPD0...``. The real CLI on real sglang releases; a real terminal
(tmux, 80x40) where tmux is installed."""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid

import click
import pytest
import typer.main

from support.repo import EXAMPLES, REPO, fetch_sglang
from support.reports import json_report

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
COLUMNS, ROWS = 80, 40
VERDICT = re.compile(r"(\d+ finding\(s\)|no findings) at or above '\w+'")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# where a printed command starts: `npudoctor fix ...`, or a workaround's launch command
COMMAND = re.compile(r"(?:^|\s)(npudoctor (?:check|fix|run|advise|explain|list|env)(?:\s.*)?)$")
CODE_SPAN = re.compile(r"`(npudoctor [^`]*)`")  # Markdown's
LAUNCH = re.compile(r"^\s*((?:\w+=\S+ )*python3? -m sglang\.launch_server\b.*)$")


def screen_rows(lines: list[str], width: int = COLUMNS) -> int:
    """How many rows of a ``width``-column terminal ``lines`` take (a longer line wraps)."""
    return sum(max(1, math.ceil(len(line) / width)) for line in lines)


def last_screen(lines: list[str], rows: int = ROWS, width: int = COLUMNS) -> list[str]:
    """The lines of which a terminal of ``rows`` x ``width`` shows at least a part at the end."""
    shown, used = [], 0
    for line in reversed(lines):
        if used >= rows:
            break
        shown.insert(0, line)
        used += screen_rows([line], width)
    return shown


def command_of(line: str) -> list[str] | None:
    """The words of the ``npudoctor ...`` command ``line`` prints (None: it prints none)."""
    found = CODE_SPAN.search(line) or COMMAND.search(line)
    if found is None:
        return None
    return shlex.split(found.group(1).strip())


def parse_error(words: list[str]) -> str | None:
    """Why the CLI would reject ``words`` (``npudoctor COMMAND ...``) before doing anything: an
    unknown command or option, a missing value; None when it parses."""
    from npudoctor.cli.app import app

    group = typer.main.get_command(app)
    with click.Context(group) as context:
        command = group.get_command(context, words[1])
        if command is None:
            return f"no command {words[1]!r}"
        try:
            command.make_context(words[1], list(words[2:]), parent=context)
        except click.ClickException as error:
            return error.format_message()
    return None


def runnable_commands(lines: list[str]) -> list[list[str]]:
    commands = [command_of(line) for line in lines]
    return [words for words in commands if words is not None and parse_error(words) is None]


def npudoctor_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR")}
    env.update(extra)
    return env


def in_tmux(argv: list[str], cwd) -> list[str]:
    """The last screen of ``argv`` run in a tmux session of 80x40 (its own server, no user config),
    each row as tmux shows it with a wrapped line joined (``capture-pane -J``: a command the terminal
    wrapped is one line again, as it is pasted)."""
    socket, name = f"npudoctor-test-{uuid.uuid4().hex[:8]}", "check"
    tmux = ["tmux", "-L", socket, "-f", os.devnull]
    script = f"cd {shlex.quote(str(cwd))} && {shlex.join(argv)}; tmux wait-for -S done; sleep 600"
    env = npudoctor_env()
    subprocess.run([*tmux, "new-session", "-d", "-x", str(COLUMNS), "-y", str(ROWS), "-s", name, script],
                   check=True, env=env)  # fmt: skip
    try:
        subprocess.run([*tmux, "wait-for", "done"], check=True, timeout=1800, env=env)
        shown = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-t", name], check=True, env=env,
                               capture_output=True, text=True).stdout  # fmt: skip
    finally:
        subprocess.run([*tmux, "kill-server"], env=env, capture_output=True)
    return [line.rstrip() for line in shown.splitlines()]


# -- item 4: the last screen ---------------------------------------------------------------------------


def test_check_on_the_bundled_example_ends_with_the_verdict_and_the_next_command(release):
    """`npudoctor check` on the README's example (0.5.12, examples/deepseek-v3-pd.yaml; the live depth
    where it runs, as the demo types it) at 80 columns: its last screen holds the verdict and one
    complete `npudoctor ...` command to run next, which the CLI parses as printed."""
    tree = os.path.relpath(release("0.5.12"), REPO)  # as scripts/demo.sh names it
    argv = ["npudoctor", "check", "--sglang-path", tree, "--config", os.path.relpath(DEEPSEEK_PD, REPO)]
    done = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True,
                          env=npudoctor_env(COLUMNS=str(COLUMNS)), timeout=1800)  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    screen = last_screen(lines)
    assert [line for line in screen if VERDICT.search(line)], "\n".join(screen)
    fixes = [w for w in runnable_commands(screen) if w[1] == "fix" and tree in w and argv[-1] in w]
    assert fixes, (
        "no runnable npudoctor fix command with the user's options on the last screen:\n" + "\n".join(screen)
    )

    if shutil.which("tmux") is None:
        return
    executable = shutil.which("npudoctor") or ""
    if not executable:
        return
    shown = in_tmux([executable, "check", *argv[2:]], REPO)
    assert [line for line in shown if VERDICT.search(line)], "\n".join(shown)
    assert [w for w in runnable_commands(shown) if w[1] == "fix" and tree in w], "tmux:\n" + "\n".join(shown)


def test_a_four_finding_deployment_fits_one_screen(cli, release, monkeypatch):
    """0.5.12 with the DeepSeek-V3 PD example: four results to show (two with a runtime fix, two catalog
    records with an upgrade and a workaround; NPC134 is a leak, a warn the default gate does not fail
    on), the whole report within 40 rows of 80 columns (it was 117 rows: paragraphs of catalog
    summaries)."""
    args = ("--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD)
    report = json_report(cli, *args)
    statuses = {"NPD001": "FAIL", "NPD006": "FAIL", "NPC072": "FAIL", "NPC134": "WARN"}
    shown = {r["id"]: r["status"].upper() for r in report["results"] if r["status"] in ("fail", "warn")}
    assert shown == statuses and report["summary"]["findings"] == 3
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    code, out, _ = cli("check", *args)
    assert code == 1
    lines = out.splitlines()
    assert screen_rows(lines) <= ROWS, f"{screen_rows(lines)} rows:\n{out}"
    for finding, status in statuses.items():  # each, with its status and title
        assert [line for line in lines if line.startswith(f"{finding} {status} ")], finding
    # what to do, at the end: one command for the runtime fixes, the release that fixes all
    tail = lines[-12:]
    (fix,) = [words for words in runnable_commands(tail) if words[1] == "fix"]
    assert {"NPD001", "NPD006"} <= {i for w in fix for i in w.split(",")}, fix
    assert any("0.5.20" in line for line in tail), "\n".join(tail)
    assert any("npudoctor explain" in line for line in tail), "\n".join(tail)


# -- item 7: every command at 80 columns -----------------------------------------------------------------

LONG_SITE = "home/operator/venvs/sglang-0.5.12-serving/lib/python3.11/site-packages"
COMMANDS = {
    "check": "check --sglang-path {old} --config {deployment}",
    "check --verbose": "check --verbose --sglang-path {old} --config {deployment}",
    # as the README types it, from the repository: the workaround names the YAML file so
    "check, the README's --config": "check --sglang-path {old} --config examples/deepseek-v3-pd.yaml",
    "check, no deployment": "check --sglang-path {newest}",
    "check, launch command": "check --sglang-path {newest} -- python -m sglang.launch_server --model-path "
    "{model} --tp-size 4 --page-size 8",
    "check --format markdown": "check --format markdown --sglang-path {newest}",
    "fix": "fix --sglang-path {old} --config {deployment}",
    "fix --apply": "fix --apply --site {site} --sglang-path {old} --config {deployment}",
    "fix --status": "fix --status --site {site} --sglang-path {new} --config {deployment}",
    "fix --revert": "fix --revert --site {site} --sglang-path {old}",
    "advise": "advise --wheel-dir {wheels} --config {deployment}",
    "advise --select ALL": "advise --wheel-dir {wheels} --select NPD,NPC,NPP --config {deployment}",
    "explain": "explain NPC030 --full",
    "list": "list",
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_prints_clean_lines_and_whole_commands_at_80_columns(
    cli, release, monkeypatch, tmp_path, command
):
    paths = {"old": release("0.5.12"), "new": release("0.5.13"), "newest": release("0.5.23")}
    paths.update(deployment=DEEPSEEK_PD, model=EXAMPLES / "models" / "qwen3-30b-a3b")
    paths.update(site=tmp_path / LONG_SITE, wheels=tmp_path / "wheels")
    paths["site"].mkdir(parents=True)
    paths["wheels"].mkdir()
    for version in ("0.5.12", "0.5.13"):  # advise offline: the wheels the release cache holds
        wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", version)
        os.link(wheel, paths["wheels"] / wheel.name)
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(fetch_sglang.cache_dir()))
    monkeypatch.chdir(REPO)
    if command in ("fix --status", "fix --revert"):  # a record of 0.5.12's fixes to read or remove
        assert cli(*COMMANDS["fix --apply"].format(**paths).split())[0] == 0
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    code, out, err = cli(*COMMANDS[command].format(**paths).split())
    assert code in (0, 1), err
    lines = ANSI.sub("", out).splitlines()
    assert lines, "nothing printed"
    assert [line for line in lines if line != line.rstrip()] == [], "trailing blanks"
    assert [line for line in lines if line and not line.strip()] == [], "a line of blanks only"
    assert "<br>" not in out
    # a YAML key a workaround sets stays with its value (``server_args.pp_size: 1``)
    assert [line for line in lines if re.search(r"\b(server_args|env)\.\w+:$", line)] == [], "a key apart"
    assert [line for line in lines if re.search(r"\bNP[CDP]\d{0,2}(?:\.\.\.|…)", line)] == [], (
        "an id cut short"
    )
    for line in lines:  # each command printed is whole on its line: it parses as the CLI reads it
        words = command_of(line)
        if words is not None and not line.lstrip().startswith(("#", "-", "|")) and "..." not in words[2:3]:
            assert parse_error(words) is None, (parse_error(words), line)
        launch = LAUNCH.match(line)
        if launch is not None:  # a workaround's launch command: its flags with their values
            words = shlex.split(launch.group(1))
            flags = [i for i, w in enumerate(words) if w.startswith("--") and w != "--trust-remote-code"]
            assert all(i + 1 < len(words) and not words[i + 1].startswith("--") for i in flags), line
    for path in (str(paths["site"]), str(paths["old"])):  # a path is whole on a line, never split
        if path in " ".join(" ".join(lines).split()):
            assert any(path in line for line in lines), path
