"""The option types and help texts more than one command shares."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from npudoctor.engine.kinds import selector_help
from npudoctor.formatters import NAMES as FORMAT_NAMES

EXIT_CODES_HELP = """
Exit codes (stable, never renumbered):
0 no finding at or above --fail-on (leak and performance findings warn unless --fail-on names them);
1 findings;
2 usage or input error (bad YAML, missing config.json, unknown flag or check id);
3 internal error;
4 nothing to check (no sglang found);
5 could not check as asked: --depth live and the live depth is unavailable (no other finding);
130 interrupted (Ctrl-C: one line on stderr, no report); 143 and 129 the same for SIGTERM and SIGHUP.
"""

DEPLOYMENT_HELP = (
    "Deployment, one of: --config deploy.yaml; the launch command after '--' "
    "(npudoctor check -- python -m sglang.launch_server --model-path M --pp-size 2 ...); --model-path DIR "
    "with --disaggregation-mode, --pp-size, --tp-size, --page-size and --env. In every form the shell's "
    "ASCEND_*, SGLANG_*, HCCL_*, PYTORCH_NPU_* and TASK_QUEUE_* variables are read, and what the "
    "deployment sets wins (--isolated reads none). With no deployment, every check assumes the "
    "conditions under which its defect bites and says so."
)


class Depth(str, Enum):
    static = "static"
    live = "live"
    auto = "auto"


# ``check --format`` and ``advise --format``: the formats of ``npudoctor.formatters.FORMATS``
# (typer offers an Enum's values)
ReportFormat = Enum("ReportFormat", {name: name for name in FORMAT_NAMES}, type=str)


class DataFormat(str, Enum):
    text = "text"
    json = "json"


# Options `fix` and `run` share.
FixSelection = Annotated[
    list[str] | None,
    typer.Option("--select", "-s", metavar="ID", help="Only these fix ids (repeatable, or ID,ID)."),
]
AllowUnsafe = Annotated[
    bool, typer.Option("--unsafe", help="Also apply fixes that change running behaviour.")
]
PlanDepth = Annotated[
    Depth,
    typer.Option(
        help="The depth the checks decide at, as in `npudoctor check`: auto runs the live probes where "
        "the target imports, so a defect only sglang's own code shows is fixed too."
    ),
]

# Options of `check`, `advise` and `fix`.
SglangPathOption = Annotated[
    Path | None,
    typer.Option(
        "--sglang-path",
        metavar="DIR",
        help="This unpacked wheel or source tree instead of the installed sglang.",
    ),
]
SelectOption = Annotated[
    list[str] | None,
    typer.Option(
        "--select",
        "-s",
        metavar="ID",
        help="Run only these check or catalog ids (repeatable, or ID,ID); a prefix selects "
        f"all it starts: {selector_help()}; ALL selects everything.",
    ),
]
OutputOption = Annotated[
    Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write the report here, not stdout.")
]
FailOnOption = Annotated[
    str | None,
    typer.Option(
        "--fail-on",
        metavar="WORD[,WORD]",
        help="What counts (default: fail, or the deployment YAML's fail_on): 'fail' or 'warn', the lowest "
        "status that is a finding; and an impact whose findings fail too. Crashes "
        "(startup-crash, runtime-crash) and silent-wrong-output fail; leak and performance findings "
        "warn unless named (--fail-on leak, --fail-on leak,performance).",
    ),
]
IgnoreOption = Annotated[
    list[str] | None,
    typer.Option(
        "--ignore",
        metavar="ID[:DATE]",
        help="Accept this check's finding (until DATE, YYYY-MM-DD; repeatable).",
    ),
]
PythonOption = Annotated[
    Path | None,
    typer.Option(
        "--python",
        metavar="PATH",
        help="The interpreter of the environment sglang runs in, for npudoctor installed in a venv of its "
        "own: its sglang is checked, and the live depth runs in it where torch and numpy import there "
        "(else in npudoctor's own live environment, `npudoctor env --prepare`).",
    ),
]


def use_python(python: Path | None) -> None:
    """Check the environment of ``--python`` (asked now: a bad path is exit 2 before any work), else
    npudoctor's own."""
    from npudoctor.target import pythonenv

    pythonenv.use_python(python)


QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines on stderr.")]
NoRecordedFixesOption = Annotated[
    bool,
    typer.Option(
        "--no-recorded-fixes",
        help="Judge the installed code alone. By default the fixes `npudoctor fix --apply` recorded "
        "beside this sglang, whose code they still fit, are applied in the live probes, as sglang's own "
        "processes apply them (the report says so).",
    ),
]


def ids(values: list[str] | None) -> list[str]:
    """Repeatable id options, each also taking a comma-separated list."""
    return [s for item in (values or []) for s in item.split(",") if s]
