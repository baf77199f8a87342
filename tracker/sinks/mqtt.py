"""MQTT sink: the guard's events, state, snapshot and availability over MQTT (docs/ARCHITECTURE.md, section 4).

The only module that imports paho-mqtt (2.x, CallbackAPIVersion.VERSION2).

    sink = MqttSink(config.mqtt, config.device, config.resolved_state_dir())
    sink.publish_event(event, snapshot_jpeg)   # durable at once; sent in the background
    sink.publish_state(state)                  # cheap: remembers the latest numbers
    sink.close()                               # flush events, last state (<= flush_timeout_s), offline

Topics, schema 1 (`<base>` = `<mqtt.prefix>/<device.id>`):
    <base>/availability  retained QoS 1  "online" on every connect; "offline" on close() and, as the
                                         Last Will, when the broker loses the guard (crash, kill -9)
    <base>/events        QoS 1           tracker.events.event_payload(event) as JSON
    <base>/state         retained QoS 0  JSON {schema, ts, <the pipeline's state dict>, events_dropped,
                                         outbox_pending, too_large, inbound_ignored}; MQTT 5 expires it
                                         after 3 intervals, 60 s at least
    <base>/snapshot      retained QoS 0  the latest event's face as JPEG bytes
    <discovery>/device/<node>/config     retained QoS 1  Home Assistant discovery (homeassistant.py);
                                         with mqtt.discovery off, empty: the device is removed

Delivery (never lose an event): `publish_event` writes the event to the SQLite outbox (outbox.py) and
returns; a publisher thread hands pending events to paho in outbox order, at most `max_inflight` at
a time, and deletes each one when its PUBACK arrives (on_publish with its message id). On every
(re)connect paho's own unacknowledged copies are dropped and the publisher starts again from the
oldest pending event, so the outbox is the single queue that survives outages and restarts; a
consumer may see an event twice (de-duplicate by `id`) but never miss one the outbox kept. A full
or failing disk does not stop delivery: the outbox then keeps its events in memory (outbox.py).

MQTT 5 is the default (`mqtt.protocol: v5`) because its PUBACK carries a reason code: a broker that
refuses an event (e.g. an ACL) says so, and the event is counted and logged instead of being taken for
delivered, as MQTT 3.1.1 would have to; its CONNACK/DISCONNECT reasons also name wrong credentials and
a second guard using the same client id. `v311` is there for old brokers.

Limits (MQTT 5): the broker's CONNACK Maximum Packet Size is never exceeded (what does not fit is
not sent, counted per topic in state.too_large and said once; an event that can never fit is dropped
from the outbox and counted) and its Receive Maximum bounds every QoS 1 publish in flight (events,
availability, discovery: one window, kept here because paho cannot change its own on a
connection). The guard's CONNECT announces CLIENT_MAX_PACKET, so the broker drops larger messages
for it; on 3.1.1, an oversize inbound message is ignored and counted (state.inbound_ignored).

Failures never stop the guard: an unreachable broker, refused credentials or a TLS failure are logged
once per outage with the cause, and paho retries with exponential back-off (reconnect_min_s ..
reconnect_max_s) while events wait in the outbox. Setup mistakes (an unreadable password file, a bad
certificate file) raise ConfigError at construction.

A slow link: state and snapshot are QoS 0, which nothing acknowledges, so paho would queue every one
of them, without bound (1 MB snapshots grew the guard by megabytes a minute). At most one of each
waits in paho's out-queue: a new one is published only once paho has written the one before (its
on_publish), and meanwhile only the latest is kept: a newer state or snapshot replaces one that has
not gone yet, and the ones between are never sent (the retained topics show the latest anyway).
Events are not affected: they wait in the outbox, at most `max_inflight` of them in paho.
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import ssl
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from tracker.config import DeviceConfig, MQTTConfig
from tracker.errors import BackendUnavailable, ConfigError
from tracker.events import SCHEMA_VERSION, event_payload
from tracker.passwords import read_secret
from tracker.sinks.homeassistant import discovery_payload, discovery_topic
from tracker.sinks.outbox import Outbox
from tracker.types import Event

log = logging.getLogger(__name__)

CREDENTIAL_NAME = "mqtt-password"  # the file name under $CREDENTIALS_DIRECTORY (systemd LoadCredential=)
MAX_SNAPSHOT_BYTES = 1 << 20  # one face JPEG is a few kB; refuse anything absurd rather than hold it
_EXPIRE_EVERY_S = 60.0  # how often the age bound of the outbox is applied while running
_ERROR_LOG_EVERY_S = 60.0  # a publisher error that lasts is logged again at most this often
_STABLE_S = 30.0  # a connection that lasted this long ends an outage (its problems may be logged again)
# A connection dropped this soon after its CONNACK, with no reason from the broker, whose reconnect
# then succeeds at once (a broker that restarted refuses connections for a while), is a flap; this
# many in a row are worth a hint at the usual cause (a second client with the same id, an ACL).
_FLAP_S = 2.0
_FLAPS = 3
# MQTT 5 CONNECT's Maximum Packet Size: the most the guard accepts from the broker. It subscribes
# only to Home Assistant's status ("online"/"offline"), so a few kB is plenty; without it one 200 MB
# retained message on that topic was read whole into memory at every start.
CLIENT_MAX_PACKET = 4096
_STATUS_MAX = 16  # payload bytes of <discovery_prefix>/status worth reading ("online", "offline")
# Home Assistant's own status topic (its birth message) stays this whatever its discovery prefix is
# set to (its MQTT options keep the two apart): listened to beside <discovery_prefix>/status
HA_BIRTH_TOPIC = "homeassistant/status"
# Reasons in a broker's DISCONNECT that say what went wrong: no guessing needed then.
_GENERIC_REASONS = {"Unspecified error", "Normal disconnection", "Success", "Implementation specific error"}


def _varint_size(n: int) -> int:
    """Bytes of MQTT's variable byte integer for n."""
    size = 1
    while n >= 128:
        n >>= 7
        size += 1
    return size


def publish_packet_size(topic: str, payload: int, qos: int, properties: int = 0, v5: bool = True) -> int:
    """Bytes of a PUBLISH packet (MQTT 5 3.3 / 3.1.1 3.3): fixed header, topic, packet id (QoS > 0),
    the properties (their encoded length `properties`, MQTT 5 only) and `payload` bytes."""
    remaining = 2 + len(topic.encode()) + (2 if qos else 0) + payload
    if v5:
        remaining += _varint_size(properties) + properties
    return 1 + _varint_size(remaining) + remaining


def read_password(config: MQTTConfig) -> str | None:
    """The broker password: `mqtt.password_file`, else `$CREDENTIALS_DIRECTORY/mqtt-password`, else
    None (tracker.passwords.read_secret); a password needs `mqtt.username` to go with it, and holds
    no NUL (ConfigError)."""
    secret = read_secret(config.password_file, CREDENTIAL_NAME, "mqtt password file")
    if secret is None:
        return None
    if "\0" in secret.value:  # (the password itself is never shown)
        raise ConfigError(f"mqtt password file {str(secret.path)!r}: holds a NUL character, which MQTT brokers "
                          "refuse; expected the password without one")
    if config.username is None:
        if secret.managed:
            log.warning("a systemd credential %s exists but mqtt.username is not set; connecting without "
                        "user name and password", CREDENTIAL_NAME)
            return None
        raise ConfigError(f"mqtt.password_file is {str(secret.path)!r} but mqtt.username is null; "
                          "expected a user name to go with the password")
    return secret.value


def tls_context(config: MQTTConfig) -> ssl.SSLContext | None:
    """The client TLS context for `config.tls` (None when TLS is off): verifies the broker against
    `ca` (or the system CAs), presents `cert`/`key` if given. A file that cannot be loaded is a
    ConfigError naming its key, its path and the cause."""
    tls = config.tls
    if not tls.active:
        return None
    try:
        ctx = ssl.create_default_context(cafile=str(tls.ca) if tls.ca else None)
    except (ssl.SSLError, OSError) as err:
        raise ConfigError(f"mqtt.tls.ca: cannot load {str(tls.ca)!r} ({err}); expected a PEM file of CA "
                          "certificates") from None
    if tls.cert is not None and tls.key is not None:
        try:
            # a password, so that OpenSSL never prompts for one on the terminal (an encrypted key
            # would hang --check-config and the guard there); the key must be unencrypted
            ctx.load_cert_chain(str(tls.cert), str(tls.key), password=b"")
        except (ssl.SSLError, OSError) as err:
            raise ConfigError(_client_cert_problem(tls.cert, tls.key, err)) from None
    if tls.insecure:
        ctx.check_hostname = False
    return ctx


def _client_cert_problem(cert: Path, key: Path, err: OSError) -> str:
    """The one-line message for `err`, which load_cert_chain(cert, key) raised."""
    if getattr(err, "reason", None) == "KEY_VALUES_MISMATCH":
        return (f"mqtt.tls.key: {str(key)!r} is not the private key of mqtt.tls.cert {str(cert)!r} ({err}); "
                "expected the key the client certificate was made for")
    if "PEM lib" in str(err):  # OpenSSL does not say which file: if the certificate reads alone, the key
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(cert))
        except ssl.SSLError:
            return f"mqtt.tls.cert: cannot load {str(cert)!r} ({err}); expected a PEM client certificate"
        return (f"mqtt.tls.key: cannot load {str(key)!r} ({err}): it may be encrypted (have a passphrase) or not be a PEM "
                f"private key; expected the unencrypted PEM private key of mqtt.tls.cert {str(cert)!r}")
    return (f"mqtt.tls.cert/key: cannot load {str(cert)!r} and {str(key)!r} ({err}); expected PEM files: a client "
            "certificate and its unencrypted private key")


def _logging_failures(callback):
    """`callback` for paho, with its failures logged (with their traceback: a bug) rather than
    raised: one raised into paho ends its network thread, and with it every later delivery and
    reconnect of the run."""

    @functools.wraps(callback)
    def call(*args):
        try:
            callback(*args)
        except Exception:
            log.exception("mqtt: %s failed; the connection goes on", callback.__name__)

    return call


def _jsonable(value):
    """json.dumps fallback for numpy scalars and paths in the pipeline's state dict."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class MqttSink:
    """See the module docstring. Thread-safe; `publish_event`/`publish_state` never block on the network."""

    def __init__(self, config: MQTTConfig, device: DeviceConfig, state_dir: Path):
        try:
            import paho.mqtt.client as mqtt
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties
        except ImportError as err:
            raise BackendUnavailable(f"mqtt.enabled is true but paho-mqtt is not installed ({err}); "
                                     "install it with: pip install 'tracker[mqtt]'") from None
        self._mqtt = mqtt
        self.config = config
        self.device = device
        base = f"{config.prefix}/{device.id}"
        self.topics = {name: f"{base}/{name}" for name in ("availability", "events", "state", "snapshot")}
        self._status_topics = tuple(dict.fromkeys([f"{config.discovery_prefix}/status", HA_BIRTH_TOPIC]))
        self.client_id = f"{config.prefix.replace('/', '-')}-{device.id}"
        self._where = f"{config.host}:{config.port}"
        self._v5 = config.protocol == "v5"
        password = read_password(config)
        context = tls_context(config)

        self.outbox = Outbox(config.outbox.file_path(state_dir), config.outbox.max_events, config.outbox.max_age_s)

        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._connected = False
        self._generation = 0  # bumped on every connect; stale in-flight records are ignored
        self._cursor = 0  # highest outbox seq handed to paho on this connection
        self._inflight: dict[int, int] = {}  # paho mid -> outbox seq, this connection only
        # on_publish calls that beat the recording of their mid: PUBACKs, and QoS 0 publishes written at once
        self._early_acks: dict[int, object] = {}
        self._add_failures = 0  # events the outbox could not store (the refused and oversize ones it counts itself)
        self._removals_failing = False  # the outbox refuses to delete acknowledged events (logged once)
        self._state: dict = {}
        self._state_unsent = False  # publish_state gave numbers not yet handed to paho (close() sends them)
        self._present: bool | None = None
        self._state_due = True
        self._next_state = 0.0
        self._snapshot: bytes | None = None
        self._snapshot_due = False
        self._discovery_due = False  # due on each connect (_on_connect)
        self._online_due = False  # "online" on availability: due on each connect, sent before any event
        self._problems: set[str] = set()  # connection problems logged in this outage (each once)
        self._connected_at = 0.0
        self._short_sessions = 0  # connections in a row that were dropped within _FLAP_S of their CONNACK
        self._unstable_sessions = 0  # connections in a row that were dropped within _STABLE_S
        self._refused_now = False  # this connection attempt was refused in CONNACK (already logged)
        self._closed = False
        self._outbox_closed = False  # (paho's thread may deliver a PUBACK after close() closed the outbox)
        self.failed_attempts = 0  # connection attempts that failed or were refused (for tests and logs)
        self._work = False  # set (lock held) whenever the publisher has something new to do
        self._max_packet: int | None = None  # the broker's Maximum Packet Size (MQTT 5 CONNACK)
        self._window = config.max_inflight  # events in flight: at most the broker's Receive Maximum too
        self._too_large: dict[str, int] = {}  # topic name -> messages not sent: larger than _max_packet
        self._inbound_ignored = 0
        self._control: dict[int, str] = {}  # mid -> topic of QoS 1 availability/discovery publishes in flight
        # "state"/"snapshot" -> its QoS 0 publish that paho has not written yet (at most one of each)
        self._unwritten: dict[str, mqtt.MQTTMessageInfo] = {}
        self._refusals_said: set[str] = set()  # topics whose refusal by the broker was logged on this connection

        if self._v5:
            self._state_props: Properties | None = Properties(PacketTypes.PUBLISH)
            # A minute at least: a short interval must not let a retained state expire while the guard
            # merely reconnects to its broker (a subscriber would see the guard's numbers vanish).
            self._state_props.MessageExpiryInterval = int(max(3 * config.state_interval_s, 60))
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        else:
            self._state_props = None
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                 protocol=mqtt.MQTTv311, clean_session=True)
        self._client = client
        # paho keeps at most the events window plus a few control messages (availability, discovery).
        client.max_inflight_messages_set(config.max_inflight + 8)
        client.max_queued_messages_set(config.max_inflight + 8)
        client.reconnect_delay_set(config.reconnect_min_s, config.reconnect_max_s)
        client.will_set(self.topics["availability"], "offline", qos=1, retain=True)
        if config.username is not None:
            client.username_pw_set(config.username, password)
        if context is not None:
            client.tls_set_context(context)
            if config.tls.insecure:
                client.tls_insecure_set(True)
        client.on_connect = _logging_failures(self._on_connect)
        client.on_connect_fail = _logging_failures(self._on_connect_fail)
        client.on_disconnect = _logging_failures(self._on_disconnect)
        client.on_publish = _logging_failures(self._on_publish)
        client.on_message = _logging_failures(self._on_message)

        pending = len(self.outbox)
        if pending:
            log.info("mqtt: %d event(s) from a previous run wait in the outbox %s", pending, self.outbox.path)
        if self._v5:
            limits = Properties(PacketTypes.CONNECT)
            limits.MaximumPacketSize = CLIENT_MAX_PACKET
            client.connect_async(config.host, config.port, keepalive=config.keepalive_s, clean_start=True,
                                 properties=limits)
        else:
            client.connect_async(config.host, config.port, keepalive=config.keepalive_s)
        client.loop_start()
        self._thread = threading.Thread(target=self._publisher, name="mqtt-publisher", daemon=True)
        self._thread.start()

    # -- the sink API (pipeline thread) ---------------------------------------------------------

    def publish_event(self, event: Event, snapshot_jpeg: bytes | None = None) -> None:
        """Make `event` durable in the outbox (one SQLite commit; in memory while the disk is full
        or failing, outbox.py) and wake the publisher. The JPEG, if any, replaces the retained
        snapshot. Never raises for a disk or broker problem: an event the outbox refuses all the same
        (an error that is not the disk's, or a disk that fails while its file is copied to memory)
        is logged and counted in state.events_dropped."""
        payload = json.dumps(event_payload(event), separators=(",", ":")).encode()
        try:
            self.outbox.add(event.id, payload)
        except Exception as err:  # sqlite3.Error or OSError: keep guarding
            with self._lock:
                self._add_failures += 1
                first = self._add_failures == 1
            (log.error if first else log.debug)("mqtt: could not store event %s in the outbox (%s); it is "
                                                "dropped (further failures are counted in state)", event.id, err)
        with self._wake:
            if snapshot_jpeg is not None:
                if len(snapshot_jpeg) <= MAX_SNAPSHOT_BYTES:
                    self._snapshot, self._snapshot_due = bytes(snapshot_jpeg), True
                else:
                    log.warning("mqtt: snapshot of %d bytes not published (limit %d)", len(snapshot_jpeg),
                                MAX_SNAPSHOT_BYTES)
            self._poke()

    def publish_state(self, state: dict) -> None:
        """Remember the pipeline's latest numbers; published every `state_interval_s`, at once when
        `tracks` goes between zero and non-zero (Home Assistant's "person present"), on connect, and
        the first time (none is published before it: a state without the guard's numbers).

        Expected keys (others pass through): fps (float), tracks (int), frames_dropped (int),
        backend (str), latency_ms ({stage: {"p50": ms, "p95": ms}}, tracker.latency.RollingStats)."""
        with self._wake:
            first = not self._state
            self._state = dict(state)
            self._state_unsent = bool(self._state)
            present = bool(state.get("tracks", 0))
            if first or present != self._present:
                self._present, self._state_due = present, True
                self._poke()

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def events_dropped(self) -> int:
        """Events that will never be sent: dropped by the outbox bounds, refused by the broker or
        larger than it accepts (all counted in the outbox file, across restarts), and not storable
        (counted since the guard started: the disk that refused them keeps no count)."""
        return self.outbox.dropped + self._add_failures

    def close(self) -> None:
        """Give in-flight events up to `flush_timeout_s` to be acknowledged (the rest stay in the
        outbox for the next start) and, within the same bound, hand paho the last state given if it
        has not gone yet (the guard's last state, "nobody present", often comes just before SIGTERM:
        the retained state must not go on saying someone is there); then publish `offline`,
        disconnect, stop the threads, close the outbox. Bounded by flush_timeout_s + about 2 s, so
        SIGTERM finishes well within systemd's timeout."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.config.flush_timeout_s
        with self._wake:
            if self._state_unsent:
                self._state_due = True
                self._poke()
            while (self._connected and (len(self.outbox) or self._state_unsent)
                   and time.monotonic() < deadline):
                self._wake.wait(0.05)
            self._stop = True
            self._wake.notify_all()
        self._thread.join(timeout=2.0)
        if self._connected:
            info = self._client.publish(self.topics["availability"], "offline", qos=1, retain=True)
            try:
                info.wait_for_publish(timeout=1.0)
            except (RuntimeError, ValueError):  # not queued (connection dropped meanwhile): the Will covers it
                pass
        self._client.disconnect()
        # loop_stop joins paho's thread, which may sit in a connect attempt (connect timeout 5 s):
        # wait a bounded time; the thread is a daemon and cannot outlive the process.
        stopper = threading.Thread(target=self._client.loop_stop, daemon=True)
        stopper.start()
        stopper.join(timeout=1.0)
        left = len(self.outbox)
        with self._wake:  # a PUBACK that comes later leaves its event for the next start (sent again)
            self.outbox.close()  # (one kept in memory saves its events to the file, or says they are lost)
            self._outbox_closed = True
        if self.outbox.durable:
            log.info("mqtt: closed (%d event(s) left in the outbox for the next start)", left)
        else:
            log.info("mqtt: closed")

    # -- paho callbacks (paho's network thread) -------------------------------------------------

    def _log_problem(self, text: str, error: bool = False) -> None:
        """Log each distinct connection problem once per outage. An outage ends only when a connection
        has lasted _STABLE_S, so a flapping connection does not fill the journal."""
        self.failed_attempts += 1
        if text not in self._problems and len(self._problems) < 16:
            self._problems.add(text)
            pending = len(self.outbox)
            (log.error if error else log.warning)(
                "mqtt: %s; the guard keeps running, %d event(s) wait in the outbox, retrying with back-off "
                "(%d..%d s)", text, pending, self.config.reconnect_min_s, self.config.reconnect_max_s)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            hint = ""
            if reason_code.getName() in ("Bad user name or password", "Not authorized"):
                hint = " (check mqtt.username and the password file)"
            self._refused_now = True
            self._log_problem(f"broker {self._where} refused the connection: {reason_code.getName()}{hint}",
                              error=True)
            return
        # paho would re-send its own unacknowledged copies now; the publisher re-sends from the
        # outbox instead, in order, so drop them (they are all in the outbox).
        client.drop_out_messages()
        max_packet = getattr(properties, "MaximumPacketSize", None) if properties is not None else None
        receive_max = getattr(properties, "ReceiveMaximum", None) if properties is not None else None
        with self._wake:
            self._max_packet = max_packet
            # Every QoS 1 publish (events, availability, discovery) counts against the broker's
            # Receive Maximum; paho cannot change its own limit on a connection, so the window is ours.
            self._window = min(self.config.max_inflight, receive_max or self.config.max_inflight)
            self._control.clear()
            self._refusals_said.clear()
            self._connected = True
            self._generation += 1
            self._cursor = 0
            self._inflight.clear()
            self._early_acks.clear()
            self._state_due = True
            self._snapshot_due = self._snapshot is not None
            self._unwritten.clear()  # paho dropped its unwritten QoS 0 copies when it reconnected
            self._discovery_due = True  # the document, or (discovery off) its removal
            # Due with the connection itself: the publisher sends it first, in the thread that fills the
            # window with events (published here, an event coming meanwhile could take the last place in
            # the window, and "online" was then never sent on this connection)
            self._online_due = True
            self._poke()
        if self.config.discovery:
            client.subscribe([(topic, 1) for topic in self._status_topics])
        self._connected_at = time.monotonic()
        if not self._problems:
            log.info("mqtt: connected to %s as %s", self._where, self.client_id)
        elif "(connected)" not in self._problems:
            self._problems.add("(connected)")
            log.warning("mqtt: connected to %s; sending %d waiting event(s)", self._where, len(self.outbox))

    def _on_connect_fail(self, client, userdata) -> None:
        self._short_sessions = 0  # the broker was away: the drops before were not flaps
        # paho calls this from inside its `except OSError` block, so the exception is at hand.
        err = sys.exception()
        # the port answered, then hung up on the ClientHello: what a plain MQTT listener does
        hung_up_on_tls = self.config.tls.active and isinstance(err, ConnectionResetError | ssl.SSLEOFError)
        if hung_up_on_tls:
            text = (f"broker {self._where} closed the connection during the TLS handshake ({type(err).__name__}); "
                    f"mqtt.tls is on: check that port {self.config.port} is the broker's TLS listener "
                    "(a plain MQTT port, often 1883, takes no mqtt.tls)")
        elif isinstance(err, ssl.SSLError):
            text = f"TLS handshake with {self._where} failed ({err.reason or err}); check mqtt.tls.ca/cert/key"
        elif isinstance(err, ConnectionRefusedError):
            text = f"broker {self._where} unreachable (connection refused)"
        elif err is not None:
            text = f"broker {self._where} unreachable ({type(err).__name__}: {err})"
        else:
            text = f"broker {self._where} unreachable"
        self._log_problem(text, error=hung_up_on_tls or isinstance(err, ssl.SSLError))

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._wake:
            was_connected, self._connected = self._connected, False
        if self._stop:
            return
        name = reason_code.getName() if hasattr(reason_code, "getName") else str(reason_code)
        if not was_connected:
            if name == "Keep alive timeout" and not flags.is_disconnect_packet_from_server:
                # paho gave up waiting for the CONNACK: something listens there but does not answer
                # MQTT; neither the broker's closing nor TLS has anything to do with it
                self._log_problem(f"no answer to CONNECT from {self._where} within {self.config.keepalive_s} s "
                                  "(mqtt.keepalive_s): check that it is an MQTT broker", error=True)
            elif not self._refused_now:  # closed after TCP/TLS but before CONNACK
                if self.config.tls.active:  # a TLS 1.3 broker checks the client certificate only now
                    hint = "check whether it requires a client certificate (mqtt.tls.cert/key)"
                else:  # a TLS listener hangs up on a plain CONNECT
                    hint = (f"mqtt.tls is off: if port {self.config.port} is the broker's TLS listener (often 8883), "
                            "set mqtt.tls (enabled: true, or ca)")
                self._log_problem(f"broker {self._where} closed the connection before accepting it ({name}); {hint}",
                                  error=True)
            self._refused_now = False
            return
        lasted = time.monotonic() - self._connected_at
        if lasted >= _STABLE_S:
            self._problems.clear()  # the previous outage is over: this is a new one
        self._short_sessions = self._short_sessions + 1 if lasted < _FLAP_S else 0
        # paho starts its back-off afresh at every CONNACK, so a broker that accepts the guard and
        # drops it soon after (another client taking the session over) would be retried every
        # reconnect_min_s for ever: from the second session in a row that ends before _STABLE_S,
        # each doubles the first wait, up to reconnect_max_s. (Not only sessions shorter than
        # _FLAP_S: two guards with one client id each hold the session as long as the other waits.)
        self._unstable_sessions = self._unstable_sessions + 1 if lasted < _STABLE_S else 0
        doublings = min(max(self._unstable_sessions - 1, 0), 12)
        client.reconnect_delay_set(min(self.config.reconnect_min_s << doublings, self.config.reconnect_max_s),
                                   self.config.reconnect_max_s)
        if name == "Session taken over":
            self._log_problem(f"broker {self._where} closed the connection: {name}: another client connected "
                              f"with client id {self.client_id!r} (two guards with the same device.id?); give each "
                              "guard its own device.id", error=True)
        elif name not in _GENERIC_REASONS:  # the broker said why: say that, guess nothing
            self._log_problem(f"broker {self._where} closed the connection: {name}", error=name != "Server shutting down")
        else:
            self._log_problem(f"lost the connection to {self._where} ({name})")
            if self._short_sessions >= _FLAPS:
                # MQTT 3.1.1's CONNACK has no Maximum Packet Size: a broker whose limit is below a message
                # of the guard's (the discovery document is about 2 kB) hangs up each time it is sent
                too_large = "" if self._v5 else (", or a message of the guard's is larger than the broker accepts (its "
                                                 "max_packet_size, which MQTT 3.1.1 does not tell clients; with "
                                                 "mqtt.protocol v5 the guard learns it and keeps to it)")
                self._log_problem(
                    # no count in the text: _log_problem says each distinct text once per outage
                    f"the broker closed the connection within {_FLAP_S:g} s of accepting it {_FLAPS} or more "
                    f"times in a row without a reason: another client may be using client id {self.client_id!r} "
                    f"(give each guard its own device.id), or the broker's ACL refuses this client's topics{too_large}",
                    error=True)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._wake:
            if self._outbox_closed:  # its deletion failed with "closed database": not a full disk's error
                return
            if mid in self._control:
                self._is_refused(self._control.pop(mid), reason_code)
                self._poke()
                return
            for name, info in self._unwritten.items():  # a state or snapshot written: the next may go
                if info.mid == mid:
                    del self._unwritten[name]
                    self._poke()
                    return
            seq = self._inflight.pop(mid, None)
            if seq is None:
                self._early_acks[mid] = reason_code  # maybe an event whose mid is being recorded
                return
            self._acknowledged(seq, reason_code)
            self._poke()

    def _acknowledged(self, seq: int, reason_code) -> None:
        """An event's PUBACK (lock held): delete it; a v5 refusal is deleted as dropped (counted in the
        outbox; the first of a connection logged), not retried, because the broker would refuse it
        again and hold up every later event. An event the outbox
        cannot delete (a full disk) stays in it, and is sent again after the next reconnect:
        delivered twice (consumers know it by its id) rather than not at all."""
        refused = self._is_refused(self.topics["events"], reason_code, f"event (outbox seq {seq})",
                                   "dropped; further ones are counted in state.events_dropped")
        try:
            self.outbox.remove(seq, dropped=refused)
        except sqlite3.Error as err:
            if not self._removals_failing:
                log.error("mqtt: cannot delete acknowledged events from the outbox (%s); they stay in it and are sent "
                          "again after the next reconnect", err)
            self._removals_failing = True
        else:
            self._removals_failing = False

    def _is_refused(self, topic: str, reason_code, what: str = "", then: str = "") -> bool:
        """Whether a PUBACK's v5 `reason_code` refuses the publish on `topic` (lock held); the first
        refusal of each topic on a connection is logged (an ACL that refuses `availability` leaves
        Home Assistant showing the device unavailable, with nothing in the guard's log)."""
        if reason_code is None or not getattr(reason_code, "is_failure", False):
            return False
        if topic not in self._refusals_said:
            self._refusals_said.add(topic)
            log.error("mqtt: broker %s refused %s on %s: %s; check its ACL for this client%s", self._where,
                      what or "the message", topic, reason_code.getName(), f"; {then}" if then else "")
        return True

    def _on_message(self, client, userdata, message) -> None:
        if len(message.payload) > _STATUS_MAX:  # only an MQTT 3.1.1 broker sends these (see CONNECT)
            self._inbound_ignored += 1
            if self._inbound_ignored == 1:
                log.warning("mqtt: ignored a %d-byte message on %s (expected 'online' or 'offline'); further "
                            "ones are counted in state", len(message.payload), message.topic)
            return
        if message.topic in self._status_topics and message.payload == b"online":
            with self._wake:  # Home Assistant restarted: it needs discovery and the current state again
                self._discovery_due = self._state_due = True
                self._snapshot_due = self._snapshot is not None
                self._poke()

    # -- the publisher thread -------------------------------------------------------------------

    def _poke(self) -> None:
        """Wake the publisher (lock held); the flag keeps a wake-up that comes while it is busy."""
        self._work = True
        self._wake.notify()

    def _publisher(self) -> None:
        next_expire = time.monotonic() + _EXPIRE_EVERY_S
        errors, next_error_log = 0, 0.0  # errors in a row (see the except below)
        while True:
            with self._wake:
                if self._stop:
                    return
                # disconnected: nothing to do until a callback wakes us (or the outbox ages)
                wake_at = min(self._next_state, next_expire) if self._connected else next_expire
                self._wake.wait_for(lambda: self._work or self._stop, max(0.05, wake_at - time.monotonic()))
                self._work = False
                if self._stop:
                    return
                connected = self._connected
            try:
                if time.monotonic() >= next_expire:
                    next_expire = time.monotonic() + _EXPIRE_EVERY_S
                    self.outbox.expire()
                if connected:  # "online", then events: under a small packet limit everything that fits goes
                    self._send_online()
                    self._send_events()
                    self._send_state()
                    self._send_discovery()
                    self._send_snapshot()
            except Exception:  # a bug or a failing disk must not silently stop delivery for the rest of the run
                errors += 1
                if time.monotonic() >= next_error_log:  # the first and then one a minute: a lasting error
                    next_error_log = time.monotonic() + _ERROR_LOG_EVERY_S  # must not flood the journal
                    log.exception("mqtt: publisher error (%d in a row; said at most once a minute); continuing", errors)
                time.sleep(1.0)
                with self._wake:  # tried again then, not only at the next event or state
                    self._work = True
            else:
                if errors:
                    log.info("mqtt: the publisher works again after %d error(s)", errors)
                errors, next_error_log = 0, 0.0

    def _fits(self, name: str, topic: str, payload: int, qos: int, properties: int = 0) -> bool:
        """Whether a PUBLISH fits the broker's Maximum Packet Size (MQTT 5 forbids sending a larger
        one: the broker disconnects). A message that does not is counted per topic and said once."""
        size = publish_packet_size(topic, payload, qos, properties, self._v5)
        with self._wake:
            limit = self._max_packet
            if limit is None or size <= limit:
                return True
            self._too_large[name] = self._too_large.get(name, 0) + 1
            first = self._too_large[name] == 1
        if first:
            log.error("mqtt: %s message of %d bytes not sent: the broker %s accepts packets of at most %d bytes "
                      "(Maximum Packet Size); further ones are counted in state.too_large", name, size,
                      self._where, limit)
        return False

    def _room(self) -> int:
        """QoS 1 publishes that may still go out on this connection (lock held)."""
        return self._window - len(self._inflight) - len(self._control)

    def _publish_control(self, topic: str, payload: bytes) -> bool:
        """A retained QoS 1 publish that is not an event (availability, discovery), within the
        window; False when there is no room now."""
        with self._wake:
            if self._room() <= 0:
                return False
        info = self._client.publish(topic, payload, qos=1, retain=True)
        with self._wake:
            if info.mid in self._early_acks:  # acknowledged before paho returned the mid
                self._is_refused(topic, self._early_acks.pop(info.mid))
            elif info.rc == self._mqtt.MQTT_ERR_SUCCESS:
                self._control[info.mid] = topic
        return True

    def _send_online(self) -> None:
        """"online" on availability once per connection, ahead of the events: the window is empty
        when it becomes due (_on_connect), and only this thread fills it."""
        with self._wake:
            if not self._online_due:
                return
            self._online_due = False
        if not self._publish_control(self.topics["availability"], b"online"):
            # no room: a pass begun before the connect sent the discovery document first (a window of
            # one); tried again after its acknowledgement
            with self._wake:
                self._online_due = True

    def _send_events(self) -> None:
        with self._wake:
            room = self._room()
            generation, cursor = self._generation, self._cursor
        if room <= 0:
            return
        for seq, payload in self.outbox.pending(after=cursor, limit=room):
            if not self._fits("event", self.topics["events"], len(payload), qos=1):
                with self._wake:  # it would never fit: drop it rather than block every later event
                    self._cursor = max(self._cursor, seq)
                self.outbox.remove(seq, dropped=True)
                log.error("mqtt: event (outbox seq %d) dropped: larger than the broker accepts", seq)
                continue
            with self._wake:
                if generation != self._generation:
                    return  # reconnected: the new connection starts from the oldest, in its own window
            info = self._client.publish(self.topics["events"], payload, qos=1)
            with self._wake:
                if generation != self._generation:
                    return  # reconnected meanwhile: the new connection starts from the oldest again
                if info.rc == self._mqtt.MQTT_ERR_QUEUE_SIZE:
                    return  # paho is full; try again after the next acknowledgement
                self._cursor = seq
                if info.mid in self._early_acks:
                    self._acknowledged(seq, self._early_acks.pop(info.mid))
                else:
                    self._inflight[info.mid] = seq
        with self._wake:
            self._early_acks.clear()  # every event mid is recorded now: the rest were not events

    def _publish_latest(self, name: str, topic: str, payload: bytes, properties=None) -> None:
        """A retained QoS 0 publish of `name` ("state" or "snapshot"), remembered until paho has
        written it (the module docstring's slow link: one of each in paho's out-queue at a time)."""
        with self._wake:
            generation = self._generation
        info = self._client.publish(topic, payload, qos=0, retain=True, properties=properties)
        with self._wake:
            # written before we got here (its on_publish is in _early_acks), never queued, or queued on a
            # connection that has gone since (paho dropped it unwritten, without an on_publish: recorded,
            # it would hold back every later one for good): nothing to wait for
            written = self._early_acks.pop(info.mid, None) is not None
            if not written and info.rc == self._mqtt.MQTT_ERR_SUCCESS and generation == self._generation:
                self._unwritten[name] = info

    def _send_state(self) -> None:
        with self._wake:
            due = self._state_due or time.monotonic() >= self._next_state
            if not due:
                return
            self._next_state = time.monotonic() + self.config.state_interval_s
            if not self._state:  # none from the guard yet: sent when it comes (publish_state), not without its numbers
                return
            if "state" in self._unwritten:  # the latest numbers go when paho has written the last ones
                self._state_due = True
                return
            self._state_due = self._state_unsent = False
            document = {"schema": SCHEMA_VERSION, "ts": _now_iso(), **self._state}
        document["events_dropped"] = self.events_dropped
        document["outbox_pending"] = len(self.outbox)
        with self._wake:
            document["too_large"] = dict(self._too_large)
        document["inbound_ignored"] = self._inbound_ignored
        payload = json.dumps(document, separators=(",", ":"), default=_jsonable).encode()
        if self._fits("state", self.topics["state"], len(payload), qos=0, properties=5 if self._v5 else 0):
            self._publish_latest("state", self.topics["state"], payload, self._state_props)

    def _send_snapshot(self) -> None:
        with self._wake:
            # while paho writes the last one, publish_event replaces the waiting one with each newer face
            if not self._snapshot_due or "snapshot" in self._unwritten:
                return
            self._snapshot_due, jpeg = False, self._snapshot
        if jpeg is not None and self._fits("snapshot", self.topics["snapshot"], len(jpeg), qos=0):
            self._publish_latest("snapshot", self.topics["snapshot"], jpeg)

    def _send_discovery(self) -> None:
        with self._wake:
            if not self._discovery_due:
                return
            self._discovery_due = False
        topic = discovery_topic(self.config.discovery_prefix, self.config.prefix, self.device.id)
        # With discovery off, an empty retained payload: Home Assistant removes the device an earlier
        # run announced (and the broker drops the retained document), instead of keeping it for good.
        document = json.dumps(discovery_payload(self.config.prefix, self.device.id, self.device.name),
                              separators=(",", ":")).encode() if self.config.discovery else b""
        if self._fits("discovery", topic, len(document), qos=1) and not self._publish_control(topic, document):
            with self._wake:  # no room in the window now: after the next acknowledgement
                self._discovery_due = True
