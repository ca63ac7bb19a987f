"""What a process imports before it does its work: start-up cost is paid by every process.

Every Python process `npudoctor run` starts pays for its bootstrap, most of them never import
sglang; every `check` pays for what its command line imports. These tests run real processes
and read their ``sys.modules``: the bootstrap imports no npudoctor module until sglang is looked
up, and a static check never loads a check's live probe (nor, answered from the static-result
cache, its static probe). Timings are measured in benchmarks/, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks
from npudoctor.patching.planfile import BOOTSTRAP_DIR

from support.repo import EXAMPLES

PROBES = sorted(
    f"npudoctor.checks.{path.parent.name}.{path.stem}"
    for path in (Path(__file__).resolve().parents[2] / "checks").glob("*/*.py")
    if path.stem in ("live", "static")
)
REPORT = "import json, sys; print(json.dumps(sorted(m for m in sys.modules if m.startswith(('npudoctor', 'wrapt')))))"


def _loaded(code: str, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The npudoctor (and wrapt) modules loaded by ``code`` then, and what it printed before."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{REPORT}"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    *before, last = done.stdout.splitlines()
    return json.loads(last), "\n".join(before)


def test_the_probe_modules_are_found():
    """Every check with a live probe keeps it in a ``live`` module this test can find (the static-only
    properties NPP* have none), so the test below that no live module is loaded means something."""
    checks = [c for c in all_checks() if c.kind is not CheckKind.CATALOG]  # records are data
    live = {p.split(".")[2].split("_")[0].upper() for p in PROBES if p.endswith(".live")}
    assert {c.id for c in checks if c.has_live} == live


@pytest.fixture
def fake_sglang(tmp_path) -> Path:
    root = tmp_path / "fake"
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "__init__.py").write_text("")
    return root


def test_bootstrap_imports_npudoctor_only_when_sglang_is_imported(fake_sglang, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"fixes": {"NPD001": {"shape": {"sglang.srt.x:Y.z": "abc"}}}}')
    env = {
        "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), str(fake_sglang)]),
        "NPUDOCTOR_RUN_PLAN": str(plan),
    }
    before, _ = _loaded("pass", env)
    assert before == []  # not npudoctor, not wrapt: an interpreter that never imports sglang
    code = (
        "import sys\n"
        "finders = [type(f).__name__ for f in sys.meta_path]\n"
        "import sglang.srt\n"
        "print(json.dumps([finders, [type(f).__name__ for f in sys.meta_path]]))"
    )
    after, printed = _loaded(f"import json\n{code}", env)
    armed, disarmed = json.loads(printed)
    assert "_ArmAtFirstImport" in armed and "_ArmAtFirstImport" not in disarmed
    assert "npudoctor.patching.activation" in after and "wrapt" in after  # the plan's hook is registered


def _check(tree: Path) -> str:
    argv = ["check", "--depth", "static", "--format", "json", "--sglang-path", str(tree)]
    argv += ["--config", str(EXAMPLES / "deepseek-v3-pd.yaml")]
    return (
        "import contextlib, io\n"
        "from npudoctor.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main({argv!r})\n"
        "print(code, len(json.loads(out.getvalue())['results']))"
    )


def test_a_static_check_loads_no_live_probe_and_a_cached_one_no_probe(release):
    code = _check(release("0.5.12"))
    cold, printed = _loaded(f"import json\n{code}")
    from npudoctor.engine.registry import select

    default = select(all_checks(), [], "check")  # a plain check: not the properties (NPP)
    assert printed == f"1 {len(default)}"  # 0.5.12 DeepSeek-V3 PD has findings
    assert not [m for m in cold if m in PROBES and m.endswith(".live") or m == "npudoctor.live.livepools"]
    assert [m for m in cold if m.endswith(".static")]  # the static probes ran
    warm, printed = _loaded(f"import json\n{code}")
    assert printed == f"1 {len(default)}"
    assert not set(warm) & set(PROBES)  # every answer came from the static-result cache


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["explain", "NPD001"]])
def test_help_list_and_explain_load_no_probe(argv):
    code = (
        "import contextlib, io\n"
        "from npudoctor.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main({argv!r})\n"
        "print(code, bool(out.getvalue()))"
    )
    loaded, printed = _loaded(code)
    assert printed == "0 True"
    assert not set(loaded) & set(PROBES)
    assert "npudoctor.service.runner" not in loaded
