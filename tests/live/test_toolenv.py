"""npudoctor's own live environment (``npudoctor.live.toolenv``): built once, atomically, under a
lock, private to the user; one that is not this user's, or a symlink, is never used.

The machinery is exercised on a tiny requirement set (``pip``, already in every new venv: pip
installs it offline); the real shipped set is built once, in the slim-install test (slow)."""

from __future__ import annotations

import fcntl
import os
import shlex
import stat
import sys
import threading
from pathlib import Path

import pytest

from npudoctor.live import toolenv


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, Path]:
    requirements, constraints = tmp_path / "req.txt", tmp_path / "con.txt"
    requirements.write_text("pip\n")
    constraints.write_text("")
    return requirements, constraints


def prepared(requirements: Path, constraints: Path) -> tuple[Path, list[str]]:
    said: list[str] = []
    return toolenv.prepare(said.append, requirements, constraints), said


def test_built_once_private_and_reused(tiny):
    environment, said = prepared(*tiny)
    assert environment == toolenv.location(*tiny)
    assert toolenv.state(environment) is None, said
    assert any("making a venv" in line for line in said), said
    assert stat.S_IMODE(os.lstat(environment).st_mode) == 0o700
    assert os.access(toolenv.python_in(environment), os.X_OK)
    before = os.lstat(environment / toolenv.MARKER).st_ino
    again, said = prepared(*tiny)
    assert again == environment and said == [f"the live environment is ready: {environment}"]
    assert os.lstat(environment / toolenv.MARKER).st_ino == before  # not rebuilt
    # nothing else beside it but its lock and its log: no staging folder is left
    assert sorted(p.name for p in environment.parent.iterdir()) == sorted(
        [environment.name, f"{environment.name}.lock", f"{environment.name}.log"]
    )


def test_a_failed_install_leaves_nothing_to_use(tmp_path):
    requirements, constraints = tmp_path / "req.txt", tmp_path / "con.txt"
    requirements.write_text("this is not a requirement !!\n")
    constraints.write_text("")
    with pytest.raises(toolenv.PrepareError) as failed:
        prepared(requirements, constraints)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("preparing the live environment failed: "), message
    log = Path(message.rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.is_file() and "this is not a requirement" in log.read_text()
    environment = toolenv.location(requirements, constraints)
    assert toolenv.state(environment) == "not prepared"
    assert not [p for p in environment.parent.iterdir() if p.name.endswith(".partial")]


def test_a_symlink_or_another_users_folder_is_never_used(tiny, tmp_path):
    environment = toolenv.location(*tiny)
    environment.parent.mkdir(parents=True, mode=0o700)
    planted = tmp_path / "planted"
    planted.mkdir()
    environment.symlink_to(planted)
    assert toolenv.state(environment) == "a symlink, never followed"
    with pytest.raises(toolenv.PrepareError, match="a symlink"):
        prepared(*tiny)
    assert list(planted.iterdir()) == []
    environment.unlink()
    if os.geteuid() == 0:  # only root can give a folder to another user
        environment.mkdir(mode=0o700)
        os.chown(environment, 4242, 4242)
        assert toolenv.state(environment) == "owned by another user (uid 4242)"
        with pytest.raises(toolenv.PrepareError, match="another user"):
            prepared(*tiny)


def test_a_second_npudoctor_waits_for_the_first_one_building(tiny):
    environment = toolenv.location(*tiny)
    environment.parent.mkdir(parents=True, mode=0o700)
    lock = os.open(environment.parent / f"{environment.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # "the first one", building
    waiting = threading.Event()
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("waiting for another npudoctor"):
            waiting.set()

    second = threading.Thread(target=toolenv.prepare, args=(say, *tiny))
    second.start()
    try:
        assert waiting.wait(timeout=120), said
        assert not environment.exists()  # it has not started a build of its own
    finally:
        os.close(lock)  # the first one is done (it built nothing: the second builds)
    second.join(timeout=600)
    assert not second.is_alive()
    assert toolenv.state(environment) is None, said


def test_the_prepare_command_names_the_npudoctor_that_runs(tmp_path, monkeypatch):
    """``npudoctor`` when the one on PATH runs in this interpreter, else this interpreter's ``-m``."""
    script = tmp_path / "bin" / "npudoctor"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert toolenv.prepare_command() == "npudoctor env --prepare"
    script.write_text("#!/usr/bin/python3\nimport sys\n")
    assert shlex.split(toolenv.prepare_command()) == [sys.executable, "-m", "npudoctor", "env", "--prepare"]
