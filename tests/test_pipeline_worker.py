"""The guard survives its backend worker being killed mid-run: the frames whose faces were in
flight are counted as dropped in the latency log, every frame is still tracked and logged, and
inference resumes once the worker has been restarted (real child process, real kill -9)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from tracker.config import parse_config
from tracker.pipeline import Guard
from tracker.stages import build_stages


def test_killed_worker_is_restarted_and_in_flight_frames_count_as_dropped(tmp_path):
    frames = 240
    config = parse_config({
        "state_dir": str(tmp_path / "state"),
        "source": {"kind": "synthetic", "frames": frames, "realtime": False},
        "backend": {"name": "caffe-openblas-dl", "worker": True},
        "batcher": {"max_batch": 1},
        "sinks": {"console": False},
    })
    guard = Guard(config, build_stages(config, realtime=False))
    result = {}
    runner = threading.Thread(target=lambda: result.update(code=guard.run()))
    runner.start()
    deadline = time.monotonic() + 120
    while guard.frames_processed < 40 and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    restarting = guard.stages.backend.backend  # MirrorMean (the shipped card's embedding) over the RestartingBackend
    first_pid = restarting.backend.pid
    # Restart at the next call: the unpaced source can run out within the default 0.5 s back-off,
    # and the run would then end before any restart (the back-off is tested in test_worker.py).
    restarting.backoff_initial_s = 0.0
    os.kill(first_pid, signal.SIGKILL)
    runner.join(300)
    assert not runner.is_alive() and result["code"] == 0

    assert restarting.restarts >= 1 and "signal 9" in restarting.last_cause
    assert guard.state()["backend_restarts"] == restarting.restarts  # (the MQTT state's)

    rows = [json.loads(line) for line in (tmp_path / "state" / "latency.jsonl").read_text().splitlines()]
    assert [r["seq"] for r in rows] == list(range(frames))  # every frame tracked and logged, in order
    lost = guard.inference_lost
    assert lost >= 1 and rows[-1]["dropped"] == lost  # an unpaced synthetic source drops nothing itself
    first_drop = next(i for i, r in enumerate(rows) if r["dropped"] > 0)
    assert any(r["batch"] > 0 and r["infer_ms"] > 0 for r in rows[first_drop + 1:])  # inference resumed


def test_a_guard_stopped_while_its_worker_hangs_ends_the_call_at_once(tmp_path, caplog):
    """SIGTERM (here `stop()`, which the handler calls) while the guard waits on a frozen worker:
    the call ends at the next poll, not at its 24 s deadline (systemd's TimeoutStopSec is 10 s)."""
    config = parse_config({
        "state_dir": str(tmp_path / "state"),
        "source": {"kind": "synthetic", "frames": 100_000, "realtime": False},
        "backend": {"name": "caffe-openblas-dl", "worker": True},
        "batcher": {"max_batch": 1},
        "sinks": {"console": False},
    })
    guard = Guard(config, build_stages(config, realtime=False))
    runner = threading.Thread(target=guard.run)
    runner.start()
    deadline = time.monotonic() + 120
    while guard.frames_processed < 20 and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = guard.stages.backend.backend.backend  # MirrorMean over the RestartingBackend over the worker
    # The next call freezes the worker before it sends its request, as a hung runtime would: frozen
    # between two calls instead, a reply it had already written could still end the call waited on.
    sent_to_a_frozen_worker = threading.Event()
    call = worker._call

    def freeze_then_call(*args, **kwargs):
        os.kill(worker.pid, signal.SIGSTOP)
        sent_to_a_frozen_worker.set()
        return call(*args, **kwargs)

    worker._call = freeze_then_call
    assert sent_to_a_frozen_worker.wait(60) and runner.is_alive()
    guard.stop()
    runner.join(60)
    assert not runner.is_alive()
    assert "stopped waiting for the infer of 2 inputs (the guard is stopping)" in caplog.text
