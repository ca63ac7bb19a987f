#!/usr/bin/env python3
"""Time and size the live depth on a DeepSeek-V3-sized deployment vs a bare import.

    python benchmarks/live_check.py [--runs 3] [--release 0.5.12] [--config examples/deepseek-v3-pd.yaml]

Two processes, each the median of ``--runs``:
* bare import: a child that only imports the modules the live probes need, behind the
  same NPU simulation (what any live run pays first);
* live check: ``npudoctor check --depth live`` with every live probe.
The live child reports its own peak RSS and its RSS right after that import, so the
memory figure compares the two in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from fetch_sglang import fetch  # noqa: E402

BARE_IMPORT = """
import resource, sys, time
from npudoctor.check import all_checks
from npudoctor.npusim import simulated_npu
with simulated_npu():
    for check in all_checks():
        if check.has_live:
            check.live_imports()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode not in (0, 1):
        raise SystemExit(
            f"{' '.join(command[:4])} ... exited {done.returncode}: {done.stderr.strip()[-400:]}"
        )
    return time.perf_counter() - start, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--release", default="0.5.12")
    parser.add_argument("--config", default=str(REPO / "examples" / "deepseek-v3-pd.yaml"))
    args = parser.parse_args()
    tree = fetch(args.release)
    env = {**__import__("os").environ, "PYTHONPATH": str(tree)}

    bare = [timed([sys.executable, "-c", BARE_IMPORT], env) for _ in range(args.runs)]
    bare_wall = statistics.median(t for t, _ in bare)
    bare_rss = statistics.median(float(out.strip().splitlines()[-1]) for _, out in bare)

    command = [
        sys.executable,
        "-m",
        "npudoctor",
        "check",
        "--depth",
        "live",
        "--format",
        "json",
        "--sglang-path",
        str(tree),
        "--config",
        args.config,
    ]
    runs = [timed(command) for _ in range(args.runs)]
    wall = statistics.median(t for t, _ in runs)
    reports = [json.loads(out) for _, out in runs]
    live = reports[-1]["live"]
    if not live or not live.get("ran"):
        raise SystemExit(f"live depth did not run: {live}")
    peak = statistics.median(r["live"]["peak_rss_mb"] for r in reports)
    after_import = statistics.median(r["live"]["import_rss_mb"] for r in reports)
    statuses = ", ".join(f"{r['id']}={r['status']}/{r['depth']}" for r in reports[-1]["results"])

    print(f"sglang {args.release}, {Path(args.config).name}, median of {args.runs} runs")
    print(f"bare import of the probed modules: {bare_wall:.2f} s wall, {bare_rss:.0f} MB peak RSS")
    print(f"npudoctor check --depth live:      {wall:.2f} s wall (ratio {wall / bare_wall:.2f})")
    print(
        f"live child peak RSS: {peak:.0f} MB, {after_import:.0f} MB after the import "
        f"(+{peak - after_import:.0f} MB for the probes)"
    )
    print(f"results: {statuses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
