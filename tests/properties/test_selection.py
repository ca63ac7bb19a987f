"""The generic properties are selected like ruff's rules outside its default set: a plain ``check``
runs the deep checks and the catalog; ``--select NPP`` (or ``ALL``) runs the properties, through
the same engine, formats and exit codes as every other check."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks, select

from support.repo import EXAMPLES, check_folder_ids

KNOWN = {
    k["name"]: k
    for k in yaml.safe_load((Path(__file__).parents[1] / "data/properties/NPP004.yaml").read_text())["known"]
}


def ids(selection: list[str]) -> list[str]:
    return [c.id for c in select(all_checks(), selection, "check")]


def test_the_default_selection_leaves_the_properties_out():
    chosen = ids([])
    assert chosen and not [i for i in chosen if CheckKind.of(i) is CheckKind.PROPERTY]
    assert {CheckKind.of(i) for i in chosen} == {CheckKind.DEEP, CheckKind.CATALOG}


def test_npp_selects_the_properties_and_all_selects_everything():
    assert ids(["NPP"]) == check_folder_ids(CheckKind.PROPERTY)
    assert set(ids(["ALL"])) == {c.id for c in all_checks()}
    assert ids(["NPD001,NPP001"]) == ["NPD001", "NPP001"]


def test_check_select_npp_reports_a_property_finding_with_its_line(cli, release):
    """0.5.13 with the DeepSeek PD example: the NPU pools' get_cpu_copy(self, indices) refuses the
    mamba_indices= the allocator passes (sglang#27802), found by the general binding rule (NPP004);
    the attribute reads resolve (NPP001). Exit 1: a finding at or above fail."""
    code, out, _ = cli(
        "check", "--sglang-path", str(release("0.5.13")), "--config", str(EXAMPLES / "deepseek-v3-pd.yaml"),
        "--depth", "static", "--format", "json", "--select", "NPP",
    )  # fmt: skip
    report = json.loads(out)
    results = {r["id"]: r for r in report["results"]}
    assert set(results) == {"NPP001", "NPP002", "NPP003", "NPP004"}
    assert code == 1
    assert results["NPP004"]["status"] == "fail"
    lines = {
        (e["location"]["path"], e["location"]["line"]) for e in results["NPP004"]["evidence"] if e["location"]
    }
    assert ("sglang/srt/mem_cache/allocator/paged.py", 260) in lines
    assert results["NPP001"]["status"] == "pass"
