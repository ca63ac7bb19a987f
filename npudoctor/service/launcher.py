"""``npudoctor run -- <command>``: start the command with the fixes' bootstrap on its
``PYTHONPATH``, as a shell would find and run it, forwarding the signals meant for it; and tell
when its Python would ignore the environment that carries the fixes (``python -E``, ``env -i``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from npudoctor.deployment.redact import redact_argv
from npudoctor.errors import InputError
from npudoctor.patching import activation
from npudoctor.patching.planfile import BOOTSTRAP_DIR


def run_command(command: list[str], document: dict | None) -> int:
    """Run ``command`` with the bootstrap on ``PYTHONPATH``; returns its exit code.

    Every Python interpreter the command starts (sglang's spawned schedulers included)
    imports the bootstrap's ``sitecustomize``, which enables ``document``'s fixes. The plan
    file lives in a temporary directory for the duration of the command. ``document`` None
    (``NPUDOCTOR_DISABLE_FIXES``): the command runs as given, with no bootstrap.
    """
    executable = resolve_command(command)
    workdir = Path(tempfile.mkdtemp(prefix="npudoctor-run-"))
    try:
        env = dict(os.environ)
        if document is not None:
            plan_path = workdir / "plan.json"
            plan_path.write_text(json.dumps(document), encoding="utf-8")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH")) if p)
            env[activation.RUN_PLAN] = str(plan_path)
        try:
            child = subprocess.Popen([executable, *command[1:]], env=env)
        except OSError as error:
            shown = redact_argv(command[:1])[0]
            raise CommandNotFound(f"run: cannot execute {shown}: {error.strerror}", 126) from None
        previous = {  # one npudoctor was started ignoring (nohup's SIGHUP) the command ignores too
            sig: signal.signal(sig, _forward(child))
            for sig in FORWARDED_SIGNALS
            if signal.getsignal(sig) is not signal.SIG_IGN
        }
        try:
            code = child.wait()
            return 128 - code if code < 0 else code  # signal N ended it: 128 + N, as a shell says
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def resolve_command(command: list[str]) -> str:
    """The executable ``npudoctor run`` starts for ``command``, as a shell finds it; else
    ``CommandNotFound`` with the shell's exit code: 127 when there is no such command, 126 when a
    path names something that cannot be executed (a file without the x bit, a directory); an
    ``InputError`` when there is no command."""
    if not command:
        raise InputError(
            "run: give the command after '--' (npudoctor run -- python -m sglang.launch_server ...)"
        )
    name = command[0]
    found = shutil.which(name)
    if found is not None:
        return found
    shown = redact_argv([name])[0]  # `npudoctor run -- HF_TOKEN=x cmd` must not echo the token
    if os.sep in name or (os.altsep and os.altsep in name):
        path = Path(name)
        if path.is_dir():
            raise CommandNotFound(f"run: cannot execute {shown}: it is a directory", 126)
        if path.exists():
            raise CommandNotFound(f"run: cannot execute {shown}: permission denied (not executable)", 126)
    elif "=" in name:
        raise CommandNotFound(
            f"run: command not found: {shown} (put environment assignments before `npudoctor run`, "
            "or use `env NAME=value cmd`)"
        )
    raise CommandNotFound(f"run: command not found: {shown}")


@dataclass(frozen=True)
class IgnoredEnvironment:
    """How a command's Python misses the environment ``npudoctor run`` gives it (its bootstrap on
    ``PYTHONPATH``, the plan in ``NPUDOCTOR_RUN_PLAN``): ``how`` names it (``python -E``, ``env -i``),
    ``environ`` is the environment its processes do have."""

    how: str
    environ: dict[str, str]


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_ENV_OPTION_ARGUMENT = "uCS"  # env's short options that take a value: -u NAME, -C DIR, -S STRING
_PYTHON_OPTION_ARGUMENT = "WX"  # python's: -W ARG, -X OPT (-c and -m end its options)


def environment_ignored(command: Sequence[str]) -> IgnoredEnvironment | None:
    """Whether ``command`` runs a Python that ignores the environment ``npudoctor run`` sets, as the
    words say: ``env -i``/``env -``, ``env -u PYTHONPATH``, a ``PYTHONPATH=`` assignment, or the
    interpreter's ``-E`` or ``-I`` (read only before ``-c``, ``-m`` or the script: after them, a word
    is the program's). None when nothing says so (a wrapper npudoctor does not read, ``sudo``, is not
    looked into)."""
    words, environ, how = list(command), dict(os.environ), None
    if words and os.path.basename(words[0]) == "env":
        words, how = _env_options(words[1:], environ)
        while words and ASSIGNMENT.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            environ[name] = value
            how = "PYTHONPATH=... in the command" if name == "PYTHONPATH" and how is None else how
    if how is None and words and _PYTHON.fullmatch(os.path.basename(words[0])):
        how = _python_ignoring_flag(words[1:])
        if how is not None:
            environ = {name: value for name, value in environ.items() if not name.startswith("PYTHON")}
    return IgnoredEnvironment(how, environ) if how is not None else None


def _env_options(words: list[str], environ: dict[str, str]) -> tuple[list[str], str | None]:
    """``env``'s options at the start of ``words`` applied to ``environ``: the words after them, and
    how they drop what ``npudoctor run`` sets (``env -i``, ``env -u PYTHONPATH``)."""
    how = None
    while words and words[0].startswith("-"):
        word = words.pop(0)
        if word == "--":
            break
        unset = None
        if word in ("-", "-i", "--ignore-environment"):
            environ.clear()
            how = "env -i"
            continue
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            if name == "--unset":
                unset = value if equals else (words.pop(0) if words else "")
            elif name in ("--chdir", "--split-string") and not equals and words:
                words.pop(0)
        else:
            for position, letter in enumerate(word[1:], 1):
                if letter == "i":
                    environ.clear()
                    how = "env -i"
                elif letter in _ENV_OPTION_ARGUMENT:
                    value = word[position + 1 :] or (words.pop(0) if words else "")
                    unset = value if letter == "u" else None
                    break
        if unset is not None:
            environ.pop(unset, None)
            if unset == "PYTHONPATH" and how is None:
                how = "env -u PYTHONPATH"
    return words, how


def _python_ignoring_flag(words: list[str]) -> str | None:
    """``python -E`` or ``python -I`` when the interpreter's options (``words``, up to ``-c``, ``-m``
    or the script) hold one: both ignore every ``PYTHON*`` variable, ``PYTHONPATH`` with them."""
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word in ("-", "--") or not word.startswith("-"):
            return None  # the script (or stdin) is next
        if word.startswith("--"):
            continue  # --version, --help
        for position, letter in enumerate(word[1:], 1):
            if letter in "EI":
                return f"python -{letter}"
            if letter in "cm":
                return None
            if letter in _PYTHON_OPTION_ARGUMENT:
                index += position == len(word) - 1  # its value: the rest of the word, or the next one
                break
    return None


class CommandNotFound(InputError):
    """The command given to ``npudoctor run`` does not exist or cannot run (exit 127 / 126, as ``env`` does)."""

    def __init__(self, message: str, exit_code: int = 127):
        super().__init__(message)
        self.exit_code = exit_code


# What ``run`` hands to the command instead of acting on itself: what a terminal, a supervisor or
# an operator sends to stop, reload or poke a server (systemd's stop and reload, a CI runner's cancel,
# Kubernetes' termination, ``kill -USR1`` for a stack dump). npudoctor's default action for most of
# them would end it and leave the command orphaned and the plan's folder behind; forwarded, the
# command decides, npudoctor waits for it and exits with its status.
FORWARDED_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)


def _forward(child: subprocess.Popen):
    def handler(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    return handler
