"""File-system states a test puts a directory in."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def unwritable(directory: Path) -> Iterator[None]:
    """``directory`` in which no entry can be made, removed or renamed: mode 0555, or for root (who
    writes through any mode) the immutable attribute; the test is skipped where neither holds."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    with immutable(directory):
        yield


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` with the immutable attribute: no write, rename or removal, by root either (who
    writes through any mode); the test is skipped where the file system does not keep it."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
