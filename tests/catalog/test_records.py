"""Every catalog record against the releases its truth file names (``tests/data/catalog/<id>.yaml``,
verified by reading the wheels, never derived by npudoctor): the release that ships the defect ->
``fail`` at exactly the file:line the truth names, for a deployment that triggers it; the first
fixed release -> ``pass``; a deployment that cannot trigger it -> ``skip``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from npudoctor.deployment.load import from_yaml
from npudoctor.engine.catalog import all_records
from npudoctor.results import Status
from npudoctor.target.discovery import discover

TRUTHS = Path(__file__).resolve().parents[1] / "data" / "catalog"
RECORDS = {r.id: r for r in all_records()}


def truth(record_id: str) -> dict:
    return yaml.safe_load((TRUTHS / f"{record_id}.yaml").read_text())


def facts_of(deployment: dict, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(deployment))
    return from_yaml(path, shell={}).facts


_TARGETS: dict[str, object] = {}


def verdict(record_id: str, version: str, deployment: dict, release, tmp_path: Path, name: str):
    """The record's static verdict; one Target per release for the whole module, so the tree is
    indexed once (as one ``npudoctor check`` indexes it once for every record)."""
    if version not in _TARGETS:
        _TARGETS[version] = discover(release(version) / "sglang")
    return RECORDS[record_id].run(_TARGETS[version], facts_of(deployment, tmp_path, name), "static")


def test_every_record_has_a_truth_file_and_every_truth_a_record():
    assert sorted(p.stem for p in TRUTHS.glob("*.yaml")) == sorted(RECORDS)


@pytest.mark.parametrize("record_id", sorted(RECORDS))
def test_a_release_that_ships_it_fails_at_the_verified_line(record_id, release, tmp_path):
    known = truth(record_id)
    result = verdict(record_id, known["ships_in"]["release"], known["trigger"], release, tmp_path, "trigger")
    assert result.status is Status.FAIL, result.summary
    where = [f"{e.location.path}:{e.location.line}" for e in result.evidence if e.location]
    assert where == [known["ships_in"]["at"]], where
    assert result.remediation is not None and result.remediation.advice


@pytest.mark.parametrize(
    "record_id", sorted(r for r in RECORDS if (TRUTHS / f"{r}.yaml").is_file() and "fixed_in" in truth(r))
)
def test_the_fixed_release_passes(record_id, release, tmp_path):
    known = truth(record_id)
    result = verdict(record_id, known["fixed_in"]["release"], known["trigger"], release, tmp_path, "trigger")
    assert result.status is Status.PASS, result.summary
    if known["fixed_in"].get("at"):
        where = [f"{e.location.path}:{e.location.line}" for e in result.evidence if e.location]
        assert where == [known["fixed_in"]["at"]], where


@pytest.mark.parametrize("record_id", sorted(RECORDS))
def test_a_deployment_that_cannot_trigger_it_is_skipped(record_id, release, tmp_path):
    known = truth(record_id)
    result = verdict(
        record_id, known["ships_in"]["release"], known["untouched"], release, tmp_path, "untouched"
    )
    assert result.status is Status.SKIP, result.summary


ERNIE_MOE = {
    "model": {
        "hf_config": {
            "architectures": ["Ernie4_5_MoeForCausalLM"],
            "num_hidden_layers": 28,
            "num_attention_heads": 20,
            "num_key_value_heads": 4,
            "hidden_size": 2560,
            "moe_use_aux_free": True,
        }
    },
    "roles": {"server": {"server_args": {"tp_size": 2}}},
}


@pytest.mark.parametrize(("record_id", "version"), [("NPC054", "0.5.16"), ("NPC055", "0.5.9")])
def test_an_ernie_moe_without_expert_parallelism_reaches_the_npu_topk_defects(
    record_id, version, release, tmp_path
):
    """ERNIE-4.5's correction bias alone sends it into the NPU top-k branch that scores softmax with
    sigmoid (0.5.12..0.5.16, sglang PR #31393) and, earlier, through the fast path that drops the bias
    (0.5.6.post1..0.5.9, PR #17695): no expert parallelism needed."""
    result = verdict(record_id, version, ERNIE_MOE, release, tmp_path, "ernie")
    assert result.status is Status.FAIL, result.summary
