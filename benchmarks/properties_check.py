#!/usr/bin/env python3
"""Time the generic properties (NPP*): a static check of the whole property set vs ``import torch``.

    python benchmarks/properties_check.py [--runs 3] [--release 0.5.23]

The properties walk the deployment's whole NPU path (``npudoctor.static.npupath``: the classes
each role builds and the functions they run), which the four share in one process. Measured:
``check --depth static --select NPP`` on the largest tree with the example deployments that build
the most (an MLA PD deployment, DeepSeek-V3) and the least (a GQA MoE PD deployment), cold (an
empty static-result cache each run: every module on the path parsed) and warm (the same check
again: the result cache answers), against ``python -c "import torch"``; then ``--select ALL`` against
the default selection (the deep checks and the catalog), cold, for what they add to a ``check``. Every
timing is a whole process, the median of ``--runs``; bytecode caching on.
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
from fetch_sglang import fetch  # noqa: E402
from static_check import wall  # noqa: E402

DEPLOYMENTS = ("deepseek-v3-pd.yaml", "qwen3-moe-pd.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--release", default="0.5.23")
    args = parser.parse_args()
    tree = fetch(args.release)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    warm_cache = tempfile.TemporaryDirectory()
    os.environ["NPUDOCTOR_CACHE_DIR"] = warm_cache.name
    base = [sys.executable, "-m", "npudoctor", "check", "--depth", "static", "--format", "json",
            "--sglang-path", str(tree)]  # fmt: skip
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; median of {args.runs} runs")
    torch = wall([sys.executable, "-c", "import torch"], args.runs)
    print(f"python -c 'import torch':                    {torch:.3f} s")
    for name in DEPLOYMENTS:
        deployment = ["--config", str(REPO / "examples" / name)]
        properties = [*base, *deployment, "--select", "NPP"]
        wall(properties, 1)  # bytecode written, static-result cache filled
        cold = wall(properties, args.runs, cold_cache=True)
        warm = wall(properties, args.runs)
        print(
            f"{name:<22} properties cold {cold:.3f} s = {cold / torch:.2f}x, "
            f"warm {warm:.3f} s = {warm / torch:.2f}x of import torch"
        )
        default = wall([*base, *deployment], args.runs, cold_cache=True)
        whole = wall([*base, *deployment, "--select", "ALL"], args.runs, cold_cache=True)
        print(
            f"{'':<22} --select ALL cold {whole:.3f} s, the default selection (checks + catalog) "
            f"{default:.3f} s (+{whole - default:.3f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
