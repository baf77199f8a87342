"""Whether a process a test started (or its child started) still runs, read from /proc."""

from __future__ import annotations


def running(pid: int) -> bool:
    """The process exists and has not exited (an orphan's zombie waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
