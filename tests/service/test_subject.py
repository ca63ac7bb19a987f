"""The subject of a command is one value, resolved in one place.

The deployment reaches the service as a ``DeploymentSpec`` (built at the command line's edge), not
as raw fields; reading it and holding it against the sglang found (``require_ascend_backend``,
``validate_arguments``) happens in ``service.subject.resolve`` alone, which ``check``, ``fix``,
``run``, ``advise``, ``list``, ``explain`` and ``npudoctor.fixes.apply`` all call.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from npudoctor.errors import InputError
from npudoctor.service.runner import CheckRequest

REPO = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((REPO / "npudoctor").rglob("*.py")), *sorted((REPO / "fixes").rglob("*.py"))]


def callers(name: str) -> set[str]:
    """The source files that call ``name`` (as a bare name or an attribute)."""
    found = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if called == name:
                    found.add(path.relative_to(REPO).as_posix())
    return found


def test_the_check_request_holds_the_deployment_as_one_value():
    raw = {"config", "launch_command", "model_path", "server_flags", "env_flags", "isolated"}
    fields = {f.name: f for f in dataclasses.fields(CheckRequest)}
    assert not raw & set(fields), f"raw deployment fields on CheckRequest: {sorted(raw & set(fields))}"
    assert fields["deployment"].type == "DeploymentSpec"


def test_the_subject_is_resolved_in_one_place():
    """discover -> require the Ascend backend -> load -> validate has one implementation."""
    assert callers("require_ascend_backend") == {"npudoctor/service/subject.py"}
    assert callers("validate_arguments") == {"npudoctor/service/subject.py"}
    assert callers("described") == {"npudoctor/deployment/spec.py"}  # load.described: the spec's parse


def test_the_spec_repeats_the_users_options_for_hints():
    from npudoctor.deployment.spec import DeploymentSpec

    spec = DeploymentSpec(
        model_path=Path("/m"),
        server_flags=(("pp_size", 2), ("disaggregation_mode", "prefill")),
        env_flags=("ASCEND_USE_FIA=1",),
        isolated=True,
    )
    assert spec.options() == [
        "--model-path",
        "/m",
        "--pp-size=2",
        "--disaggregation-mode=prefill",
        "--env",
        "ASCEND_USE_FIA=1",
        "--isolated",
    ]
    assert DeploymentSpec(config=Path("d.yaml")).options() == ["--config", "d.yaml"]


def test_run_reads_a_command_it_cannot_parse_as_no_deployment():
    """`npudoctor run -- CMD`: a command that is no sglang launch gets the fixes for the worst case;
    with --config the command is only run."""
    from npudoctor.deployment.spec import DeploymentSpec

    unreadable = DeploymentSpec(launch_command=("bash", "serve.sh"))
    with pytest.raises(InputError, match="launch command: cannot read 'bash serve.sh'"):
        unreadable.load()
    assert unreadable.for_run().load().facts == DeploymentSpec().load().facts
    described = DeploymentSpec(config=Path("d.yaml"), launch_command=("bash",)).for_run()
    assert described.launch_command == ()
