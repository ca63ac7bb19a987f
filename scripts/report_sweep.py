"""Check every example deployment against every cached release, and compare two such sweeps.

A change that should not change behaviour (a refactor, a speed-up) is proved by running the same
sweep with the code before and after it and comparing the JSON reports::

    python scripts/report_sweep.py run OUT_DIR [--depth auto] [--npudoctor PATH] [--jobs 2] [--versions V ...]
    python scripts/report_sweep.py diff BEFORE_DIR AFTER_DIR

``run`` writes ``<version>__<example>.json`` (``npudoctor check --format json``) for each example
deployment of ``examples/`` and each release of the release cache (``.cache/sglang`` or
``$NPUDOCTOR_SGLANG_CACHE``; fetch them with ``scripts/fetch_sglang.py``), with the static-result
cache off and none of the shell's code-path variables (the sweep must not depend on the host).
``--npudoctor`` names the command of the code under test (the old code's, installed in another
venv). ``diff`` compares two directories report by report, ignoring what differs from run to run:
timings, memory, the paths of the checkout, and the out-of-bounds index torch names in an
``IndexError`` (which thread reaches the bad index first decides it); it exits 1 if any report
differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE_PATH_PREFIXES = ("ASCEND_", "SGLANG_", "HCCL_", "PYTORCH_NPU_", "TASK_QUEUE_")
RUN_TO_RUN = {"import_seconds", "probe_seconds", "import_rss_mb", "peak_rss_mb", "elapsed", "seconds"}
TORCH_INDEX = re.compile(r"index -?\d+ is out of bounds")


def release_trees() -> dict[str, Path]:
    """Every release whose wheel is in the release cache -> its tree (``scripts/fetch_sglang.py``)."""
    spec = importlib.util.spec_from_file_location("fetch_sglang", REPO / "scripts" / "fetch_sglang.py")
    fetch_sglang = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_sglang)
    return fetch_sglang.cached()


def run(args: argparse.Namespace) -> int:
    trees = release_trees()
    versions = args.versions or list(trees)
    missing = [v for v in versions if v not in trees]
    if missing:
        print(
            f"not in the release cache: {', '.join(missing)} (fetch with scripts/fetch_sglang.py)",
            file=sys.stderr,
        )
        return 2
    examples = sorted((REPO / "examples").glob("*.yaml"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(CODE_PATH_PREFIXES)}
    env["NPUDOCTOR_NO_CACHE"] = "1"

    def one(case: tuple[str, Path]) -> str | None:
        version, example = case
        report = out / f"{version}__{example.stem}.json"
        done = subprocess.run(
            [
                args.npudoctor,
                "check",
                "--format",
                "json",
                "--depth",
                args.depth,
                "--quiet",
                "--sglang-path",
                str(trees[version]),
                "--config",
                str(example),
                "--output",
                str(report),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        return (
            None
            if done.returncode in (0, 1)
            else f"{report.name}: exit {done.returncode}: {done.stderr[-500:]}"
        )

    with ThreadPoolExecutor(args.jobs) as pool:
        failures = [f for f in pool.map(one, [(v, e) for v in versions for e in examples]) if f]
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"{len(versions) * len(examples) - len(failures)} reports in {out}")
    return 1 if failures else 0


def normalized(value, paths: dict[str, str]):
    """``value`` without what differs from run to run; ``paths`` maps the report's own paths (its
    target's, its checkout's) to placeholders, the longest first."""
    if isinstance(value, dict):
        return {k: normalized(v, paths) for k, v in value.items() if k not in RUN_TO_RUN}
    if isinstance(value, list):
        return [normalized(v, paths) for v in value]
    if isinstance(value, str):
        for path, placeholder in paths.items():
            value = value.replace(path, placeholder)
        return TORCH_INDEX.sub("index N is out of bounds", value)
    return value


def own_paths(report: dict) -> dict[str, str]:
    """The target's path and the checkout the deployment was read from (``yaml:<checkout>/examples/...``)."""
    source = report.get("deployment", {}).get("source", "")
    found = {
        report.get("target", {}).get("path") or "\0": "<target>",
        source.removeprefix("yaml:").rpartition("/examples/")[0] or "\0": "<checkout>",
    }
    return dict(sorted(found.items(), key=lambda item: -len(item[0])))


def diff(args: argparse.Namespace) -> int:
    before, after = Path(args.before), Path(args.after)
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    differ = 0
    for name in names:
        a, b = before / name, after / name
        if not (a.is_file() and b.is_file()):
            differ += 1
            print(f"{name}: only in {'before' if a.is_file() else 'after'}")
            continue
        old, new = json.loads(a.read_text()), json.loads(b.read_text())
        old, new = normalized(old, own_paths(old)), normalized(new, own_paths(new))
        if old != new:
            differ += 1
            keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
            print(f"{name}: differs in {', '.join(keys)}")
    print(f"compared {len(names)} reports, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sweep = commands.add_parser("run", help="check every example against every cached release")
    sweep.add_argument("out")
    sweep.add_argument(
        "--versions", nargs="+", metavar="VERSION", help="these releases only (default: every cached one)"
    )
    sweep.add_argument("--depth", default="auto", choices=("static", "auto", "live"))
    beside = Path(sys.executable).parent / "npudoctor"  # this venv's, where the script runs in one
    sweep.add_argument("--npudoctor", default=str(beside) if beside.is_file() else shutil.which("npudoctor"))
    sweep.add_argument("--jobs", type=int, default=2)
    compare = commands.add_parser("diff", help="compare two sweeps' reports")
    compare.add_argument("before")
    compare.add_argument("after")
    args = parser.parse_args()
    return run(args) if args.command == "run" else diff(args)


if __name__ == "__main__":
    sys.exit(main())
