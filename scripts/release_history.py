#!/usr/bin/env python3
"""Write npudoctor/data/history.json: every check's verdict on every release, per witness deployment.

    python scripts/release_history.py [--since 0.4.10] [--jobs 2] [--witness NAME ...] [--reports DIR]

Runs ``npudoctor check --depth auto -f json`` (live where the release imports, static otherwise)
on every final sglang release from ``--since`` to the newest on PyPI (fetched into the release
cache, see fetch_sglang.py), for each witness deployment of ``WITNESSES``; ``npudoctor.target.history``
reads the result to say, per finding, from which release the property holds ("upgrade to X") or
that the newest release checked still fails. Rerun it when a release comes out or a check changes;
``--witness`` remakes the named witnesses only (the others keep what the history holds, as long
as it covers the same releases).
``--reports DIR`` takes reports already made (JSON of ``check --depth auto`` on a release tree
with an example deployment, e.g. the live-reports of tests/live/test_live_every_release.py) instead
of running them again.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from npudoctor.target import history

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "npudoctor" / "data" / "history.json"
# name -> example deployment: the attention kinds and FIA settings a finding is matched on
WITNESSES = {
    "deepseek-v3-pd": "deepseek-v3-pd.yaml",  # MLA, prefill PP
    "deepseek-v3.2-pd": "deepseek-v3.2-pd.yaml",  # MLA with the indexer, prefill PP, decode MTP
    "qwen3-moe-pd-fia": "qwen3-moe-pd-fia.yaml",  # GQA, FIA on
    "qwen3-moe-pd": "qwen3-moe-pd.yaml",  # GQA, FIA off
    "qwen3-cp-prefill": "qwen3-cp-prefill.yaml",  # GQA, FIA, context-parallel prefill
    "llama4-scout-swa-pd": "llama4-scout-swa-pd.yaml",  # GQA with sliding-window layers
    "llama3-70b-pp3-pd": "llama3-70b-pp3-pd.yaml",  # GQA, prefill PP 3 over 80 layers (the MHA splitter)
}


def _fetch_module():
    spec = importlib.util.spec_from_file_location("fetch_sglang", REPO / "scripts" / "fetch_sglang.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verdicts(tree: Path, deployment: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "check", "--depth", "auto", "-f", "json",
         "--sglang-path", str(tree), "--config", str(deployment)],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    if done.returncode not in (0, 1):
        raise SystemExit(
            f"{tree} {deployment.name}: npudoctor exited {done.returncode}: {done.stderr[-500:]}"
        )
    return json.loads(done.stdout)


def _reports(directory: Path, chosen: dict[str, str]) -> dict[tuple[str, str], dict]:
    """(witness, release) -> a report made before, for the chosen witnesses' example files: one
    of ``check --depth auto`` with every check and no runtime fix (a report of ``--select``,
    ``--with-fix`` or another depth answers another question)."""
    from npudoctor.engine.registry import all_checks

    by_file = {example: name for name, example in chosen.items()}
    every_check = {c.id for c in all_checks()}
    found = {}
    for path in sorted(directory.glob("*.json")):
        report = json.loads(path.read_text())
        name = by_file.get((report["deployment"].get("source") or "").rpartition("/")[2])
        live = report.get("live") or {}
        if (
            name is not None
            and report.get("depth") == "auto"
            and {r["id"] for r in report["results"]} == every_check
            and live.get("ran") is not None
            and not live.get("fixes")
        ):
            found[(name, report["target"]["version"])] = report
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--since", default="0.4.10")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--witness", action="append", choices=sorted(WITNESSES), help="default: all")
    parser.add_argument("--reports", type=Path, help="reuse the check reports in this directory")
    args = parser.parse_args(argv)
    fetch = _fetch_module()
    releases = fetch.releases(args.since)
    trees = {version: fetch.fetch(version) for version in releases}
    chosen = {name: WITNESSES[name] for name in (args.witness or WITNESSES)}
    made = _reports(args.reports, chosen) if args.reports else {}
    # the witnesses not chosen keep what the history held (their reports are not made again)
    previous = json.loads(OUTPUT.read_text()) if OUTPUT.is_file() else {}
    witnesses: dict[str, dict] = {
        name: entry
        for name, entry in previous.get("witnesses", {}).items()
        if name in WITNESSES and name not in chosen and previous.get("releases") == releases
    }
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        runs = {
            (name, version): made.get((name, version))
            or pool.submit(verdicts, trees[version], REPO / "examples" / example)
            for name, example in chosen.items()
            for version in releases
        }
        for (name, version), run in runs.items():
            report = run if isinstance(run, dict) else run.result()
            print(f"{version} {name}: " + " ".join(f"{r['id']}={r['status']}" for r in report["results"]))
            model = report["deployment"]["model"]
            entry = witnesses.setdefault(
                name,
                {
                    "deployment": f"examples/{WITNESSES[name]}",
                    "attention": model["attention"],
                    "fia": any(role["use_fia"] for role in report["deployment"]["roles"]),
                    "v_head_dim_differs": history.v_head_dim_differs(
                        model["attention"], model["head_dim"], model["v_head_dim"]
                    ),
                    "results": {},
                },
            )
            for result in report["results"]:
                entry["results"].setdefault(result["id"], {})[version] = result["status"]
    document = {"depth": "auto", "releases": releases, "witnesses": witnesses}
    OUTPUT.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
