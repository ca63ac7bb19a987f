#!/usr/bin/env python3
"""Time what the input limits and the redaction cost, against reading a real deployment.

    python benchmarks/input_limits.py [--runs 5]

The tests assert what is refused and where reading stops (tests/hardening/test_hardening_limits.py,
test_hardening_secrets.py, test_hardening_fuzz.py); how long it takes is measured here, in this
process, as the median of ``--runs`` and as a ratio to reading ``examples/deepseek-v3-pd.yaml``
(``load.from_yaml``), so the number means the same on a slower or busier machine. A refusal that
expanded what it refuses, or a pattern that retried every position of a long word, shows as a
ratio in the thousands.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from npudoctor.deployment import load  # noqa: E402
from npudoctor.deployment.redact import redact_argv  # noqa: E402
from npudoctor.errors import InputError  # noqa: E402
from npudoctor.terminal import printable, shell_join  # noqa: E402

DEPLOYMENT = REPO / "examples" / "deepseek-v3-pd.yaml"
MODEL = REPO / "examples" / "models" / "deepseek-v3" / "config.json"


def median(call: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def refused(path: Path) -> Callable[[], None]:
    def read() -> None:
        try:
            load.from_yaml(path)
        except InputError:
            return
        raise SystemExit(f"{path.name} was not refused")

    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    from hardening.test_hardening_limits import BOMBS, MAX_VALUE_CHARS

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        cases: dict[str, Callable[[], object]] = {}
        for place, text in BOMBS.items():
            (folder / f"{len(cases)}.yaml").write_text(text + "\n")
            cases[f"YAML bomb refused ({place})"] = refused(folder / f"{len(cases)}.yaml")
        many = folder / "many.yaml"
        many.write_text("roles: {decode: {server_args: {x: [" + "0," * 30_000 + "]}}}\n")
        cases["30,000 values refused at the limit"] = refused(many)
        sexagesimal = folder / "sexagesimal.yaml"
        sexagesimal.write_text(
            "roles: {decode: {server_args: {x: 1" + ":1" * (MAX_VALUE_CHARS // 2) + "}}}\n"
        )
        cases["a base-60 int longer than the limit refused"] = refused(sexagesimal)
        for shape, word in (
            ("a", "a" * 1_000_000),
            ("?token=a", "?token=" + "a" * 1_000_000),
            ("https://a:", "https://" + "a:" * 500_000),
        ):
            cases[f"redacting a 1 MB word ({shape}...)"] = lambda word=word: redact_argv(
                [f"--x={word}", word]
            )
        cases["printable + shell_join of 1 MB of controls"] = lambda: shell_join(
            [printable("\x1b" * 1_000_000)]
        )
        config = folder / "config.json"
        data = json.loads(MODEL.read_text())
        data["quantization_config"] = {"ignore": [0] * 1_000_000}
        config.write_text(json.dumps(data, separators=(",", ":")))
        facts = load.from_flags(config, {}, {}).facts
        cases["the report of a 1M-entry config.json (facts.to_dict)"] = facts.to_dict

        baseline = median(lambda: load.from_yaml(DEPLOYMENT), runs)
        print(f"reading {DEPLOYMENT.relative_to(REPO)}: {baseline * 1000:.2f} ms (the ratios' unit)")
        width = max(map(len, cases))
        for name, call in cases.items():
            seconds = median(call, runs)
            print(f"{name:<{width}}  {seconds * 1000:9.2f} ms  ratio {seconds / baseline:8.1f}")


if __name__ == "__main__":
    main()
