"""NPD006 fix (port of sglang#25383) beyond the generic fix tests (tests/patching/test_fixes.py: written_for
against the wheels, in-process apply/revert, --with-fix, npudoctor run): it is safe (no --unsafe),
needed only where the pool has no indexer, returns exactly 0.5.12's tables where it has one, and
refuses a shape it was not written for."""

from __future__ import annotations

import json

import pytest

from conftest import fixprobe, sweep
from support.repo import EXAMPLES
from support.trees import replace_text

DEEPSEEK_V3 = EXAMPLES / "deepseek-v3-pd.yaml"
DEEPSEEK_V32 = EXAMPLES / "deepseek-v3.2-pd.yaml"


def plan_of(cli, tree, config, exit_code: int = 0) -> dict:
    """NPD006's entry of the plan ``fix`` prints; ``exit_code`` 1 where the fix is refused and the
    check fails (the defect stays)."""
    code, out, err = cli(
        "fix", "--format", "json", "--select", "NPD006", "--sglang-path", tree, "--config", config
    )
    assert code == exit_code, err
    (entry,) = json.loads(out)["plan"]
    return entry


def test_safe_and_applied_where_the_check_fails(cli, release):
    entry = plan_of(cli, release("0.5.12"), DEEPSEEK_V3)
    assert entry["action"] == "apply" and entry["reason"].startswith("NPD006 fails here"), entry


@pytest.mark.parametrize(
    ("version", "config"),
    sweep([("0.5.13", DEEPSEEK_V3), ("0.5.12", DEEPSEEK_V32), ("0.5.11", DEEPSEEK_V3)], quick=("0.5.13",)),
)
def test_not_needed_where_the_check_passes(cli, release, version, config):
    """With the indexer (0.5.12), before the method existed (0.5.11), after the upstream fix (0.5.13)."""
    entry = plan_of(cli, release(version), config)
    assert entry["action"] == "not needed" and entry["reason"].startswith("NPD006 pass"), entry


def test_another_shape_is_refused_with_the_sites_that_differ(cli, release, overlay):
    """0.5.12 whose setup_state_kv_args also registers the NPU MLA pool's state tables: the defect is
    still there (static fail), but the replacement's empty tables would now change what is
    registered; the plan refuses and names that site, and only it."""
    tree = overlay(release("0.5.12"))
    replace_text(
        tree / "sglang/srt/disaggregation/utils.py",
        "                kv_args.total_kv_layers = total_kv_layers\n",
        "                kv_args.total_kv_layers = total_kv_layers\n"
        "                append_state_component(kv_args, StateType.NSA, data_ptrs, data_lens, item_lens)\n",
    )
    entry = plan_of(cli, tree, DEEPSEEK_V3, exit_code=1)
    reason = entry["reason"]
    assert entry["action"] == "refused" and "not a shape this fix was written for" in reason, entry
    assert "sglang.srt.disaggregation.utils:setup_state_kv_args (" in reason
    assert "get_state_buf_infos (" not in reason and "__init__ (" not in reason


@pytest.mark.slow  # a fresh interpreter importing sglang
def test_with_the_fix_both_deployments_start_and_the_indexer_tables_are_unchanged(release):
    """0.5.12, live, unpatched then patched then reverted: DeepSeek-V3 fails, passes, fails again;
    DeepSeek-V3.2 (with the indexer) passes throughout with the same tables (93 entries on the
    prefill stage, 186 on decode with the draft pool)."""
    report = fixprobe(
        release("0.5.12"), "compare", "NPD006", DEEPSEEK_V3, DEEPSEEK_V32, options=("--revert",)
    )
    v3, v32 = str(DEEPSEEK_V3), str(DEEPSEEK_V32)
    assert report["outcome"] == "applied", report
    assert report["patched"] == [
        "sglang.srt.hardware_backend.npu.memory_pool_npu:NPUMLATokenToKVPool.get_state_buf_infos"
    ]
    assert [report[run][v3]["status"] for run in ("plain", "fixed", "reverted")] == ["fail", "pass", "fail"]
    assert all(o.startswith("TypeError") for o in report["plain"][v3]["observed"])
    assert report["restored"] is True
    for run in ("plain", "fixed", "reverted"):
        assert report[run][v32]["status"] == "pass", report[run][v32]
        assert report[run][v32]["observed"] == report["plain"][v32]["observed"]
    assert report["plain"][v32]["observed"][1].startswith("186 KV entries")
