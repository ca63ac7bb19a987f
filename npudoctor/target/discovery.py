"""Find the sglang under test without importing it.

A target is either the installed distribution (version from ``importlib.metadata``,
files from ``importlib.util.find_spec``, in the checked environment: ``--python``'s or this
interpreter's) or a directory given with ``--sglang-path``:
an unpacked wheel or a source checkout, pointing at the directory that holds
``sglang/`` (or at ``sglang/`` itself, or at a checkout whose ``python/`` holds it).
"""

from __future__ import annotations

import ast
import os
from functools import cached_property
from pathlib import Path

from npudoctor.errors import InputError, NoTargetError, path_error
from npudoctor.results import TargetInfo
from npudoctor.static.source import SourceTree, Unreadable, python_files, read_source

# Files whose presence tells an sglang package directory from any other directory.
_MARKERS = ("srt", "__init__.py")
# A wheel's METADATA (the version line is near the top): sglang's is ~20 KB
_MAX_METADATA_BYTES = 1024 * 1024


class Target:
    """The sglang source under test: where its files are and which version they are."""

    def __init__(self, package_dir: Path, version: str | None, source: str):
        self.package_dir = package_dir
        self.version = version
        self.source = source
        self._unread: dict[str, str] = {}  # of trees released: files the checks did not read

    @property
    def root(self) -> Path:
        """The directory that contains ``sglang/``; file:line evidence is relative to it."""
        return self.package_dir.parent

    @cached_property
    def tree(self) -> SourceTree:
        return SourceTree(self.package_dir)

    @cached_property
    def cache_key(self) -> tuple[str, str, str]:
        """The tree as it is now (where, which version, each ``.py`` file's path, size and mtime):
        what the static-result cache (``npudoctor.target.resultcache``) keys this tree's answers by."""
        from npudoctor.target.resultcache import tree_fingerprint

        return (str(self.package_dir), str(self.version), tree_fingerprint(self.package_dir))

    def release(self) -> None:
        """Free the parsed source now (``SourceTree.release``); a later ``tree`` parses again."""
        tree = self.__dict__.pop("tree", None)
        if tree is not None:
            self._unread.update(tree.unread)
            tree.release()

    @property
    def unread(self) -> dict[str, str]:
        """The tree's ``.py`` files left unread (not regular files, larger than npudoctor reads),
        relative to ``root``, with the reason: listed whether or not a check asked for them, so the
        report says the same whether its verdicts were computed now or kept in the result cache."""
        tree = self.__dict__.get("tree")
        unread = {
            **self._unread,
            **(tree.unread if tree is not None else {}),
            **python_files(self.package_dir)[1],
        }
        return {Path(path).relative_to(self.root).as_posix(): why for path, why in sorted(unread.items())}

    @cached_property
    def has_ascend_backend(self) -> bool:
        """Whether this sglang can run on Ascend at all: it defines the Ascend attention backend,
        ``AscendAttnBackend`` in an ``ascend_backend.py`` under ``sglang/srt`` (0.4.10:
        ``layers/attention/``, 0.5.9+: ``hardware_backend/npu/attention/``; LoRA's file of that
        name defines another class). Every check's NPU path hangs off it."""
        srt = str(self.package_dir / "srt") + os.sep
        return any(
            b"class AscendAttnBackend" in self.tree.read(path)
            for path in self.tree.files
            if path.startswith(srt) and os.path.basename(path) == "ascend_backend.py"
        )

    def info(self) -> TargetInfo:
        return TargetInfo(
            version=self.version,
            path=str(self.package_dir),
            source=self.source,
            unread=tuple(f"{path}: {why}" for path, why in self.unread.items()),
        )

    def __repr__(self) -> str:
        return f"Target({self.package_dir}, version={self.version!r}, source={self.source!r})"


def discover(sglang_path: str | Path | None = None) -> Target:
    """The target named by ``sglang_path``, else the installed sglang.

    Raises ``InputError`` when the given path is not an sglang tree, ``NoTargetError``
    when no path is given and no sglang is installed.
    """
    if sglang_path is not None:
        return _from_path(Path(sglang_path))
    return _installed()


def require_ascend_backend(target: Target) -> None:
    """``NoTargetError`` (exit 4, nothing to check) for an sglang without the Ascend NPU backend:
    every check would only say that it cannot find the code it probes."""
    if not target.has_ascend_backend:
        raise NoTargetError(
            f"sglang {target.version} at {target.package_dir} has no Ascend NPU backend "
            "(no AscendAttnBackend under sglang/srt): nothing to check"
        )


def _installed() -> Target:
    """The sglang installed in the checked environment (``npudoctor.target.pythonenv``: this
    interpreter's, or the one ``--python`` names)."""
    from npudoctor.target import pythonenv

    checked = pythonenv.checked()
    if checked.sglang is None:
        where = f"for {checked.executable}" if checked.named else "in this interpreter"
        hint = "" if checked.named else "; --python PATH to check the environment sglang runs in"
        raise NoTargetError(
            f"no sglang found: it is not installed {where} "
            f"(use --sglang-path to check an unpacked wheel or a source checkout{hint})"
        )
    found, version = checked.sglang
    package_dir = Path(found)
    return Target(package_dir, version or _version_from_tree(package_dir), "installed")


def _from_path(path: Path) -> Target:
    try:
        package_dir = _package_dir(path)
    except (OSError, ValueError) as error:  # a folder the user cannot enter, a name too long, a loop
        raise path_error(f"--sglang-path {path}", error) from None
    return Target(package_dir, _version_from_tree(package_dir), "path")


def _package_dir(path: Path) -> Path:
    """The ``sglang/`` package directory ``path`` names; the system's refusals (``OSError``) pass
    through, ``Path.exists`` raising them for a folder on the way the user cannot enter."""
    if not path.exists():
        raise InputError(f"--sglang-path {path}: no such directory")
    if not path.is_dir():
        raise InputError(f"--sglang-path {path}: not a directory")
    for candidate in (path, path / "sglang", path / "python" / "sglang"):
        if all((candidate / marker).exists() for marker in _MARKERS) and candidate.name == "sglang":
            return candidate.resolve()
    raise InputError(
        f"--sglang-path {path}: not an sglang tree "
        "(expected a directory containing sglang/srt/, e.g. an unpacked wheel)"
    )


def _version_from_tree(package_dir: Path) -> str | None:
    """The version a tree declares: ``_version.py``/``version.py``, else a ``.dist-info`` beside it."""
    for name in ("_version.py", "version.py"):
        version = _literal_version(package_dir / name)
        if version:
            return version
    for dist_info in sorted(package_dir.parent.glob("sglang-*.dist-info")):
        try:
            text = read_source(dist_info / "METADATA", _MAX_METADATA_BYTES).decode(errors="replace")
        except Unreadable:
            continue
        for line in text.splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _literal_version(path: Path) -> str | None:
    """``__version__ = "X"`` (or ``version = "X"``) at module level, read without executing the file."""
    try:
        module = ast.parse(read_source(path))
    except (Unreadable, SyntaxError, ValueError):
        return None
    for node in module.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = set()
            for target in node.targets:
                names.update(elt.id for elt in ast.walk(target) if isinstance(elt, ast.Name))
            if names & {"__version__", "version"} and isinstance(node.value.value, str):
                return node.value.value
    return None
