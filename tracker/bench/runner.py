"""Run benchmark children (tracker.bench.child) and turn what happened to them into outcomes.

A child is a `tracker.child_process.ChildProcess`, as the backend worker's is: reaped with wait4
so that its peak RSS is known even when it was killed, its output kept as a bounded tail for the
error detail, and never left behind: on a timeout, on Ctrl-C or on any error of the parent it is
killed (SIGKILL) and reaped before the parent goes on.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tracker.bench.memory_cap import MemoryCap
from tracker.child_process import POLL_S, ChildProcess, describe_exit, short_exit

# After the child closed its pipe it should exit promptly; runtimes with thread pools may need a moment.
_EXIT_GRACE_S = 30.0
PROBE_TIMEOUT_S = 300.0  # without a message, for importing every runtime (TensorFlow takes seconds on a Pi)
_TAIL_LINES, _TAIL_CHARS = 3, 400  # the child's output in an error detail


class _TimedOut(Exception):
    pass


class _Child:
    """One `python -m tracker.bench.child` process and the pipe it answers on."""

    def __init__(self, job: dict):
        # --memory-limit: a memory cgroup for the child's process tree, or RLIMIT_AS set by the child
        self.cap = MemoryCap(job["memory_limit_mb"]) if job.get("memory_limit_mb") else None
        if self.cap is not None:
            job = {**job, "memory_cap": self.cap.method}
        read_fd, write_fd = os.pipe()
        try:
            self.process = ChildProcess([sys.executable, "-m", "tracker.bench.child", str(write_fd), json.dumps(job)],
                                        pass_fds=(write_fd,))
            if self.cap is not None:
                self.cap.add(self.process.pid)
        except BaseException:
            os.close(read_fd)
            if self.cap is not None:
                self.cap.close()
            raise
        finally:
            os.close(write_fd)
        self._read_fd = read_fd
        self._buffer = b""

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
            ready, _, _ = select.select([self._read_fd], [], [], POLL_S)
            if ready:
                chunk = os.read(self._read_fd, 1 << 16)
                if not chunk:
                    break
                last = time.monotonic()
                self._dispatch(chunk, on_message)
            elif self.process.exited_with_nothing_to_read(self._read_fd):
                break
            if time.monotonic() - last > timeout_s:
                self.process.kill()
                raise _TimedOut()
        self.process.reap(_EXIT_GRACE_S)

    def ended(self) -> str:
        """How the child ended, for a child that reported no result."""
        returncode = self.process.returncode
        # a cell's SIGKILL is most likely the OOM killer (at --memory-limit, or the machine's)
        cause = describe_exit(returncode, sigkill="out of memory?")
        return f"{cause} without a result" if returncode is not None and returncode >= 0 else cause

    def output_tail(self) -> str:
        """The last lines the child printed, joined on one line (for error details)."""
        return self.process.output_tail(_TAIL_LINES, _TAIL_CHARS)

    def close(self) -> None:
        self.process.close()
        os.close(self._read_fd)
        if self.cap is not None:
            self.cap.close()


@dataclass
class CellOutcome:
    """What one child did with one cell. status: "ok" | "failed" | "unavailable"."""

    status: str
    pass_ns: list[int] = field(default_factory=list)
    warmup_passes: int | None = None  # untimed passes before pass_ns
    peak_rss_kb: int | None = None
    rss_method: str | None = None
    rss_processes: int | None = None  # processes whose peaks peak_rss_kb adds up (the worker's too)
    load_s: float | None = None
    versions: dict = field(default_factory=dict)
    interrupted: bool = False  # the run was stopped (Ctrl-C, SIGTERM) after the cell was measured: record it, then stop
    error: str | None = None  # the cause, one line, e.g. "killed by signal 9 (out of memory?) during pass 3/100"
    reason: str | None = None  # the same, short enough for a table cell
    error_detail: str | None = None  # the cause plus the tail of the child's output


def run_cell(job: dict, timeout_s: float, on_progress: Callable[[int], None]) -> CellOutcome:
    """Run one cell in a fresh child; every way it can end becomes a CellOutcome.

    on_progress(done) is called with the number of passes done (warm-up included) as they finish.
    KeyboardInterrupt kills the child and propagates, unless the child had sent its result (it was
    closing its backend): then the outcome comes back with `interrupted` set, for the caller to
    record before it stops.
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
            return "the warm-up passes"
        if state["done"] > job["passes"]:
            return "closing the backend"
        # progress is reported at most every 0.2 s: this is the earliest pass it can be
        return f"pass {state['done']}/{job['passes']}"

    child = _Child(job)
    interrupted = False
    try:
        try:
            child.communicate(timeout_s, on_message)
            cause = None
        except _TimedOut:
            cause = (f"timeout after {timeout_s:g} s without progress during {stage()}", f"timeout {timeout_s:g} s")
        except KeyboardInterrupt:
            if state["result"] is None:
                raise
            interrupted, cause = True, None
        loaded = state["loaded"] or {}
        outcome = CellOutcome(status="ok", load_s=loaded.get("load_s"), versions=loaded.get("versions", {}),
                              interrupted=interrupted)
        result, error = state["result"], state["error"]
        if result is not None:  # measured; how the child then exited (or hung in close) does not matter
            outcome.pass_ns = result["pass_ns"]
            outcome.warmup_passes = result["warmup_passes"]
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
            cause = (f"{child.ended()} during {stage()}", short_exit(child.process.returncode))
        if child.cap is not None and child.cap.oom_kills():
            cause = (f"{cause[0]} (out of memory: the OOM killer ended a process of this cell at its "
                     f"{child.cap.method} limit of {child.cap.limit_mb} MB)", cause[1])
        outcome.error, outcome.reason = cause
        tail = child.output_tail()
        outcome.error_detail = f"{outcome.error}; output: {tail}" if tail else outcome.error
        outcome.peak_rss_kb = child.process.maxrss_kb  # what the child reached before it failed
        outcome.rss_method = "maxrss-at-exit"
        return outcome
    finally:
        child.close()


def run_job(job: dict, timeout_s: float, event: str, on_progress: Callable[[int], None] | None = None,
            stage: Callable[[int | None], str] | None = None) -> dict:
    """A quality check or a runoff (tracker.bench.child) in a fresh child: the fields of its
    `event` message, or {"error": cause} when it sent none.

    on_progress(done) gets the child's progress messages; stage(done), given the last `done`
    (None before any), says what the child was doing for a cause the child could not report
    itself (a signal, a timeout). A message sent before the child then hung, crashed, failed to
    close or was stopped counts, as a cell's result does; stopped (KeyboardInterrupt) after it,
    the fields come back with "interrupted": True, for the caller to record before it stops.
    """
    got: dict = {}
    state: dict = {"done": None}

    def on_message(msg: dict) -> None:
        kind = msg.get("event")
        if kind == "progress":
            state["done"] = msg["done"]
            if on_progress is not None:
                on_progress(msg["done"])
        elif kind == event or (kind == "error" and got.get("event") != event):  # an error in close() voids nothing
            got.clear()
            got.update(msg)

    child = _Child(job)
    interrupted = False
    try:
        try:
            child.communicate(timeout_s, on_message)
            cause = None
        except _TimedOut:
            cause = f"timeout after {timeout_s:g} s without progress"
        except KeyboardInterrupt:
            if got.get("event") != event:
                raise
            interrupted, cause = True, None
        if got.get("event") == event:
            return {k: v for k, v in got.items() if k != "event"} | ({"interrupted": True} if interrupted else {})
        if got.get("event") == "error":
            return {"error": f"{got['type']}: {got['message']} during {got['stage']}"}
        cause = cause or child.ended()
        return {"error": f"{cause} during {stage(state['done'])}" if stage is not None else cause}
    finally:
        child.close()


@dataclass(frozen=True)
class Probe:
    """Whether a backend can run here and which precisions it offers."""

    available: bool
    reason: str | None
    precisions: tuple[str, ...]


def probe_backends(entries: list[tuple[str, list]]) -> dict[str, Probe]:
    """check_runtime() of each (name, registry entry as a list), in a child so that importing a runtime can
    neither crash nor bloat the parent. A child that dies is restarted on the remaining names; the
    name it died on is reported unavailable with the cause."""
    probes: dict[str, Probe] = {}
    pending = list(entries)
    while pending:

        def on_message(msg: dict) -> None:
            if msg.get("event") == "probe":
                probes[msg["backend"]] = Probe(msg["available"], msg["reason"], tuple(msg["precisions"]))

        child = _Child({"mode": "probe", "backends": [list(e) for e in pending]})
        try:
            try:
                child.communicate(PROBE_TIMEOUT_S, on_message)
                cause = None if child.process.returncode == 0 else child.ended()
            except _TimedOut:
                cause = f"timeout after {PROBE_TIMEOUT_S:g} s"
            remaining = [e for e in pending if e[0] not in probes]
            if remaining and cause is None:
                cause = "the probe ended early"
            if remaining:
                name = remaining[0][0]
                tail = child.output_tail()
                probes[name] = Probe(False, f"backend {name!r}: checking its runtime failed: {cause}" + (f" ({tail})" if tail else ""), ())
            pending = [e for e in pending if e[0] not in probes]
        finally:
            child.close()
    return probes
