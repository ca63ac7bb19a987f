"""The result cache and the test pool's live-outcome memo on a shared machine: they delete only
what they made, never through a symlink, and read back only what this user wrote (a pickle is
code: an entry someone else could have written is a miss, never unpickled). A cache that is
unusable costs the speed, never the run.

Each case is a real static ``check`` of a real release (``--select NPD001``: one probe, the
server-args table and the catalog records are kept, a second or so warm)."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest

from support.repo import EXAMPLES
from support.reports import json_report

DEEPSEEK = EXAMPLES / "deepseek-v3-pd.yaml"
FOREIGN = ("css", "js", "img", "fonts", "vendor")


def check(cli, release) -> dict:
    return json_report(cli, "--sglang-path", release("0.5.13"), "--config", DEEPSEEK, "--select", "NPD001")


def listing(folder: Path) -> dict[str, bytes | None]:
    """Every path below ``folder`` (not through symlinks), with its bytes for a file."""
    found = {}
    for path in sorted(folder.rglob("*")):
        found[str(path.relative_to(folder))] = path.read_bytes() if path.is_file() else None
    return found


def project_static(folder: Path) -> Path:
    """A web project's ``static/`` (the names a cache's generation directories once shared),
    oldest first by modification time, each with a file."""
    static = folder / "static"
    for index, name in enumerate(FOREIGN):
        (static / name).mkdir(parents=True)
        (static / name / f"site.{name}").write_text(name)
        os.utime(static / name, (1_000_000 + index, 1_000_000 + index))
    return static


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("static/*/*.pickle"))


class Planted:
    """Unpickling it touches ``marker``: what an entry written by someone else may do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# -- it deletes only what it made --------------------------------------------------------------


def test_a_cache_variable_on_a_project_folder_deletes_nothing_of_it(cli, release, tmp_path, monkeypatch):
    project = tmp_path / "project"
    static = project_static(project)
    before = listing(static)
    monkeypatch.setenv("NPUDOCTOR_CACHE_DIR", str(project))
    check(cli, release)
    assert all((static / name / f"site.{name}").read_text() == name for name in FOREIGN)
    after = listing(static)
    assert {k: v for k, v in after.items() if k in before} == before


def test_a_symlinked_static_folder_is_not_followed(cli, release, tmp_path, monkeypatch):
    elsewhere = project_static(tmp_path / "elsewhere")
    before = listing(elsewhere)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "static").symlink_to(elsewhere)
    monkeypatch.setenv("NPUDOCTOR_CACHE_DIR", str(cache))
    first = check(cli, release)
    assert listing(elsewhere) == before  # nothing deleted there, nothing written there
    assert check(cli, release) == first


# -- it reads back only what this user wrote ----------------------------------------------------


def test_a_swapped_entry_is_not_unpickled(cli, release, static_cache, tmp_path):
    first = check(cli, release)
    marker = tmp_path / "ran-foreign-code"
    stored = entries(static_cache)
    assert stored
    for path in stored:
        path.write_bytes(pickle.dumps(Planted(marker)))
    second = check(cli, release)
    assert not marker.exists(), "a cache entry written by someone else ran its code"
    assert second == first


def rewritten(paths: list[Path], before: dict[Path, int]) -> list[Path]:
    """The entries of ``before`` (path -> inode) written again since: a miss recomputes and keeps."""
    return [p for p in paths if p.exists() and p.stat().st_ino != before[p]]


def test_an_entry_others_may_write_is_a_miss(cli, release, static_cache):
    first = check(cli, release)
    stored = entries(static_cache)
    inodes = {p: p.stat().st_ino for p in stored}
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in stored)
    os.chmod(stored[0], 0o666)
    assert check(cli, release) == first
    assert rewritten(stored, inodes) == [stored[0]]
    assert stat.S_IMODE(stored[0].stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_an_entry_of_another_user_is_a_miss(cli, release, static_cache):
    first = check(cli, release)
    stored = entries(static_cache)
    inodes = {p: p.stat().st_ino for p in stored}
    os.chown(stored[0], 65534, 65534)
    assert check(cli, release) == first
    assert rewritten(stored, inodes) == [stored[0]]


def test_an_entry_moved_or_altered_is_a_miss(cli, release, static_cache):
    """The key seals each entry to its own name: one genuine answer put in another's place, or a
    changed byte, is a miss."""
    first = check(cli, release)
    stored = entries(static_cache)
    assert len(stored) >= 2
    inodes = {p: p.stat().st_ino for p in stored}
    stored[0].write_bytes(stored[1].read_bytes())  # same owner, same mode: only the seal tells
    inodes[stored[0]] = stored[0].stat().st_ino
    data = bytearray(stored[1].read_bytes())
    data[-2] ^= 1
    stored[1].write_bytes(bytes(data))
    assert check(cli, release) == first
    assert rewritten(stored, inodes) == stored[:2]


def test_an_untrusted_key_turns_the_cache_off(cli, release, static_cache):
    """The key that seals the entries must be this user's alone; one others could read (or a
    symlink) means no answer is read from the cache and none is kept."""
    first = check(cli, release)
    keys = [p for p in static_cache.iterdir() if p.is_file()]
    assert len(keys) == 1 and stat.S_IMODE(keys[0].stat().st_mode) == 0o600
    os.chmod(keys[0], 0o644)
    stored = entries(static_cache)
    inodes = {p: p.stat().st_ino for p in stored}
    assert check(cli, release) == first
    assert rewritten(stored, inodes) == []  # nothing read nor written with a key others may know


def test_the_cache_is_made_private(cli, release, static_cache):
    check(cli, release)
    for path in [static_cache, *static_cache.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"


# -- an unusable cache costs only the speed -----------------------------------------------------


@pytest.mark.parametrize("kind", ["a file", "static a file", "key a directory", "key a symlink"])
def test_an_unusable_cache_still_checks(cli, release, tmp_path, monkeypatch, kind):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NPUDOCTOR_CACHE_DIR", str(tmp_path / "reference"))
    expected = check(cli, release)
    if kind == "a file":
        cache.write_text("")
    else:
        cache.mkdir()
        if kind == "static a file":
            (cache / "static").write_text("")
    monkeypatch.setenv("NPUDOCTOR_CACHE_DIR", str(cache))
    if kind.startswith("key"):  # the key's name, from a cache that works
        key_name = next(p.name for p in (tmp_path / "reference").iterdir() if p.is_file())
        if kind == "key a directory":
            (cache / key_name).mkdir()
        else:
            (tmp_path / "known-to-others").write_bytes(b"k" * 32)
            (cache / key_name).symlink_to(tmp_path / "known-to-others")
    assert check(cli, release) == expected
    assert check(cli, release) == expected
    assert (tmp_path / "known-to-others").read_bytes() == b"k" * 32 if kind == "key a symlink" else True


# -- the live-outcome memo of the test pool ----------------------------------------------------


def memo_run(pool, root: Path):
    """Ask ``pool`` for a live run on ``root`` (an empty folder: a zygote started for it ends at
    once), answered from its memo or not at all: its fallback is never asked."""

    def fresh():
        raise AssertionError("the run fell back to a fresh child")

    return pool.start(str(root), [], ["NPD001"], {}, {"model": "m"}, dict(os.environ), None, fresh)


def test_the_pool_memo_does_not_unpickle_what_others_wrote(tmp_path):
    from npudoctor.live import zygote

    memo, root, marker = tmp_path / "memo", tmp_path / "tree", tmp_path / "ran-foreign-code"
    memo.mkdir()
    root.mkdir()
    pool = zygote.Pool(memo=memo)
    try:
        steps = [("fixes", "{}"), ("import", "NPD001")]
        planted = pool._memo_file(str(root), [], steps, {"model": "m"}, dict(os.environ))
        planted.write_bytes(pickle.dumps(Planted(marker)))
        memo_run(pool, root)
    finally:
        pool.close()
    assert not marker.exists(), "a memo entry written by someone else ran its code"
    assert pool.remembered == 0


def test_the_pool_memo_answers_what_this_user_sealed(tmp_path):
    from npudoctor.engine.check import LiveOutcome
    from npudoctor.live import zygote
    from npudoctor.target.privatestore import PrivateStore

    memo, root = tmp_path / "memo", tmp_path / "tree"
    root.mkdir()
    pool = zygote.Pool(memo=memo)
    try:
        steps = [("fixes", "{}"), ("import", "NPD001")]
        kept = pool._memo_file(str(root), [], steps, {"model": "m"}, dict(os.environ))
        PrivateStore(memo).save(LiveOutcome(errors={"NPD001": "kept"}), kept.name)
        assert memo_run(pool, root).outcome().errors == {"NPD001": "kept"}
    finally:
        pool.close()
    assert pool.remembered == 1
