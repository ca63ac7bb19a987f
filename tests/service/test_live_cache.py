"""The live outcome is kept like the static one: the README's flow (``check``, ``fix``, ``fix
--apply``, ``fix --status``, ``run``) runs the live depth once for one deployment, and anything
the outcome depends on (the deployment, the fixes enabled, the environment) is a new run."""

from __future__ import annotations

import json

import pytest

from npudoctor.live import child_process

from support.repo import EXAMPLES

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
