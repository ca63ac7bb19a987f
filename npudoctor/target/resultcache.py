"""The result cache: a check's static probe, and a live run's outcome, kept on disk for the same
code and deployment.

A static probe is a function of three things only: the target's source files, the deployment
(``Facts``) and npudoctor's own code. Its ``Probe`` is kept under a key made of all three, so
a second ``check`` of an unchanged tree, and ``advise`` over releases it has seen, read the
answer instead of parsing sglang again.

Why results and not parsed files (the obvious first idea, a cache of parsed ASTs): measured on the 28 files a
0.5.12 check parses (1.4 MB), ``ast.parse`` takes 0.58 s and unpickling the same ASTs 0.89 s, so
a cache of ASTs would be slower than no cache; and only 1.1 of the 25 MB parsed over the 16
releases 0.5.8..0.5.23 is a file identical to one of another release, so sharing parses
across releases saves almost nothing either. A cached probe costs one stat walk of the tree.

* the tree: every ``.py`` file's path, size and modification time (``Target.cache_key``), the
  way build tools decide a file is unchanged; an unpacked wheel or an edited checkout gets a
  new key, never a stale answer;
* the deployment: the full ``Facts`` (not the redacted report form), hashed;
* npudoctor: the path, size and modification time of every file of the installed package and
  its checks, and the Python version, so an upgrade or an edit of a check is a new cache.

A live run's outcome (``npudoctor.service.evaluate``) is a function of the same three and of the
Python environment the live child imports from (``npudoctor.service.evaluate.environment_fingerprint``: torch's version, the
modules stood in), so it is kept under those four: ``check``, ``fix``, ``fix --apply``, ``fix
--status`` and ``run`` of one deployment run the live depth once (each probes every check in the
deployment's scope, whatever it selects: ``npudoctor.service.evaluate.live_checks``).

Kept in ``$NPUDOCTOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/npudoctor`` (``~/.cache/npudoctor``), as
``static/<generation>/<entry>.pickle``: a generation (24 hex digits of npudoctor's code key) per
npudoctor version or edit. ``NPUDOCTOR_NO_CACHE=1`` turns it off. A probe that raises is never
kept. The entries are a ``PrivateStore``'s (``npudoctor.target.privatestore``): read back only when
this user wrote them and sealed with this user's key, reached never through a symlink, and pruning
deletes only generations and entries of its own naming, so a variable pointed at a folder of other
files costs none of them. An unreadable, damaged or untrusted entry is a miss; a cache directory
that cannot be written costs only the speed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from npudoctor.target.privatestore import MISS, PrivateStore, entry_name

NO_CACHE = "NPUDOCTOR_NO_CACHE"
T = TypeVar("T")


def cache_dir() -> Path:
    if os.environ.get("NPUDOCTOR_CACHE_DIR"):
        return Path(os.environ["NPUDOCTOR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "npudoctor"


def enabled() -> bool:
    return os.environ.get(NO_CACHE, "") in ("", "0")


def remembered(kind: str, tree: tuple[str, ...], compute: Callable[[], T], *inputs: str) -> T:
    """``compute()``, a function of one source tree (``Target.cache_key``: where, which version,
    ``tree_fingerprint``) and ``inputs`` only, from the cache when the same code already computed
    it for the same tree and inputs."""
    found = lookup(kind, tree, *inputs)
    if found is not MISS:
        return found  # type: ignore[return-value]
    value = compute()
    keep(value, kind, tree, *inputs)
    return value


def lookup(kind: str, tree: tuple[str, ...], *inputs: str) -> object:
    """The answer kept for ``kind`` on this tree and ``inputs`` (see ``remembered``), else ``MISS``:
    for a caller that computes the answer in steps (the live depth: a child started, other work
    done while it runs, its outcome collected) and ``keep``s it at the end."""
    if not enabled():
        return MISS
    return PrivateStore(cache_dir()).load(*_place(kind, tree, inputs))


def keep(value: object, kind: str, tree: tuple[str, ...], *inputs: str) -> None:
    """Keep ``value`` as the answer ``lookup`` gives for the same ``kind``, tree and ``inputs``."""
    if enabled() and PrivateStore(cache_dir()).save(value, *_place(kind, tree, inputs)):
        _prune()


def tree_fingerprint(package_dir: Path) -> str:
    """Path, size and modification time of every ``.py`` file below ``package_dir``, hashed."""
    return _fingerprint([package_dir], lambda name: name.endswith(".py"))


def _place(kind: str, tree: tuple[str, ...], inputs: tuple[str, ...]) -> tuple[str, str, str]:
    key = "\0".join((kind, *tree, *inputs)).encode("utf-8", "surrogatepass")
    return "static", _code_fingerprint(), entry_name(key)


KEPT_GENERATIONS = 4
GENERATION = re.compile(r"[0-9a-f]{24}")  # ``_code_fingerprint``'s: the only folders pruning touches


def _prune() -> None:
    """A new npudoctor (or an edit of it) starts a new generation of answers: only the
    ``KEPT_GENERATIONS`` most recent are kept (another installed version may still use one)."""
    PrivateStore(cache_dir()).prune(("static",), GENERATION, keep=_code_fingerprint(), kept=KEPT_GENERATIONS)


@lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """npudoctor's own code: its package, its checks and its catalog records (installed beside it
    or in ``checks/`` and ``catalog/``: an edited record's verdict must not come from the cache)."""
    import importlib.util

    roots = [Path(__file__).parent.parent]
    for package in ("npudoctor.checks", "npudoctor.catalog"):  # found, not imported: nothing runs here
        spec = importlib.util.find_spec(package)
        roots += [Path(p) for p in (spec.submodule_search_locations or [])]
    return _fingerprint(roots, lambda name: name.endswith((".py", ".json", ".yaml")), extra=sys.version)[:24]


def _fingerprint(roots: list[Path], wanted: Callable[[str], bool], extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for root in roots:
        stack = [str(root)]
        while stack:
            directory = stack.pop()
            with contextlib.suppress(OSError), os.scandir(directory) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            stack.append(entry.path)
                    elif wanted(entry.name):
                        try:
                            stat = entry.stat()
                        except OSError:  # a dangling link: the link itself, not the rest of the folder
                            stat = entry.stat(follow_symlinks=False)
                        digest.update(
                            f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode(
                                "utf-8", "surrogateescape"
                            )
                        )
    return digest.hexdigest()
