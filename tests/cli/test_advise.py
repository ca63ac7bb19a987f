"""``npudoctor advise`` on real releases from the release cache: the earliest clean release of a
buggy-to-fixed range for each check (expected from the truths, not written here), regressions,
rows for releases that cannot be had, offline ``--wheel-dir``, the formats and the exit codes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from npudoctor.engine.kinds import CheckKind

from support.repo import EXAMPLES, default_check_ids, fetch_sglang
from support.truths import TRUTH, truth_present

DEEPSEEK = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA without indexer
QWEN_FIA = EXAMPLES / "qwen3-moe-pd-fia.yaml"  # GQA (MHA pool), ASCEND_USE_FIA=1
QWEN_CP = EXAMPLES / "qwen3-cp-prefill.yaml"


@pytest.fixture
def release_cache(release, monkeypatch):
    """advise reads the tests' release cache (the trees ``release`` fetched), never the user's."""
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(fetch_sglang.cache_dir()))

    def ensure(*versions: str) -> None:
        for version in versions:
            release(version)

    return ensure


def advise_json(cli, *args) -> tuple[int, dict, str]:
    code, out, err = cli("advise", "--format", "json", *args)
    assert code in (0, 1, 4) and out, err
    return code, json.loads(out), err


def earliest_by_truth(versions: list[str], check_id: str, family: str) -> str | None:
    return next((v for v in versions if not truth_present(v, check_id, family)), None)


# check id, deployment, its pool family in the truths, a buggy-to-fixed run of releases
RANGES = [
    ("NPD001", DEEPSEEK, "mla", ["0.5.12", "0.5.13"]),
    ("NPD002", QWEN_FIA, "mha", ["0.5.9", "0.5.10"]),
    ("NPD003", DEEPSEEK, "mla", ["0.5.10", "0.5.11", "0.5.12"]),
    ("NPD005", DEEPSEEK, "mla", ["0.5.13", "0.5.14", "0.5.15"]),
    ("NPD006", DEEPSEEK, "mla", ["0.5.12", "0.5.13"]),
]


@pytest.mark.parametrize(("check_id", "config", "family", "versions"), RANGES, ids=[r[0] for r in RANGES])
def test_a_buggy_to_fixed_range_gives_the_earliest_clean_release(
    cli, release_cache, check_id, config, family, versions
):
    release_cache(*versions)
    expected = earliest_by_truth(versions, check_id, family)
    assert expected not in (None, versions[0]), "the range must go from buggy to fixed by the truths"
    code, data, err = advise_json(
        cli, "--config", config, "--select", check_id, "--releases", f"{versions[0]}..{versions[-1]}"
    )
    assert [row["release"] for row in data["releases"]] == versions
    statuses = {row["release"]: row["report"]["results"][0]["status"] for row in data["releases"]}
    assert statuses == {v: "fail" if truth_present(v, check_id, family) else "pass" for v in versions}
    recommendation = data["recommendation"]
    assert recommendation["earliest_clean"] == expected
    assert recommendation["baseline"] == versions[0]
    assert recommendation["baseline_findings"] == [check_id]
    assert code == 1  # the baseline has the finding
    assert (
        f"[1/{len(versions)}] sglang {versions[0]}: 1 finding(s): {check_id}" in err
    )  # progress, per release


def test_npd004_from_the_cp_gap_state_to_the_release(cli, release_cache, cp_gap, release):
    """Trees of one's own (--sglang-path, repeatable) are subjects too, in the order given."""
    fixed = release("0.5.13")
    assert TRUTH["synthetic"]["0.5.13+cp-gap"]["NPD004"]["verdict"] == "present"
    assert not truth_present("0.5.13", "NPD004")
    code, data, _ = advise_json(
        cli, "--config", QWEN_CP, "--select", "NPD004", "--sglang-path", cp_gap, "--sglang-path", fixed
    )
    first, second = data["releases"]
    assert first["report"]["results"][0]["status"] == "fail"
    assert second["report"]["results"][0]["status"] == "pass"
    assert data["recommendation"]["earliest_clean"] == second["release"] == "0.5.13"
    assert code == 1


def test_a_defect_that_comes_back_is_a_regression(cli, release_cache):
    """DeepSeek-V3 PD: NPD006 is clean in 0.5.11 and fails in 0.5.12; NPD005 clean in 0.5.12,
    fails in 0.5.13 (truths). advise names both, with the release before."""
    versions = ["0.5.11", "0.5.12", "0.5.13"]
    release_cache(*versions)
    _, data, _ = advise_json(
        cli, "--config", DEEPSEEK, "--select", "NPD005,NPD006", "--releases", ",".join(versions)
    )
    expected = {
        (check_id, later, earlier)
        for check_id in ("NPD005", "NPD006")
        for earlier, later in zip(versions, versions[1:])
        if truth_present(later, check_id, "mla") and not truth_present(earlier, check_id, "mla")
    }
    found = {(r["check_id"], r["release"], r["clean_in"]) for r in data["recommendation"]["regressions"]}
    assert found == expected and expected


def test_the_baseline_cures_are_the_fix_plan(cli, release_cache, release):
    """The fixes advise offers for the baseline are what `npudoctor fix` decides for that tree."""
    release_cache("0.5.12")
    # the deep checks (NPD): the ones with runtime fixes; the catalog's records have none
    _, data, _ = advise_json(cli, "--config", DEEPSEEK, "--releases", "0.5.12", "--select", "NPD")
    cures = {c["check_id"]: c["action"] for c in data["recommendation"]["cures"]}
    code, out, err = cli("fix", "--config", DEEPSEEK, "--sglang-path", release("0.5.12"), "--format", "json")
    assert code == 0, err
    plan = {p["id"]: p["action"] for p in json.loads(out)["plan"] if p["id"] in cures}
    assert cures == plan and set(cures) == set(data["recommendation"]["baseline_findings"])


def test_each_release_gets_the_report_check_gives(cli, release_cache, release):
    release_cache("0.5.12", "0.5.13")
    _, data, _ = advise_json(cli, "--config", DEEPSEEK, "--releases", "0.5.12,0.5.13")
    for row in data["releases"]:
        code, out, _ = cli(
            "check", "--config", DEEPSEEK, "--sglang-path", release(row["release"]), "-f", "json"
        )
        alone = json.loads(out)
        assert [(r["id"], r["status"], r["summary"]) for r in row["report"]["results"]] == [
            (r["id"], r["status"], r["summary"]) for r in alone["results"]
        ]


def test_a_release_that_cannot_be_had_is_a_row(cli, release, tmp_path, monkeypatch):
    """pip really fails (an index nobody answers): the release is a row saying why, the others are checked."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    release("0.5.12")
    wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", "0.5.12")
    os.link(wheel, cache / "wheels" / wheel.name)  # 0.5.12 is had from the cache, 0.5.13 is not
    shutil.copy(fetch_sglang.cache_dir() / "pypi-sglang.json", cache / "pypi-sglang.json")  # fresh copy
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(cache))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    code, data, err = advise_json(cli, "--config", DEEPSEEK, "--releases", "0.5.12,0.5.13,0.5.99")
    rows = {row["release"]: row for row in data["releases"]}
    assert rows["0.5.12"]["report"] is not None and rows["0.5.12"]["error"] is None
    assert rows["0.5.13"]["report"] is None and "cannot download sglang==0.5.13" in rows["0.5.13"]["error"]
    assert rows["0.5.99"]["error"] == "sglang 0.5.99 is not on the package index"
    assert code == 1  # from the baseline 0.5.12, which has findings
    assert "not checked: cannot download sglang==0.5.13" in err


def test_offline_wheel_dir(cli, release, tmp_path, monkeypatch):
    """--wheel-dir: the wheels there, unpacked into the cache; no index, no network."""
    for version in ("0.5.12", "0.5.13"):
        release(version)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("0.5.12", "0.5.13"):
        wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", version)
        assert wheel is not None
        os.link(wheel, wheels / wheel.name)
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(tmp_path / "empty-cache"))
    for proxy in ("https_proxy", "http_proxy", "HTTPS_PROXY", "HTTP_PROXY"):
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    code, data, _ = advise_json(cli, "--config", DEEPSEEK, "--select", "NPD006", "--wheel-dir", wheels)
    assert [row["release"] for row in data["releases"]] == ["0.5.12", "0.5.13"]
    assert [row["report"]["results"][0]["status"] for row in data["releases"]] == ["fail", "pass"]
    assert data["recommendation"]["earliest_clean"] == "0.5.13"
    assert [p.name for p in (tmp_path / "empty-cache" / "trees").glob("0.5.13-*/sglang/srt")] == ["srt"]
    code, data, _ = advise_json(cli, "--select", "NPD006", "--wheel-dir", wheels, "--releases", "0.5.11")
    assert data["releases"][0]["error"] == "sglang 0.5.11 is not in --wheel-dir"
    assert code == 4  # the baseline could not be checked


def test_a_clean_baseline_exits_0_and_says_so(cli, release_cache):
    release_cache("0.5.15")  # clean for the deep checks (the catalog has NPC072, NPC134 there)
    code, out, _ = cli("advise", "--config", DEEPSEEK, "--releases", "0.5.15", "--select", "NPD")
    assert code == 0
    assert "0.5.15 (the baseline) has no findings for this deployment" in " ".join(out.split())


def test_every_format(cli, release_cache, tmp_path, monkeypatch):
    """Every format says what the JSON says: DeepSeek-V3 PD fails NPD005 on 0.5.14 only (truths)."""
    release_cache("0.5.14", "0.5.15")
    assert truth_present("0.5.14", "NPD005", "mla") and not truth_present("0.5.15", "NPD005", "mla")
    args = ("--config", DEEPSEEK, "--releases", "0.5.14..0.5.15", "--select", "NPD")  # the deep checks
    _, data, _ = advise_json(cli, *args)
    failing = [
        [r["id"] for r in row["report"]["results"] if r["status"] == "fail"] for row in data["releases"]
    ]
    assert failing == [["NPD005"], []]
    code, out, _ = cli("advise", *args, "-f", "markdown")
    assert code == 1 and "| 0.5.14 | pass | pass | skip | pass | skip | **FAIL** | pass |" in out
    assert "### Recommendation" in out
    code, out, _ = cli("advise", *args, "-f", "junit")
    suites = ET.fromstring(out).findall("testsuite")
    assert [s.get("name") for s in suites] == ["sglang 0.5.14", "sglang 0.5.15"]
    assert [int(s.get("failures")) for s in suites] == [len(f) for f in failing]
    code, out, _ = cli("advise", *args, "-f", "sarif")
    runs = json.loads(out)["runs"]
    assert [r["properties"]["sglangVersion"] for r in runs] == ["0.5.14", "0.5.15"]
    assert [{r["ruleId"] for r in run["results"] if r["level"] == "error"} for run in runs] == [
        {"NPD005"},
        set(),
    ]
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, _ = cli("advise", *args, "-f", "github")
    assert out.count("::error ") == 1 and "::notice title=npudoctor advise::" in out
    assert "| 0.5.15 |" in summary.read_text()
    code, out, _ = cli("advise", *args, "-o", tmp_path / "advice.txt")
    text = " ".join((tmp_path / "advice.txt").read_text().split())
    assert code == 1 and "upgrade to sglang 0.5.15 or later" in text and out == ""


def test_advise_and_check_name_the_same_upgrade(cli, release_cache, release):
    """DeepSeek-V3 PD on 0.5.12: NPD001 and NPD006 hold from 0.5.13, NPD005 fails there and on 0.5.14
    (truths), and the catalog's records of this deployment (its prefill PP 2: NPC072, through 0.5.19)
    count too. ``check``'s "upgrade to X or later" (from the release history and the records' derived
    ranges) and ``advise`` (from the releases it checks) name one release, by one rule, and it is not
    0.5.13."""
    versions = ["0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.19", "0.5.20"]
    release_cache(*versions)
    _, data, _ = advise_json(cli, "--config", DEEPSEEK, "--depth", "static", "--releases", ",".join(versions))
    upgrade = data["recommendation"]["upgrade_to"]
    assert truth_present("0.5.13", "NPD005", "mla") and upgrade not in ("0.5.13", "0.5.14")
    code, out, _ = cli("check", "-f", "json", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK)
    advice = {r["id"]: r["remediation"]["advice"] for r in json.loads(out)["results"] if r["remediation"]}
    assert advice and code == 1
    for text in advice.values():
        assert text.startswith(f"Upgrade sglang to {upgrade} or later"), text


def test_text_fits_80_columns(cli, release_cache, monkeypatch):
    release_cache("0.5.14", "0.5.15")
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = cli("advise", "--config", DEEPSEEK, "--releases", "0.5.14..0.5.15")
    table = out.splitlines()[1:5]
    assert all(len(line) <= 80 for line in table), table
    deep = default_check_ids(CheckKind.DEEP)
    assert table[0].split()[: 1 + len(deep)] == ["sglang", *deep]  # no id cut short
    command = f"npudoctor fix --apply --select NPD005 --config {DEEPSEEK}"
    assert any(line.endswith(command) for line in out.splitlines()), out  # one line, to copy


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--releases", "0.5.x..0.5.13"), "'0.5.x' is not a release number"),
        (("--releases", "9.9.1..9.9.9"), "no release on the package index in that range"),
        (("--wheel-dir", "/nonexistent"), "--wheel-dir /nonexistent: no such directory"),
    ],
)
def test_bad_input_is_exit_2(cli, release_cache, args, message):
    code, _, err = cli("advise", *args)
    assert code == 2 and message in err


def test_no_installed_sglang_and_no_release_named_is_exit_4(cli, release_cache):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("an sglang is installed in this interpreter: advise starts from it")
    code, _, err = cli("advise", "--config", DEEPSEEK)
    assert code == 4 and "give --releases A..B, --wheel-dir DIR or --sglang-path" in err


@pytest.mark.slow
def test_live_depth_checks_releases_side_by_side(cli, release_cache, release):
    """--depth live: each release in a live child of its own, two at once; each row is the verdict
    `check --depth live` gives (NPD006 on DeepSeek-V3 PD: 0.5.12 fails, 0.5.13 passes, by the truths)."""
    versions = ["0.5.12", "0.5.13"]
    release_cache(*versions)
    code, out, err = cli(
        "advise", "--config", DEEPSEEK, "--select", "NPD006", "--depth", "live", "--jobs", "2",
        "--releases", ",".join(versions), "-f", "json",
    )  # fmt: skip
    assert code == 1, err
    rows = json.loads(out)["releases"]
    for row in rows:
        result = row["report"]["results"][0]
        assert result["depth"] == "live" and row["report"]["live"]["ran"]
        assert result["status"] == ("fail" if truth_present(row["release"], "NPD006", "mla") else "pass")


def test_by_default_from_the_installed_release_to_the_newest(release_cache, tmp_path):
    """An sglang wheel really installed (pip --no-deps --target) is the baseline, checked where it
    is installed; the index's later releases follow it."""
    newest = fetch_sglang.releases("0.5.22")
    release_cache(*newest)
    wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", "0.5.22")
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "--quiet",
            "--target",
            site,
            wheel,
        ],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "advise", "--config", str(DEEPSEEK), "-f", "json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode in (0, 1), done.stderr
    rows = json.loads(done.stdout)["releases"]
    assert [row["release"] for row in rows] == newest
    assert rows[0]["installed"] and rows[0]["report"]["target"]["path"] == str(site / "sglang")
    assert not any(row["installed"] for row in rows[1:])
