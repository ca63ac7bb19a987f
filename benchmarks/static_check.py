#!/usr/bin/env python3
"""Time the static depth: one release vs ``python -c "import torch"``, and a sweep of the cache.

    python benchmarks/static_check.py [--runs 5] [--release 0.5.12]

Every timing is a whole process (interpreter start included), the way CI runs it; the
figure quoted is the median of ``--runs``. Prints the ratio check / import torch, so the
number means the same on a slower machine. The check is timed cold (an empty static-result
cache each run) and warm (the same check again), and so is what it imports before it reads
anything (the CLI, the runner, every check), the start-up part, which should be no more than what
the command uses. Bytecode caching is on (``PYTHONDONTWRITEBYTECODE`` removed), as an installed
npudoctor runs: without it every start compiles npudoctor's modules again, which no user pays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from fetch_sglang import cache_dir, cached, fetch  # noqa: E402, F401 (cache_dir: for bench.py)

DEPLOYMENT = REPO / "examples" / "deepseek-v3-pd.yaml"
# what a static check imports before it reads a file: the command line, the runner, every check
IMPORTS = "import npudoctor.cli, npudoctor.service.runner; from npudoctor.engine.registry import all_checks; all_checks()"


def wall(command: list[str], runs: int, cold_cache: bool = False) -> float:
    """Median wall time of ``command``; ``cold_cache``: each run with an empty static-result cache."""
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as scratch:
            env = {**os.environ, "NPUDOCTOR_CACHE_DIR": scratch} if cold_cache else None
            start = time.perf_counter()
            done = subprocess.run(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
            )
            times.append(time.perf_counter() - start)  # removing the scratch cache is not the check's
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


def cached_trees() -> dict[str, Path]:
    """Every release whose wheel is in the release cache -> its tree, oldest first."""
    return cached()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--release", default="0.5.12")
    args = parser.parse_args()

    tree = fetch(args.release)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # see the module docstring
    warm_cache = tempfile.TemporaryDirectory()
    os.environ["NPUDOCTOR_CACHE_DIR"] = warm_cache.name  # the warm runs' cache, not the user's
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; median of {args.runs} runs")
    wall(check_command(tree), 1)  # writes the bytecode and fills the static-result cache
    cold = wall(check_command(tree), args.runs, cold_cache=True)
    check = wall(check_command(tree), args.runs)
    imports = wall([sys.executable, "-c", IMPORTS], args.runs)
    print(f"npudoctor check --depth static (sglang {args.release}): cold {cold:.3f} s, warm {check:.3f} s")
    print(f"of which what it imports (CLI, runner, every check):   {imports:.3f} s")
    try:
        torch = wall([sys.executable, "-c", "import torch"], args.runs)
    except SystemExit as missing:
        print(f"python -c 'import torch': not measured ({missing})")
    else:
        print(f"python -c 'import torch':                   {torch:.3f} s")
        print(
            f"ratio check / import torch:                 cold {cold / torch:.2f}, warm {check / torch:.2f}"
        )

    trees = cached_trees()
    total = 0.0
    print(f"\nstatic sweep of {len(trees)} cached releases (median of {args.runs}):")
    for version, release_tree in trees.items():
        seconds = wall(check_command(release_tree), args.runs)
        total += seconds
        print(f"  {version:>10}: {seconds:.3f} s")
    print(f"  total: {total:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
