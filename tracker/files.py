"""Writing a file so that a reader, a crash or a full disk never leaves half of it, and reading
the project's .npz archives so that a damaged one is one known kind of error.

`atomic_write(path, content, mode=0o644)`: the content goes to a temporary file beside `path` (same
file system, so the final rename is atomic; a symbolic link is written through, to the file it
names), is flushed to the disk (fsync), gets its permission bits, and replaces `path` by rename.
On any failure (a full disk, an error in `content`) the temporary file is removed and `path` is as
it was; the exception propagates (OSError for the disk, and for a `path` that is a device, a FIFO
or a socket, never replaced).

content: bytes, or a function that writes the file at the temporary path it is given (for writers
that want a path, such as numpy's or TensorFlow's). The temporary name keeps `path`'s suffix, since
some writers decide the format by it (numpy appends .npz otherwise).
mode: 0o644 for what is meant to be shared (models, reports, caches), 0o600 for the household's
private files (enrolments).

`load_npz(path)`: numpy's archive of `path`, to read in a `with` block; any failure to open it or
to read a member from it is one of `NPZ_UNREADABLE`.

`LineFile(path, what, max_bytes=, backups=)`: a log the guard appends lines to as it runs (events,
latency), where a full disk must neither stop the guard nor leave half a line, rotated by size so
that its disk use is bounded (see the class); `generations(path, backups)` names its files.

`file_sha256(path)`: a file's sha256, read in blocks. `open_regular_file(path)`: a file opened for
reading that refuses a FIFO rather than wait on it; `read_regular_file(path, limit)`: a small one
read whole, up to a bound.

`make_writable_folder(folder)`, `probe_writable(folder)`: a folder that work will write into, made
(or not) and proven writable before the work starts (OSError otherwise; each caller words it as its
option's error); `nearest_existing(path)` finds what it would be made in.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

log = logging.getLogger(__name__)

# What opening an .npz or reading one of its members raises for a file that is not a whole archive
# of the expected members: missing, unreadable or not a regular file (OSError), not a zip archive
# (zipfile.BadZipFile: empty, another format, a single .npy array, no directory, a bad CRC), a
# member that is not a whole array (EOFError, ValueError), a member absent (KeyError).
NPZ_UNREADABLE = (OSError, EOFError, zipfile.BadZipFile, ValueError, KeyError)
ROTATION_RETRY_NS = 60 * 10**9  # after a rotation the file system refused, the next try


def file_sha256(path: Path) -> str:
    """The sha256 of the file at `path`, hex; read in blocks of 1 MB, so a file of any size takes
    no more memory (OSError if it cannot be read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def probe_writable(folder: Path) -> None:
    """Create a file in `folder` and let it go at once (an unnamed one where the file system can:
    a kill in between leaves nothing behind); OSError if it cannot be (no permission for this user,
    a read-only file system, not a folder). A file system too full for the work may still pass:
    an empty file takes no room."""
    with tempfile.TemporaryFile(dir=folder):
        pass


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest of its parents that exists (what a folder would be made in, or the
    file that stands in the way of it); "/" if none can be looked at."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return candidate
        except OSError:
            continue
    return Path("/")


def make_writable_folder(folder: Path) -> None:
    """Make `folder` with its parents if absent and `probe_writable` it: OSError if either fails."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    probe_writable(folder)


def load_npz(path: Path) -> np.lib.npyio.NpzFile:
    """numpy's lazily read archive of the .npz at `path` (close it: a `with` block; it closes the
    file); one of NPZ_UNREADABLE if it is not one. The file is opened as `open_regular_file` does:
    a FIFO named like a person's file hung the guard's start (np.load opened it and waited)."""
    file = open_regular_file(path)
    try:
        return np.lib.npyio.NpzFile(file, own_fid=True)
    except zipfile.BadZipFile:  # an empty file, a .npy, a text, one cut short: "File is not a zip file"
        file.close()
        raise zipfile.BadZipFile("not a whole .npz archive") from None
    except BaseException:
        file.close()
        raise


def _temporary_name(name: str) -> str:
    """`.<stem>.<pid>.<random>.tmp<suffix>` for the file `name`, its stem (then its suffix) cut so
    that the name stays within the file systems' 255 bytes, as `name` is."""
    stem, suffix = os.path.splitext(name)
    tag = f".{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    room = 255 - 1 - len(os.fsencode(tag))
    if len(os.fsencode(suffix)) > room // 2:  # a name that is mostly suffix: neither part kept whole
        suffix = ""
    stem = os.fsencode(stem)[: room - len(os.fsencode(suffix))].decode(errors="ignore")
    return f".{stem}{tag}{suffix}"


def atomic_write(path: Path, content: bytes | memoryview | Callable[[Path], None], *, mode: int = 0o644) -> None:
    """See the module docstring."""
    path = Path(path)
    _refuse_special(path)
    if path.is_symlink():  # written through, as `cp` and `>` do: the rename would have replaced the link
        path = Path(os.path.realpath(path))
    tmp = path.with_name(_temporary_name(path.name))
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


def _refuse_special(path: Path) -> None:
    """OSError if `path`, or the file a link there names, is there and is not a regular file: the
    rename would put a file in place of a device, a FIFO or a socket (`tracker convert --out
    /dev/null` as root replaced the device node; `/dev/stdout` is a link to one)."""
    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:  # absent, or a link to nothing: the rename makes the file
        return
    if not stat.S_ISREG(kind):
        raise OSError(errno.EEXIST, f"{path} exists and is not a regular file")


def open_regular_file(path: Path) -> BinaryIO:
    """The regular file at `path` opened for reading (binary). OSError if it cannot be, or is not a
    regular file: it is opened without blocking, so a FIFO is refused, never waited on for a writer
    for ever (a config, a password file or a pairs file that is one hung the command)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise OSError(errno.EISDIR if stat.S_ISDIR(kind) else errno.EINVAL,
                          "is a directory" if stat.S_ISDIR(kind) else "not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path` (`open_regular_file`), at most `limit` of them;
    OSError EFBIG for one that holds more, found by its size before anything is read. As many
    bytes are read as the size said (and one more): a file still growing is read cut there, or,
    one byte past `limit`, refused."""
    with open_regular_file(path) as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        data = file.read(size + 1)  # (the buffer as large as the file says it is, not as the limit)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


def generations(path: Path, backups: int) -> list[Path]:
    """A rotated log's files, newest first: `path`, `path.1`, ... `path.<backups>`."""
    path = Path(path)
    return [path] + [path.with_name(f"{path.name}.{i}") for i in range(1, backups + 1)]


class LineFile:
    """Whole lines appended to the file at `path` (made, with its folder, if absent), each in one
    write(2), so a crash loses at most the line being written. A line that cannot be written whole
    (a full disk, a device that refuses it) is taken back out of the file, counted in `lost` and
    never raised: the first of a run of failures is logged as an error naming `what`, the return to
    writing as a warning with the count. A file found ending in part of a line (a power cut while
    its last line was written, or a line that could not be taken back) gets that line's newline
    first, so that the next line is one of its own, not glued to the fragment and lost with it. A
    file deleted from under it, its folder too, is made again at the next line, not written on
    unseen (a file renamed, as logrotate does by default, is written on under its new name). After
    `close()` (or a line that could not be taken back), the next line opens the file again. One
    fstat(2) a line. Not thread-safe (one writer).

    With `max_bytes`, a line that would take the file past it (and is not the file's first) rotates
    the files first (`generations`: each is renamed one along, the oldest goes, the line starts
    `path` afresh), so at most `backups` + 1 files of about `max_bytes` each are kept. A rotation the
    file system refuses is logged once and tried again a minute later (not on every line); the lines
    go on into the current file meanwhile."""

    def __init__(self, path: Path, what: str, *, max_bytes: int | None = None, backups: int = 0) -> None:
        self.path, self.what = Path(path), what
        self.max_bytes, self.backups = max_bytes, backups
        self.lost = 0  # lines not written, over the file's life
        self._lost_in_run = 0  # since the last line that was written
        self._next_rotation_ns = 0  # after a failed rotation, the next try (monotonic ns); 0: none failed
        self._fd: int | None = None
        self._size = 0  # the file's bytes as of the last line (0 while it is not open)
        self._torn = False  # the open file ends in part of a line: the next line starts with its newline
        self._open()

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT  # (read: its last byte, to find a torn line)
        try:
            fd = self._fd = os.open(self.path, flags, 0o644)
        except FileNotFoundError:  # no folder: not made yet, or removed by hand while the guard runs
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = self._fd = os.open(self.path, flags, 0o644)
        self._size = os.fstat(fd).st_size
        self._torn = self._size > 0 and os.pread(fd, 1, self._size - 1) != b"\n"
        if self._torn:
            log.warning("%s: %s ends in part of a line (stopped while it was written); the next line starts on a "
                        "line of its own", self.what, self.path)
        return fd

    def append(self, line: str) -> bool:
        """Write `line` (ending in a newline) whole, or not at all; True if written."""
        data = line.encode("utf-8")
        if (self.max_bytes is not None and self._size + len(data) > self.max_bytes and self._size > 0
                and time.monotonic_ns() >= self._next_rotation_ns):
            self._rotate()
        start = None
        try:
            fd = self._fd if self._fd is not None else self._open()
            found = os.fstat(fd)
            if found.st_nlink == 0:  # removed: its lines would go nowhere anyone looks
                log.warning("%s: %s was removed; writing a new one", self.what, self.path)
                self.close()
                fd = self._open()
                found = os.fstat(fd)
            start = found.st_size
            whole = b"\n" + data if self._torn else data
            written = os.write(fd, whole)
            if written != len(whole):  # the disk filled up inside the line
                raise OSError(f"{written} of {len(whole)} bytes written")
        except OSError as err:
            self._take_back(start)
            self.lost += 1
            self._lost_in_run += 1
            if self._lost_in_run == 1:
                log.error("%s: cannot write %s (%s); lines are lost until it can (counted)", self.what, self.path,
                          err.strerror or err)
            return False
        self._size = start + written
        self._torn = False
        if self._lost_in_run:
            log.warning("%s: writing %s again; %d line(s) lost meanwhile", self.what, self.path, self._lost_in_run)
            self._lost_in_run = 0
        return True

    def _rotate(self) -> None:
        self.close()
        files = generations(self.path, self.backups)
        try:
            if self.backups == 0:
                self.path.unlink(missing_ok=True)
            for older, newer in reversed(list(zip(files, files[1:]))):
                if older.exists():
                    os.replace(older, newer)
        except OSError as err:
            if not self._next_rotation_ns:
                log.error("%s: cannot rotate %s (%s); it grows past %d bytes until it can", self.what, self.path,
                          err.strerror or err, self.max_bytes)
            self._next_rotation_ns = time.monotonic_ns() + ROTATION_RETRY_NS
        else:
            self._next_rotation_ns = 0

    def _take_back(self, start: int | None) -> None:
        """Cut a partly written line off the end, or, if that fails too, close the file (the next
        line opens it again)."""
        if self._fd is None or start is None:
            return
        try:
            if os.fstat(self._fd).st_size > start:
                os.ftruncate(self._fd, start)
        except OSError:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._size = 0
            os.close(fd)

    def end(self) -> None:
        """The owner's last close: a run of failures that never ended (a disk full until exit) is
        logged with its count, which the return to writing would otherwise have said."""
        if self._lost_in_run:
            log.warning("%s: %d line(s) not written to %s since it could not be written", self.what,
                        self._lost_in_run, self.path)
            self._lost_in_run = 0
        self.close()
