"""Child processes, both sides: what the two supervisors share and what their children share.

Two parts of the product run work in a child process so that a crash, a signal, an out-of-memory
or a hang ends the child, not the caller: the backend worker (`tracker.backends.worker`, its child
`tracker.backends.worker_child`) and the benchmark (`tracker.bench.runner`, its child
`tracker.bench.child`). Each speaks its own protocol over its own pipe; this module is what they
have in common (ARCHITECTURE.md, section 2).

Parent side: `ChildProcess` starts a child with its output (stdout and stderr together) kept as a
bounded tail (`OutputTail`, the last 16 KiB: never on disk, never unbounded), reaps it with wait4
so that its peak RSS is known even when it was killed, and kills (SIGKILL) it and every process
below it or left in its session's group, then reaps it, on request, so that no child nor grandchild
is left behind (a benchmark cell's worker runs in a session of its own, which a signal to the cell's
group would miss);
`describe_exit` and `short_exit` say in words how a child ended.
Child side: `one_line` (an error as one line for the parent), `RUNTIME_MODULES` and
`loaded_versions` (which runtimes the child's backend loaded, at which versions), `exit_with_parent`
(a child never outlives its caller).

The standard library only, and Python >= 3.9: the worker's child imports this module on whatever
interpreter runs it (the MXNet environment's, say), before it says hello and before numpy.
"""

from __future__ import annotations

import collections
import errno
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

POLL_S = 1.0  # liveness check while waiting on a child's pipe (a grandchild could hold the pipe open)
_TAIL_BYTES = 16384
_OUTPUT_GRACE_S = 5.0  # a reaped child's output reader gets this long to reach the end of its output
# Runtimes whose versions a child reports when its backend loaded them into the child.
RUNTIME_MODULES = ("numpy", "cv2", "tensorflow", "ai_edge_litert", "onnxruntime", "onnx", "torch", "mxnet")


def printable(text: str) -> str:
    """`text` with every character that is not printable (a NUL, a terminal's escape, a bell) but
    a tab as "?": a child's output goes into the guard's log lines, where the journal would keep a
    line with a control character as a blob and a terminal would act on an escape."""
    return "".join(c if c.isprintable() or c == "\t" else "?" for c in text)


# ---------------------------------------------------------------------- parent side


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"


def describe_exit(returncode: int | None, *, sigkill: str = "SIGKILL: out of memory, or killed by another process") -> str:
    """How a child ended, in words: "exited with code N", "killed by signal N (NAME)", or "did not
    exit" (returncode None: not reaped). A SIGKILL is what the kernel's OOM killer sends, so its
    parentheses say what it most likely means where the caller runs children: `sigkill`."""
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        signum = -returncode
        if signum == signal.SIGKILL:
            return f"killed by signal {signum} ({sigkill})"
        return f"killed by signal {signum} ({_signal_name(signum)})"
    return f"exited with code {returncode}"


def short_exit(returncode: int | None) -> str:
    """The same, short enough for a table cell: "exit N", "signal N (NAME)", "signal 9 (OOM?)"."""
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        signum = -returncode
        return f"signal {signum} ({'OOM?' if signum == signal.SIGKILL else _signal_name(signum)})"
    return f"exit {returncode}"


class OutputTail:
    """Reads a child's output pipe on a thread, keeping only the last 16 KiB; closes the pipe at
    its end (once the child and every process that inherited the pipe closed it)."""

    def __init__(self, fd: int):
        self._fd = fd
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="child-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while chunk := os.read(self._fd, 4096):
                with self._lock:
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    while self._size - len(self._chunks[0]) >= _TAIL_BYTES:
                        self._size -= len(self._chunks.popleft())
        except OSError:
            pass
        finally:
            os.close(self._fd)

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks)[-_TAIL_BYTES:].decode("utf-8", "replace")

    def tail(self, lines: int = 4, chars: int = 600) -> str:
        """The last non-empty lines, joined on one line (for error messages), printable."""
        kept = [line.strip() for line in self.text().splitlines() if line.strip()][-lines:]
        return printable(" | ".join(kept)[-chars:])

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class ChildProcess:
    """One child process, its output kept by an OutputTail, reaped with wait4.

    argv, pass_fds, env: as for subprocess.Popen; stdin is /dev/null, stdout and stderr go to the
    tail (runtimes print on both). Raises OSError when it cannot be started (EAGAIN, the child killed
    and reaped, when no thread can be started to read its output).
    The child runs in a session of its own, leading its process group: a Ctrl-C at the terminal
    reaches the caller alone, which closes the child as it stops; and `kill` (and `close`) also kill
    what is left of that group, the processes it started that outlived it (orphaned when it died,
    they are no longer below it; they would hold its output pipe open, and its reader with it).
    `pid`; once reaped (`poll`, `reap`, `kill`), `returncode` (as Popen's: -N for signal N) and
    `maxrss_kb`, the child's peak RSS in KiB, known even when it was killed.
    """

    def __init__(self, argv: list[str], *, pass_fds: tuple[int, ...] = (), env: dict | None = None):
        out_r, out_w = os.pipe()
        try:
            self._popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                                           pass_fds=pass_fds, env=env, start_new_session=True)
        except BaseException:
            os.close(out_r)
            raise
        finally:
            os.close(out_w)
        self.pid = self._popen.pid
        self.returncode: int | None = None
        self.maxrss_kb: int | None = None
        try:
            self._output = OutputTail(out_r)
        except RuntimeError as err:  # no thread to read it (TasksMax reached): the child was left running
            os.close(out_r)
            self.kill()
            raise OSError(errno.EAGAIN, f"cannot start a thread to read its output ({err})") from None

    def _wait4(self, block: bool) -> bool:
        """Reap the child if it exited (with its rusage); True once reaped."""
        if self.returncode is not None:
            return True
        pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        self.returncode = os.waitstatus_to_exitcode(status)
        self._popen.returncode = self.returncode  # so Popen never waits for it again
        self.maxrss_kb = usage.ru_maxrss // 1024 if sys.platform == "darwin" else usage.ru_maxrss
        return True

    def poll(self) -> int | None:
        """Reap the child if it exited: its returncode, None while it runs."""
        self._wait4(block=False)
        return self.returncode

    def exited_with_nothing_to_read(self, fd: int) -> bool:
        """True if the child has exited (reaping it) and `fd`, a pipe it writes to, holds nothing
        to read. A child may write its last message and exit between a caller's wait on the pipe
        and that caller's check of poll(): the message is still in the pipe, and the caller must
        read it before it reports the child gone. The pipe's end is not waited for: a grandchild
        may hold it open."""
        return self.poll() is not None and not select.select([fd], [], [], 0)[0]

    def kill(self) -> None:
        """SIGKILL the child and every process below it, and reap the child (os.kill, not
        Popen.kill: that could reap it and lose the rusage); init reaps the others. Then SIGKILL
        what is left of the child's process group (its id is not reused while a member lives, so
        this reaches no stranger)."""
        if self.returncode is None:
            for pid in [*_descendants(self.pid), self.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._wait4(block=True)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # nobody left in it
            pass

    def reap(self, grace_s: float) -> None:
        """Give the child up to grace_s to exit, then kill it; it is reaped on return."""
        deadline = time.monotonic() + grace_s
        while not self._wait4(block=False):
            if time.monotonic() > deadline:
                self.kill()
                break
            time.sleep(0.02)

    def output_text(self) -> str:
        """The child's recent output (stdout and stderr, the last 16 KiB), for diagnostics."""
        return self._output.text()

    def output_tail(self, lines: int = 4, chars: int = 600) -> str:
        """The last non-empty lines the child printed, joined on one line (for error messages).
        Once the child is reaped, the reader first gets a moment to reach the end of the output,
        so that a child's last words before it died are in."""
        if self.returncode is not None:
            self._output.join(_OUTPUT_GRACE_S)
        return self._output.tail(lines, chars)

    def close(self) -> None:
        """Kill the child if it still runs, reap it, and let the reader finish its output."""
        self.kill()
        self._output.join(_OUTPUT_GRACE_S)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from the parent of each in /proc/<pid>/stat (Linux; [] where
    there is no /proc). A process started after the scan is not in it."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdecimal():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])  # after "(comm)": state, then ppid
        parents.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        below = parents.get(queue.pop(), [])
        found += below
        queue += below
    return found


# ---------------------------------------------------------------------- child side


def exit_with_parent(parent: int) -> None:
    """Start a thread that ends this process (os._exit(1)) within POLL_S once `parent` is no longer
    its parent: a child runs in a session of its own, so a caller killed outright (SIGKILL, the OOM
    killer) sends it no signal, and a child inside a hung or long call lived on, reparented to init,
    until the call ended (an hour, or never). Raises RuntimeError if no thread can be started."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def one_line(err: BaseException) -> str:
    """The error for the parent: its message's lines joined by " | ", at most 2000 characters (a
    message is bounded like everything else), printable, or its class name when it has no message."""
    text = " | ".join(part.strip() for part in str(err).splitlines() if part.strip())
    return printable(text[:2000]) or err.__class__.__name__


def loaded_versions(backend: Any) -> dict:
    """{module: version} of the RUNTIME_MODULES this process has loaded, then what the backend says
    it runs (its `runtime_versions`: a backend behind a worker runs on another interpreter)."""
    versions = {}
    for name in RUNTIME_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__version__", None):
            versions[name] = str(module.__version__)
    versions.update(getattr(backend, "runtime_versions", None) or {})
    return versions
