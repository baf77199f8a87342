"""Run benchmark children (tracker.bench.child) and turn what happened to them into outcomes.

A child is reaped with wait4 so that its peak RSS is known even when it was killed, and it is
never left behind: on a timeout, on Ctrl-C or on any error of the parent it is killed (SIGKILL)
and reaped before the parent goes on.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tracker.bench.memory_cap import MemoryCap

# After the child closed its pipe it should exit promptly; runtimes with thread pools may need a moment.
_EXIT_GRACE_S = 30.0


class _TimedOut(Exception):
    pass


class _Child:
    """One `python -m tracker.bench.child` process and the pipe it answers on."""

    def __init__(self, job: dict, env: dict | None = None):
        # --memory-limit: a memory cgroup for the child's process tree, or RLIMIT_AS set by the child
        self.cap = MemoryCap(job["memory_limit_mb"]) if job.get("memory_limit_mb") else None
        if self.cap is not None:
            job = {**job, "memory_cap": self.cap.method}
        read_fd, write_fd = os.pipe()
        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tracker.bench.child", str(write_fd), json.dumps(job)],
                stdin=subprocess.DEVNULL,
                stdout=self._stderr,  # runtimes print on stdout too; keep both for the error tail
                stderr=self._stderr,
                pass_fds=(write_fd,),
                env=env,
            )
            if self.cap is not None:
                self.cap.add(self.proc.pid)
        except BaseException:
            os.close(read_fd)
            self._stderr.close()
            if self.cap is not None:
                self.cap.close()
            raise
        finally:
            os.close(write_fd)
        self._read_fd = read_fd
        self._buffer = b""
        self.returncode: int | None = None
        self.maxrss_kb: int | None = None

    def _try_reap(self, block: bool = False) -> bool:
        """Reap the child if it exited (with its rusage); True once reaped."""
        if self.returncode is not None:
            return True
        pid, status, usage = os.wait4(self.proc.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode  # so Popen never waits for it again
        self.maxrss_kb = usage.ru_maxrss // 1024 if sys.platform == "darwin" else usage.ru_maxrss
        return True

    def kill(self) -> None:
        """SIGKILL and reap (os.kill, not Popen.kill: that could reap it and lose the rusage)."""
        if self.returncode is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._try_reap(block=True)

    def _dispatch(self, chunk: bytes, on_message: Callable[[dict], None]) -> None:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.strip():
                on_message(json.loads(line))

    def communicate(self, timeout_s: float, on_message: Callable[[dict], None]) -> None:
        """Feed each message to on_message until the child closes the pipe and exits.

        Raises _TimedOut (child killed) when nothing arrives for timeout_s seconds. A child that
        exits while a grandchild still holds the pipe is noticed by polling once a second.
        """
        last = time.monotonic()
        while True:
            ready, _, _ = select.select([self._read_fd], [], [], 1.0)
            if ready:
                chunk = os.read(self._read_fd, 1 << 16)
                if not chunk:
                    break
                last = time.monotonic()
                self._dispatch(chunk, on_message)
            elif self._try_reap():
                break
            if time.monotonic() - last > timeout_s:
                self.kill()
                raise _TimedOut()
        deadline = time.monotonic() + _EXIT_GRACE_S
        while not self._try_reap():
            if time.monotonic() > deadline:
                self.kill()
                break
            time.sleep(0.02)

    def stderr_tail(self, lines: int = 3, chars: int = 400) -> str:
        """The last lines the child printed, joined on one line (for error details)."""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - 8192))
        text = self._stderr.read().decode("utf-8", "replace")
        tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(tail)[-chars:]

    def close(self) -> None:
        self.kill()
        os.close(self._read_fd)
        self._stderr.close()
        if self.cap is not None:
            self.cap.close()


def describe_exit(returncode: int | None) -> tuple[str, str]:
    """(cause, short reason) for a child that ended without reporting a result."""
    if returncode is None:
        return "did not exit", "did not exit"
    if returncode < 0:
        signum = -returncode
        if signum == signal.SIGKILL:
            return f"killed by signal {signum} (out of memory?)", f"signal {signum} (OOM?)"
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {signum} ({name})", f"signal {signum} ({name})"
    return f"exited with code {returncode} without a result", f"exit {returncode}"


@dataclass
class CellOutcome:
    """What one child did with one cell. status: "ok" | "failed" | "unavailable"."""

    status: str
    pass_ns: list[int] = field(default_factory=list)
    peak_rss_kb: int | None = None
    rss_method: str | None = None
    rss_processes: int | None = None  # processes whose peaks peak_rss_kb adds up (the worker's too)
    load_s: float | None = None
    versions: dict = field(default_factory=dict)
    error: str | None = None  # the cause, one line, e.g. "killed by signal 9 (out of memory?) during pass 3/100"
    reason: str | None = None  # the same, short enough for a table cell
    error_detail: str | None = None  # the cause plus the tail of the child's output


def run_cell(job: dict, timeout_s: float, on_progress: Callable[[int], None], env: dict | None = None) -> CellOutcome:
    """Run one cell in a fresh child; every way it can end becomes a CellOutcome.

    on_progress(done) is called with the number of passes done (warm-up included) as they finish.
    KeyboardInterrupt kills the child and propagates.
    """
    state: dict = {"loaded": None, "done": 0, "result": None, "error": None}

    def on_message(msg: dict) -> None:
        event = msg.get("event")
        if event == "loaded":
            state["loaded"] = msg
        elif event == "progress":
            state["done"] = msg["done"]
            on_progress(msg["done"])
        elif event in ("result", "error"):
            state[event] = msg

    def stage() -> str:
        if state["loaded"] is None:
            return "loading the backend"
        if state["done"] == 0:
            return "the warm-up pass"
        if state["done"] > job["passes"]:
            return "closing the backend"
        # progress is reported at most every 0.2 s: this is the earliest pass it can be
        return f"pass {state['done']}/{job['passes']}"

    child = _Child(job, env)
    try:
        try:
            child.communicate(timeout_s, on_message)
            cause = None
        except _TimedOut:
            cause = (f"timeout after {timeout_s:g} s without progress during {stage()}", f"timeout {timeout_s:g} s")
        loaded = state["loaded"] or {}
        outcome = CellOutcome(status="ok", load_s=loaded.get("load_s"), versions=loaded.get("versions", {}))
        result, error = state["result"], state["error"]
        if result is not None:  # measured; how the child then exited (or hung in close) does not matter
            outcome.pass_ns = result["pass_ns"]
            outcome.peak_rss_kb = result["peak_rss_kb"]
            outcome.rss_method = result["rss_method"]
            outcome.rss_processes = result["rss_processes"]
            return outcome
        outcome.status = "failed"
        if cause is None and error is not None:
            if error["unavailable"]:
                outcome.status = "unavailable"
            cause = (f"{error['type']}: {error['message']} during {error['stage']}", error["type"])
        elif cause is None:
            exit_cause, short = describe_exit(child.returncode)
            cause = (f"{exit_cause} during {stage()}", short)
        if child.cap is not None and child.cap.oom_kills():
            cause = (f"{cause[0]} (out of memory: the OOM killer ended a process of this cell at its "
                     f"{child.cap.method} limit of {child.cap.limit_mb} MB)", cause[1])
        outcome.error, outcome.reason = cause
        tail = child.stderr_tail()
        outcome.error_detail = f"{outcome.error}; output: {tail}" if tail else outcome.error
        outcome.peak_rss_kb = child.maxrss_kb  # what the child reached before it failed
        outcome.rss_method = "maxrss-at-exit"
        return outcome
    finally:
        child.close()


def run_quality(job: dict, timeout_s: float, env: dict | None = None) -> dict:
    """The int8 quality check of tracker.bench.child.run_quality in a fresh child: its
    measurements, or {"error": cause} when it failed."""
    got: dict = {}

    def on_message(msg: dict) -> None:
        if msg.get("event") in ("quality", "error"):
            got.update(msg)

    child = _Child(job, env)
    try:
        try:
            child.communicate(timeout_s, on_message)
        except _TimedOut:
            return {"error": f"timeout after {timeout_s:g} s without progress"}
        if got.get("event") == "quality" and child.returncode == 0:
            return {k: v for k, v in got.items() if k != "event"}
        if got.get("event") == "error":
            return {"error": f"{got['type']}: {got['message']} during {got['stage']}"}
        return {"error": describe_exit(child.returncode)[0]}
    finally:
        child.close()


@dataclass(frozen=True)
class Probe:
    """Whether a backend can run here and which precisions it offers."""

    available: bool
    reason: str | None
    precisions: tuple[str, ...]


def probe_backends(entries: list[tuple[str, list]], timeout_s: float = 300.0, env: dict | None = None) -> dict[str, Probe]:
    """check_runtime() of each (name, registry entry as a list), in a child so that importing a runtime can
    neither crash nor bloat the parent. A child that dies is restarted on the remaining names; the
    name it died on is reported unavailable with the cause."""
    probes: dict[str, Probe] = {}
    pending = list(entries)
    while pending:

        def on_message(msg: dict) -> None:
            if msg.get("event") == "probe":
                probes[msg["backend"]] = Probe(msg["available"], msg["reason"], tuple(msg["precisions"]))

        child = _Child({"mode": "probe", "backends": [list(e) for e in pending]}, env)
        try:
            try:
                child.communicate(timeout_s, on_message)
                cause = None if child.returncode == 0 else describe_exit(child.returncode)[0]
            except _TimedOut:
                cause = f"timeout after {timeout_s:g} s"
            remaining = [e for e in pending if e[0] not in probes]
            if remaining and cause is None:
                cause = "the probe ended early"
            if remaining:
                name = remaining[0][0]
                tail = child.stderr_tail()
                probes[name] = Probe(False, f"backend {name!r}: checking its runtime failed: {cause}" + (f" ({tail})" if tail else ""), ())
            pending = [e for e in pending if e[0] not in probes]
        finally:
            child.close()
    return probes
