"""scripts/demo.sh checks copies of the releases of its own: the `fix --apply` hint it prints, pasted
as printed, records the fixes in the demo's copy, never in the release cache the tests share (where
the record would be applied in every later live run of that release)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from support.repo import REPO


def test_the_demos_fix_hint_writes_into_its_own_copy_not_the_release_cache(release, tmp_path):
    cached = release("0.5.12")
    before = sorted(p.name for p in cached.iterdir())
    demo_dir = tmp_path / "demo"
    env = {
        **os.environ,
        "NPUDOCTOR_DEMO_DIR": str(demo_dir),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)

    made = run("bash", "-c", "source scripts/demo.sh && tree 0.5.12")  # the demo's own step
    assert made.returncode == 0, made.stderr
    copy = Path(made.stdout.strip())
    assert copy == demo_dir / "0.5.12" and (copy / "sglang" / "srt").is_dir()
    # the demo's `fix` step (at the static depth: the live one has tests of its own), then its hint
    planned = run(
        "npudoctor", "fix", "--sglang-path", str(copy), "--config", "examples/deepseek-v3-pd.yaml",
        "--depth", "static",
    )  # fmt: skip
    hints = [
        line.strip()
        for line in planned.stdout.splitlines()
        if line.strip().startswith("npudoctor fix --apply")
    ]
    assert planned.returncode in (0, 1) and len(hints) == 1, planned.stdout + planned.stderr
    applied = run(*shlex.split(hints[0]))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    recorded = [p.name for p in copy.iterdir() if p.name.endswith(".dist-info")]
    assert any("npudoctor" in name for name in recorded), recorded
    assert sorted(p.name for p in cached.iterdir()) == before
