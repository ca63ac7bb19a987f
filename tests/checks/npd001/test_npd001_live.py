"""NPD001 live: real NPU pools of real releases, built on CPU behind the NPU simulation."""

from __future__ import annotations

import json

import pytest

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.truths import RELEASES, expected_status

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"


@pytest.mark.parametrize("version", sweep(RELEASES))
def test_live_round_trip_matches_truth(live_report, version):
    result = result_of(live_report(version, DEEPSEEK_PD), "NPD001")
    assert result["depth"] == "live"
    assert result["status"] == expected_status(version, "NPD001"), result
    text = json.dumps(result["evidence"])
    if result["status"] == "fail":
        assert "AttributeError" in text and "kv_buffer" in text and "(live, CPU)" in text
    else:
        assert "round-tripped" in text


@pytest.mark.slow
def test_auto_depth_agrees_with_static(cli, release):
    result = result_of(
        json_report(
            cli,
            "--sglang-path",
            release("0.5.12"),
            "--config",
            DEEPSEEK_PD,
            "--select",
            "NPD001",
            "--depth",
            "auto",
        ),
        "NPD001",
    )
    assert result["status"] == "fail" and result["depth"] == "live"
    observed = [e["observed"] for e in result["evidence"]]
    assert any("(live, CPU)" in o for o in observed) and any("resolves to" in o for o in observed)
