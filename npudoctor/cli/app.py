"""The ``npudoctor`` typer application: its commands, in the order --help lists them."""

from __future__ import annotations

from typing import Annotated

import typer

import npudoctor  # its __version__ is looked up on use: --help, list and explain never need it
from npudoctor.cli import advise_command, check_command, fix_command, info_commands, run_command
from npudoctor.cli.options import EXIT_CODES_HELP
from npudoctor.errors import ExitCode

app = typer.Typer(
    name="npudoctor",
    help=(
        "Pre-flight doctor and hot-fix kit for sglang deployments on Ascend NPUs: tells which "
        "known defects the installed sglang has for your deployment, before launch and in CI.\n\n"
        + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# The words after `--`: a launch command that describes the deployment (check, advise, fix) or the
# command to run (run, which also passes options it does not know on to it).
_LAUNCH_COMMAND = {"allow_extra_args": True, "ignore_unknown_options": False}
_COMMAND_TO_RUN = {"allow_extra_args": True, "ignore_unknown_options": True}

app.command(context_settings=_LAUNCH_COMMAND, epilog=check_command.EPILOG)(check_command.check)
app.command(context_settings=_LAUNCH_COMMAND, epilog=advise_command.EPILOG)(advise_command.advise)
app.command(context_settings=_LAUNCH_COMMAND, epilog=fix_command.EPILOG)(fix_command.fix)
app.command(context_settings=_COMMAND_TO_RUN, epilog=run_command.EPILOG)(run_command.run)
app.command("list", context_settings=_LAUNCH_COMMAND)(info_commands.list_checks)
app.command(context_settings=_LAUNCH_COMMAND)(info_commands.explain)
app.command("env")(info_commands.env_command)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(f"npudoctor {npudoctor.__version__}")
        raise typer.Exit(ExitCode.OK)
