"""Run one check's live probe in a fresh interpreter, the way a patched sglang process would.

    python tests/fixprobe.py MODE CHECK_ID CONFIG      (sglang on PYTHONPATH)

MODE:
* ``inprocess``: decide the fix like ``npudoctor fix``, enable it, probe; revert it, probe
  again, and report whether every replaced attribute is the original object again;
* ``spawn``: probe in a ``multiprocessing`` spawn child (fixes, if any, come from the
  environment: ``npudoctor run``'s bootstrap);
* ``plugin``: call sglang's own ``load_plugins()`` (0.5.11+) first, then probe.

Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path


def _facts(config: str):
    from npudoctor.deployment import from_yaml

    return from_yaml(Path(config)).facts


def _probe(check_id: str, config: str) -> dict:
    from npudoctor.check import all_checks
    from npudoctor.npusim import npu_runtime
    from npudoctor.target import discover

    check = next(c for c in all_checks() if c.id == check_id)
    check.live_imports()
    with npu_runtime():
        probe = check.live(discover(), _facts(config))
    return {"status": probe.status.value, "summary": probe.summary}


def _originals(fix) -> dict[str, int | None]:
    """id() of what each replaced attribute is now (None: not defined on the owner itself)."""
    owners = {}
    for site in fix.replaces:
        module, _, qualname = site.partition(":")
        owner_path, _, name = qualname.rpartition(".")
        owner = sys.modules[module]
        for part in owner_path.split("."):
            owner = getattr(owner, part)
        value = vars(owner).get(name)
        owners[site] = None if value is None else id(value)
    return owners


def inprocess(check_id: str, config: str) -> dict:
    from npudoctor import activation
    from npudoctor.fix import fix_by_id
    from npudoctor.fixing import Action, decide
    from npudoctor.npusim import simulated_npu
    from npudoctor.target import discover

    fix = fix_by_id(check_id)
    # this mode proves the patch and its revert; the --unsafe opt-in is decide's, tested on its own
    decision = decide(fix, discover(), _facts(config), allow_unsafe=True)
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
    from npudoctor import activation
    from npudoctor.npusim import simulated_npu

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
    from npudoctor import activation
    from npudoctor.npusim import simulated_npu

    with simulated_npu():
        from sglang.srt.plugins import load_plugins

        load_plugins()
        result = _probe(check_id, config)
    return {**result, "fixes": activation.outcomes()}


if __name__ == "__main__":
    mode, check_id, config = sys.argv[1:4]
    print(json.dumps({"inprocess": inprocess, "spawn": spawn, "plugin": plugin}[mode](check_id, config)))
