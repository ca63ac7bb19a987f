"""The deployment options ``check``, ``fix``, ``run`` and ``advise`` share, and the check request
they make."""

from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npudoctor.cli.options import Depth, ids
from npudoctor.deployment.redact import redact_argv
from npudoctor.deployment.spec import DeploymentSpec
from npudoctor.errors import InputError, UnknownLaunchFlag

if TYPE_CHECKING:
    from npudoctor.service.runner import CheckRequest


class Role(str, Enum):
    null = "null"
    prefill = "prefill"
    decode = "decode"


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", metavar="FILE", help="Deployment YAML (model, env, roles, ignore)."),
]
ModelPathOption = Annotated[
    Path | None,
    typer.Option("--model-path", metavar="DIR", help="Local model directory (its config.json is read)."),
]
RoleOption = Annotated[
    Role | None, typer.Option("--disaggregation-mode", help="With --model-path: the server's PD role.")
]
PpSizeOption = Annotated[int | None, typer.Option("--pp-size", min=1, metavar="N", help="With --model-path.")]
TpSizeOption = Annotated[int | None, typer.Option("--tp-size", min=1, metavar="N", help="With --model-path.")]
PageSizeOption = Annotated[
    int | None, typer.Option("--page-size", min=1, metavar="N", help="With --model-path.")
]
EnvOption = Annotated[
    list[str] | None,
    typer.Option(
        "--env", "-e", metavar="NAME=VALUE", help="With --model-path: an environment variable (repeatable)."
    ),
]
IsolatedOption = Annotated[
    bool,
    typer.Option(
        "--isolated",
        help="Do not read the shell's environment: the deployment's variables are only those it sets.",
    ),
]

# The deployment options, in the order --help lists them: (parameter, its typer annotation, default).
_OPTIONS = (
    ("config", ConfigOption, None),
    ("model_path", ModelPathOption, None),
    ("role", RoleOption, None),
    ("pp_size", PpSizeOption, None),
    ("tp_size", TpSizeOption, None),
    ("page_size", PageSizeOption, None),
    ("env", EnvOption, None),
    ("isolated", IsolatedOption, False),
)


@dataclass(frozen=True)
class DeploymentOptions:
    """The deployment as the command line describes it: the words after ``--`` (a launch command;
    for ``run``, the command to run) and the deployment options."""

    launch_command: tuple[str, ...]
    config: Path | None
    model_path: Path | None
    role: Role | None
    pp_size: int | None
    tp_size: int | None
    page_size: int | None
    env: tuple[str, ...]
    isolated: bool

    def spec(self) -> DeploymentSpec:
        """The deployment these options describe, once the words after ``--`` are known to be a
        launch command, not a misplaced option."""
        if self.launch_command and self.launch_command[0].startswith("-"):
            shown = redact_argv(self.launch_command[:1])[0]  # `--api-key=X` before the `--`
            raise InputError(f"unknown option {shown!r} (a launch command goes after '--')")
        flags = (
            ("disaggregation_mode", self.role.value if self.role else None),
            ("pp_size", self.pp_size),
            ("tp_size", self.tp_size),
            ("page_size", self.page_size),
        )
        return DeploymentSpec(
            config=self.config,
            launch_command=self.launch_command,
            model_path=self.model_path,
            server_flags=tuple((key, value) for key, value in flags if value is not None),
            env_flags=self.env,
            isolated=self.isolated,
        )

    def inputs(self) -> list[tuple[Path, str]]:
        """The files this description is read from, with the words that name them: a report is
        never written over one (``output.require_destination``)."""
        found = [(self.config, "the deployment file given with --config")] if self.config else []
        if self.model_path is not None:
            config = self.model_path if self.model_path.suffix == ".json" else self.model_path / "config.json"
            found.append((config, "the model config --model-path reads"))
        return found

    def check_request(
        self,
        depth: Depth,
        select: list[str] | None = None,
        fail_on: str | None = None,
        ignore: list[str] | None = None,
        sglang_path: Path | None = None,
        with_fixes: list[str] | None = None,
        recorded_fixes: bool = True,
    ) -> CheckRequest:
        """The ``CheckRequest`` of this deployment and the command's own options."""
        from npudoctor.service.runner import CheckRequest

        return CheckRequest(
            deployment=self.spec(),
            sglang_path=sglang_path,
            depth=depth.value,
            select=ids(select),
            fail_on=fail_on,
            ignore=list(ignore or []),
            today=dt.date.today(),
            with_fixes=list(with_fixes or []),
            recorded_fixes=recorded_fixes,
        )


def takes_deployment(command: Callable) -> Callable:
    """Give ``command`` (check, fix, run, advise, list, explain) the deployment options, first in its --help, as one
    ``DeploymentOptions``, its ``deployment`` parameter.

    typer has no option groups: it reads a command's options from its signature, so the context
    (whose extra arguments are the words after ``--``) and the options are put in the signature here."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "deployment"]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    added = [
        inspect.Parameter(name, kind, default=default, annotation=option)
        for name, option, default in _OPTIONS
    ]
    context = inspect.Parameter("ctx", kind, annotation=typer.Context)

    @functools.wraps(command)
    def with_deployment(ctx: typer.Context, **options):
        given = {name: options.pop(name) for name, _, _ in _OPTIONS}
        deployment = DeploymentOptions(
            launch_command=tuple(ctx.args), **{**given, "env": tuple(given["env"] or ())}
        )
        try:
            return command(deployment=deployment, **options)
        except UnknownLaunchFlag as error:
            raise _misplaced_option(ctx, error) from None

    # the command's own parameters without a default (``explain``'s ID) keep their place first
    required = [p for p in own if p.default is inspect.Parameter.empty]
    rest = [p for p in own if p.default is not inspect.Parameter.empty]
    with_deployment.__signature__ = signature.replace(parameters=[context, *required, *added, *rest])
    with_deployment.__annotations__ = {
        p.name: p.annotation for p in with_deployment.__signature__.parameters.values()
    }
    return with_deployment


def _misplaced_option(ctx: typer.Context, error: UnknownLaunchFlag) -> InputError:
    """``error`` as it is, unless its flag is one of this command's own options written after ``--``
    (``npudoctor check -- python -m sglang.launch_server ... --format json``): then sglang's nearest
    flag (``--load-format``) would mislead, and the line says where npudoctor's options go, with
    the words to move (secrets redacted)."""
    flag = error.flag.partition("=")[0]
    param = next((p for p in ctx.command.params if flag in (*p.opts, *p.secondary_opts)), None)
    at = next((i for i, word in enumerate(ctx.args) if word.partition("=")[0] == flag), None)
    if param is None or at is None:
        return error
    takes_value = not getattr(param, "is_flag", False) and "=" not in ctx.args[at]
    words = ctx.args[at : at + (2 if takes_value else 1)]
    return InputError(
        f"launch command: {flag} is an option of npudoctor {ctx.info_name}, not of sglang's server: "
        f"npudoctor's options go before '--' (move {' '.join(redact_argv(words))!r} there)"
    )
