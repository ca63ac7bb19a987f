#!/usr/bin/env python3
"""Time the known-defect catalog: a static check with every record vs ``python -c "import torch"``.

    python benchmarks/catalog_check.py [--runs 5] [--release 0.5.23]

Every record reads the source when no deployment is given (each assumes its defect bites), so the
worst case is measured: ``check --depth static`` with no deployment on the largest tree (0.5.23:
4,700 files, 68 MB), the catalog alone (``--select`` every record) and the whole check (the deep
checks and the catalog), cold (an empty static-result cache each run) and warm (the same check
again). The catalog's targets: warm <= 0.25x and cold <= 0.5x ``import torch``. Then ``advise``
over 16 releases (0.5.8..0.5.23) at the static depth, warm (target <= 3 s), with the example
deployment. Every timing is a whole process, the median of ``--runs``; bytecode caching on.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))
from fetch_sglang import cache_dir, fetch  # noqa: E402
from static_check import wall  # noqa: E402

ADVISE_RANGE = "0.5.8..0.5.23"
DEPLOYMENT = REPO / "examples" / "qwen3-moe-pd.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--release", default="0.5.23")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from npudoctor.engine.catalog import all_records

    records = [r.id for r in all_records()]
    tree = fetch(args.release)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    warm_cache = tempfile.TemporaryDirectory()
    os.environ["NPUDOCTOR_CACHE_DIR"] = warm_cache.name
    base = [sys.executable, "-m", "npudoctor", "check", "--depth", "static", "--format", "json"]
    catalog = [*base, "--sglang-path", str(tree), *(w for r in records for w in ("--select", r))]
    whole = [*base, "--sglang-path", str(tree)]
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; median of {args.runs} runs")
    print(
        f"{len(records)} catalog records, sglang {args.release}, no deployment (every record reads the source)"
    )
    torch = wall([sys.executable, "-c", "import torch"], args.runs)
    print(f"python -c 'import torch':                    {torch:.3f} s")
    for label, command in (("the catalog alone", catalog), ("checks + catalog", whole)):
        wall(command, 1)  # bytecode written, static-result cache filled
        cold = wall(command, args.runs, cold_cache=True)
        warm = wall(command, args.runs)
        print(
            f"{label:<18} cold {cold:.3f} s = {cold / torch:.2f}x (target 0.5x), "
            f"warm {warm:.3f} s = {warm / torch:.2f}x (target 0.25x)"
        )
    os.environ["NPUDOCTOR_SGLANG_CACHE"] = str(cache_dir())
    advise = [sys.executable, "-m", "npudoctor", "advise", "--format", "json", "--config", str(DEPLOYMENT),
              "--releases", ADVISE_RANGE]  # fmt: skip
    wall(advise, 1)
    warm = wall(advise, args.runs)
    print(f"advise {ADVISE_RANGE} (16 releases), static, warm: {warm:.3f} s (target 3 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
