"""``npudoctor run -- CMD...``: run a command (an sglang server) with the runtime fixes its sglang needs."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from npudoctor.cli import output
from npudoctor.cli.deployment_options import DeploymentOptions, takes_deployment
from npudoctor.cli.options import AllowUnsafe, Depth, FixSelection, PlanDepth, PythonOption, use_python
from npudoctor.deployment.redact import redact_argv
from npudoctor.errors import InputError, NoTargetError

EPILOG = (
    "Every Python process the command starts, sglang's spawned schedulers included, applies "
    "the fixes when sglang's modules are imported (a sitecustomize on PYTHONPATH); works for "
    "every sglang release. Before it starts, one line on stderr says which fixes apply "
    "(--verbose: every fix's decision; --quiet: nothing unless a fix applies). The deployment is "
    "the launch command's, unless --config or --model-path describes it; the shell's ASCEND_*, "
    "SGLANG_*, HCCL_*, PYTORCH_NPU_* and TASK_QUEUE_* variables are read (what the deployment sets "
    "wins; --isolated reads none). A command that is not an sglang launch npudoctor can read gets the "
    "fixes for the worst case. A command whose Python ignores the environment (python -E or -I, env -i, "
    "env -u PYTHONPATH) gets the fixes only through the record of `npudoctor fix --apply`: without "
    "one that sglang loads, run refuses (exit 2). Exit code: the command's (128 + N when signal N ended it: 130 for "
    "Ctrl-C); 126/127 when it cannot run or is not found; 2 for bad npudoctor options; 130 when "
    "interrupted before the command starts (143 SIGTERM, 129 SIGHUP); once it runs, SIGINT, SIGTERM, "
    "SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are handed to it. Kill switch: NPUDOCTOR_DISABLE_FIXES=1."
)


@takes_deployment
def run(
    deployment: DeploymentOptions,
    select: FixSelection = None,
    unsafe: AllowUnsafe = False,
    depth: PlanDepth = Depth.auto,
    python: PythonOption = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Every fix's decision, on stderr.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress; say nothing when no fix applies.")
    ] = False,
) -> None:
    """Run a command (an sglang server) with the runtime fixes its sglang needs: npudoctor run -- CMD..."""
    from npudoctor.patching import activation
    from npudoctor.service import launcher, operations, planning
    from npudoctor.service.subject import Need, resolve

    command = list(deployment.launch_command)
    if command and command[0].startswith("-"):
        shown = redact_argv(command[:1])[0]  # `--api-key=X` before the `--`
        raise InputError(f"unknown option {shown!r} (the command goes after '--')")
    launcher.resolve_command(command)  # 127/126 before any planning
    use_python(python)
    request = deployment.check_request(depth, select=select)
    request = dataclasses.replace(request, deployment=request.deployment.for_run())
    if activation.disabled():  # no process would apply a fix: nothing to plan, nothing to claim
        resolve(request.deployment, depth=request.depth, need=Need.DEPLOYMENT)  # a bad one is still exit 2
        output.say(f"{activation.KILL_SWITCH} is set: fixes are disabled, the command runs without any")
        raise typer.Exit(launcher.run_command(command, None))
    try:
        subject = resolve(request.deployment, depth=request.depth, need=Need.ANY_SGLANG)
    except NoTargetError:
        raise NoTargetError(
            "run: no sglang found: it is not installed in the environment whose sglang `npudoctor run` "
            "fixes (--python PATH names the interpreter sglang runs in; or put sglang on PYTHONPATH)"
        ) from None
    target = subject.target
    if target.has_ascend_backend:
        planned = operations.plan_fixes(request, subject, unsafe, quiet)
    else:
        planned = []
        if not quiet:
            output.say(f"sglang {target.version} has no Ascend NPU backend: no runtime fix applies")
    document = planning.record_document(planned, target)
    if verbose:
        for p in planned:
            output.say(f"{p.fix.id}: {p.decision.action.value}: {p.decision.reason}")
    applied = sorted(document["fixes"])
    ignored = launcher.environment_ignored(command) if applied else None
    if ignored is not None:
        # the bootstrap never reaches its processes: only the record of `fix --apply` may
        not_by_record = operations.record_route(target, document, ignored.environ)
        if not_by_record is not None:
            raise InputError(
                f"run: {ignored.how} ignores the environment npudoctor run sets (PYTHONPATH), so "
                f"{', '.join(applied)} would not be applied in its processes: drop it, or record them "
                f"with `npudoctor fix --apply` where sglang loads them ({not_by_record})"
            )
        output.say(
            f"applying {', '.join(applied)} to sglang {target.version} through the record of "
            f"`npudoctor fix --apply` ({ignored.how} ignores the environment npudoctor run sets)"
        )
    elif applied:
        output.say(
            f"applying {', '.join(applied)} to sglang {target.version} in every process of the command"
        )
    elif planned and not quiet:
        output.say(f"no runtime fix applies to sglang {target.version} for this deployment")
    raise typer.Exit(launcher.run_command(command, document))
