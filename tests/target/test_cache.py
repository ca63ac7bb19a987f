"""The static-result cache (``npudoctor.target.resultcache``) never answers for code that changed: a second
run gives the first run's report, an edited tree or another deployment is a new answer, and a
damaged or unwritable cache costs only the speed."""

from __future__ import annotations

import json
import os

from support.repo import EXAMPLES
from support.reports import json_report, result_of
from support.trees import drop_fia_page_factor

DEEPSEEK = EXAMPLES / "deepseek-v3-pd.yaml"
QWEN_FIA = EXAMPLES / "qwen3-moe-pd-fia.yaml"


def entries(cache) -> list:
    return sorted(cache.glob("static/*/*.pickle"))


def test_a_second_run_reads_the_first_runs_answers(cli, release, static_cache):
    tree = release("0.5.12")
    first = json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK)
    stored = entries(static_cache)
    assert len(stored) > sum(
        r["status"] in ("pass", "fail") for r in first["results"]
    )  # + the server-args table
    times = [p.stat().st_mtime_ns for p in stored]
    second = json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK)
    assert second == first
    assert [p.stat().st_mtime_ns for p in entries(static_cache)] == times  # read, not written again


def test_an_edited_tree_is_checked_again(cli, release, overlay, static_cache):
    """The fixed 0.5.15 pool passes; the same tree with 0.5.9's item formula fails, cache or not."""
    tree = overlay(release("0.5.15"))
    assert (
        result_of(json_report(cli, "--sglang-path", tree, "--config", QWEN_FIA), "NPD002")["status"] == "pass"
    )
    drop_fia_page_factor(tree)
    assert (
        result_of(json_report(cli, "--sglang-path", tree, "--config", QWEN_FIA), "NPD002")["status"] == "fail"
    )


def test_another_deployment_is_another_answer(cli, release):
    tree = release("0.5.12")
    mla = result_of(
        json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK, "--select", "NPD001"), "NPD001"
    )
    gqa = result_of(
        json_report(cli, "--sglang-path", tree, "--config", QWEN_FIA, "--select", "NPD001"), "NPD001"
    )
    assert "NPUMLATokenToKVPool" in mla["summary"] and "NPUMLATokenToKVPool" not in gqa["summary"]


def test_a_damaged_entry_is_a_miss(cli, release, static_cache):
    tree = release("0.5.12")
    first = json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK)
    for path in entries(static_cache):
        path.write_bytes(b"not a pickle")
    assert json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK) == first


def test_an_unwritable_cache_costs_only_the_speed(cli, release, tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("NPUDOCTOR_CACHE_DIR", str(blocked / "cache"))  # below a file: cannot be made
    report = json_report(cli, "--sglang-path", release("0.5.12"), "--config", DEEPSEEK)
    assert result_of(report, "NPD001")["status"] == "fail"


def test_no_cache_writes_nothing(cli, release, static_cache, monkeypatch):
    monkeypatch.setenv("NPUDOCTOR_NO_CACHE", "1")
    json_report(cli, "--sglang-path", release("0.5.12"), "--config", DEEPSEEK, "--select", "NPD001")
    assert not static_cache.exists()


def test_advise_json_carries_the_cached_reports_unchanged(cli, release, monkeypatch):
    """A warm advise gives the cold one's answer (the reports differ in nothing but timing)."""
    from support.repo import fetch_sglang

    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(fetch_sglang.cache_dir()))
    release("0.5.12")
    runs = []
    for _ in range(2):
        code, out, _ = cli("advise", "--config", DEEPSEEK, "--releases", "0.5.12", "-f", "json")
        data = json.loads(out)
        for row in data["releases"]:
            row.pop("seconds")
        runs.append(data)
    assert runs[0] == runs[1]


def test_old_generations_are_pruned(cli, release, static_cache):
    """Each npudoctor version (or edit) answers in a generation directory of its own; a new one
    keeps only the most recent few of its own (their entries deleted, then the directory), and
    leaves a folder it did not make alone, however old."""
    from npudoctor.target.resultcache import KEPT_GENERATIONS

    def run() -> None:
        json_report(cli, "--sglang-path", release("0.5.12"), "--config", DEEPSEEK, "--select", "NPD001")

    run()
    (current,) = {p.parent for p in entries(static_cache)}
    entry_name = entries(static_cache)[0].name
    old = []
    for index in range(KEPT_GENERATIONS + 2):
        generation = static_cache / "static" / f"{index:024x}"
        generation.mkdir()
        (generation / entry_name).write_bytes(b"an old answer")
        os.utime(generation, (1_000_000 + index, 1_000_000 + index))
        old.append(generation.name)
    foreign = static_cache / "static" / "vendor"
    foreign.mkdir()
    (foreign / "lib.js").write_text("keep me")
    os.utime(foreign, (1, 1))  # the oldest of all
    for path in entries(static_cache):
        if path.parent == current:
            path.unlink()
    current.rmdir()  # the next run starts a generation, as after an upgrade
    run()
    kept = sorted(d.name for d in (static_cache / "static").iterdir())
    assert [k for k in kept if k in old] == old[-(KEPT_GENERATIONS - 1) :]
    assert current.name in kept
    assert (foreign / "lib.js").read_text() == "keep me"


def test_the_code_key_covers_the_catalog_records(monkeypatch):
    """An edited catalog record must not be answered from the cache: its YAML files are part of
    the key of npudoctor's own code, as the checks' modules are."""
    from npudoctor.engine.catalog import all_records
    from npudoctor.target import resultcache

    seen = {}

    def capture(roots, wanted, extra=""):
        seen["files"] = [p for root in roots for p in root.rglob("*") if p.is_file() and wanted(p.name)]
        return "0" * 24

    resultcache._code_fingerprint.cache_clear()
    monkeypatch.setattr(resultcache, "_fingerprint", capture)
    try:
        resultcache._code_fingerprint()
    finally:
        resultcache._code_fingerprint.cache_clear()
    names = {p.name for p in seen["files"]}
    assert all(any(n.startswith(r.id + "_") and n.endswith(".yaml") for n in names) for r in all_records())
