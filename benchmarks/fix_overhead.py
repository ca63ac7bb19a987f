#!/usr/bin/env python3
"""What the runtime fixes cost: interpreter start-up with the `npudoctor run` bootstrap, and
each override's hot path against the upstream fixed method on the same data.

    python benchmarks/fix_overhead.py [--runs 10] [--repeat 20]

* start-up: ``python -c pass`` with the bootstrap on PYTHONPATH and a plan of every fix
  vs without, median of ``--runs`` each (the bootstrap only arms import hooks);
* NPD001: ``get_cpu_copy`` + ``load_cpu_copy`` of 1024 scattered slots on a DeepSeek-V3
  sized NPU MLA pool (61 layers, page 128, 32 pages) built on CPU from sglang 0.5.13, whose
  own methods are the upstream fix; the override runs on the very same pool object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from fetch_sglang import fetch  # noqa: E402


def startup(runs: int) -> tuple[float, float]:
    from npudoctor.fixing import BOOTSTRAP_DIR

    with tempfile.TemporaryDirectory() as workdir:
        plan = Path(workdir) / "plan.json"
        from npudoctor.fix import all_fixes

        plan.write_text(
            json.dumps({"fixes": {f.id: {"shape": next(iter(f.written_for.values()))} for f in all_fixes()}})
        )
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPUDOCTOR_RUN_PLAN")}
        with_bootstrap = {**base, "PYTHONPATH": str(BOOTSTRAP_DIR), "NPUDOCTOR_RUN_PLAN": str(plan)}

        def median(env: dict[str, str]) -> float:
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        median(base)  # warm the page cache
        return median(base), median(with_bootstrap)


NPD001_HOT_PATH = r"""
import statistics, sys, time, json
import torch
from npudoctor.npusim import simulated_npu, npu_runtime
from npudoctor import livepools
from npudoctor.facts import RoleFacts
from npudoctor.deployment import from_yaml
from npudoctor.fixes import npd001_cpu_offload_roundtrip as fix
from pathlib import Path

repeat = int(sys.argv[1])
facts = from_yaml(Path(sys.argv[2])).facts
with simulated_npu():
    livepools.import_pool_modules()
    cls = [c for c in livepools.npu_pool_classes("mla") if c.__name__ == "NPUMLATokenToKVPool"][0]
    role = RoleFacts(name="decode", disaggregation_mode="decode", page_size=128)
    livepools.PAGES = 32
    with npu_runtime():
        pool = livepools.build_pool(cls, facts.model, role)
        indices = torch.randperm(pool.size)[:1024] + pool.page_size
        target = torch.randperm(pool.size)[:1024] + pool.page_size

        pair = {"upstream": (cls.get_cpu_copy, cls.load_cpu_copy), "override": (fix.get_cpu_copy, fix.load_cpu_copy)}
        times = {name: [] for name in pair}
        for name, (get, load) in pair.items():  # warm-up: first touches of the buffers
            load(pool, get(pool, indices), target)
        for _ in range(repeat):  # alternate, so drift on a shared machine hits both alike
            for name, (get, load) in pair.items():
                start = time.perf_counter()
                load(pool, get(pool, indices), target)
                times[name].append(time.perf_counter() - start)
        upstream, override = (statistics.median(times[name]) for name in pair)
print(json.dumps({"upstream": upstream, "override": override}))
"""


def npd001_hot_path(repeat: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(fetch("0.5.13"))}
    done = subprocess.run(
        [sys.executable, "-c", NPD001_HOT_PATH, str(repeat), str(REPO / "examples" / "deepseek-v3-pd.yaml")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    plain, boot = startup(args.runs)
    print(
        f"python -c pass: {plain * 1000:.1f} ms, with the npudoctor run bootstrap: {boot * 1000:.1f} ms "
        f"(+{(boot - plain) * 1000:.1f} ms, ratio {boot / plain:.2f}; median of {args.runs})"
    )
    hot = npd001_hot_path(args.repeat)
    print(
        f"NPD001 offload+reload of 1024 slots, DeepSeek-V3 MLA pool (61 layers): upstream 0.5.13 "
        f"{hot['upstream'] * 1000:.1f} ms, override {hot['override'] * 1000:.1f} ms "
        f"(ratio {hot['override'] / hot['upstream']:.2f}; median of {args.repeat})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
