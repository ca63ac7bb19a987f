"""NPD007, the dry run: the deployment's real sglang start-up and serving path on a small model.

Every other deep check proves one property on one path. The defects users hit are mostly on the
path their deployment runs and that nobody listed: an attribute a class never sets, a keyword a
callee does not take, a CUDA-only import or kernel on the NPU path, a None where a tensor goes, an
``else: raise`` the NPU defaults reach. Running that path finds them, named or not.

For each role of the deployment the dry run starts sglang's real scheduler process entry
(``run_scheduler_process``) in an interpreter of its own that is an Ascend host with one simulated
NPU from import on (``npudoctor.live.ascendsim``), with the role's server arguments and a model of
the deployment's architecture with its sizes shrunk (``smallmodel``; random weights through sglang's
dummy loader), and serves requests that reach each step (``outcome.STEPS``): start-up, prefill of
several sequences of different lengths, a chunked prefill, a prefix-cache hit, decode
(``serve``). sglang raising on the path is a ``fail`` naming the step, the exception and the sglang
frames; an op the simulation has no CPU reference for, or a module this host lacks, is a ``warn``
(npudoctor cannot tell past that step), never a verdict on sglang. Features one simulated device
cannot serve (TP/PP/DP/EP above one, PD transfer, speculative decoding, NPU graphs, HiCache, LoRA)
are named in the report as not run.

Opt-in for now (``--select NPD007``): each role costs a fresh import of sglang and its start-up.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact, Status
from npudoctor.target.discovery import Target


class DryRun(Check):
    id = "NPD007"
    kind = CheckKind.DEEP
    opt_in = True
    title = "Dry run: the deployment starts and serves on a simulated Ascend"
    impact = Impact.STARTUP_CRASH
    why = (
        "A deployment dies on the first path it runs that nobody checked: start-up, the first "
        "prefill, a chunked prompt, a cache hit, decode. The dry run runs that path, with sglang's "
        "own code and the deployment's server arguments, before a single NPU is reserved."
    )
    bites_when = "any deployment: each role's start-up and serving path on its installed release"
    how_to_fix = (
        "read the exception and the sglang frames the finding names; the upgrade that fixes the "
        "path, where one does, is in the release notes of the file named"
    )
    upstream_history = False  # no static witness: the history of a path is the dry run's own
    runtime_fix = False

    def out_of_scope(self, facts: Facts) -> Probe | None:
        if facts.model is None:
            return Probe(
                Status.SKIP,
                "no model given: the dry run builds a small model of the deployment's architecture "
                "from its config.json (give --model-path or a YAML with model:)",
            )
        return None

    def static(self, target: Target, facts: Facts) -> Probe:
        return Probe(Status.SKIP, "the dry run needs the live depth: it runs sglang (--depth live)")

    def live(self, target: Target, facts: Facts) -> Probe:
        from . import live as live_module  # live only: never loaded at static depth

        return live_module.live_probe(target, facts)


CHECK = DryRun()
