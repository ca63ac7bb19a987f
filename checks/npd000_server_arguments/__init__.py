"""NPD000: the release accepts every server argument and flag the deployment passes.

sglang starts only with arguments it defines: ``ServerArgs(**fields)`` raises ``TypeError`` on a
field its dataclass does not declare, and the launch parser (``prepare_server_args``: argparse,
abbreviations allowed) exits with "unrecognized arguments" on a flag it does not register. Flags
move between releases: context parallelism on prefill was ``--enable-prefill-context-parallel`` /
``--prefill-cp-mode`` in 0.5.10-0.5.13, became deprecated aliases of ``--enable-prefill-cp`` /
``--cp-strategy`` in 0.5.14 and is gone from 0.5.20 on. A deployment written for one release
never starts on another, and every other check would have judged it with the defaults in place
of the value it meant (``attn_cp_size: 2`` read as 1).

Static probe (the property, not the diff): read the release's ServerArgs fields and launch
flags from its source (``npudoctor.target.serverargs``: ``sglang/srt/server_args.py``, the namespace
classes it is assembled from in 0.5.20+, the flags ``add_cli_args`` registers and those
``add_cli_args_from_dataclass`` derives from the field annotations in 0.5.14+) and require every
name the deployment passes to be one of them: a YAML ``server_args`` key a field, a launch flag
(or YAML ``args`` flag) an option string or an unambiguous abbreviation of one, not retired with
an action that raises. A name no release 0.4.10..0.5.23 knows is an input error (exit 2, with a
did-you-mean) before any check runs; a name other releases know is this check's ``fail``, with
the releases that know it.

No live probe: sglang's own parser (``launch.sglang_parser``) is the live form of the same table,
and it is used to read a launch command when the installed sglang imports. No runtime fix: the
remedy is the spelling this release defines.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact, Status
from npudoctor.target.discovery import Target


class ServerArguments(Check):
    id = "NPD000"
    kind = CheckKind.DEEP
    title = "The release accepts every server argument and flag the deployment passes"
    upstream_history = False  # a fault of the deployment's input, not a defect a release fixes
    runtime_fix = False  # the server reads its arguments before any code npudoctor could patch
    impact = Impact.STARTUP_CRASH
    why = (
        "sglang refuses to start on a ServerArgs field or a launch flag the release does not define "
        "(TypeError from ServerArgs, 'unrecognized arguments' from its parser). Flags are renamed, "
        "added and removed between releases (the context-parallel flags changed three times from "
        "0.5.10 to 0.5.20): a deployment written for one release never starts on another, and the "
        "other checks would judge it with the default in place of the value it meant."
    )
    bites_when = (
        "The deployment passes a field or flag the release under test does not define: one from a "
        "later release (a CP flag on an older image), one a later release removed, or one the release "
        "retired with an action that raises."
    )
    how_to_fix = (
        "Use the spelling this release defines (the evidence names the release's ServerArgs), or check "
        "the deployment against the release it was written for. There is no runtime fix: the server "
        "reads its arguments before any code npudoctor could patch."
    )

    def out_of_scope(self, facts: Facts) -> Probe | None:
        if facts.described:
            return None
        return Probe(Status.SKIP, "no deployment given: no server arguments to check against the release")

    def static(self, target: Target, facts: Facts) -> Probe:
        from .static import static_probe  # not loaded when the answer is cached

        return static_probe(target, facts)


CHECK = ServerArguments()
