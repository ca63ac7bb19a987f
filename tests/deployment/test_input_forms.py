"""One deployment, three descriptions: a YAML file, the launch command after ``--`` and
``--model-path`` with flags give the same facts, and the same verdicts at the live depth.

The forms reach different code in npudoctor (``yaml.safe_load``, the launch-command parser, typer's
options), and a probe that read a raw input the others lack once failed a deployment given as a
launch command that passed as YAML (sglang 0.5.20-0.5.23, NPD003: ``ServerArgs`` got
``model_path`` twice). Every example deployment's roles are the subjects; the values each form
reads are the example's own."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
import yaml

from npudoctor.cli import main
from npudoctor.deployment import load

from conftest import sweep
from support.repo import EXAMPLES

# the server arguments ``--model-path`` takes as flags of its own (``npudoctor check --help``)
FLAG_FORM = {
    "disaggregation_mode": "--disaggregation-mode",
    "pp_size": "--pp-size",
    "tp_size": "--tp-size",
    "page_size": "--page-size",
}


def example_roles() -> list[tuple[str, str]]:
    """(example file, role name) of every role of every example deployment."""
    return [
        (path.name, role)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for role in yaml.safe_load(path.read_text())["roles"]
    ]


@dataclasses.dataclass
class Forms:
    """One role of an example as the three descriptions: the files and argument lists to give."""

    yaml_file: Path
    launch: list[str]
    flags: list[str] | None  # None: the role sets an argument --model-path has no flag for


def role_forms(example: str, role: str, tmp_path: Path, *, flag_form_only: bool = False) -> Forms:
    """The example's role as a one-role YAML, a launch command and ``--model-path`` flags.
    ``flag_form_only``: only the arguments the flag form can give (so all three exist)."""
    path = EXAMPLES / example
    data = yaml.safe_load(path.read_text())
    spec = data["roles"][role] or {}
    deployment = load.from_yaml(path, {})
    facts = next(r for r in deployment.facts.roles if r.name == role)
    server_args = dict(facts.server_args)  # the YAML's server_args and args, as the file gives them
    if flag_form_only:
        server_args = {k: v for k, v in server_args.items() if k in FLAG_FORM}
    env = {**(data.get("env") or {}), **(spec.get("env") or {})}
    model_dir = (path.parent / data["model"]["config"]).parent
    one = tmp_path / f"{role}.yaml"
    one.write_text(
        yaml.safe_dump(
            {"model": {"path": str(model_dir)}, "env": env, "roles": {role: {"server_args": server_args}}}
        )
    )
    words = []
    for key, value in server_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        else:
            words += [flag, str(value)]
    launch = [f"{k}={v}" for k, v in env.items()]
    launch += ["python", "-m", "sglang.launch_server", "--model-path", str(model_dir), *words]
    flags = None
    if set(server_args) <= set(FLAG_FORM):
        flags = ["--model-path", str(model_dir)]
        for key, value in server_args.items():
            flags += [FLAG_FORM[key], str(value)]
        for name, value in env.items():
            flags += ["--env", f"{name}={value}"]
    return Forms(one, launch, flags)


def without_provenance(facts) -> dict:
    """The facts as the checks read them, without where each came from (file names, the form)."""
    data = facts.to_dict()
    data.pop("source")
    if data["model"]:
        data["model"].pop("source")
    for role in data["roles"]:
        role.pop("unknown_args")  # the flags sglang's parser is left with: only a launch command has them
    return data


@pytest.mark.parametrize(("example", "role"), example_roles())
def test_every_form_gives_the_same_facts(example, role, tmp_path):
    for flag_form_only in (False, True):
        forms = role_forms(example, role, tmp_path, flag_form_only=flag_form_only)
        from_yaml = without_provenance(load.described(config=forms.yaml_file, isolated=True).facts)
        from_command = without_provenance(load.described(launch_command=forms.launch, isolated=True).facts)
        assert from_command == from_yaml, shlex.join(forms.launch)
        if forms.flags is not None:
            model = Path(forms.flags[1])
            rest = forms.flags[2:]
            server = {
                k: v
                for k, v in yaml.safe_load(forms.yaml_file.read_text())["roles"][role]["server_args"].items()
            }
            env = [rest[i + 1] for i in range(0, len(rest), 2) if rest[i] == "--env"]
            from_flags = without_provenance(
                load.described(model_path=model, server_flags=server, env_flags=env, isolated=True).facts
            )
            assert from_flags == from_yaml


def verdicts(*argv: str, capsys) -> dict[str, str]:
    code = main(["check", "--format", "json", "--isolated", *argv])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    return {r["id"]: r["status"] for r in json.loads(out)["results"]}


# the PP prefill of DeepSeek-V3 (NPD003's subject) and a Qwen3 GQA decode server with FIA
LIVE_SUBJECTS = [("deepseek-v3-pd.yaml", "prefill"), ("qwen3-moe-pd-fia.yaml", "decode")]


@pytest.mark.parametrize(
    ("version", "example", "role"),
    sweep([("0.5.13", e, r) for e, r in LIVE_SUBJECTS] + [("0.5.20", *LIVE_SUBJECTS[0])]),
)
def test_every_form_gives_the_same_live_verdicts(version, example, role, subject, tmp_path, capsys):
    forms = role_forms(example, role, tmp_path, flag_form_only=True)
    common = ["--depth", "live", "--sglang-path", str(subject(version))]
    by_yaml = verdicts(*common, "--config", str(forms.yaml_file), capsys=capsys)
    by_command = verdicts(*common, "--", *forms.launch, capsys=capsys)
    by_flags = verdicts(*common, *forms.flags, capsys=capsys)
    assert by_command == by_yaml
    assert by_flags == by_yaml
    (tmp_path / "full").mkdir()
    full = role_forms(example, role, tmp_path / "full")
    assert verdicts(*common, "--", *full.launch, capsys=capsys) == verdicts(
        *common, "--config", str(full.yaml_file), capsys=capsys
    )
