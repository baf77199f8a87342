"""Clean shutdown: SIGTERM, SIGINT or SIGHUP (a closed terminal) to a running `tracker --demo` stops it promptly, exit 0, with
its logs flushed (every line of the latency log and the events file is complete JSON), and every
person it announced gets their `left` (nobody is followed any more).

The demo runs as the product does (the scene paced at its 10 fps, 400 frames = 40 s); the signal
comes once someone has entered (about 2 s in). The wait for the exit is bounded (5 s) so a guard that
ignores the signal fails the test instead of hanging it; how fast it stops is not asserted (shared
machines), but the time is printed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from test_pipeline_e2e import LATENCY_KEYS, isolated_env, tracker_command, write_config


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
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the demo did not stop within 5 s of {sig.name}; stderr tail: {err[-2000:]}")
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
    assert 5 <= len(rows) < 400  # it stopped early, on the signal
    assert all(list(r) == LATENCY_KEYS for r in rows)
    assert [r["seq"] for r in rows] == sorted({r["seq"] for r in rows})
    events = events_file.read_text(encoding="utf-8")
    assert events.endswith("\n")
    events = [json.loads(line) for line in events.splitlines()]
    entered = sorted(e["track_id"] for e in events if e["kind"] == "entered")
    left = [e for e in events if e["kind"] == "left"]
    assert entered and sorted(e["track_id"] for e in left) == entered
    assert all(e["seq"] == rows[-1]["seq"] for e in left)  # stamped with the last frame processed
