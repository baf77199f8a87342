"""Pages of the guard's event log (the JSON-lines file of `tracker.sinks.jsonl`), newest first,
read backwards from the end of the file in fixed blocks: a request never loads the log whole.

A page is at most `limit` events, optionally of one identity, that start before byte offset
`before` (None: the end of the file); with it comes the offset to ask for the next (older) page,
or None at the start of the file. A request reads at most `max_scan` bytes: a filter that matches
rarely returns a short page and the offset to go on from, not a long wait. A line that is not a JSON
object (a torn last line while the guard writes, a stray edit) is skipped; a line longer than
MAX_LINE is skipped without being held in memory whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

BLOCK = 64 * 1024
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


def read_page(path: Path, *, before: int | None = None, limit: int = 20, identity: str | None = None,
              max_scan: int = 4 << 20) -> tuple[list[dict], int | None]:
    """(events newest first, offset for the next page or None); see the module docstring. A
    missing log is an empty page."""
    limit = max(1, min(limit, MAX_LIMIT))
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return [], None
    with f:
        size = f.seek(0, 2)
        end = size if before is None else max(0, min(before, size))
        events: list[dict] = []
        line_end = end
        for start, line in _lines_backwards(f, end):
            if end - start > max_scan and line_end < end:  # at least one line per call: always progress
                return events, line_end
            line_end = start
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or (identity is not None and event.get("identity") != identity):
                continue
            events.append(event)
            if len(events) == limit:
                return events, start if start > 0 else None
        return events, None
