"""Catalog records are one product with the checks: ``check`` (formats, exit codes, ``--select``,
``--ignore``, every input form), ``explain`` and ``advise`` (a release with a catalogued defect for
the deployment is not clean), on real releases and the truths of ``tests/data/catalog``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from npudoctor.engine.catalog import all_records
from npudoctor.engine.kinds import CheckKind

TRUTHS = Path(__file__).resolve().parents[1] / "data" / "catalog"
KNOWN = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(TRUTHS.glob("*.yaml"))}
WITH_FIX = sorted(i for i, t in KNOWN.items() if "fixed_in" in t)
# the page-size record the issue names: a workaround in flags, a launch command that triggers it
PAGE_SIZE = next(r.id for r in all_records() if r.remedy.flags.get("page_size") == 128)


def deployment_file(tmp_path: Path, data: dict, name: str = "deploy") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def advise_subject(record_id: str, release, tmp_path: Path, monkeypatch) -> tuple[list[str], Path]:
    """The release that ships the record and its first fixed one, in the tests' release cache, and
    the deployment that triggers it."""
    from support.repo import fetch_sglang

    known = KNOWN[record_id]
    versions = [known["ships_in"]["release"], known["fixed_in"]["release"]]
    for version in versions:
        release(version)
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(fetch_sglang.cache_dir()))
    return versions, deployment_file(tmp_path, known["trigger"])


def report(cli, *args) -> tuple[int, dict]:
    code, out, err = cli("check", "--format", "json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def test_check_fails_on_a_release_that_ships_it_and_names_the_line(cli, release, tmp_path):
    record_id = sorted(KNOWN)[0]
    known = KNOWN[record_id]
    tree = release(known["ships_in"]["release"])
    config = deployment_file(tmp_path, known["trigger"])
    code, data = report(cli, "--sglang-path", tree, "--config", config, "--select", record_id)
    (result,) = data["results"]
    assert code == 1 and result["status"] == "fail"
    location = result["evidence"][0]["location"]
    assert f"{location['path']}:{location['line']}" == known["ships_in"]["at"]
    code, data = report(
        cli, "--sglang-path", tree, "--config", config, "--select", record_id, "--ignore", record_id
    )
    assert code == 0 and data["results"][0]["ignored"] is not None


def test_a_deployment_that_cannot_trigger_it_is_skipped_and_exits_0(cli, release, tmp_path):
    record_id = sorted(KNOWN)[0]
    known = KNOWN[record_id]
    config = deployment_file(tmp_path, known["untouched"])
    code, data = report(
        cli, "--sglang-path", release(known["ships_in"]["release"]), "--config", config, "--select", record_id
    )
    assert code == 0 and data["results"][0]["status"] == "skip"


def test_the_workaround_repeats_the_users_launch_command(cli, release, tmp_path):
    """The same deployment as YAML and as a launch command: the same verdict, and the workaround
    in each form (the launch command rewritten with --page-size 128)."""
    known = KNOWN[PAGE_SIZE]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(known["trigger"]["model"]["hf_config"]))
    (role,) = known["trigger"]["roles"].values()
    flags = [w for k, v in role["server_args"].items() for w in (f"--{k.replace('_', '-')}", str(v))]
    launch = ["python", "-m", "sglang.launch_server", "--model-path", str(model), *flags]
    tree = release(known["ships_in"]["release"])
    _, from_yaml = report(
        cli,
        "--sglang-path",
        tree,
        "--config",
        deployment_file(tmp_path, known["trigger"]),
        "--select",
        PAGE_SIZE,
    )
    _, from_launch = report(cli, "--sglang-path", tree, "--select", PAGE_SIZE, "--", *launch)
    assert from_yaml["results"][0]["status"] == from_launch["results"][0]["status"] == "fail"
    advice = from_launch["results"][0]["remediation"]["advice"]
    assert "your launch command with it: python -m sglang.launch_server" in advice
    assert "--page-size 128" in advice and "--page-size 16" not in advice
    assert "server_args.page_size: 128" in from_yaml["results"][0]["remediation"]["advice"]


def test_explain_a_record_names_the_releases_the_wheels_say(cli):
    record = all_records()[0]
    code, out, _ = cli("explain", record.id, "--full")
    assert code == 0
    flat = " ".join(out.split())
    assert record.title.split()[0] in flat and "Releases that ship it" in flat
    for version in record.releases["affected"][:1]:
        assert version in flat


@pytest.mark.parametrize("record_id", WITH_FIX[:1])
def test_advise_does_not_call_a_release_with_a_catalogued_defect_clean(
    cli, release, tmp_path, monkeypatch, record_id
):
    versions, config = advise_subject(record_id, release, tmp_path, monkeypatch)
    code, out, err = cli("advise", "--format", "json", "--config", config, "--releases", ",".join(versions))
    data = json.loads(out)
    findings = {
        row["release"]: [r["id"] for r in row["report"]["results"] if r["status"] == "fail"]
        for row in data["releases"]
    }
    assert record_id in findings[versions[0]], findings
    assert record_id not in findings[versions[1]]
    assert (
        data["recommendation"]["baseline_findings"]
        and record_id in data["recommendation"]["baseline_findings"]
    )


@pytest.mark.parametrize("record_id", WITH_FIX[:1])
def test_advise_text_gives_the_catalog_one_column_that_names_the_records(
    cli, release, tmp_path, monkeypatch, record_id
):
    """Forty records are one column (``NPC*``): the records flagged on each release, ``ok`` where
    none is; the table still fits 80 columns."""
    versions, config = advise_subject(record_id, release, tmp_path, monkeypatch)
    _, out, _ = cli("advise", "--config", config, "--select", record_id, "--releases", ",".join(versions))
    table = out.split("Recommendation:")[0].splitlines()
    assert CheckKind.CATALOG.heading in table[1] and all(len(line) <= 80 for line in table)
    rows = {line.split()[0]: line for line in table[3:] if line.strip()}
    assert record_id in rows[versions[0]] and " ok " in rows[versions[1]] + " "
