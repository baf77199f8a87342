"""Writing a file so that a reader, a crash or a full disk never leaves half of it, and reading
the project's .npz archives so that a damaged one is one known kind of error.

`atomic_write(path, content, mode=0o644)`: the content goes to a temporary file beside `path` (same
file system, so the final rename is atomic), is flushed to the disk (fsync), gets its permission
bits, and replaces `path` by rename. On any failure (a full disk, an error in `content`) the
temporary file is removed and `path` is as it was; the exception propagates (OSError for the disk).

content: bytes, or a function that writes the file at the temporary path it is given (for writers
that want a path, such as numpy's or TensorFlow's). The temporary name keeps `path`'s suffix, since
some writers decide the format by it (numpy appends .npz otherwise).
mode: 0o644 for what is meant to be shared (models, reports, caches), 0o600 for the household's
private files (enrolments).

`load_npz(path)`: numpy's archive of `path`, to read in a `with` block; any failure to open it or
to read a member from it is one of `NPZ_UNREADABLE`.
"""

from __future__ import annotations

import os
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

# What opening an .npz or reading one of its members raises for a file that is not a whole archive
# of the expected members: missing or unreadable (OSError), empty (EOFError), truncated or damaged
# (zipfile.BadZipFile: no directory, a bad CRC), another format or a single .npy array
# (ValueError, also raised by load_npz), a member absent (KeyError).
NPZ_UNREADABLE = (OSError, EOFError, zipfile.BadZipFile, ValueError, KeyError)


def load_npz(path: Path) -> np.lib.npyio.NpzFile:
    """numpy's lazily read archive of the .npz at `path` (close it: a `with` block); one of
    NPZ_UNREADABLE if it is not one (np.load returns a bare array for a .npy file)."""
    data = np.load(path)
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError("a single array (.npy), not an .npz archive")
    return data


def atomic_write(path: Path, content: bytes | memoryview | Callable[[Path], None], *, mode: int = 0o644) -> None:
    """See the module docstring."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        if callable(content):
            content(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            with open(tmp, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
