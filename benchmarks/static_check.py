#!/usr/bin/env python3
"""Time the static depth: one release vs ``python -c "import torch"``, and a sweep of the cache.

    python benchmarks/static_check.py [--runs 5] [--release 0.5.12]

Every timing is a whole process (interpreter start included), the way CI runs it; the
figure quoted is the median of ``--runs``. Prints the ratio check / import torch, so the
number means the same on a slower machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from fetch_sglang import cache_dir, fetch  # noqa: E402

DEPLOYMENT = REPO / "examples" / "deepseek-v3-pd.yaml"


def wall(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return statistics.median(times)


def check_command(tree: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "npudoctor",
        "check",
        "--depth",
        "static",
        "--format",
        "json",
        "--sglang-path",
        str(tree),
        "--config",
        str(DEPLOYMENT),
    ]


def cached_trees() -> list[Path]:
    """Every complete release tree in the wheel cache, oldest first."""
    return sorted(
        (p for p in (cache_dir() / "trees").iterdir() if (p / ".complete").is_file()),
        key=lambda p: tuple(int(x) if x.isdigit() else 0 for x in p.name.split(".")),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--release", default="0.5.12")
    args = parser.parse_args()

    tree = fetch(args.release)
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; median of {args.runs} runs")
    check = wall(check_command(tree), args.runs)
    print(f"npudoctor check --depth static (sglang {args.release}): {check:.3f} s")
    try:
        torch = wall([sys.executable, "-c", "import torch"], args.runs)
    except SystemExit as missing:
        print(f"python -c 'import torch': not measured ({missing})")
    else:
        print(f"python -c 'import torch':                   {torch:.3f} s")
        print(f"ratio check / import torch:                 {check / torch:.2f}")

    trees = cached_trees()
    total = 0.0
    print(f"\nstatic sweep of {len(trees)} cached releases (median of {args.runs}):")
    for release_tree in trees:
        seconds = wall(check_command(release_tree), args.runs)
        total += seconds
        print(f"  {release_tree.name:>10}: {seconds:.3f} s")
    print(f"  total: {total:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
