"""tracker.child_process.ChildProcess leaves nothing behind: killing a child kills every process
below it, a grandchild in a session of its own too (as a benchmark cell's backend worker runs),
which a signal to the child's process group would miss."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

import tracker.child_process as child_process
from tracker.child_process import ChildProcess, one_line

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


def test_what_a_child_leaves_behind_when_it_dies_goes_at_close():
    """A child that crashes (a backend worker's, a benchmark cell's) leaves the helpers it started
    orphaned, no longer below it: closing it kills what is left of its process group (they held its
    output pipe, and its reader, open for good). A benchmark cell's child led no group of its own,
    and its helpers outlived it."""
    crashing = ("import subprocess, sys; "
                "h = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                "print(h.pid, flush=True); sys.exit(3)")
    child = ChildProcess([sys.executable, "-c", crashing])
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    helper = int(child.output_text().split()[0])
    assert child.returncode == 3 and alive(helper)
    child.close()
    deadline = time.monotonic() + 10
    while alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(helper)


def test_a_childs_output_in_an_error_line_is_printable():
    child = ChildProcess([sys.executable, "-c", "import sys; sys.stdout.write('bad\\x00 \\x1b[2J\\tend\\n')"])
    child.reap(30)
    assert child.output_tail() == "bad? ?[2J\tend"
    assert one_line(ValueError("a\x07b\nc")) == "a?b | c"


def test_a_child_whose_output_cannot_be_read_is_killed_and_the_failure_is_eagain(monkeypatch):
    """At the unit's TasksMax the reader thread cannot start: the child was started, left running
    and never reaped, and the caller saw a RuntimeError it does not retry."""
    started = []

    def recording_popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def no_thread(fd):
        raise RuntimeError("can't start new thread")

    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    monkeypatch.setattr(child_process, "OutputTail", no_thread)
    with pytest.raises(OSError) as refused:
        ChildProcess([sys.executable, "-c", "import time; time.sleep(60)"])
    assert refused.value.errno == errno.EAGAIN and "cannot start a thread" in str(refused.value)
    (popen,) = started
    assert popen.returncode == -9  # killed and reaped
