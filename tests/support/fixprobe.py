"""Run one check's live probe in a fresh interpreter, the way a patched sglang process would.

    python tests/support/fixprobe.py MODE CHECK_ID CONFIG...   (sglang on PYTHONPATH)

MODE:
* ``inprocess``: decide the fix like ``npudoctor fix``, enable it, probe; revert it, probe
  again, and report whether every replaced attribute is the original object again;
* ``spawn``: probe in a ``multiprocessing`` spawn child (fixes, if any, come from the
  environment: ``npudoctor run``'s bootstrap);
* ``plugin``: call sglang's own ``load_plugins()`` (0.5.11+) first, then probe;
* ``compare``: probe every CONFIG unpatched, decide the fix for each, enable the first accepted
  decision and probe them all again (``--revert``: revert it and probe once more). ``--unsafe``
  accepts unsafe fixes; ``--prelude CODE`` runs first (a test's smaller or larger workload).

Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing
import sys
from pathlib import Path


def _facts(config: str):
    from npudoctor.deployment.load import from_yaml

    return from_yaml(Path(config)).facts


def _decide(fix, config: str, unsafe: bool):
    """``npudoctor fix``'s decision at the static depth: this process already imported sglang behind
    the NPU simulation, and the cases these tests drive are ones both depths agree on."""
    from npudoctor.service.planning import plan
    from npudoctor.target.discovery import discover

    [planned] = plan([fix], discover(), _facts(config), unsafe, depth="static")
    return planned.decision


def _probe(check_id: str, config: str) -> dict:
    from npudoctor.engine.registry import all_checks
    from npudoctor.live.npusim import npu_runtime
    from npudoctor.target.discovery import discover

    check = next(c for c in all_checks() if c.id == check_id)
    check.live_imports()
    with npu_runtime():
        probe = check.live(discover(), _facts(config))
    return {
        "status": probe.status.value,
        "summary": probe.summary,
        "observed": [e.observed for e in probe.evidence],
    }


def _owner_and_name(site: str) -> tuple[object, str]:
    module, _, qualname = site.partition(":")
    owner_path, _, name = qualname.rpartition(".")
    owner = sys.modules[module]
    for part in owner_path.split("."):
        owner = getattr(owner, part)
    return owner, name


def _originals(fix) -> dict[str, int | None]:
    """id() of what each replaced attribute is now (None: not defined on the owner itself)."""
    owners = {}
    for site in fix.replaces:
        owner, name = _owner_and_name(site)
        value = vars(owner).get(name)
        owners[site] = None if value is None else id(value)
    return owners


def _signatures(fix) -> dict[str, str]:
    return {site: str(inspect.signature(getattr(*_owner_and_name(site)))) for site in fix.replaces}


def inprocess(check_id: str, config: str) -> dict:
    from npudoctor.live.npusim import simulated_npu
    from npudoctor.patching import activation
    from npudoctor.patching.fixbase import fix_by_id
    from npudoctor.service.planning import Action

    fix = fix_by_id(check_id)
    # this mode proves the patch and its revert; the --unsafe opt-in is decide's, tested on its own
    decision = _decide(fix, config, unsafe=True)
    if decision.action is not Action.APPLY:
        return {"decision": decision.action.value, "reason": decision.reason}
    with simulated_npu():
        check_modules = [__import__(m, fromlist=["_"]) for m in fix.modules]
        before = _originals(fix)
        activation.enable({fix.id: decision.shape})
        activation.enable({fix.id: decision.shape})  # idempotent
        with_fix = _probe(check_id, config)
        patched = _originals(fix)
        activation.revert([fix.id])
        after = _probe(check_id, config)
        restored = _originals(fix)
        del check_modules
    return {
        "decision": decision.action.value,
        "outcome": activation.outcomes().get(fix.id),
        "with_fix": with_fix,
        "after_revert": after,
        "patched": patched != before,
        "restored": restored == before,
    }


def _spawned(check_id: str, config: str, queue) -> None:
    from npudoctor.live.npusim import simulated_npu
    from npudoctor.patching import activation

    with simulated_npu():
        result = _probe(check_id, config)
    queue.put({**result, "fixes": activation.outcomes()})


def spawn(check_id: str, config: str) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_spawned, args=(check_id, config, queue))
    child.start()
    result = queue.get(timeout=600)
    child.join()
    return result


def plugin(check_id: str, config: str) -> dict:
    from npudoctor.live.npusim import simulated_npu
    from npudoctor.patching import activation

    with simulated_npu():
        from sglang.srt.plugins import load_plugins

        load_plugins()
        result = _probe(check_id, config)
    return {**result, "fixes": activation.outcomes()}


def compare(check_id: str, configs: list[str], unsafe: bool, revert: bool) -> dict:
    from npudoctor.live.npusim import simulated_npu
    from npudoctor.patching import activation
    from npudoctor.patching.fixbase import fix_by_id
    from npudoctor.service.planning import Action

    fix = fix_by_id(check_id)
    with simulated_npu():
        for module in fix.modules:
            __import__(module)

        def probes() -> dict:
            return {config: _probe(check_id, config) for config in configs}

        report: dict = {"plain": probes(), "decisions": {}}
        accepted = None
        for config in configs:
            decision = _decide(fix, config, unsafe)
            report["decisions"][config] = {
                "action": decision.action.value,
                "reason": decision.reason,
                "installs": list(decision.installs),
            }
            if accepted is None and decision.action is Action.APPLY:
                accepted = decision
        if accepted is None:
            return report
        before, plain_signatures = _originals(fix), _signatures(fix)
        activation.enable({fix.id: accepted.shape})
        report["outcome"] = activation.outcomes().get(fix.id)
        report["patched"] = sorted(site for site, value in _originals(fix).items() if value != before[site])
        report["signatures"] = {"before": plain_signatures, "with_fix": _signatures(fix)}
        report["fixed"] = probes()
        if revert:
            activation.revert([fix.id])
            report["restored"] = _originals(fix) == before
            report["reverted"] = probes()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("inprocess", "spawn", "plugin", "compare"))
    parser.add_argument("check_id")
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--unsafe", action="store_true")
    parser.add_argument("--revert", action="store_true")
    parser.add_argument("--prelude", default="")
    options = parser.parse_args()
    exec(options.prelude)
    if options.mode == "compare":
        result = compare(options.check_id, options.configs, options.unsafe, options.revert)
    else:
        result = {"inprocess": inprocess, "spawn": spawn, "plugin": plugin}[options.mode](
            options.check_id, options.configs[0]
        )
    print(json.dumps(result))
