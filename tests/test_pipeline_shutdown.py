"""Clean shutdown: SIGTERM, SIGINT or SIGHUP (a closed terminal) to a running `tracker --demo`
stops it promptly, exit 0, with its logs flushed (every line of the latency log and the events
file is complete JSON), and every person it announced gets their `left` (nobody is followed any
more); and one guard per state_dir.

The demo runs as the product does (the scene paced at its 10 fps, 400 frames = 40 s); the signal
comes once someone has entered (about 2 s in). How fast it stops is not asserted (shared machines),
but the time is printed; what is asserted is that it stopped on the signal: before the scene's last
frame, with a `left` for everyone announced. A guard that ignores the signal runs the scene to its
end and fails those checks; the wait for the exit is bounded (60 s, well past the scene's 40 s) only
so that one that hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_pipeline_e2e import LATENCY_KEYS, isolated_env, tracker_command, write_config

from tracker.cli import DEMO_FRAMES

HANG_S = 60  # a hang guard, not a speed limit: the scene would end by itself in 40 s


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_stops_the_demo_cleanly(tmp_path, sig):
    config = write_config(tmp_path, source={"realtime": True}, sinks={"console": False})
    latency = tmp_path / "state" / "demo" / "latency.jsonl"
    events_file = tmp_path / "state" / "demo" / "events.jsonl"
    proc = subprocess.Popen([*tracker_command(), "--demo", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=isolated_env(tmp_path), cwd=tmp_path)
    try:
        wait_for(lambda: events_file.exists() and '"entered"' in events_file.read_text() or proc.poll() is not None,
                 120, "the demo to announce someone")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        sent = time.monotonic()
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the demo hung: still running {HANG_S} s after {sig.name}; stderr tail: {err[-2000:]}")
        print(f"{sig.name}: stopped {time.monotonic() - sent:.2f} s after the signal")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    text = latency.read_text(encoding="utf-8")
    assert text.endswith("\n")  # the last line was written whole
    rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) >= 5
    assert rows[-1]["seq"] < DEMO_FRAMES - 1  # it stopped on the signal, not at the scene's end
    assert all(list(r) == LATENCY_KEYS for r in rows)
    assert [r["seq"] for r in rows] == sorted({r["seq"] for r in rows})
    events = events_file.read_text(encoding="utf-8")
    assert events.endswith("\n")
    events = [json.loads(line) for line in events.splitlines()]
    entered = sorted(e["track_id"] for e in events if e["kind"] == "entered")
    left = [e for e in events if e["kind"] == "left"]
    assert entered and sorted(e["track_id"] for e in left) == entered
    assert all(e["seq"] == rows[-1]["seq"] for e in left)  # stamped with the last frame processed


def test_a_second_guard_on_the_same_state_dir_is_refused_while_the_first_runs(tmp_path):
    """The service and a guard started by hand on one state_dir would write over each other's logs,
    outbox and snapshots: the second is refused in one line naming the first's pid (exit 2), and
    once the first has stopped (its lock released with it) a guard starts there again."""
    config = write_config(tmp_path, source={"realtime": True}, sinks={"console": False}, web={"enabled": False})
    latency = tmp_path / "state" / "demo" / "latency.jsonl"
    command = [*tracker_command(), "--demo", "--config", str(config)]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=isolated_env(tmp_path), cwd=tmp_path)
    try:
        wait_for(lambda: latency.exists() or first.poll() is not None, 120, "the first guard's first frame")
        assert first.poll() is None, first.communicate()[1][-2000:]
        lines_before = latency.read_text().count("\n")
        second = subprocess.run(command, capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path,
                                timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert f"another guard is running on it (pid {first.pid})" in second.stderr, second.stderr
        assert first.poll() is None  # the first goes on, its log still growing
        wait_for(lambda: latency.read_text().count("\n") > lines_before, 30, "the first guard's next frames")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    third = subprocess.run([*command, "--frames", "3"], capture_output=True, text=True, env=isolated_env(tmp_path),
                           cwd=tmp_path, timeout=120)
    assert third.returncode == 0, third.stderr[-2000:]


def test_a_stop_while_a_backend_worker_starts_ends_its_wait(tmp_path, monkeypatch, caplog):
    """A SIGTERM while build_stages waited for a worker's start-up (seconds on a Pi 3) waited it
    out, past the unit's TimeoutStopSec, and systemd killed the guard."""
    import logging
    import os
    import signal
    import threading

    import tracker.stages as stages
    from tracker.backends.worker import WorkerBackend
    from tracker.config import load_config
    from tracker.model.spec import default_model
    from tracker.pipeline import run_guard

    tests = Path(__file__).resolve().parent

    def never_ready(*args, worker_options, **kwargs):
        # the signal once run_guard's handlers are in place: the stages are being built
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return WorkerBackend("never-ready", default_model(), target="worker_faults:NeverReady",
                             env={"PYTHONPATH": str(tests)}, ready_timeout_s=60, stop=worker_options["stop"])

    monkeypatch.setattr(stages, "create_backend", never_ready)
    config = load_config(write_config(tmp_path, backend={"name": "caffe-openblas-dl", "worker": True}))
    with caplog.at_level(logging.INFO, logger="tracker.pipeline"):
        assert run_guard(config) == 0
    assert "guard: stopped while starting" in caplog.text and "the guard is stopping" in caplog.text, caplog.text
    assert "timeout after" not in caplog.text


def test_the_guard_leaves_a_signal_handler_python_did_not_install_alone(tmp_path, monkeypatch):
    """Python reports a handler it did not install (a program embedding it set its own) as None, and
    cannot put it back: run_guard's own copy of the install and restore replaced it all the same, and
    its restore called signal.signal(SIGHUP, None), a TypeError at the end of every run."""
    from tracker.config import load_config
    from tracker.pipeline import run_guard

    real_signal, real_getsignal = signal.signal, signal.getsignal
    foreign = {signal.SIGHUP}  # what Python would say of SIGHUP until it installs a handler of its own

    def getsignal(signum):
        return None if signum in foreign else real_getsignal(signum)

    def set_signal(signum, handler):
        previous = real_signal(signum, handler)
        if signum in foreign:
            foreign.discard(signum)
            return None
        return previous

    monkeypatch.setattr(signal, "getsignal", getsignal)
    monkeypatch.setattr(signal, "signal", set_signal)
    before = real_getsignal(signal.SIGHUP)
    config = load_config(write_config(tmp_path, source={"frames": 3}, sinks={"console": False}, web={"enabled": False}))
    assert run_guard(config) == 0
    assert signal.SIGHUP in foreign and real_getsignal(signal.SIGHUP) is before  # never touched
