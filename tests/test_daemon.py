"""sd_notify helpers against a real AF_UNIX datagram socket bound by the test (what systemd does)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tracker import daemon

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setattr(daemon, "_last_watchdog", float("-inf"))
    yield sock
    sock.close()


def received(sock) -> list[bytes]:
    """Every datagram waiting on the socket (without blocking after the first)."""
    out = [sock.recv(4096)]
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096))
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
        sock.settimeout(10)
    return out


def test_ready_status_stopping(notify_socket):
    assert daemon.ready("camera up,\nbackend caffe-openblas-dl")
    assert daemon.status("9.8 fps, 2 tracks")
    assert daemon.stopping()
    assert received(notify_socket) == [
        b"READY=1\nSTATUS=camera up, backend caffe-openblas-dl",  # the newline cannot start a new field
        b"STATUS=9.8 fps, 2 tracks",
        b"STOPPING=1",
    ]


def test_watchdog_is_rate_limited_to_half_the_interval(notify_socket, monkeypatch):
    assert not daemon.watchdog()  # no WATCHDOG_USEC: systemd armed no watchdog
    monkeypatch.setenv("WATCHDOG_USEC", str(3600 * 10**6))  # an hour: the 2nd call is surely within 30 min
    assert daemon.watchdog_interval_s() == 3600.0
    assert daemon.watchdog()
    assert not daemon.watchdog()
    assert received(notify_socket) == [b"WATCHDOG=1"]
    monkeypatch.setattr(daemon, "_last_watchdog", float("-inf"))
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # armed for another process: not us
    assert daemon.watchdog_interval_s() is None and not daemon.watchdog()
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert daemon.watchdog()
    assert received(notify_socket) == [b"WATCHDOG=1"]


def test_abstract_namespace_socket(monkeypatch):
    name = f"tracker-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert daemon.ready()
        assert sock.recv(4096) == b"READY=1"


def test_no_notify_socket_means_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    assert not daemon.ready("x") and not daemon.status("x") and not daemon.stopping() and not daemon.watchdog()


def test_a_vanished_socket_is_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert daemon.ready() is False  # nothing raised: a lost notification must not stop the guard


def test_notifications_from_a_child_process_environment(notify_socket, tmp_path):
    """As under systemd: the variables come from the environment of a freshly started process."""
    env = {**os.environ, "WATCHDOG_USEC": str(3600 * 10**6), "PYTHONPATH": str(REPO)}
    code = "from tracker import daemon; daemon.ready('up'); daemon.watchdog(); daemon.watchdog(); daemon.stopping()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert received(notify_socket) == [b"READY=1\nSTATUS=up", b"WATCHDOG=1", b"STOPPING=1"]
