"""Test helper: a real Mosquitto broker (Debian's `mosquitto`) on a free local port, and a subscriber.

    broker = Broker(tmp_path)                                # plain, anonymous
    broker = Broker(tmp_path, users={"guard": "s3cret"})     # password file, no anonymous clients
    broker = Broker(tmp_path, tls=make_certs(tmp_path))      # TLS listener (client cert optional)
    broker.start(); broker.kill(); broker.restart(); broker.stop(); broker.freeze(); broker.thaw()

The broker listens on 127.0.0.1 only and logs to `<dir>/mosquitto.log`; with `persistent=True` it keeps
sessions and queued messages in `<dir>/mosquitto.db` across restarts (saved on a clean stop and after
every change), otherwise nothing. `start()` returns once the port accepts connections.

`Subscriber` is a paho client that records every message it receives, for assertions (tests may use
paho; the package imports it only in its sink). With `persistent=True` its session (subscriptions and
QoS 1 messages queued while it is away) lives on in the broker; `sync()` is a round trip through the
broker after which every message queued for it before has arrived (the broker keeps per-client order).
With `v5=True` it speaks MQTT 5 and records each message's properties too (e.g. the remaining
MessageExpiryInterval the broker forwards), in `properties`, index for index with `messages`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
WAIT_S = 20.0  # generous: the machine is shared; these are deadlines, not timing assertions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class Certs:
    """PEM files made by `make_certs`: a CA, a server certificate for 127.0.0.1/localhost, a client
    certificate, and a second CA that signed none of them (for a verification failure)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(directory: Path) -> Certs:
    """Make a throw-away CA and certificates with the openssl command (EC P-256: fast to make)."""
    d = Path(directory) / "certs"
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
                 "-subj", f"/CN=tracker test {ca}", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, ext in (("server", "server.ext"), ("client", "client.ext")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=d)
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return Certs(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
                 d / "other-ca.crt")


class Broker:
    def __init__(self, directory: Path, *, users: dict[str, str] | None = None, tls: Certs | None = None,
                 require_client_cert: bool = False, port: int | None = None, persistent: bool = False,
                 options: tuple[str, ...] = ()):
        """options: extra mosquitto.conf lines (e.g. "max_packet_size 1024")."""
        self.dir = Path(directory) / f"mosquitto-{id(self):x}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.tls = tls
        self.users = users or {}
        self.log = self.dir / "mosquitto.log"
        self.proc: subprocess.Popen | None = None
        lines = [f"listener {self.port} 127.0.0.1", f"log_dest file {self.log}", "log_type all",
                 "connection_messages true"]
        if persistent:
            lines += ["persistence true", f"persistence_location {self.dir}/", "autosave_interval 1",
                      "autosave_on_changes true"]
        else:
            lines.append("persistence false")
        if os.geteuid() == 0:
            lines.append("user root")  # otherwise it drops to `mosquitto`, who cannot read the temp files
        if self.users:
            passwd = self.dir / "passwd"
            passwd.touch(mode=0o600)
            for user, password in self.users.items():
                subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True,
                               capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        if tls:
            lines += [f"cafile {tls.ca}", f"certfile {tls.server_cert}", f"keyfile {tls.server_key}",
                      f"require_certificate {'true' if require_client_cert else 'false'}"]
        lines += list(options)
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> Broker:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.dir / "stderr.log", "ab"))
        deadline = time.monotonic() + WAIT_S
        while not _port_open(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: "
                                   f"{(self.dir / 'stderr.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not open port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.send_signal(signal.SIGCONT)  # a frozen broker acts on the SIGTERM once it runs
            try:
                self.proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: the broker vanishes without closing anything (a crash or power cut)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP: the broker keeps its sockets open but reads, answers and saves nothing more (until
        killed, or stopped: see stop)."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: a frozen broker runs on where it stopped, its connections as they were."""
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> Broker:
        self.stop()
        return self.start()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Subscriber:
    """A paho client subscribed to `topics` (QoS 1) that records (topic, payload, retain) tuples."""

    def __init__(self, broker: Broker, topics: list[str], *, persistent: bool = False, v5: bool = False):
        assert not (persistent and v5), "a persistent MQTT 5 session needs a session expiry: not made here"
        self.messages: list[tuple[str, bytes, bool]] = []
        self.properties: list = []  # paho Properties of each message (v5; None under MQTT 3.1.1)
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self.id = f"test-sub-{id(self):x}"
        self._topics = [*topics, f"test/sync/{self.id}"]
        self._syncs = 0
        if v5:
            self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.id, protocol=mqtt.MQTTv5)
        else:
            self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.id,
                                      protocol=mqtt.MQTTv311, clean_session=not persistent)
        if broker.users:
            user, password = next(iter(broker.users.items()))
            self.client.username_pw_set(user, password)
        if broker.tls:
            self.client.tls_set(ca_certs=str(broker.tls.ca), certfile=str(broker.tls.client_cert),
                                keyfile=str(broker.tls.client_key))
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.2, 1)
        self.client.connect_async("127.0.0.1", broker.port, keepalive=10)
        self.client.loop_start()
        if not self._subscribed.wait(WAIT_S):
            raise RuntimeError("test subscriber could not subscribe")

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if not reason_code.is_failure:
            client.subscribe([(t, 1) for t in self._topics])

    def _on_message(self, client, userdata, msg):
        with self._cond:
            self.messages.append((msg.topic, bytes(msg.payload), bool(msg.retain)))
            self.properties.append(getattr(msg, "properties", None))
            self._cond.notify_all()

    def wait_for(self, predicate, timeout: float = WAIT_S) -> list[tuple[str, bytes, bool]]:
        """Wait until predicate(messages) is true; returns a copy of the messages (raises on timeout)."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.messages), timeout):
                raise AssertionError(f"timed out; received {[(t, p[:80]) for t, p, _ in self.messages]}")
            return list(self.messages)

    def sync(self, timeout: float = WAIT_S) -> None:
        """Publish a marker to ourselves and wait for it: everything queued for us before has arrived."""
        self._syncs += 1
        marker = f"sync-{self._syncs}".encode()
        deadline = time.monotonic() + timeout
        while not self.client.is_connected():
            if time.monotonic() > deadline:
                raise AssertionError("test subscriber did not reconnect")
            time.sleep(0.05)
        self.client.publish(f"test/sync/{self.id}", marker, qos=1)
        self.wait_for(lambda m: any(p == marker for _, p, _ in m), max(0.1, deadline - time.monotonic()))

    def payloads(self, topic: str) -> list[bytes]:
        with self._cond:
            return [p for t, p, _ in self.messages if t == topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def wait_until(condition, timeout: float = WAIT_S, what: str = "condition") -> None:
    """Poll `condition()` until true (raises AssertionError after `timeout` s). For state that another
    thread changes after the broker has answered, e.g. the outbox row a PUBACK deletes with a commit."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def sink_config(broker: Broker, device: str = "pi1", **mqtt_keys):
    """A validated Config whose mqtt section points at `broker` (fast reconnects for tests)."""
    from tracker.config import parse_config

    section = {"enabled": True, "host": "127.0.0.1", "port": broker.port, "reconnect_min_s": 1,
               "reconnect_max_s": 2, "keepalive_s": 10, **mqtt_keys}
    return parse_config({"device": {"id": device, "name": f"Guard {device}"}, "mqtt": section})


def make_event(kind: str = "entered", track_id: int = 1, identity: str = "unknown", confidence: float = 0.0):
    """A tracker.types.Event with a fresh uuid4 id and plausible values."""
    import uuid

    from tracker.types import Box, Event

    return Event(id=uuid.uuid4().hex, kind=kind, track_id=track_id, identity=identity, confidence=confidence,
                 box=Box(10.0, 20.5, 64.0, 80.0), t_ns=time.monotonic_ns(), wall_time=time.time())
