"""The live outcome is kept like the static one: the README's flow (``check``, ``fix``, ``fix
--apply``, ``fix --status``, ``run``) runs the live depth once for one deployment, and anything
the outcome depends on (the deployment, the fixes enabled, the environment) is a new run."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from npudoctor.live import child_process

from support.repo import EXAMPLES
from support.trees import overlay_tree

DEPLOYMENT = EXAMPLES / "qwen3-moe-pd.yaml"


@pytest.fixture
def live_starts(monkeypatch):
    """The live children started (each ``child_process.start`` call runs the real one)."""
    started = []
    real = child_process.start

    def start(target, facts, checks, *args, **kwargs):
        started.append(sorted(c.id for c in checks))
        return real(target, facts, checks, *args, **kwargs)

    monkeypatch.setattr(child_process, "start", start)
    return started


def test_the_readme_flow_runs_the_live_depth_once(cli, release, live_starts):
    tree = str(release("0.5.13"))
    common = ("--sglang-path", tree, "--config", DEPLOYMENT, "--depth", "live")
    code, first, _ = cli("check", "--format", "json", *common)
    assert code in (0, 1) and len(live_starts) == 1
    code, second, err = cli("check", "--format", "json", *common)
    assert len(live_starts) == 1, "the second check started a live child"
    first, second = json.loads(first), json.loads(second)
    assert [r["status"] for r in second["results"]] == [r["status"] for r in first["results"]]
    assert second["live"]["from_cache"] is True and first["live"]["from_cache"] is False
    assert "kept from an earlier identical run" in err
    cli("fix", *common)  # the plan decides from the same verdicts
    cli("fix", "--status", *common)
    assert len(live_starts) == 1


def test_what_the_outcome_depends_on_is_a_new_run(cli, release, live_starts, monkeypatch, tmp_path):
    tree = str(release("0.5.13"))
    common = ("--sglang-path", tree, "--depth", "live", "--format", "json")
    cli("check", *common, "--config", DEPLOYMENT)
    other = tmp_path / "d.yaml"  # the same deployment but one server argument
    other.write_text(
        DEPLOYMENT.read_text().replace("tp_size: 4", "tp_size: 8").replace("models/", f"{EXAMPLES}/models/")
    )
    assert cli("check", *common, "--config", other)[0] in (0, 1)
    assert len(live_starts) == 2
    monkeypatch.setenv("ASCEND_LAUNCH_BLOCKING", "1")  # inherited by the child: may change its run
    cli("check", *common, "--config", DEPLOYMENT, "--isolated")
    assert len(live_starts) == 3
    monkeypatch.setenv("NPUDOCTOR_NO_CACHE", "1")
    cli("check", *common, "--config", DEPLOYMENT, "--isolated")
    assert len(live_starts) == 4


LIVE_IMPORT = "live probes: importing sglang"  # the progress line each live child's import prints


@pytest.mark.slow
def test_the_readme_flow_through_the_cli_runs_the_live_depth_once_per_input(release, tmp_path):
    """The README's flow on one unchanged deployment, each command as the one before printed it:
    ``check``, the ``fix --select ...`` its end hints, the ``fix --apply`` the plan hints, the
    ``fix --status`` ``--apply`` hints, ``check``, ``run``; sglang installed (on ``PYTHONPATH``, with
    its dist-info, so ``--apply`` records beside it, on that path). Two inputs reach the live probes:
    the installed code, and the code with the recorded fixes in place (``--status`` proves them with
    it, ``check`` after ``--apply`` judges with them); each runs once, counted by the progress line
    of each live child's import."""
    wheel = release("0.5.12")
    installed = overlay_tree(wheel, tmp_path)
    for dist_info in wheel.glob("sglang-*.dist-info"):
        shutil.copytree(dist_info, installed / dist_info.name)
    env = {**os.environ, "PYTHONPATH": str(installed), "NPUDOCTOR_CACHE_DIR": str(tmp_path / "cache")}
    deployment = ["--config", str(EXAMPLES / "deepseek-v3-pd.yaml")]
    imports = []

    def npudoctor(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "npudoctor", *args],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800,
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr[-2000:]
        imports.append(done.stderr.count(LIVE_IMPORT))
        return done.stdout

    def hinted(text: str, command: str, lead: str = "") -> list[str]:
        """The first ``npudoctor COMMAND ...`` printed after ``lead`` on a line of ``text``, as a
        shell reads it (without the word ``npudoctor``)."""
        start = f"{lead}npudoctor {command}"
        line = next(line.strip() for line in text.splitlines() if line.strip().startswith(start))
        return shlex.split(line[len(lead) :])[1:]

    report = npudoctor("check", *deployment)
    plan = npudoctor(*hinted(report, "fix --select"))  # the one fix command the report ends with
    applied = npudoctor(*hinted(plan, "fix --apply"))
    status = npudoctor(*hinted(applied, "fix --status", lead="check it: "))
    npudoctor("check", *deployment)
    npudoctor("run", *deployment, "--", sys.executable, "-c", "pass")
    # the installed code once, by the first check; the code with the fix once, by --status, whose
    # proof it is; check judges with the fix from it, and run plans from the installed code's verdicts
    assert imports == [1, 0, 0, 1, 0, 0], (
        f"live imports of check, fix, fix --apply, fix --status, check, run: {imports}"
    )
    assert "in place" in status and "judged with it:" in status, status
