"""The deployment as the user described it, one frozen value built at the command line's edge.

A user describes a deployment in one of three forms: a YAML file (``--config``), a launch
command (the words after ``--``), or ``--model-path`` with a few flags and ``--env`` pairs; or
not at all (every check assumes its worst case). ``DeploymentSpec`` keeps that description as
given, so that every later use reads the one value: the parse (``load``), the options a hint
repeats (``options``), and a catalog workaround rewritten in the user's own form
(``with_workaround``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npudoctor.deployment import load
from npudoctor.deployment.workarounds import with_workaround
from npudoctor.errors import InputError
from npudoctor.results import Result


@dataclass(frozen=True)
class DeploymentSpec:
    config: Path | None = None
    launch_command: tuple[str, ...] = ()
    model_path: Path | None = None
    server_flags: tuple[tuple[str, int | str], ...] = ()  # --model-path's: (server argument, value)
    env_flags: tuple[str, ...] = ()  # --model-path's --env NAME=VALUE
    isolated: bool = False  # the shell's environment is not read (``load.shell_env``)
    # the launch command is whatever `npudoctor run` starts: one npudoctor cannot read as an sglang
    # launch describes no deployment (the fixes for the worst case) instead of being an input error
    any_command: bool = False

    @property
    def described(self) -> bool:
        """Whether the user described a deployment at all."""
        return bool(self.config or self.launch_command or self.model_path)

    def load(self, sglang_parser: Callable[[], Any] | None = None) -> load.Deployment:
        """The deployment this describes (``load.described``); ``sglang_parser`` reads a launch
        command with the installed release's own parser, where the caller may import sglang."""
        try:
            return load.described(
                config=self.config,
                launch_command=self.launch_command,
                model_path=self.model_path,
                server_flags=dict(self.server_flags),
                env_flags=self.env_flags,
                isolated=self.isolated,
                sglang_parser=sglang_parser,
            )
        except InputError:
            if not (self.any_command and self.launch_command):
                raise
            return dataclasses.replace(self, launch_command=()).load()

    def for_run(self) -> DeploymentSpec:
        """The deployment ``npudoctor run`` plans for: the one --config or --model-path describes
        (the command is then only run), else the launch command's, where a command npudoctor cannot
        read as an sglang launch gets the fixes for the worst case."""
        if self.config is not None or self.model_path is not None:
            return dataclasses.replace(self, launch_command=())
        return dataclasses.replace(self, any_command=True)

    def options(self) -> list[str]:
        """The deployment options a hint repeats (``service.hints.hint``), unredacted; the
        launch command is not among them: a hint puts it last, after ``--``."""
        words: list[str] = []
        if self.config is not None:
            words += ["--config", str(self.config)]
        if self.model_path is not None:
            words += ["--model-path", str(self.model_path)]
            words += [f"--{key.replace('_', '-')}={value}" for key, value in self.server_flags]
            for pair in self.env_flags:
                words += ["--env", pair]
        if self.isolated:
            words.append("--isolated")
        return words

    def with_workaround(self, result: Result, record) -> Result:
        """``result`` with ``record``'s workaround said in this description's form
        (``deployment.workarounds``): the launch command rewritten, the YAML keys, or the flags."""
        config = str(self.config) if self.config is not None else None
        return with_workaround(result, record, config, self.launch_command)
