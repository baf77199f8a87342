"""End to end through the real CLI: `tracker --demo` (the synthetic scene, the real pipeline and
backend) publishing to a real Mosquitto; SIGTERM ends it cleanly with availability going offline, and
every event the guard logged locally arrived over MQTT."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml
from mosquitto import Broker, Subscriber

REPO = Path(__file__).resolve().parents[2]
EVENT_KEYS = {"schema", "id", "kind", "track_id", "identity", "confidence", "box", "ts", "seq", "media_time_s"}


def test_demo_guard_publishes_events_and_goes_offline_on_sigterm(tmp_path):
    with Broker(tmp_path / "broker") as broker:
        sub = Subscriber(broker, ["tracker/e2e/#", "homeassistant/device/#"])
        events_file = tmp_path / "events.jsonl"
        config = tmp_path / "tracker.yaml"
        config.write_text(yaml.safe_dump({
            "device": {"id": "e2e", "name": "End to end"},
            "state_dir": str(tmp_path / "state"),
            "sinks": {"console": False, "jsonl": str(events_file)},
            "mqtt": {"enabled": True, "host": "127.0.0.1", "port": broker.port, "state_interval_s": 1},
        }))
        guard = subprocess.Popen([sys.executable, "-m", "tracker", "--demo", "--frames", "100000",
                                  "--config", str(config)], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            # the scene's people walk in: at least two events over MQTT, then stop the guard
            messages = sub.wait_for(lambda m: sum(t == "tracker/e2e/events" for t, _, _ in m) >= 2, timeout=300)
            assert ("tracker/e2e/availability", b"online") in [(t, p) for t, p, _ in messages]
            guard.send_signal(signal.SIGTERM)
            out, err = guard.communicate(timeout=60)
        finally:
            if guard.poll() is None:
                guard.kill()
                guard.communicate()
        assert guard.returncode == 0, err[-3000:]
        assert "Traceback" not in err
        messages = sub.wait_for(lambda m: m[-1][:2] == ("tracker/e2e/availability", b"offline"))

        received = [json.loads(p) for t, p, _ in messages if t == "tracker/e2e/events"]
        for event in received:
            assert set(event) == EVENT_KEYS and event["schema"] == 1
            assert event["kind"] in ("entered", "identified", "left")
        logged = [json.loads(line) for line in events_file.read_text().splitlines()]
        assert len(logged) >= 2
        # every event the guard produced reached the broker (close() flushes before going offline)
        assert {e["id"] for e in logged} <= {e["id"] for e in received}
        states = [json.loads(p) for t, p, _ in messages if t == "tracker/e2e/state"]
        assert states and states[-1]["backend"] and "latency_ms" in states[-1] and "fps" in states[-1]
        assert any(t == "homeassistant/device/tracker_e2e/config" for t, _, _ in messages)
        assert any(t == "tracker/e2e/snapshot" and p[:2] == b"\xff\xd8" for t, p, _ in messages)  # a JPEG
        sub.close()

    # The outbox is empty: nothing left for the next start.
    outbox = tmp_path / "state" / "demo" / "outbox.sqlite3"
    with sqlite3.connect(outbox) as db:
        assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0


def test_killed_guard_goes_offline_by_its_last_will(tmp_path):
    with Broker(tmp_path / "broker") as broker:
        sub = Subscriber(broker, ["tracker/crash/availability"])
        config = tmp_path / "tracker.yaml"
        config.write_text(yaml.safe_dump({
            "device": {"id": "crash"}, "state_dir": str(tmp_path / "state"), "sinks": {"console": False},
            "mqtt": {"enabled": True, "host": "127.0.0.1", "port": broker.port},
        }))
        guard = subprocess.Popen([sys.executable, "-m", "tracker", "--demo", "--frames", "100000",
                                  "--config", str(config)], cwd=REPO, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            sub.wait_for(lambda m: [p for _, p, _ in m] == [b"online"], timeout=300)
            guard.send_signal(signal.SIGKILL)  # no chance to say goodbye: the broker must say it
            guard.wait(60)
            messages = sub.wait_for(lambda m: len(m) >= 2)
            assert [p for _, p, _ in messages] == [b"online", b"offline"]
        finally:
            if guard.poll() is None:
                guard.kill()
                guard.wait()
            sub.close()
