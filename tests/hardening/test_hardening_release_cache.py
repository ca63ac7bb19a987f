"""The release cache (``npudoctor.target.releases``) proves what it hands out, and one bad wheel or
one bad cache folder costs that release's row in ``advise``, never the run.

A tree is the unpacked content of one wheel, found by that wheel's bytes: a wheel named for one
release that holds another is that release's error; a replaced wheel is a new tree; a tree that
changed since it was unpacked, or that someone else could have written (the live depth imports
it), is unpacked again. Unpacking takes regular files and folders only, within size and count
limits. The wheels are built here from a real release's wheel (a few of its files, or all of it
renamed); ``advise`` runs in a subprocess with a timeout, so a hang fails the test."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from npudoctor.target import releases

from support.filesystem import unwritable
from support.repo import EXAMPLES, fetch_sglang
from support.truths import truth_present

DEEPSEEK = EXAMPLES / "deepseek-v3-pd.yaml"
GENUINE = "0.5.12"  # the real release the test wheels are made from
NOBODY = 65534  # another user's id, for the files a root test plants as someone else
IS_ROOT = os.geteuid() == 0


def real_wheel(release, version: str) -> Path:
    release(version)  # the tests' release cache holds its wheel from then on
    wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", version)
    assert wheel is not None
    return wheel


def small_wheel(
    directory: Path,
    version: str,
    source: Path,
    *,
    package: bool = True,
    marker: str = "one",
    extra: tuple[tuple[zipfile.ZipInfo | str, bytes], ...] = (),
) -> Path:
    """A wheel of sglang ``version`` made of the real wheel ``source``'s ``sglang/__init__.py`` and
    dist-info METADATA (its version made ``version``, as ``sglang/_version.py`` says), a file
    ``sglang/srt/marker.py`` holding ``marker``, and ``extra`` entries."""
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(source) as real, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        metadata = real.read(next(n for n in real.namelist() if n.endswith(".dist-info/METADATA")))
        lines = [
            f"Version: {version}" if line.startswith("Version:") else line
            for line in metadata.decode().splitlines()
        ]
        out.writestr(f"sglang-{version}.dist-info/METADATA", "\n".join(lines) + "\n")
        if package:
            out.writestr("sglang/__init__.py", real.read("sglang/__init__.py"))
            out.writestr("sglang/_version.py", f"__version__ = version = {version!r}\n")
            out.writestr("sglang/srt/marker.py", f"MARKER = {marker!r}\n")
        for name, data in extra:
            out.writestr(name, data)
    return wheel


def patch_entry(wheel: Path, name: str, *, flag_bits: int | None = None, method: int | None = None) -> None:
    """Set an entry's general-purpose flags or compression method in its local header and in the
    central directory (zipfile writes neither as asked)."""
    data = bytearray(wheel.read_bytes())
    with zipfile.ZipFile(wheel) as archive:
        local = archive.getinfo(name).header_offset
    central = next(
        i
        for i in _all(data, b"PK\x01\x02")
        if data[i + 46 : i + 46 + len(name)] == name.encode()
        and int.from_bytes(data[i + 28 : i + 30], "little") == len(name)
    )
    for header, flags_at, method_at in ((local, 6, 8), (central, 8, 10)):
        if flag_bits is not None:
            data[header + flags_at : header + flags_at + 2] = flag_bits.to_bytes(2, "little")
        if method is not None:
            data[header + method_at : header + method_at + 2] = method.to_bytes(2, "little")
    wheel.write_bytes(bytes(data))


def _all(data: bytearray, needle: bytes):
    start = data.find(needle)
    while start != -1:
        yield start
        start = data.find(needle, start + 1)


def advise(cache: Path, *args) -> tuple[int, dict | None, str]:
    """``npudoctor advise --format json`` on DeepSeek-V3 PD, NPD006 only, offline, in a subprocess
    (a hang is a failure, after a 600 s guard): exit code, JSON, stderr."""
    env = {**os.environ, "NPUDOCTOR_SGLANG_CACHE": str(cache), "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "advise", "-f", "json", "--config", str(DEEPSEEK)]
        + ["--select", "NPD006", "--jobs", "1", *map(str, args)],  # no worker processes to start
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert "Traceback" not in done.stderr, done.stderr
    data = json.loads(done.stdout) if done.stdout.strip() else None
    return done.returncode, data, done.stderr


def rows(data: dict | None) -> dict[str, dict]:
    assert data is not None
    return {row["release"]: row for row in data["releases"]}


def owned_and_private(tree: Path) -> list[str]:
    """Every entry of ``tree`` that is not this user's, or that others may write."""
    wrong = []
    for path in [tree, *tree.rglob("*")]:
        st = path.lstat()
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or stat.S_ISLNK(st.st_mode):
            wrong.append(str(path))
    return wrong


# -- one bad wheel is its release's row -------------------------------------------------------------


def _encrypted(directory: Path, source: Path) -> Path:
    wheel = small_wheel(directory, "0.5.91", source, extra=(("sglang/srt/secret.py", b"X = 1\n"),))
    patch_entry(wheel, "sglang/srt/secret.py", flag_bits=0x1)
    return wheel


def _unknown_compression(directory: Path, source: Path) -> Path:
    wheel = small_wheel(directory, "0.5.91", source, extra=(("sglang/srt/packed.py", b"X = 1\n"),))
    patch_entry(wheel, "sglang/srt/packed.py", method=97)  # WavPack: no zip reader here has it
    return wheel


def _no_package(directory: Path, source: Path) -> Path:
    return small_wheel(directory, "0.5.91", source, package=False)


def _symlink_entry(directory: Path, source: Path) -> Path:
    link = zipfile.ZipInfo("sglang/srt/passwd.py")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    return small_wheel(directory, "0.5.91", source, extra=((link, b"/etc/passwd"),))


def _bomb(directory: Path, source: Path) -> Path:
    """Zeros just over the unpacking limit: 2 MB of wheel (quickly compressed) for 513 MiB."""
    wheel = small_wheel(directory, "0.5.91", source)
    megabyte = bytes(1 << 20)
    limit = getattr(releases, "MAX_UNPACKED_BYTES", 512 << 20)  # today's code has none: the same figure
    with (
        zipfile.ZipFile(wheel, "a", zipfile.ZIP_DEFLATED, compresslevel=1) as archive,
        archive.open("sglang/srt/zeros.bin", "w", force_zip64=True) as entry,
    ):
        for _ in range((limit >> 20) + 1):
            entry.write(megabyte)
    return wheel


def _fifo(directory: Path, source: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "sglang-0.5.91-py3-none-any.whl"
    os.mkfifo(wheel)
    return wheel


def _folder(directory: Path, source: Path) -> Path:
    wheel = directory / "sglang-0.5.91-py3-none-any.whl"
    wheel.mkdir(parents=True)
    return wheel


BAD_WHEELS = {
    "encrypted": (_encrypted, "sglang/srt/secret.py is encrypted"),
    "unknown-compression": (_unknown_compression, "sglang/srt/packed.py uses compression method 97"),
    "no-sglang-package": (_no_package, "holds no sglang/ package"),
    "symlink-entry": (_symlink_entry, "sglang/srt/passwd.py is a symlink"),
    "zip-bomb": (_bomb, "unpacks to more than 512 MiB"),
    "fifo": (_fifo, "is not a regular file"),
    "folder": (_folder, "is not a regular file"),
}


@pytest.mark.parametrize("kind", sorted(BAD_WHEELS))
def test_a_bad_wheel_is_its_releases_row(release, tmp_path, kind):
    """The other subject (0.5.12's tree, the baseline) is checked as always; the bad wheel's
    release is a row naming the cause; the exit code is the baseline's (1: NPD006 fails on 0.5.12)."""
    build, cause = BAD_WHEELS[kind]
    wheels = tmp_path / "wheels"
    wheel = build(wheels, real_wheel(release, GENUINE))
    tree = release(GENUINE)
    code, data, err = advise(tmp_path / "cache", "--sglang-path", tree, "--wheel-dir", wheels)
    found = rows(data)
    assert found[GENUINE]["report"] is not None and found[GENUINE]["error"] is None
    bad = found["0.5.91"]
    assert bad["report"] is None and cause in bad["error"] and wheel.name in bad["error"], bad["error"]
    assert code == 1, err
    assert not list((tmp_path / "cache").glob("trees/*/sglang/srt/zeros.bin"))


def test_too_many_entries_are_refused_before_unpacking(release, tmp_path):
    limit = getattr(releases, "MAX_ENTRIES", 32768)
    many = tuple((f"sglang/srt/many/m{i}.py", b"") for i in range(limit + 1))
    wheel = small_wheel(tmp_path / "wheels", "0.5.91", real_wheel(release, GENUINE), extra=many)
    with pytest.raises(releases.FetchError, match=r"more than \d+ entries") as error:
        releases.fetch("0.5.91", tmp_path / "cache", wheel.parent)
    assert wheel.name in str(error.value)
    assert not list((tmp_path / "cache").glob("trees/*/sglang"))


def test_a_wheel_that_holds_another_release_is_its_rows_error(release, tmp_path):
    """0.5.12's wheel under 0.5.13's name: its row says so (both versions, the file), no report."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    genuine = real_wheel(release, GENUINE)
    fake = wheels / genuine.name.replace(GENUINE, "0.5.13")
    os.link(genuine, fake)
    code, data, err = advise(tmp_path / "cache", "--wheel-dir", wheels)
    row = rows(data)["0.5.13"]
    assert row["report"] is None, "0.5.12's tree was checked as 0.5.13"
    assert f"{fake.name} holds sglang {GENUINE}, not 0.5.13" in row["error"]
    assert code == 4  # the baseline (the only release) could not be checked


def test_the_genuine_release_after_a_mislabelled_wheel_gets_its_own_findings(release, tmp_path):
    """A wheel named 0.5.13 holding 0.5.12 was tried once; then the real 0.5.13's wheel, same cache:
    its row is 0.5.13's verdict (NPD006 passes there, fails on 0.5.12: truths), not 0.5.12's."""
    assert truth_present(GENUINE, "NPD006", "mla") and not truth_present("0.5.13", "NPD006", "mla")
    genuine = real_wheel(release, GENUINE)
    fake, real = tmp_path / "fake", tmp_path / "real"
    fake.mkdir()
    real.mkdir()
    os.link(genuine, fake / genuine.name.replace(GENUINE, "0.5.13"))
    os.link(real_wheel(release, "0.5.13"), real / real_wheel(release, "0.5.13").name)
    advise(tmp_path / "cache", "--wheel-dir", fake)
    code, data, err = advise(tmp_path / "cache", "--wheel-dir", real)
    row = rows(data)["0.5.13"]
    assert row["report"]["target"]["version"] == "0.5.13"
    assert row["report"]["results"][0]["status"] == "pass"
    assert code == 0, err


# -- the trees: found by the wheel's bytes, proven each time they are handed out ------------------


@pytest.fixture
def small(release, tmp_path):
    """A cache, a wheel folder, and ``make(marker)`` writing sglang 0.5.90's small wheel there."""
    source = real_wheel(release, GENUINE)
    wheels = tmp_path / "wheels"

    def make(marker: str = "one") -> Path:
        with contextlib.suppress(FileNotFoundError):
            (wheels / "sglang-0.5.90-py3-none-any.whl").unlink()
        return small_wheel(wheels, "0.5.90", source, marker=marker)

    return tmp_path / "cache", wheels, make


def marker_of(tree: Path) -> str:
    return (tree / "sglang" / "srt" / "marker.py").read_text()


def test_a_replaced_wheel_is_a_new_tree(small):
    cache, wheels, make = small
    make("one")
    assert marker_of(releases.fetch("0.5.90", cache, wheels)) == "MARKER = 'one'\n"
    make("two")  # the same release, the same file name, other bytes
    assert marker_of(releases.fetch("0.5.90", cache, wheels)) == "MARKER = 'two'\n"


def test_a_tree_that_changed_is_unpacked_again(small):
    cache, wheels, make = small
    make()
    tree = releases.fetch("0.5.90", cache, wheels)
    (tree / "sglang" / "srt" / "marker.py").unlink()  # half a tree (a cleanup, a full disk)
    again = releases.fetch("0.5.90", cache, wheels)
    assert marker_of(again) == "MARKER = 'one'\n"


def test_a_tree_others_could_write_is_unpacked_again(small):
    """A file of the tree that others may write (what the live depth would import) is not trusted:
    the tree is unpacked again, private."""
    cache, wheels, make = small
    make()
    tree = releases.fetch("0.5.90", cache, wheels)
    planted = tree / "sglang" / "srt" / "marker.py"
    planted.chmod(0o666)
    planted.write_text("MARKER = 'planted'\n")
    again = releases.fetch("0.5.90", cache, wheels)
    assert marker_of(again) == "MARKER = 'one'\n"
    assert owned_and_private(again) == []


@pytest.mark.skipif(not IS_ROOT, reason="planting a file as another user needs root")
def test_a_file_another_user_planted_in_a_tree_is_not_used(small):
    cache, wheels, make = small
    make()
    tree = releases.fetch("0.5.90", cache, wheels)
    planted = tree / "sglang" / "srt" / "marker.py"
    planted.write_text("MARKER = 'planted'\n")
    os.chown(planted, NOBODY, NOBODY)
    again = releases.fetch("0.5.90", cache, wheels)
    assert marker_of(again) == "MARKER = 'one'\n"
    assert owned_and_private(again) == []


@pytest.mark.skipif(not IS_ROOT, reason="planting a wheel as another user needs root")
def test_a_wheel_another_user_planted_in_the_cache_is_not_used(small):
    cache, wheels, make = small
    (cache / "wheels").mkdir(parents=True)
    planted = shutil.copy(make(), cache / "wheels")
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(releases.FetchError, match="belongs to uid 65534") as error:
        releases.fetch("0.5.90", cache)
    assert str(planted) in str(error.value)
    assert not list(cache.glob("trees/*/sglang"))


def test_a_cache_others_may_write_is_refused(small):
    """A cache folder anyone may write (no sticky bit): anyone could swap its trees after they are
    checked; it is not used, and the error says to use a private one."""
    cache, wheels, make = small
    make()
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(releases.FetchError, match="writable by others") as error:
        releases.fetch("0.5.90", cache, wheels)
    assert "NPUDOCTOR_SGLANG_CACHE" in str(error.value)
    cache.chmod(0o1777)  # a shared folder with the sticky bit (like /tmp): each keeps their own
    assert marker_of(releases.fetch("0.5.90", cache, wheels)) == "MARKER = 'one'\n"


def test_a_symlinked_tree_is_not_followed(small, tmp_path):
    """A tree folder that became a symlink is replaced by an unpacked tree; what it pointed to is
    left alone."""
    cache, wheels, make = small
    make()
    tree = releases.fetch("0.5.90", cache, wheels)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(tree, elsewhere)
    (elsewhere / "sglang" / "srt" / "marker.py").write_text("MARKER = 'elsewhere'\n")
    shutil.rmtree(tree)
    tree.symlink_to(elsewhere)
    again = releases.fetch("0.5.90", cache, wheels)
    assert not again.is_symlink() and marker_of(again) == "MARKER = 'one'\n"
    assert marker_of(elsewhere) == "MARKER = 'elsewhere'\n"


# -- a cache folder that cannot serve is each release's row -----------------------------------------


def _cache_is_a_file(cache: Path) -> contextlib.AbstractContextManager:
    cache.write_text("not a folder\n")
    return contextlib.nullcontext()


@contextlib.contextmanager
def _read_only(cache: Path):
    cache.mkdir()
    with unwritable(cache):
        yield


CACHE_STATES = {
    "a-file": (_cache_is_a_file, "is not a folder"),
    "read-only": (_read_only, "cannot write"),
}


@pytest.mark.parametrize("state", sorted(CACHE_STATES))
def test_a_cache_that_cannot_serve_is_each_releases_row(release, tmp_path, state):
    prepare, cause = CACHE_STATES[state]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    genuine = real_wheel(release, "0.5.13")
    os.link(genuine, wheels / genuine.name)
    cache = tmp_path / "cache"
    with prepare(cache):
        code, data, err = advise(cache, "--sglang-path", release(GENUINE), "--wheel-dir", wheels)
    found = rows(data)
    assert found[GENUINE]["report"] is not None
    assert found["0.5.13"]["report"] is None and cause in found["0.5.13"]["error"], found["0.5.13"]
    assert str(cache) in found["0.5.13"]["error"]
    assert code == 1, err


def test_a_symlinked_version_folder_costs_nothing(release, tmp_path):
    """A symlink where an older npudoctor kept a release's tree (``trees/0.5.13``), pointing at a
    folder that is no tree: the release is checked as if it were not there, the folder untouched."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    genuine = real_wheel(release, "0.5.13")
    os.link(genuine, wheels / genuine.name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine\n")
    cache = tmp_path / "cache"
    (cache / "trees").mkdir(parents=True)
    (cache / "trees" / "0.5.13").symlink_to(elsewhere)
    code, data, err = advise(cache, "--sglang-path", release(GENUINE), "--wheel-dir", wheels)
    found = rows(data)
    assert found["0.5.13"]["error"] is None and found["0.5.13"]["report"]["target"]["version"] == "0.5.13"
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]
    assert code == 1, err


# -- the live depth imports only what this user unpacked --------------------------------------------


@pytest.mark.slow
def test_the_live_depth_never_imports_a_tree_others_wrote(release, tmp_path):
    """A tree in the cache whose ``sglang/__init__.py`` others may write and did (it writes a file
    when imported): ``advise --depth live`` unpacks the release again and imports that."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    genuine = real_wheel(release, GENUINE)
    os.link(genuine, wheels / genuine.name)
    cache = tmp_path / "cache"
    tree = releases.fetch(GENUINE, cache, wheels)
    ran = tmp_path / "planted-code-ran"
    init = tree / "sglang" / "__init__.py"
    init.chmod(0o666)
    init.write_text(init.read_text() + f"\nopen({str(ran)!r}, 'w').close()\n")
    code, data, err = advise(cache, "--depth", "live", "--wheel-dir", wheels)
    assert not ran.exists(), "the live child imported code another user wrote"
    assert rows(data)[GENUINE]["report"]["results"][0]["depth"] == "live", err


def test_a_wheel_of_ours_others_could_write_is_downloaded_again(small, monkeypatch):
    """A wheel in the cache that group or others may write (as ``pip download`` leaves it under a
    umask like 002) is not unpacked: it is downloaded again (here from an index nobody answers)."""
    cache, wheels, make = small
    (cache / "wheels").mkdir(parents=True)
    loose = shutil.copy(make(), cache / "wheels")
    os.chmod(loose, 0o666)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(
        releases.FetchError, match="is writable by others: not used; cannot download"
    ) as error:
        releases.fetch("0.5.90", cache)
    assert str(loose) in str(error.value)
    assert not list(cache.glob("trees/*/sglang"))


def test_bytecode_the_live_depth_writes_keeps_the_tree(small):
    """Importing a tree writes ``__pycache__`` into it (under a umask like 002, a folder its group
    may write): the tree stays the same one, that folder made private, not unpacked again."""
    cache, wheels, make = small
    make()
    tree = releases.fetch("0.5.90", cache, wheels)
    (tree / "left-here").write_text("gone if the tree is unpacked again\n")  # beside what is counted
    previous = os.umask(0o002)
    try:
        # the bytecode an import writes, as the import writes it (the real __init__ needs all of sglang)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "sglang/srt"], cwd=tree, check=True)
    finally:
        os.umask(previous)
    bytecode = tree / "sglang" / "srt" / "__pycache__"
    assert bytecode.is_dir() and bytecode.stat().st_mode & 0o020
    again = releases.fetch("0.5.90", cache, wheels)
    assert again == tree and (again / "left-here").is_file()
    assert owned_and_private(again) == []


def test_a_symlinked_trees_folder_is_refused(small, tmp_path):
    """``<cache>/trees`` that is a symlink is not followed: whoever made it chose where the trees
    are; the error names it (the cache is the user's to point elsewhere)."""
    cache, wheels, make = small
    make()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache.mkdir()
    (cache / "trees").symlink_to(elsewhere)
    with pytest.raises(releases.FetchError, match="trees is a symlink"):
        releases.fetch("0.5.90", cache, wheels)
    assert list(elsewhere.iterdir()) == []


# -- a damaged wheel, however damaged, is its release's row ------------------------------------------
#
# These wheels are made here from nothing (a METADATA, ``sglang/__init__.py``, ``sglang/srt/``), a few
# KB each: unpacking them needs no real release.

PAYLOAD = b"".join(b"VALUE_%d = %d\n" % (i, i * i) for i in range(400))  # a few KB that compress


def made_wheel(
    directory: Path, version: str, extra: tuple[tuple[str, bytes, int], ...] = (), metadata_method: int = 8
) -> Path:
    """A wheel of sglang ``version``; ``extra``: (name, bytes, compression method) entries."""
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"sglang-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n\n".encode() + PAYLOAD
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr(f"sglang-{version}.dist-info/METADATA", metadata, compress_type=metadata_method)
        out.writestr("sglang/__init__.py", b"")
        out.writestr("sglang/srt/__init__.py", b"")
        for name, data, method in extra:
            out.writestr(name, data, compress_type=method)
    return wheel


def damage_stream(wheel: Path, name: str, at: int = 0) -> None:
    """Overwrite 8 bytes of entry ``name``'s compressed stream, ``at`` bytes into it (its sizes and
    CRC as they were): 0xff first in a deflate stream is a block of the reserved type."""
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(name)
    data = bytearray(wheel.read_bytes())
    extra = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    start = info.header_offset + 30 + len(name.encode()) + extra + at
    data[start : start + 8] = b"\xff" * 8
    wheel.write_bytes(bytes(data))


def _corrupt_deflate(directory: Path, version: str) -> Path:
    wheel = made_wheel(directory, version, (("sglang/srt/broken.py", PAYLOAD, zipfile.ZIP_DEFLATED),))
    damage_stream(wheel, "sglang/srt/broken.py")
    return wheel


def _corrupt_lzma(directory: Path, version: str) -> Path:
    wheel = made_wheel(directory, version, (("sglang/srt/broken.py", PAYLOAD, zipfile.ZIP_LZMA),))
    damage_stream(wheel, "sglang/srt/broken.py", at=9)  # after zipfile's LZMA header and properties
    return wheel


def _corrupt_metadata(directory: Path, version: str) -> Path:
    wheel = made_wheel(directory, version)
    damage_stream(wheel, f"sglang-{version}.dist-info/METADATA")
    return wheel


def _deep(directory: Path, version: str) -> Path:
    return made_wheel(directory, version, (("sglang/srt/" + "d/" * 1200 + "deep.py", b"", 8),))


def _long(directory: Path, version: str) -> Path:
    """A 2,000-character path in 12 folders: each name within what a file system takes."""
    return made_wheel(directory, version, (("sglang/srt/" + ("x" * 180 + "/") * 11 + "long.py", b"", 8),))


DAMAGED_WHEELS = {  # kind: (builder, what the row says)
    "corrupt-deflate": (_corrupt_deflate, "sglang/srt/broken.py: Error -3 while decompressing"),
    "corrupt-lzma": (_corrupt_lzma, "sglang/srt/broken.py: Corrupt input data"),
    "corrupt-metadata": (_corrupt_metadata, ".dist-info/METADATA: Error -3 while decompressing"),
    "1200-folders-deep": (_deep, "deeper than"),
    "2000-character-path": (_long, "longer than"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGED_WHEELS))
def test_a_damaged_wheel_is_a_fetch_error(tmp_path, kind):
    build, cause = DAMAGED_WHEELS[kind]
    wheel = build(tmp_path / "wheels", "0.5.91")
    with pytest.raises(releases.FetchError) as error:
        releases.fetch("0.5.91", tmp_path / "cache", wheel.parent)
    assert cause in str(error.value) and wheel.name in str(error.value), str(error.value)
    assert not list((tmp_path / "cache").glob("trees/*/sglang")), "a damaged wheel left a tree"


def test_damaged_wheels_are_rows_and_the_run_goes_on(release, tmp_path):
    """One ``advise`` over a wheel folder holding each damaged wheel (one release each) and a real
    release's tree as the baseline: every damaged release is a row naming its cause, the baseline is
    checked (NPD006 fails on 0.5.12: exit 1)."""
    wheels = tmp_path / "wheels"
    expected = {}
    for patch, kind in enumerate(sorted(DAMAGED_WHEELS), start=91):
        build, cause = DAMAGED_WHEELS[kind]
        expected[f"0.5.{patch}"] = (build(wheels, f"0.5.{patch}").name, cause)
    code, data, err = advise(tmp_path / "cache", "--sglang-path", release(GENUINE), "--wheel-dir", wheels)
    found = rows(data)
    assert found[GENUINE]["report"] is not None, err
    for version, (name, cause) in expected.items():
        assert found[version]["report"] is None, version
        assert cause in found[version]["error"] and name in found[version]["error"], found[version]
    assert code == 1, err


def test_mutated_wheels_are_unpacked_or_refused(tmp_path):
    """Bytes of a small wheel overwritten at 300 places chosen by a fixed seed (headers, streams,
    the central directory): each wheel is unpacked or refused with a FetchError, nothing else."""
    import random

    chooser = random.Random(33)
    source = made_wheel(tmp_path / "source", "0.5.91", (("sglang/srt/lz.py", PAYLOAD, zipfile.ZIP_LZMA),))
    original = source.read_bytes()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    unexpected = []
    for attempt in range(300):
        data = bytearray(original)
        for _ in range(chooser.choice((1, 2, 4))):
            data[chooser.randrange(len(data))] = chooser.randrange(256)
        (wheels / source.name).write_bytes(bytes(data))
        try:
            releases.fetch("0.5.91", tmp_path / "cache", wheels)
        except releases.FetchError:
            pass
        except Exception as error:  # noqa: BLE001 (what the test is looking for)
            unexpected.append(f"{attempt}: {type(error).__name__}: {error}")
    assert unexpected == []


def central_directory_only(path: Path, entries: int, declared: int | None = None) -> int:
    """A zip whose central directory lists ``entries`` empty stored files (zip64 end records: more
    than 65,535) and holds nothing else: what a reader parses before it reads any entry; its end
    record says there are ``declared`` (zipfile reads the directory to its end all the same).
    Returns the central directory's size."""
    declared = entries if declared is None else declared
    header = b"PK\x01\x02" + bytes(24) + (12).to_bytes(2, "little") + bytes(16)  # 12: the name's length
    central = b"".join(header + b"sglang/%05x" % (i % 0xFFFFF) for i in range(entries))
    zip64_end = (
        b"PK\x06\x06"
        + (44).to_bytes(8, "little")
        + (45).to_bytes(2, "little") * 2
        + bytes(8)
        + declared.to_bytes(8, "little") * 2
        + len(central).to_bytes(8, "little")
        + bytes(8)  # the central directory starts the file
    )
    locator = b"PK\x06\x07" + bytes(4) + len(central).to_bytes(8, "little") + (1).to_bytes(4, "little")
    end = b"PK\x05\x06" + bytes(4) + b"\xff\xff" * 2 + b"\xff\xff\xff\xff" * 2 + bytes(2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(central + zip64_end + locator + end)
    return len(central)


ENTRY_COUNTS = {  # what the end record says of 200,000 entries: the refusal
    "counted": (200_000, r"more than 32768 entries \(200000\)"),
    "understated": (1_000, r"list of entries takes more than 8 MiB \(11 MiB\)"),
}


@pytest.mark.parametrize("count", sorted(ENTRY_COUNTS))
def test_too_many_entries_are_refused_before_the_directory_is_read(tmp_path, count):
    """200,000 entries (the limit is 32,768): refused from the end record (its count, or the
    directory's size when the count understates it), before the central directory (11.6 MB here)
    is read, let alone parsed into 200,000 entries (~90 MB)."""
    import tracemalloc

    declared, refusal = ENTRY_COUNTS[count]
    wheel = tmp_path / "wheels" / "sglang-0.5.91-py3-none-any.whl"
    size = central_directory_only(wheel, 200_000, declared)
    with zipfile.ZipFile(wheel) as archive:  # a zip a reader takes: the refusal is npudoctor's
        assert len(archive.infolist()) == 200_000
    tracemalloc.start()
    try:
        with pytest.raises(releases.FetchError, match=refusal):
            releases.fetch("0.5.91", tmp_path / "cache", wheel.parent)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size // 2, f"{peak >> 20} MiB at the peak: the central directory was read"
