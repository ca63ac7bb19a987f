#!/usr/bin/env python3
"""Time and size the live depth on a DeepSeek-V3-sized deployment vs a bare import.

    python benchmarks/live_check.py [--runs 3] [--release 0.5.12] [--config examples/deepseek-v3-pd.yaml]

Two processes, each the median of ``--runs``:
* bare import: a child that only imports the modules the live probes need, behind the
  same NPU simulation (what any live run pays first);
* live check: ``npudoctor check --depth live`` with every live probe.
The live child reports its own peak RSS and its RSS right after that import, so the
memory figure compares the two in the same run. The same live check of a 128-layer DeepSeek-V3
(``bench.scaled_deployment``) shows whether the probes' memory grows with the layer count; the
last lines are the live speed targets (benchmarks/README.md section 8), each met or NOT met.
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from fetch_sglang import fetch  # noqa: E402

BARE_IMPORT = """
import resource, sys, time
from npudoctor.engine.registry import all_checks
from npudoctor.live.npusim import simulated_npu
with simulated_npu():
    for check in all_checks():
        if check.has_live:
            check.live_imports()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


@dataclass(frozen=True)
class LiveCost:
    wall: float  # seconds, whole `npudoctor check --depth live` process
    peak_rss_mb: float  # the live child's peak
    import_rss_mb: float  # the live child's RSS right after importing the probed modules
    import_seconds: float  # the live child's import of the probed modules
    probe_seconds: dict[str, float]  # check id -> its live probe, in the child
    statuses: str


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode not in (0, 1):
        raise SystemExit(
            f"{' '.join(command[:4])} ... exited {done.returncode}: {done.stderr.strip()[-400:]}"
        )
    return time.perf_counter() - start, done.stdout


def bare_import(tree: Path, runs: int) -> tuple[float, float]:
    """Median wall time and peak RSS (MB) of importing the probed modules of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    bare = [timed([sys.executable, "-c", BARE_IMPORT], env) for _ in range(runs)]
    return statistics.median(t for t, _ in bare), statistics.median(
        float(o.strip().splitlines()[-1]) for _, o in bare
    )


def live_check(tree: Path, config: Path, runs: int) -> LiveCost:
    """Median cost of ``npudoctor check --depth live`` with every live probe."""
    command = [
        sys.executable, "-m", "npudoctor", "check", "--depth", "live", "--format", "json",
        "--sglang-path", str(tree), "--config", str(config),
    ]  # fmt: skip
    # every run pays the live depth: an outcome kept in the result cache would answer runs 2..n
    uncached = {**os.environ, "NPUDOCTOR_NO_CACHE": "1"}
    runs_done = [timed(command, uncached) for _ in range(runs)]
    reports = [json.loads(out) for _, out in runs_done]
    live = reports[-1]["live"]
    if not live or not live.get("ran"):
        raise SystemExit(f"live depth did not run: {live}")
    return LiveCost(
        wall=statistics.median(t for t, _ in runs_done),
        peak_rss_mb=statistics.median(r["live"]["peak_rss_mb"] for r in reports),
        import_rss_mb=statistics.median(r["live"]["import_rss_mb"] for r in reports),
        import_seconds=statistics.median(r["live"]["import_seconds"] for r in reports),
        probe_seconds={
            check_id: statistics.median(r["live"]["probe_seconds"][check_id] for r in reports)
            for check_id in live["probe_seconds"]
        },
        statuses=", ".join(f"{r['id']}={r['status']}/{r['depth']}" for r in reports[-1]["results"]),
    )


README_FLOW = (("check",), ("fix",), ("fix", "--status"), ("check",))


def readme_flow(tree: Path, config: Path) -> tuple[float, float]:
    """Total wall of the README's flow on one deployment (``check``, ``fix``, ``fix --status``,
    ``check``, each at ``--depth auto``): with a fresh result cache, where the first command's
    live outcome answers the others, and with ``NPUDOCTOR_NO_CACHE=1``, where each pays it."""
    totals = []
    for cache in (True, False):
        with tempfile.TemporaryDirectory() as scratch:
            env = {**os.environ, "NPUDOCTOR_CACHE_DIR": scratch}
            if not cache:
                env["NPUDOCTOR_NO_CACHE"] = "1"
            total = 0.0
            for words in README_FLOW:
                command = [sys.executable, "-m", "npudoctor", *words, "--sglang-path", str(tree),
                           "--config", str(config)]  # fmt: skip
                start = time.perf_counter()
                subprocess.run(command, capture_output=True, env=env, check=False)
                total += time.perf_counter() - start
            totals.append(total)
    return totals[0], totals[1]


def breakdown(cost: LiveCost) -> str:
    """Where the wall time of a live check went: the child's import, each probe, the rest."""
    probes = sum(cost.probe_seconds.values())
    return (
        f"of which: child import {cost.import_seconds:.2f} s, probes {probes:.2f} s "
        f"({', '.join(f'{k} {v:.2f}' for k, v in cost.probe_seconds.items())}), "
        f"the rest (start-ups, static depth, report) {cost.wall - cost.import_seconds - probes:.2f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--release", default="0.5.12")
    parser.add_argument("--config", default=str(REPO / "examples" / "deepseek-v3-pd.yaml"))
    args = parser.parse_args()
    tree = fetch(args.release)
    bare_wall, bare_rss = bare_import(tree, args.runs)
    cost = live_check(tree, Path(args.config), args.runs)
    print(f"sglang {args.release}, {Path(args.config).name}, median of {args.runs} runs")
    print(f"bare import of the probed modules: {bare_wall:.2f} s wall, {bare_rss:.0f} MB peak RSS")
    print(f"npudoctor check --depth live:      {cost.wall:.2f} s wall (ratio {cost.wall / bare_wall:.2f})")
    print(f"  {breakdown(cost)}")
    print(
        f"live child peak RSS: {cost.peak_rss_mb:.0f} MB, {cost.import_rss_mb:.0f} MB after the import "
        f"(+{cost.peak_rss_mb - cost.import_rss_mb:.0f} MB for the probes)"
    )
    print(f"results: {cost.statuses}")
    kept, uncached = readme_flow(tree, Path(args.config))
    print(
        f"README flow ({', '.join(' '.join(w) for w in README_FLOW)}): {kept:.2f} s with the live outcome kept, "
        f"{uncached:.2f} s with NPUDOCTOR_NO_CACHE=1 (ratio {kept / uncached:.2f})"
    )
    import bench  # imports this module; here, not at the top, so that is no import cycle

    with tempfile.TemporaryDirectory() as scratch:
        large = live_check(tree, bench.scaled_deployment(Path(scratch), 128, 2), args.runs)
    print("speed targets (live):")
    print(f"  {met('live check / bare import', cost.wall / bare_wall, 1.2, '')}")
    for layers, run in ((Path(args.config).name, cost), ("128 layers (DeepSeek-V3 PD, prefill PP 2)", large)):
        above = run.peak_rss_mb - run.import_rss_mb
        print(f"  {met(f'probe memory above the import, {layers}', above, 64, ' MB')}")
    grows = (large.peak_rss_mb - large.import_rss_mb) - (cost.peak_rss_mb - cost.import_rss_mb)
    print(
        f"  probe memory growth from {Path(args.config).name} to 128 layers: {grows:+.0f} MB (target: flat)"
    )
    return 0


def met(label: str, value: float, limit: float, unit: str) -> str:
    return f"{label}: {value:.2f}{unit} (target <= {limit:g}{unit}): {'met' if value <= limit else 'NOT met'}"


if __name__ == "__main__":
    sys.exit(main())
