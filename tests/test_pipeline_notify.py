"""The guard under systemd's notify protocol: READY, WATCHDOG, STATUS and STOPPING arrive on a real
AF_UNIX datagram socket named by NOTIFY_SOCKET, as systemd would receive them (Type=notify)."""

from __future__ import annotations

import socket
import subprocess
import threading

from test_pipeline_e2e import isolated_env, tracker_command, write_config


def test_guard_reports_ready_watchdog_status_and_stopping(tmp_path):
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    messages: list[str] = []

    def drain():  # like systemd: read every datagram as it comes
        while (data := sock.recv(4096)) != b"":
            messages.append(data.decode())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    env = isolated_env(tmp_path)
    env.update(NOTIFY_SOCKET=address, WATCHDOG_USEC="50000")  # ping at least every 25 ms
    config = write_config(tmp_path, latency={"report_every_s": 1.0})
    run = subprocess.run([*tracker_command(), "--demo", "--frames", "80", "--config", str(config)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    sock.shutdown(socket.SHUT_RDWR)  # ends the reader's recv
    reader.join(5)
    lines = [line for m in messages for line in m.splitlines()]
    assert lines.count("READY=1") == 1
    # Pinged before READY (the loop's first turn) and after it, as the frames go on: the 79 frames
    # after READY (detection and inference) take some 20 times the 25 ms between pings here, so
    # a loop that stopped pinging once ready is caught on any machine (counts are not asserted).
    ready = lines.index("READY=1")
    assert "WATCHDOG=1" in lines[:ready] and "WATCHDOG=1" in lines[ready:], lines
    assert any(line.startswith("STATUS=") and "fps" in line for line in lines)
    assert lines.index("READY=1") < lines.index("STOPPING=1")
    assert lines[lines.index("READY=1") + 1].startswith("STATUS=synthetic scene")


def test_a_guard_waiting_on_an_absent_camera_says_ready_with_why(tmp_path, monkeypatch):
    """READY waits for the first frame only so long: a camera absent at boot is retried by a
    running guard, which the unit's start timeout would otherwise kill and restart."""
    import tracker.pipeline as pipeline
    import tracker.stages as stages
    from tracker import daemon
    from tracker.config import parse_config
    from tracker.sources import SourceUnavailable
    from tracker.sources.base import SourceBase

    class AbsentCamera(SourceBase):
        live = True
        description = "camera test-absent"

        def open(self) -> None:
            raise SourceUnavailable(f"{self.description}: /dev/video9 does not exist (camera absent or unplugged?)")

        def read(self):
            raise AssertionError("never opened")

    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(60)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.setattr(daemon, "_last_watchdog", float("-inf"))
    monkeypatch.setattr(pipeline, "READY_WITHOUT_FRAME_S", 0.5)
    monkeypatch.setattr(stages, "make_source", lambda *args, **kwargs: AbsentCamera())
    config = parse_config({"state_dir": str(tmp_path / "state"), "sinks": {"console": False}})
    guard = pipeline.Guard(config, stages.build_stages(config))
    thread = threading.Thread(target=guard.run, daemon=True)
    thread.start()
    try:
        ready = sock.recv(4096).decode()
    finally:
        guard.stop()
        thread.join(30)
        sock.close()
    assert ready.startswith("READY=1\nSTATUS=waiting for the first frame (retrying), camera test-absent"), ready
    assert guard.frames_processed == 0 and not thread.is_alive()


def test_ready_refused_by_a_full_queue_is_sent_again(tmp_path):
    """An AF_UNIX datagram queue holds a few messages: READY sent once into a full one was lost, and
    systemd would have killed the guard at TimeoutStartSec."""
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    queued = 0
    while True:  # as a busy PID 1 would leave it
        try:
            filler.sendto(b"X=1", socket.MSG_DONTWAIT, address)
        except BlockingIOError:
            break
        queued += 1
    env = isolated_env(tmp_path)
    env["NOTIFY_SOCKET"] = address
    config = write_config(tmp_path)
    guard = subprocess.Popen([*tracker_command(), "--demo", "--frames", "60", "--config", str(config)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first_event = guard.stdout.readline()  # frames were processed: READY was tried by now
        assert "entered" in first_event, first_event
        sock.settimeout(60)
        lines = []
        while "READY=1" not in lines:
            lines += sock.recv(4096).decode().splitlines()
        assert lines.count("X=1") == queued
    finally:
        guard.stdout.read()
        assert guard.wait(timeout=300) == 0
        sock.close()
        filler.close()
