"""``npudoctor fix --apply``: record the enabled fixes where every sglang process finds them.

The record is one small distribution, ``npudoctor-fixes-activation``, written into a
directory on the interpreter's path (by default the site-packages of this interpreter,
where sglang is installed): a ``.dist-info`` with ``METADATA``, a ``RECORD`` (so ``pip
uninstall npudoctor-fixes-activation`` also removes it), the plan (``npudoctor-fixes.json``)
and an ``entry_points.txt`` that registers ``npudoctor.activation:sglang_plugin`` in
sglang's plugin group ``sglang.srt.plugins``. sglang 0.5.11+ loads that group in every
scheduler process (``load_plugins()``), so the fixes are applied there; ``SGLANG_PLUGINS``
can select the plugin by its name, ``npudoctor``.

The directory is written beside its final name and renamed into place, so a reader sees
the old record or the new one, never a half-written one. ``remove`` deletes exactly the
files the record lists, leaving the directory as it was before ``--apply``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

from npudoctor.errors import InputError
from npudoctor.plan import DIST_NAME, PLAN_FILE, plan_of

DIST_INFO = "npudoctor_fixes_activation-1.dist-info"
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "npudoctor"
SITE_ENV = "NPUDOCTOR_SITE"  # where the record goes instead of this interpreter's site-packages


def site_dir(site: Path | None = None) -> Path:
    """The directory that holds the record: ``site``, ``$NPUDOCTOR_SITE``, else site-packages."""
    chosen = site or os.environ.get(SITE_ENV) or sysconfig.get_paths()["purelib"]
    return Path(chosen)


def write(plan: dict, site: Path | None = None) -> Path:
    """Write (or replace) the record with ``plan``; returns its directory."""
    directory = site_dir(site)
    if not directory.is_dir():
        raise InputError(
            f"{directory}: not a directory (set --site or {SITE_ENV} to a directory on sys.path)"
        )
    final = directory / DIST_INFO
    try:
        staging = Path(tempfile.mkdtemp(prefix=".npudoctor-", dir=directory))
    except OSError as error:
        raise InputError(
            f"cannot write to {directory} ({error.strerror}): use --site DIR with a writable directory "
            f"that sglang's processes have on sys.path (PYTHONPATH), or `npudoctor run`"
        ) from None
    try:
        files = {
            "METADATA": f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 1\n"
            "Summary: npudoctor runtime fixes enabled by `npudoctor fix --apply`\n",
            "entry_points.txt": f"[{PLUGIN_GROUP}]\n{PLUGIN_NAME} = npudoctor.activation:sglang_plugin\n",
            PLAN_FILE: json.dumps(plan, indent=2, sort_keys=True) + "\n",
            "INSTALLER": "npudoctor\n",
        }
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / "RECORD").write_text(_record(files), encoding="utf-8")
        staging.chmod(0o755)
        if final.exists():
            retired = Path(tempfile.mkdtemp(prefix=".npudoctor-old-", dir=directory))
            os.replace(final, retired / DIST_INFO)
            os.replace(staging, final)
            shutil.rmtree(retired)
        else:
            os.replace(staging, final)
    except OSError as error:  # a full disk, a record directory someone made unwritable
        shutil.rmtree(staging, ignore_errors=True)
        raise InputError(f"cannot write the fix record in {directory} ({error.strerror or error})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def remove(site: Path | None = None) -> Path | None:
    """Delete the record; returns its former path, or None when there was none."""
    final = site_dir(site) / DIST_INFO
    if not final.exists() and not final.is_symlink():
        return None
    if final.is_symlink() or not final.is_dir():
        raise InputError(f"{final} is not the directory npudoctor writes; not removed")
    try:
        # the names --apply writes: a record whose plan or RECORD is damaged still goes, anything
        # someone else put there stays
        unexpected = sorted({p.name for p in final.iterdir()} - set(_FILES))
        if unexpected:
            raise InputError(
                f"{final} holds files npudoctor did not write ({', '.join(unexpected)}); not removed"
            )
        shutil.rmtree(final)
    except OSError as error:
        raise InputError(f"cannot remove {final} ({error.strerror})") from None
    return final


def read(site: Path | None = None) -> dict | None:
    """The recorded plan document in ``site`` (None when nothing is recorded there)."""
    path = site_dir(site) / DIST_INFO / PLAN_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise InputError(
            f"{path}: unreadable fix record ({error}); `npudoctor fix --revert` removes it"
        ) from None
    try:
        plan_of(document)  # what sglang's processes would read
    except ValueError as error:
        raise InputError(f"{path}: not a fix record ({error}); `npudoctor fix --revert` removes it") from None
    return document


_FILES = ("METADATA", "entry_points.txt", PLAN_FILE, "INSTALLER", "RECORD")


def _record(files: dict[str, str]) -> str:
    lines = []
    for name, text in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        lines.append(f"{DIST_INFO}/{name},sha256={digest},{len(text.encode())}")
    lines.append(f"{DIST_INFO}/RECORD,,")
    return "\n".join(lines) + "\n"
