"""The live depth runs on every sglang release on PyPI from 0.4.10 to the newest.

One CPU dependency set (requirements-live.txt) for all of them: what a release imports and this
host lacks is stood in (``npudoctor.live.standins``) and named in the report. For each release and each
deployment (MLA PD with prefill PP, MLA with the indexer PD with decode MTP, MHA PD with FIA on and off), every check in the deployment's
scope gets its live probe run: no check loses it to an import failure, none ends in ``error``.
The releases come from PyPI's index (kept in the release cache after the first run).
"""

from __future__ import annotations

import pytest

from npudoctor.engine.kinds import CheckKind

from conftest import QUICK_STATES, sweep
from support.repo import EXAMPLES, fetch_sglang
from support.truths import KIND_FAMILY, TRUTH, expected_status

OLDEST = "0.4.10"
DEPLOYMENTS = {
    "mla-pd-pp": EXAMPLES / "deepseek-v3-pd.yaml",
    "mha-pd-fia": EXAMPLES / "qwen3-moe-pd-fia.yaml",
    "mha-pd": EXAMPLES / "qwen3-moe-pd.yaml",
    "mla-indexer-pd-mtp": EXAMPLES / "deepseek-v3.2-pd.yaml",  # the release history's MLA+indexer witness
}
FAMILY = {
    "mla-pd-pp": "mla",
    "mha-pd-fia": KIND_FAMILY["gqa"],
    "mha-pd": KIND_FAMILY["gqa"],
    "mla-indexer-pd-mtp": "mla+indexer",
}
# truths not stated for a deployment: NPD001's are the MLA pool's and the page-major MHA pool's;
# with FIA the MHA pool's per-layer token views round-trip (known.yaml, 0.5.12 notes)
NOT_STATED = {("NPD001", "mha-pd-fia")}
RELEASES = fetch_sglang.releases(OLDEST)
CASES = [(version, name) for version in RELEASES for name in DEPLOYMENTS]
QUICK = (("0.4.10", "mla-pd-pp"), ("0.5.16", "mha-pd"))  # a stand-in release each side of 0.5.9


def test_the_sweep_reaches_the_newest_release():
    assert RELEASES[0] == OLDEST and len(RELEASES) >= 24, RELEASES
    assert set(QUICK_STATES[:2]) <= set(RELEASES)


@pytest.mark.parametrize(("version", "deployment"), sweep(CASES, quick=QUICK))
def test_every_check_probes_live(version, deployment, live_report):
    report = live_report(version, DEPLOYMENTS[deployment], depth="auto")
    live = report["live"]
    assert live["ran"], live
    assert live["not_run"] == {}, live["not_run"]
    errors = {r["id"]: r["summary"] for r in report["results"] if r["status"] == "error"}
    assert not errors, errors
    for result in report["results"]:
        probed = result["depth"] == "live" or any(a.startswith("live depth: ") for a in result["assumptions"])
        # every check ran its live probe, except one out of the deployment's scope (a skip); NPD000 and
        # the catalog's records (NPC) have none: they answer from the source
        static_only = result["id"] == "NPD000" or CheckKind.of(result["id"]) is CheckKind.CATALOG
        assert probed or result["status"] == "skip" or static_only, result
    # on a release with verified truths, the auto verdict is the truth wherever the check applies
    for check_id in TRUTH["releases"].get(version, {}):
        result = next((r for r in report["results"] if r["id"] == check_id), None)
        if result is not None and result["status"] != "skip" and (check_id, deployment) not in NOT_STATED:
            assert result["status"] == expected_status(version, check_id, FAMILY[deployment]), result
    stood_in = set(live["stood_in"])
    assert not {m for m in stood_in if m.split(".")[0] in ("sglang", "torch")}, stood_in
