"""Server argument names against the release under test (npudoctor.target.serverargs, NPD000).

A name no release knows exits 2 with a did-you-mean, naming where it came from; a name another
release knows but this one lacks is NPD000's finding (exit 1, file:line of the release's
ServerArgs); the reader finds the fields and flags of every release, read statically.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from npudoctor.deployment import load
from npudoctor.deployment.facts import GivenArgument
from npudoctor.errors import InputError
from npudoctor.static.source import SourceTree
from npudoctor.target.discovery import discover
from npudoctor.target.serverargs import history, read_table, validate_arguments

from conftest import sweep
from support.repo import EXAMPLES, REPO
from support.reports import json_report, result_of
from support.truths import RELEASES, TRUTH

MODEL = EXAMPLES / "models" / "qwen3-30b-a3b"
HISTORY_RELEASES = list(history().releases)
LAUNCH = ["python", "-m", "sglang.launch_server", "--model-path", str(MODEL)]
# names every release 0.4.10..0.5.23 defines (fields) and accepts (flags, aliases included)
EVERY_RELEASE_FIELDS = ("model_path", "tp_size", "pp_size", "dp_size", "page_size", "disaggregation_mode",
                        "disaggregation_transfer_backend", "kv_cache_dtype", "attention_backend", "host", "port")  # fmt: skip
EVERY_RELEASE_FLAGS = ("--model-path", "--tp-size", "--tensor-parallel-size", "--pp-size", "--dp-size",
                       "--page-size", "--disaggregation-mode", "--trust-remote-code", "--host", "--port")  # fmt: skip


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def npd000(cli, tree: Path, *args: str) -> tuple[int, dict]:
    code, out, err = cli("check", "--format", "json", "--select", "NPD000", "--sglang-path", tree, *args)
    assert code in (0, 1), err
    return code, result_of(json.loads(out), "NPD000")


# ----- names no release knows: exit 2, with a did-you-mean ---------------------------------------


def test_yaml_short_key_exits_2_with_did_you_mean(cli, release, tmp_path):
    """`tp: 16` is no ServerArgs field: it was kept silently and the checks ran with tp_size 1.
    sglang's `--tp` is an abbreviation of `--tp-size`, whose field is tp_size: the suggestion."""
    config = write_yaml(tmp_path, "roles:\n  decode: {server_args: {tp: 16, disaggregation_mode: decode}}\n")
    code, out, err = cli("check", "--sglang-path", release("0.5.13"), "--config", config)
    assert code == 2 and out == ""
    assert f"{config}: roles.decode.server_args: unknown server argument 'tp'" in err
    assert "did you mean 'tp_size'?" in err
    assert len(err.strip().splitlines()) == 1


def test_yaml_misspelled_field_suggests_the_release_field(cli, release, tmp_path):
    config = write_yaml(tmp_path, "roles:\n  prefill: {server_args: {pp_sise: 2}}\n")
    code, _, err = cli("check", "--sglang-path", release("0.5.9"), "--config", config)
    assert code == 2
    assert "roles.prefill.server_args: unknown server argument 'pp_sise'" in err
    assert "did you mean 'pp_size'?" in err


def test_launch_flag_typo_exits_2_with_did_you_mean(cli, release):
    code, out, err = cli("check", "--sglang-path", release("0.5.13"), "--", *LAUNCH, "--tp-sise", "16")
    assert code == 2 and out == ""
    assert "launch command: unknown flag --tp-sise (sglang 0.5.13 has no such flag" in err
    assert "did you mean --tp-size?" in err


def test_yaml_args_flag_typo_names_the_role(cli, release, tmp_path):
    config = write_yaml(
        tmp_path, 'roles:\n  decode: {args: ["--disaggregation-mode", "decode", "--tp-sise=16"]}\n'
    )
    code, _, err = cli("check", "--sglang-path", release("0.5.13"), "--config", config)
    assert code == 2
    assert "roles.decode.args: unknown flag --tp-sise" in err and "did you mean --tp-size?" in err


def test_abbreviations_sglang_accepts_are_accepted(cli, release):
    """sglang's parser allows unambiguous prefixes (argparse): `--tp 16` is `--tp-size 16`; an
    ambiguous prefix is refused by sglang, so it exits 2 naming the candidates."""
    tree = release("0.5.13")
    code, result = npd000(cli, tree, "--", *LAUNCH, "--tp", "16", "--pipeline-parallel-size=2")
    assert (code, result["status"]) == (0, "pass"), result["summary"]
    code, _, err = cli("check", "--sglang-path", tree, "--", *LAUNCH, "--disaggregation", "decode")
    assert code == 2
    assert "launch command: ambiguous flag --disaggregation" in err and "--disaggregation-mode" in err


def test_fix_validates_before_planning(cli, release, tmp_path):
    config = write_yaml(tmp_path, "roles:\n  decode: {server_args: {tp: 16}}\n")
    code, _, err = cli("fix", "--config", config, "--sglang-path", release("0.5.13"))
    assert code == 2 and "unknown server argument 'tp'" in err and "did you mean 'tp_size'?" in err


def test_run_validates_before_starting_the_command(cli, release, monkeypatch, tmp_path):
    """`npudoctor run` with a flag no sglang knows: exit 2 before planning or starting anything."""
    target = discover(release("0.5.13"))
    monkeypatch.setattr("npudoctor.target.discovery.discover", lambda sglang_path=None: target)
    code, _, err = cli("run", "--", sys.executable, *LAUNCH[1:], "--tp-sise", "16")
    assert code == 2 and "launch command: unknown flag --tp-sise" in err


def test_sglang_parser_path_checks_what_the_parser_did_not_know(release):
    """At the live depth the installed sglang's own parser reads the command: the flags it knows
    are accepted by definition, the ones it returns unknown are checked like any other."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int)
    parser.add_argument("--model-path")
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    deploy = load.from_command(["--model-path", str(MODEL), "--tp-size", "8", "--tp-sise", "16"], parser)
    (role,) = deploy.facts.roles
    assert role.tp_size == 8 and role.unknown_args == ("--tp-sise", "16")
    assert role.given == (GivenArgument("flag", "--tp-sise", "launch command"),)
    with pytest.raises(
        InputError, match=r"launch command: unknown flag --tp-sise .*did you mean --tp-size\?"
    ):
        validate_arguments(deploy.facts, discover(release("0.5.13")))


# ----- names another release knows: NPD000 fails -------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.10", "0.5.13"])
def test_cp_flag_from_a_later_release_fails(cli, release, version):
    tree = release(version)
    code, result = npd000(cli, tree, "--", *LAUNCH, "--attn-cp-size", "2", "--enable-prefill-cp")
    assert (code, result["status"]) == (1, "fail")
    assert result["summary"] == (
        f"sglang {version} has no --enable-prefill-cp (known in 0.5.14..0.5.23): the server would refuse to start"
    )
    assert result["depth"] == "static" and result["remediation"]["fix_id"] is None
    (evidence,) = result["evidence"]
    assert "launch command passes --enable-prefill-cp" in evidence["observed"]
    location = evidence["location"]
    assert (location["path"], location["symbol"]) == ("sglang/srt/server_args.py", "ServerArgs")
    assert (
        (tree / location["path"])
        .read_text()
        .splitlines()[location["line"] - 1]
        .startswith("class ServerArgs")
    )


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_cp_flag_on_a_release_that_has_it_passes(cli, release, version):
    code, result = npd000(cli, release(version), "--", *LAUNCH, "--attn-cp-size", "2", "--enable-prefill-cp")
    assert (code, result["status"]) == (0, "pass"), result["summary"]
    assert result["summary"].startswith(f"sglang {version} accepts every server argument")


def test_yaml_field_from_a_later_release_fails_with_the_role(cli, release, tmp_path):
    config = write_yaml(
        tmp_path,
        "roles:\n  prefill: {server_args: {disaggregation_mode: prefill, attn_cp_size: 2, enable_prefill_cp: true}}\n"
        "  decode: {server_args: {tp_size: 4}}\n",
    )
    code, result = npd000(cli, release("0.5.13"), "--config", config)
    assert (code, result["status"], result["roles"]) == (1, "fail", ["prefill"])
    assert "no ServerArgs field enable_prefill_cp (known in 0.5.14..0.5.23)" in result["summary"]
    assert (
        f"{config}: roles.prefill.server_args passes enable_prefill_cp" in result["evidence"][0]["observed"]
    )
    code, result = npd000(cli, release("0.5.15"), "--config", config)
    assert (code, result["status"]) == (0, "pass")


def test_the_checks_read_the_values_they_were_given(cli, release, tmp_path):
    """The point of rejecting `tp: 16`: with `tp_size: 16` the checks see the value meant."""
    config = write_yaml(
        tmp_path, "roles:\n  decode: {server_args: {tp_size: 16, disaggregation_mode: decode}}\n"
    )
    report = json_report(cli, "--sglang-path", release("0.5.13"), "--config", config, "--select", "NPD000")
    assert report["deployment"]["roles"][0]["tp_size"] == 16
    assert "given" not in report["deployment"]["roles"][0]  # raw names stay out of the report schema


def test_no_deployment_skips(cli, release):
    code, result = npd000(cli, release("0.5.13"))
    assert (code, result["status"]) == (0, "skip")


def test_unreadable_server_args_warns_and_rejects_nothing(cli, release, overlay):
    """A tree whose ServerArgs npudoctor cannot read is no verdict: NPD000 warns, no name exits 2."""
    tree = overlay(release("0.5.13"))
    path = tree / "sglang" / "srt" / "server_args.py"
    path.unlink()  # hard-linked to the cached release: never write through the link
    path.write_text("class Settings:\n    tp_size: int = 1\n")
    code, result = npd000(cli, tree, "--", *LAUNCH, "--tp-sise", "16")
    assert (code, result["status"]) == (0, "warn")
    assert result["summary"].startswith("cannot tell whether sglang 0.5.13 accepts")


@pytest.mark.slow
def test_retired_flag_fails(cli, release):
    """0.5.3 registers --enable-ep-moe with a DeprecatedAction whose __call__ raises ValueError: the
    parser knows the flag, the server still refuses it (0.5.2 accepted it)."""
    code, result = npd000(cli, release("0.5.3"), "--", *LAUNCH, "--enable-ep-moe")
    assert (code, result["status"]) == (1, "fail")
    assert (
        "has retired --enable-ep-moe (sglang refuses it: its action DeprecatedAction raises"
        in result["summary"]
    )
    assert "sglang/srt/server_args.py:3294" in result["summary"]
    code, result = npd000(cli, release("0.5.2"), "--", *LAUNCH, "--enable-ep-moe")
    assert (code, result["status"]) == (0, "pass")


# ----- the reader, on every release --------------------------------------------------------------


@pytest.mark.parametrize("version", sweep(HISTORY_RELEASES))
def test_reader_finds_the_known_names_on_every_release(release, version):
    tree = release(version)
    table = read_table(SourceTree((tree / "sglang").resolve()))
    assert table is not None
    for name in EVERY_RELEASE_FIELDS:
        assert table.accepts_field(name), (version, name)
    for flag in EVERY_RELEASE_FLAGS:
        assert table.accepts_flag(flag), (version, flag)
    assert table.field_suggestions("tp") == ["tp_size"]  # --tp abbreviates --tp-size on every release
    # the bundled history agrees with the tree: every name of this release is in it, spanning it
    known = history()
    for kind, names in (
        ("field", table.fields),
        ("flag", [o for o, i in table.flags.items() if not i.retired]),
    ):
        for name in names:
            first, last = known.known(kind, name)
            assert _key(first) <= _key(version) <= _key(last), (version, kind, name)
    line = (tree / table.location.path).read_text().splitlines()[table.location.line - 1]
    assert line.startswith("class ServerArgs")


@pytest.mark.parametrize("version", sweep(RELEASES))
def test_cp_names_are_accepted_where_the_truths_say(release, version):
    """known.yaml (server_args): which releases accept which CP field and flag, with evidence."""
    tree = release(version)
    table = read_table(SourceTree((tree / "sglang").resolve()))
    for name, truth in TRUTH["server_args"].items():
        first, last = truth["accepted"].split("..")
        inside = _key(first) <= _key(version) <= _key(last)
        assert table.accepts_field(name) is inside, (version, name)
        assert table.accepts_flag(truth["flag"]) is inside, (version, truth["flag"])
        assert history().known("field", name) == (first, last)


@pytest.mark.parametrize(
    "version, flag",
    [
        ("0.5.10", "--no-experts-shared-outer-loras"),  # add_argument(action=BooleanOptionalAction)
        ("0.5.23", "--no-dcp-replicate-q-proj"),  # A[..., Arg(action=BooleanOptionalAction)]
    ],
)
def test_boolean_optional_flags_have_their_negation(release, version, flag):
    table = read_table(SourceTree((release(version) / "sglang").resolve()))
    assert table.accepts_flag(flag) and table.accepts_flag(flag.replace("--no-", "--", 1))
    assert table.flags[flag].dest == table.flags[flag.replace("--no-", "--", 1)].dest


def test_evidence_lines_of_the_cp_truths(release):
    """The file:line evidence in known.yaml's server_args is where the reader finds the names."""
    checks = {
        ("0.5.9", "attn_cp_size"): "sglang/srt/server_args.py:422",
        ("0.5.10", "enable_prefill_context_parallel"): "sglang/srt/server_args.py:678",
        ("0.5.10", "prefill_cp_mode"): "sglang/srt/server_args.py:679",
        ("0.5.14", "enable_prefill_cp"): "sglang/srt/server_args.py:902",
        ("0.5.23", "enable_prefill_cp"): "sglang/srt/arg_groups/fields/parallel.py:153",
    }
    for (version, name), where in checks.items():
        table = read_table(SourceTree((release(version) / "sglang").resolve()))
        assert table.fields[name] == where, (version, name)
        evidence = TRUTH["server_args"][name]["evidence"]
        assert f"{version} " in evidence and f":{where.rpartition(':')[2]}" in evidence, (version, name)


@pytest.mark.slow
def test_the_bundled_history_is_what_the_script_generates():
    """npudoctor/data/server_args.json is scripts/server_args_history.py's output for 0.4.10..0.5.23."""
    spec = importlib.util.spec_from_file_location(
        "server_args_history", REPO / "scripts" / "server_args_history.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    expected = script.render(script.build(HISTORY_RELEASES))
    assert (REPO / "npudoctor" / "data" / "server_args.json").read_text() == expected
