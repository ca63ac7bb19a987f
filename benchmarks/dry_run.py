#!/usr/bin/env python3
"""The dry run's cost beside today's live depth, for the bundled examples, cold and warm.

    python benchmarks/dry_run.py [--runs 1] [--release 0.5.23] [--examples deepseek-v3-pd qwen3-moe-pd]

For each example, each a whole ``npudoctor check`` process (the median of ``--runs``):
* live: ``--depth live`` with the default selection (every live probe, one import of sglang);
* dry run: ``--depth live --select NPD007`` (the dry run of every role, each role an interpreter of
  its own; the shared live run comes with it, as one cache entry answers both);
cold with an empty result cache, warm with the cache the cold run left. The ratio dry/live is the
issue's target (within 2x per role); the roles are counted so the per-role figure can be read.
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


def timed(command: list[str], env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command[:6])} ... exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return wall, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--examples", nargs="+", default=["deepseek-v3-pd", "qwen3-moe-pd"])
    args = parser.parse_args()
    tree = fetch(args.release)
    npudoctor = str(Path(sys.executable).with_name("npudoctor"))
    print(f"sglang {args.release}, median of {args.runs} run(s); seconds per whole process")
    print(f"{'example':<22} {'roles':>5} {'live cold':>9} {'dry cold':>9} {'ratio':>6} {'dry warm':>9}  NPD007")
    for example in args.examples:
        config = REPO / "examples" / f"{example}.yaml"
        base = [npudoctor, "check", "--sglang-path", str(tree), "--config", str(config), "--format", "json"]
        live, dry, warm = [], [], []
        status, roles = "?", 0
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "NPUDOCTOR_CACHE_DIR": cache}
                live.append(timed([*base, "--depth", "live"], env)[0])
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "NPUDOCTOR_CACHE_DIR": cache}
                wall, report = timed([*base, "--depth", "live", "--select", "NPD007"], env)
                dry.append(wall)
                warm.append(timed([*base, "--depth", "live", "--select", "NPD007"], env)[0])
            (result,) = [r for r in report["results"] if r["id"] == "NPD007"]
            status = result["status"]
            roles = sum(1 for a in result["assumptions"] if ": steps run: " in a)
        live_s, dry_s, warm_s = (statistics.median(x) for x in (live, dry, warm))
        print(
            f"{example:<22} {roles:>5} {live_s:>9.1f} {dry_s:>9.1f} {dry_s / live_s:>6.2f} {warm_s:>9.1f}  {status}"
        )


if __name__ == "__main__":
    main()
