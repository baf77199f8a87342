"""Pages of the guard's event log (the JSON-lines files of `tracker.sinks.jsonl`: the log and its
rotated `backups`, tracker.files.generations), newest first, read backwards from the end of each
file in fixed blocks: a request never loads a file whole.

A page is at most `limit` events, optionally of one identity, that come before the cursor `before`
(None: the end of the newest file); with it comes the cursor to ask for the next (older) page, or
None at the start of the oldest file. A cursor is "<inode>:<mark>:<byte offset>": the file is
found by its inode, so a cursor stays good while the guard rotates the files under a reader, and
its mark (the CRC-32 of its first line, which never changes once written) must match, since a file
system may give a new file the inode of one the rotation removed (ext4 does); one whose file has
been rotated out, or whose offset is neither the start of one of its lines nor its end, gives an
empty last page. (A page that ends at the start of a file points at the next file's end: a rotated
file may end in a torn line, the guard having stopped mid-line before the rotation.)
A request reads at most `max_scan` bytes: a filter that matches rarely returns a short page and
the cursor to go on from, not a long wait. A line that is not a JSON object (a torn last line
while the guard writes, a stray edit) is skipped; a line longer than MAX_LINE is skipped without
being held in memory whole.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

from tracker.files import generations

BLOCK = 64 * 1024
MARK_BYTES = 4096  # a cursor's mark covers the file's first line up to here (an event line is well under 1 kB)
MAX_LINE = 64 * 1024  # an event line is well under 1 kB
MAX_LIMIT = 100


def _lines_backwards(f, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset of the line's first byte, the line without its newline) from the line that ends at
    or before `end`, backwards to the start of the file."""
    pos, tail = end, b""
    while pos > 0:
        size = min(BLOCK, pos)
        pos -= size
        f.seek(pos)
        parts = (f.read(size) + tail).split(b"\n")
        tail = parts[0]  # the start of this line is in an earlier block (or it is the first line)
        offset = pos + len(tail) + 1
        found = []
        for line in parts[1:]:
            found.append((offset, line))
            offset += len(line) + 1
        yield from reversed(found)
        if len(tail) > MAX_LINE:
            tail = b""  # its start is lost; the line is skipped as malformed
    if tail:
        yield 0, tail


def parse_cursor(text: str) -> tuple[int, int, int]:
    """(inode, mark, offset) of a page's `next` as `read_page` gave it ("<inode>:<mark>:<offset>");
    ValueError if it is not one."""
    fields = text.split(":")
    if len(fields) != 3 or not all(field.isdecimal() for field in fields):
        raise ValueError(f"not <inode>:<mark>:<offset>: {text!r}")
    inode, mark, offset = map(int, fields)
    return inode, mark, offset


def _mark(f) -> int:
    """The CRC-32 of the file's first line (at most MARK_BYTES of it)."""
    f.seek(0)
    return zlib.crc32(f.read(MARK_BYTES).split(b"\n", 1)[0])


def _cursor(f, inode: int, offset: int) -> str:
    return f"{inode}:{_mark(f)}:{offset}"


def _starts_a_line(f, offset: int, size: int) -> bool:
    """Whether `offset` is where a line of `f` (`size` bytes) starts, or its end."""
    if offset in (0, size):
        return True
    f.seek(offset - 1)
    return f.read(1) == b"\n"


def read_page(path: Path, *, backups: int = 0, before: str | None = None, limit: int = 20,
              identity: str | None = None, max_scan: int = 4 << 20) -> tuple[list[dict], str | None]:
    """(events newest first, the cursor of the next page or None); see the module docstring. A
    missing log is an empty page; so is a cursor whose file has been rotated out."""
    limit = max(1, min(limit, MAX_LIMIT))
    with ExitStack() as files:
        opened: list[tuple[BinaryIO, int, int]] = []  # (file, inode, where to read back from), newest first
        for name in generations(path, backups):
            try:
                handle: BinaryIO = files.enter_context(open(name, "rb"))
            except FileNotFoundError:
                continue
            inode = os.fstat(handle.fileno()).st_ino
            if any(inode == ino for _, ino, _ in opened):  # rotated between two opens: already here
                continue
            opened.append((handle, inode, handle.seek(0, 2)))
        if before is not None:
            inode, mark, offset = parse_cursor(before)
            at = next((i for i, (f, ino, size) in enumerate(opened)
                       if ino == inode and offset <= size and _mark(f) == mark and _starts_a_line(f, offset, size)), None)
            if at is None:  # its file was rotated out, or the cursor was not made from this one
                return [], None
            opened = [(opened[at][0], inode, offset), *opened[at + 1:]]
        events: list[dict] = []
        scanned = 0  # bytes of the files already read through
        for n, (f, ino, end) in enumerate(opened):
            line_end = end
            for start, line in _lines_backwards(f, end):
                if scanned + end - start > max_scan and (scanned or line_end < end):  # each call moves on
                    return events, _cursor(f, ino, line_end)
                line_end = start
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict) or (identity is not None and event.get("identity") != identity):
                    continue
                events.append(event)
                if len(events) == limit:
                    if start > 0:
                        return events, _cursor(f, ino, start)
                    return events, (_cursor(*opened[n + 1]) if n + 1 < len(opened) else None)
            scanned += end
        return events, None
