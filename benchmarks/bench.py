#!/usr/bin/env python3
"""Every benchmark of npudoctor in one run: medians of repeated runs and their ratios.

    python benchmarks/bench.py [--runs 3] [--release 0.5.12]

1. static check of one release vs ``python -c "import torch"`` (cold: an empty static-result
   cache; warm: the same check again), the static sweep of every release in the wheel cache, and
   ``npudoctor advise`` over 0.5.8..0.5.23 (cold and warm; one worker and one per core);
2. live check of the DeepSeek-V3 PD deployment vs a bare import of the probed modules
   (wall time and peak RSS of the live child);
3. how the live cost grows with model size (8 -> 61 -> 128 layers, prefill PP 2) and
   with prefill PP stages (1 -> 8, 61 layers);
4. start-up overhead of the ``npudoctor run`` bootstrap, and each runtime fix's hot path
   against the upstream fixed method on the same objects.

Each figure an issue sets a target for is printed with its ratio or its limit and "met" or
"NOT met" (section 0 repeats them all at the end). Every process runs with bytecode caching on
(``PYTHONDONTWRITEBYTECODE`` removed), as an installed npudoctor and torch run: without it each
start-up compiles npudoctor's modules again, which no user pays. Results with the machine and
the command are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import fix_overhead
import live_check
import static_check
import yaml

REPO = Path(__file__).resolve().parent.parent
DEEPSEEK = REPO / "examples" / "models" / "deepseek-v3" / "config.json"
DEPLOYMENT = REPO / "examples" / "deepseek-v3-pd.yaml"
ADVISE_RANGE = "0.5.8..0.5.23"
TARGETS: list[str] = []  # one line per target, printed again at the end


def target(label: str, value: float, limit: float, unit: str = "") -> str:
    """``label: value (target ...): met`` (``live_check.met``), remembered for the summary."""
    line = live_check.met(label, value, limit, unit)
    TARGETS.append(line)
    return line


def warm_wall(command: list[str], runs: int) -> float:
    """Median wall time of ``command`` after one unmeasured run has filled the static-result cache."""
    subprocess.run(command, capture_output=True, check=False)
    return static_check.wall(command, runs)


def advise_command(*options: str) -> list[str]:
    return [sys.executable, "-m", "npudoctor", "advise", "--config", str(DEPLOYMENT), "-f", "json", *options]


def scaled_deployment(directory: Path, layers: int, prefill_pp: int) -> Path:
    """DeepSeek-V3 with ``layers`` layers, PD with prefill PP ``prefill_pp``, decode PP 1."""
    config = json.loads(DEEPSEEK.read_text())
    config["num_hidden_layers"] = layers
    config["first_k_dense_replace"] = min(config.get("first_k_dense_replace", 0), layers)
    model = directory / f"deepseek-{layers}.json"
    model.write_text(json.dumps(config))
    deployment = {
        "model": {"config": str(model)},
        "roles": {
            "prefill": {"server_args": {"disaggregation_mode": "prefill", "pp_size": prefill_pp, "tp_size": 8,
                                        "disaggregation_transfer_backend": "ascend"}},
            "decode": {"server_args": {"disaggregation_mode": "decode", "tp_size": 16,
                                       "disaggregation_transfer_backend": "ascend"}},
        },
    }  # fmt: skip
    path = directory / f"deepseek-{layers}-pp{prefill_pp}.yaml"
    path.write_text(yaml.safe_dump(deployment))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions per measurement (medians)")
    parser.add_argument("--release", default="0.5.12", help="the release of sections 1-3")
    args = parser.parse_args()
    runs = args.runs
    tree = static_check.fetch(args.release)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; medians of {runs} runs"
    )

    print("\n1. static depth")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # see the module docstring
    os.environ["NPUDOCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="npudoctor-bench-")  # never the user's cache
    os.environ["NPUDOCTOR_SGLANG_CACHE"] = str(static_check.cache_dir())
    subprocess.run(static_check.check_command(tree), capture_output=True, check=False)  # writes the .pyc
    torch = static_check.wall([sys.executable, "-c", "import torch"], runs)
    cold = static_check.wall(static_check.check_command(tree), runs, cold_cache=True)
    warm = warm_wall(static_check.check_command(tree), runs)
    print(f"  import torch: {torch:.3f} s; check --depth static, sglang {args.release}: cold {cold:.3f} s, "
          f"warm {warm:.3f} s")  # fmt: skip
    print("  " + target("static check / import torch, cold", cold / torch, 0.25))
    print("  " + target("static check / import torch, warm", warm / torch, 0.25))
    sweep = {
        version: static_check.wall(static_check.check_command(t), runs, cold_cache=True)
        for version, t in static_check.cached_trees().items()
    }
    print(f"  sweep of {len(sweep)} cached releases as separate cold checks: total {sum(sweep.values()):.2f} s "
          f"({', '.join(f'{k} {v:.2f}' for k, v in sweep.items())})")  # fmt: skip
    for jobs, label in (("0", f"one per core ({os.cpu_count()})"), ("1", "one worker")):
        command = advise_command("--releases", ADVISE_RANGE, "--jobs", jobs)
        cold, warm = static_check.wall(command, runs, cold_cache=True), warm_wall(command, runs)
        print(f"  advise {ADVISE_RANGE} (16 releases), static, {label}: cold {cold:.2f} s, warm {warm:.2f} s")
        print("  " + target(f"advise, {label}, cold", cold, 8, " s"))
        print("  " + target(f"advise, {label}, warm", warm, 3, " s"))

    print("\n2. live depth, DeepSeek-V3 PD (61 layers, prefill PP 2, page 128)")
    bare_wall, bare_rss = live_check.bare_import(tree, runs)
    cost = live_check.live_check(tree, REPO / "examples" / "deepseek-v3-pd.yaml", runs)
    print(f"  bare import of the probed modules: {bare_wall:.2f} s, {bare_rss:.0f} MB peak RSS")
    print(f"  check --depth live: {cost.wall:.2f} s (ratio {cost.wall / bare_wall:.2f}); live child peak "
          f"{cost.peak_rss_mb:.0f} MB = import {cost.import_rss_mb:.0f} MB + "
          f"{cost.peak_rss_mb - cost.import_rss_mb:.0f} MB for the probes")  # fmt: skip
    print(f"    {live_check.breakdown(cost)}")
    print("  " + target("live check / bare import", cost.wall / bare_wall, 1.2))
    kept, uncached = live_check.readme_flow(tree, REPO / "examples" / "deepseek-v3-pd.yaml")
    print(f"  README flow (check, fix, fix --status, check): {kept:.2f} s with the live outcome kept, "
          f"{uncached:.2f} s without the result cache (ratio {kept / uncached:.2f})")  # fmt: skip
    serial, parallel = (
        static_check.wall(
            advise_command("--depth", "live", "--releases", "0.5.12,0.5.13", "--jobs", jobs),
            1,
            cold_cache=True,
        )
        for jobs in ("1", "2")
    )
    print(f"  advise --depth live, 2 releases: one at a time {serial:.1f} s, two at once {parallel:.1f} s "
          f"(ratio {parallel / serial:.2f})")  # fmt: skip

    print("\n3. live cost vs model size and PP stages (wall s / probe MB above the import)")
    with tempfile.TemporaryDirectory() as scratch:
        for label, layers, pp in [
            ("layers 8, PP 2", 8, 2), ("layers 61, PP 2", 61, 2), ("layers 128, PP 2", 128, 2),
            ("layers 61, PP 1", 61, 1), ("layers 61, PP 4", 61, 4), ("layers 61, PP 8", 61, 8),
        ]:  # fmt: skip
            scaled = live_check.live_check(tree, scaled_deployment(Path(scratch), layers, pp), runs)
            above = scaled.peak_rss_mb - scaled.import_rss_mb
            print(f"  {label:>16}: {scaled.wall:6.2f} s, +{above:4.0f} MB "
                  f"(ratio to bare import {scaled.wall / bare_wall:.2f})")  # fmt: skip
            if pp == 2 and layers in (61, 128):
                print("    " + target(f"probe memory above the import, {layers} layers", above, 64, " MB"))

    print("\n4. runtime fixes")
    plain, boot = fix_overhead.startup(max(runs, 10))
    print(f"  python -c pass: {plain * 1000:.1f} ms; with the npudoctor run bootstrap {boot * 1000:.1f} ms "
          f"(+{(boot - plain) * 1000:.1f} ms, ratio {boot / plain:.2f}; median of {max(runs, 10)})")  # fmt: skip
    print("  " + target("npudoctor run bootstrap per interpreter start", (boot - plain) * 1000, 5, " ms"))
    for line in fix_overhead.hot_paths(max(runs, 10)):
        print(f"  {line}")

    print("\n0. the speed targets")
    for line in TARGETS:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
