"""Hints: the npudoctor commands the output names (a finding's fix, the plan's ``fix --apply``,
``--status``'s next step, ``advise``'s recommendation), each a line to paste into a shell that
repeats the user's own target, deployment and depth. Every format and command that names a
command builds it here, so they cannot disagree about what to type."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor.deployment.redact import redact_argv
from npudoctor.patching.fixbase import Safety, all_fixes
from npudoctor.service.launcher import ASSIGNMENT
from npudoctor.terminal import shell_join

if TYPE_CHECKING:
    from npudoctor.results import Report


# What each command a hint may name takes besides its own options: the target (--sglang-path), the
# deployment options (and a launch command after `--`), and --depth, with its default.
_TAKES_TARGET = frozenset({"check", "fix", "advise"})
_TAKES_DEPLOYMENT = frozenset({"check", "fix", "run", "advise"})
_DEFAULT_DEPTH = {"check": "auto", "fix": "auto", "run": "auto", "advise": "static"}
# `npudoctor run` runs the launch command: with a deployment given another way, the hint shows
# where the user's own command goes
LAUNCH_TEMPLATE = ("python", "-m", "sglang.launch_server", "...")


@dataclass(frozen=True)
class UserOptions:
    """The user's own options that a hint repeats (``npudoctor fix --select NPD001 <these>``): the
    target, the deployment, the depth and ``fix``'s ``--site``; the launch command goes last, after
    ``--`` (``hint``). Secret values are redacted for the shell (``redact_argv(..., for_shell=True)``):
    the hint refers to a variable for each (``--api-key "${API_KEY:?redacted}"``), never ``***``."""

    target: tuple[str, ...] = ()  # --sglang-path DIR
    deployment: tuple[str, ...] = ()  # --config, --model-path and its flags, --isolated
    depth: str | None = None  # the depth the user asked for; None: the default of the command they ran
    site: tuple[str, ...] = ()  # --site DIR (fix only)
    launch_command: tuple[str, ...] = ()

    @classmethod
    def of_report(cls, report: Report) -> UserOptions:
        """What a report itself names, for a caller that has no request: ``--sglang-path`` for a
        tree given by path, ``--config`` for a YAML deployment, the depth."""
        target: tuple[str, ...] = ()
        if report.target.source == "path":
            target = ("--sglang-path", str(Path(report.target.path).parent))
        source = str(report.deployment.get("source", ""))
        deployment = ("--config", source[len("yaml:") :]) if source.startswith("yaml:") else ()
        depth = report.depth if report.depth != "auto" else None
        target, deployment = redact_argv(target, for_shell=True), redact_argv(deployment, for_shell=True)
        return cls(target=tuple(target), deployment=tuple(deployment), depth=depth)


def fix_hint(fix_ids: str | Sequence[str], user: UserOptions | None = None) -> str:
    """A finding's fix, or the fixes of all a report's findings, as one command (``npudoctor fix
    --select ID[,ID]``, the plan for them), with ``--unsafe`` where a fix changes running code:
    pasted, the plan marks it apply, never "refused" for the flag the hint left out."""
    ids = [fix_ids] if isinstance(fix_ids, str) else list(fix_ids)
    unsafe = any(f.id in ids and f.safety is Safety.UNSAFE for f in all_fixes())
    return hint("fix", "--select", ",".join(ids), *(["--unsafe"] if unsafe else []), user=user)


def hint(command: str, *own: str, user: UserOptions | None = None, deployment: bool = True) -> str:
    """The one way npudoctor names one of its commands in what it prints (a finding's fix, the plan's
    ``fix --apply``, ``--apply``'s ``--status`` and ``--revert``, ``--status``'s next step,
    ``advise``'s recommendation, ``explain --full``), so that the line works pasted into a shell:
    ``npudoctor COMMAND OWN...`` (the command's own options: ``--apply --select NPD001``), then the
    user's options that COMMAND takes (``user``; ``deployment=False``: only the target and
    ``--site``), the depth where it is not COMMAND's default, and last ``--`` and the launch
    command: an option after ``--`` would be a word of the launch command (``run`` executes it, so a
    leading ``NAME=value`` goes through ``env``, as a shell runs it). Every word is quoted for a
    shell (``npudoctor.terminal.shell_join``: as ``shlex.join`` quotes it, a value with a control
    character as ``$'...'``)."""
    user = user or UserOptions()
    words = ["npudoctor", command, *own]
    if command in _TAKES_TARGET:
        words += user.target
    launch: Sequence[str] = ()
    if deployment and command in _TAKES_DEPLOYMENT:
        words += user.deployment
        if user.depth is not None and user.depth != _DEFAULT_DEPTH[command]:
            words += ["--depth", user.depth]
        launch = user.launch_command or (LAUNCH_TEMPLATE if command == "run" else ())
    if command == "fix":
        words += user.site
    if launch:
        if command == "run" and ASSIGNMENT.match(launch[0]):
            launch = ["env", *launch]  # `run` executes the command: a shell's `X=1 cmd` is `env X=1 cmd`
        words += ["--", *launch]
    return shell_join(words)
