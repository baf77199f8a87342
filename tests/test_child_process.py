"""tracker.child_process.ChildProcess leaves nothing behind: killing a child kills every process
below it, a grandchild in a session of its own too (as a benchmark cell's backend worker runs),
which a signal to the child's process group would miss."""

from __future__ import annotations

import os
import sys
import time

from tracker.child_process import ChildProcess

# The child starts a grandchild in a new session that would sleep for a minute, says its pid, waits.
CHILD = (
    "import subprocess, sys, time; "
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
    "print(g.pid, flush=True); time.sleep(60)"
)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_killing_a_child_kills_its_grandchild_in_another_session_too():
    child = ChildProcess([sys.executable, "-c", CHILD])
    deadline = time.monotonic() + 60
    while not child.output_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(child.output_text().split()[0])
    assert alive(grandchild) and os.getsid(grandchild) != os.getsid(child.pid)
    child.kill()
    assert child.returncode == -9
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:  # init reaps it
        time.sleep(0.05)
    assert not alive(grandchild)
    child.close()
