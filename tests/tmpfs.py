"""A real small or read-only file system for a test: tmpfs mounted on a folder (needs root)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(folder: Path, options: str):
    """Mount a tmpfs with mount `options` (e.g. "ro,size=1m") on `folder` (created) for the
    block; the test is skipped, with mount's reason, where this machine cannot mount one."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
