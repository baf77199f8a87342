"""The MQTT sink against a real Mosquitto broker: topics, payloads, retained flags, availability and
the Last Will, Home Assistant discovery, two guards on one broker, the outbox across restarts."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from mosquitto import Broker, Subscriber, make_event, sink_config, wait_until

from tracker.errors import ConfigError
from tracker.events import event_payload
from tracker.sinks.mqtt import MqttSink, read_password

REPO = Path(__file__).resolve().parents[2]
EVENT_KEYS = {"schema", "id", "kind", "track_id", "identity", "confidence", "box", "ts", "seq", "media_time_s"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("broker")) as b:
        yield b


@pytest.fixture
def sinks():
    made: list[MqttSink] = []
    yield made
    for sink in made:
        sink.close()


def open_sink(sinks, broker, state_dir, device="pi1", **mqtt_keys) -> MqttSink:
    config = sink_config(broker, device, **mqtt_keys)
    sink = MqttSink(config.mqtt, config.device, state_dir)
    sinks.append(sink)
    return sink


def events_of(messages, topic):
    return [json.loads(p) for t, p, _ in messages if t == topic]


def test_events_state_snapshot_and_availability(broker, sinks, tmp_path):
    sub = Subscriber(broker, ["tracker/pi1/#"])
    sink = open_sink(sinks, broker, tmp_path)
    sent = [make_event("entered", 3), make_event("identified", 3, "alice", 0.91), make_event("left", 3, "alice", 0.9)]
    for i, event in enumerate(sent):
        sink.publish_event(event, b"\xff\xd8 face %d" % i)
    sink.publish_state({"fps": np.float32(9.5), "tracks": 1, "frames_dropped": 2, "backend": "caffe-openblas-dl",
                        "latency_ms": {"total_ms": {"p50": 41.0, "p95": 77.5}}})
    messages = sub.wait_for(lambda m: len(events_of(m, "tracker/pi1/events")) == 3
                            and any(t == "tracker/pi1/state" and b'"tracks":1' in p for t, p, _ in m)
                            and ("tracker/pi1/snapshot", b"\xff\xd8 face 2", False) in m)
    got = events_of(messages, "tracker/pi1/events")
    assert [g["id"] for g in got] == [e.id for e in sent]  # in order
    for g, e in zip(got, sent):
        assert set(g) == EVENT_KEYS
        assert g == json.loads(json.dumps(event_payload(e)))
        assert g["schema"] == 1 and set(g["box"]) == {"x", "y", "w", "h"}
    state = [json.loads(p) for t, p, _ in messages if t == "tracker/pi1/state"][-1]
    assert state["schema"] == 1 and state["fps"] == 9.5 and state["tracks"] == 1
    assert state["latency_ms"]["total_ms"]["p95"] == 77.5 and state["backend"] == "caffe-openblas-dl"
    assert state["events_dropped"] == 0 and "outbox_pending" in state and "ts" in state
    sub.close()

    # A late subscriber gets the retained topics: online, the last state, the latest snapshot.
    late = Subscriber(broker, ["tracker/pi1/#"])
    retained = late.wait_for(lambda m: {t for t, _, r in m if r} >= {
        "tracker/pi1/availability", "tracker/pi1/state", "tracker/pi1/snapshot"})
    assert (("tracker/pi1/availability", b"online", True)) in retained
    assert ("tracker/pi1/snapshot", b"\xff\xd8 face 2", True) in retained
    # every event acknowledged and deleted (each deletion is a commit on paho's thread, after the PUBACK)
    wait_until(lambda: len(sink.outbox) == 0, what="the outbox to empty")
    late.sync()  # the retained messages come before the SUBACK'd sync marker: all are here
    assert not [p for t, p, _ in late.messages if t == "tracker/pi1/events"]  # events are never retained
    late.close()

    sink.close()
    after = Subscriber(broker, ["tracker/pi1/availability"])
    assert after.wait_for(lambda m: m)[0] == ("tracker/pi1/availability", b"offline", True)
    after.close()


LWT_CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from mosquitto import Broker, sink_config
    from tracker.sinks.mqtt import MqttSink
    class B: port = {port}
    config = sink_config(B, "victim")
    sink = MqttSink(config.mqtt, config.device, {state!r})
    while not sink.connected:
        time.sleep(0.05)
    print("connected", flush=True)
    time.sleep(600)
""")


def test_an_event_that_comes_as_the_guard_connects_does_not_keep_online_out(broker, sinks, tmp_path, monkeypatch):
    """Forced interleaving: an event comes just as "online" is published on a connect, with a window
    of one QoS 1 publish (max_inflight 1). "online" was published from paho's thread once the
    connection was marked up, so the publisher could take the window's last place with the event
    first: "online" was then never sent, and Home Assistant showed the guard unavailable (the Will's
    retained "offline") for as long as the connection lasted."""
    publish_control = MqttSink._publish_control
    came: list = []

    def event_comes_meanwhile(self, topic, payload):
        if payload == b"online" and not came:
            came.append(make_event())
            self.publish_event(came[0], None)
            if threading.current_thread().name != "mqtt-publisher":  # the publisher may run meanwhile: let it
                wait_until(lambda: self._inflight, what="the publisher to send the event")
        return publish_control(self, topic, payload)

    monkeypatch.setattr(MqttSink, "_publish_control", event_comes_meanwhile)
    sub = Subscriber(broker, ["tracker/racer/availability", "tracker/racer/events"])
    open_sink(sinks, broker, tmp_path, "racer", max_inflight=1)
    messages = sub.wait_for(lambda m: events_of(m, "tracker/racer/events")
                            and ("tracker/racer/availability", b"online", False) in m)
    assert [e["id"] for e in events_of(messages, "tracker/racer/events")] == [came[0].id]
    sub.close()


def test_last_will_when_the_guard_is_killed(broker, tmp_path):
    sub = Subscriber(broker, ["tracker/victim/availability"])
    code = LWT_CHILD.format(tests=str(REPO / "tests"), port=broker.port, state=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "connected"
        sub.wait_for(lambda m: ("tracker/victim/availability", b"online", False) in m
                     or ("tracker/victim/availability", b"online", True) in m)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        payloads = sub.wait_for(lambda m: m[-1][1] == b"offline")
        assert [p for _, p, _ in payloads][-2:] == [b"online", b"offline"]
    finally:
        if child.poll() is None:
            child.kill()
        sub.close()


def test_home_assistant_discovery(broker, sinks, tmp_path):
    sub = Subscriber(broker, ["homeassistant/device/#"])
    open_sink(sinks, broker, tmp_path, "hall")
    topic = "homeassistant/device/tracker_hall/config"
    doc = json.loads(sub.wait_for(lambda m: any(t == topic for t, _, _ in m))[-1][1])
    assert doc["dev"]["ids"] == ["tracker_hall"] and doc["dev"]["name"] == "Guard hall"
    assert doc["o"]["name"] == "tracker"  # origin is mandatory for device discovery
    assert doc["availability_topic"] == "tracker/hall/availability"
    assert (doc["payload_available"], doc["payload_not_available"]) == ("online", "offline")
    cmps = doc["cmps"]
    for key, comp in cmps.items():
        assert comp["p"] and comp["unique_id"].startswith("tracker_hall_"), key
    assert len({c["unique_id"] for c in cmps.values()}) == len(cmps)
    platforms = {key: c["p"] for key, c in cmps.items()}
    assert platforms == {"presence": "binary_sensor", "person": "event", "snapshot": "image", "fps": "sensor",
                         "latency": "sensor", "dropped": "sensor"}
    assert cmps["person"]["event_types"] == ["entered", "identified", "left"]
    assert cmps["person"]["state_topic"] == "tracker/hall/events"
    assert cmps["snapshot"]["image_topic"] == "tracker/hall/snapshot"
    assert cmps["snapshot"]["content_type"] == "image/jpeg"
    assert cmps["presence"]["state_topic"] == "tracker/hall/state"
    assert cmps["fps"]["entity_category"] == cmps["latency"]["entity_category"] == "diagnostic"
    assert cmps["latency"]["unit_of_measurement"] == "ms"

    # Home Assistant restarts and announces itself: the guard sends discovery again.
    before = len([1 for t, _, _ in sub.messages if t == topic])
    sub.client.publish("homeassistant/status", "online", qos=1)
    sub.wait_for(lambda m: len([1 for t, _, _ in m if t == topic]) > before)
    sub.close()


def test_home_assistants_restart_is_heard_with_another_discovery_prefix(broker, sinks, tmp_path):
    """Home Assistant announces itself on homeassistant/status whatever its discovery prefix (its
    birth message is a setting of its own): with `discovery_prefix: ha` the guard listened on
    ha/status only, and a restarted Home Assistant waited for the next state message."""
    topic = "ha/device/tracker_shed/config"
    sub = Subscriber(broker, ["ha/device/#"])
    open_sink(sinks, broker, tmp_path, "shed", discovery_prefix="ha")
    sub.wait_for(lambda m: any(t == topic for t, _, _ in m))
    for status in ("homeassistant/status", "ha/status"):
        before = len(sub.payloads(topic))
        sub.client.publish(status, "online", qos=1)
        sub.wait_for(lambda m, before=before: len([1 for t, _, _ in m if t == topic]) > before)
    sub.close()


def test_turning_discovery_off_removes_the_device_from_home_assistant(broker, sinks, tmp_path):
    """The retained discovery document of an earlier run stayed on the broker for good: Home
    Assistant kept the device's entities, unavailable, after discovery was turned off."""
    topic = "homeassistant/device/tracker_porch/config"
    sub = Subscriber(broker, ["homeassistant/device/#"])
    first = open_sink(sinks, broker, tmp_path / "on", "porch")
    sub.wait_for(lambda m: any(t == topic and p for t, p, _ in m))
    first.close()
    open_sink(sinks, broker, tmp_path / "off", "porch", discovery=False)
    sub.wait_for(lambda m: any(t == topic and p == b"" for t, p, _ in m))  # the removal
    sub.close()
    later = Subscriber(broker, ["homeassistant/device/#"])  # a Home Assistant that starts now
    later.sync()
    assert later.payloads(topic) == []  # nothing retained: no device to create
    later.close()


def test_two_guards_on_one_broker(broker, sinks, tmp_path):
    sub = Subscriber(broker, ["tracker/+/events", "tracker/+/availability", "homeassistant/device/#"])
    kitchen = open_sink(sinks, broker, tmp_path / "kitchen", "kitchen")
    garden = open_sink(sinks, broker, tmp_path / "garden", "garden")
    assert kitchen.client_id != garden.client_id
    a = [make_event(track_id=i) for i in range(5)]
    b = [make_event(track_id=100 + i) for i in range(5)]
    for x, y in zip(a, b):
        kitchen.publish_event(x, None)
        garden.publish_event(y, None)
    m = sub.wait_for(lambda m: len(events_of(m, "tracker/kitchen/events")) == 5
                     and len(events_of(m, "tracker/garden/events")) == 5)
    assert [e["id"] for e in events_of(m, "tracker/kitchen/events")] == [e.id for e in a]
    assert [e["id"] for e in events_of(m, "tracker/garden/events")] == [e.id for e in b]
    m = sub.wait_for(lambda m: {t for t, _, _ in m if t.startswith("homeassistant/")} >= {
        "homeassistant/device/tracker_kitchen/config", "homeassistant/device/tracker_garden/config"})
    assert ("tracker/kitchen/availability", b"online") in [(t, p) for t, p, _ in m]
    assert ("tracker/garden/availability", b"online") in [(t, p) for t, p, _ in m]
    assert kitchen.connected and garden.connected  # neither knocked the other off
    assert "already connected" not in broker.log_text()
    sub.close()


def test_two_guards_with_one_device_id_are_named_as_the_cause(broker, sinks, tmp_path, caplog):
    """A misconfiguration, not a crash loop: MQTT 5 tells the displaced guard why it was dropped."""
    first = open_sink(sinks, broker, tmp_path / "a", "twin", reconnect_max_s=1)
    deadline = time.monotonic() + 30
    while not first.connected and time.monotonic() < deadline:
        time.sleep(0.05)
    open_sink(sinks, broker, tmp_path / "b", "twin", reconnect_max_s=1)
    while time.monotonic() < deadline and not any("give each guard its own device.id" in r.getMessage()
                                                  for r in caplog.records):
        time.sleep(0.05)
    mine = [r.getMessage() for r in caplog.records if r.name == "tracker.sinks.mqtt" and r.levelno >= logging.WARNING]
    # mosquitto 2.0.11 just closes the displaced connection (newer brokers send the MQTT 5 reason
    # "Session taken over"); either way the log names the likely cause
    assert any("client id 'tracker-twin'" in m and "own device.id" in m for m in mine), mine
    # The guards go on flapping while the log is read, so bound what holds at any moment: each
    # problem is said once per outage by each guard, and no outage ends here (that takes a 30 s
    # connection): the hint at most once per guard, and a few distinct lines in all.
    assert max(Counter(mine).values()) <= 2, mine
    assert sum("own device.id" in m for m in mine) <= 2, mine
    assert len(mine) <= 2 * 6, mine


def test_guards_dropped_as_soon_as_accepted_back_off(broker, sinks, tmp_path):
    """paho starts its back-off afresh at every CONNACK: two guards with one device.id, each taking
    the other's session over, would reconnect every reconnect_min_s for ever. Each session that
    ends at once doubles the first wait (paho's, read from the client)."""
    twins = [open_sink(sinks, broker, tmp_path / name, "twin", reconnect_min_s=1, reconnect_max_s=8) for name in "ab"]
    wait_until(lambda: all(t._client._reconnect_min_delay >= 4 for t in twins), 60, "both first waits to reach 4 s")
    assert all(t._client._reconnect_max_delay == 8 for t in twins)


def test_presence_change_publishes_state_at_once(broker, sinks, tmp_path):
    # state_interval_s is an hour: only the presence change can explain the second state message
    sink = open_sink(sinks, broker, tmp_path, "porch", state_interval_s=3600)
    sub = Subscriber(broker, ["tracker/porch/state"])
    sink.publish_state({"tracks": 0, "fps": 10.0})
    sub.wait_for(lambda m: any(json.loads(p).get("tracks") == 0 for _, p, _ in m))  # the first state
    sink.publish_state({"tracks": 2, "fps": 10.0})
    states = sub.wait_for(lambda m: any(json.loads(p).get("tracks") == 2 for _, p, _ in m))
    assert json.loads(states[-1][1])["fps"] == 10.0
    sub.close()


def test_the_retained_state_expires_three_intervals_on_and_a_minute_at_least(broker, sinks, tmp_path):
    """A guard cut off without its Last Will (a power cut while the broker is away) must not leave
    its numbers retained for ever: the state expires after 3 intervals (MQTT 5 MessageExpiryInterval),
    never before a minute. The broker forwards the time left, so it is bounded, not equal."""
    for device, interval, least, most in (("shed", 3600, 60, 3 * 3600), ("barn", 1, 3, 60)):
        topic = f"tracker/{device}/state"
        live = Subscriber(broker, [topic])
        open_sink(sinks, broker, tmp_path / device, device, state_interval_s=interval).publish_state({"tracks": 0})
        live.wait_for(lambda m: m)  # the broker holds it now
        live.close()
        late = Subscriber(broker, [topic], v5=True)
        (_, _, retained), *_ = late.wait_for(lambda m: m)
        assert retained and least < getattr(late.properties[0], "MessageExpiryInterval", 0) <= most, device
        late.close()


def test_broker_down_at_start_then_restart_with_a_full_outbox(tmp_path, sinks, caplog):
    """The guard starts with no broker: it runs, says so once, keeps events (bounded, oldest dropped
    and counted); restarted later, the new process delivers what the outbox kept, in order."""
    broker = Broker(tmp_path / "b")  # configured, not started
    caplog.set_level(logging.INFO, logger="tracker.sinks")
    sink = open_sink(sinks, broker, tmp_path / "state", "attic", outbox={"max_events": 20})
    events = [make_event(track_id=i) for i in range(30)]
    for e in events:
        sink.publish_event(e, None)
    assert len(sink.outbox) == 20 and sink.outbox.dropped == 10 and not sink.connected
    deadline = time.monotonic() + 30
    while sink.failed_attempts < 2 and time.monotonic() < deadline:  # it keeps retrying...
        time.sleep(0.1)
    assert sink.failed_attempts >= 2
    sink.close()
    sinks.remove(sink)

    with broker:
        sub = Subscriber(broker, ["tracker/attic/events", "tracker/attic/state"])
        sink = open_sink(sinks, broker, tmp_path / "state", "attic", outbox={"max_events": 20})
        m = sub.wait_for(lambda m: len(events_of(m, "tracker/attic/events")) >= 20)
        assert [e["id"] for e in events_of(m, "tracker/attic/events")][:20] == [e.id for e in events[10:]]
        sink.publish_state({"tracks": 1})  # presence change: a state with the counters now
        m = sub.wait_for(lambda m: any(json.loads(p).get("tracks") == 1 for t, p, _ in m if t.endswith("/state")))
        state = [json.loads(p) for t, p, _ in m if t.endswith("/state")][-1]
        assert state["events_dropped"] == 10  # the drop count survived the restart
        sub.close()
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 1, [r.getMessage() for r in unreachable]
    assert "the guard keeps running" in unreachable[0].getMessage()


def test_mqtt_3_1_1_works_too(broker, sinks, tmp_path):
    sub = Subscriber(broker, ["tracker/old/events"])
    sink = open_sink(sinks, broker, tmp_path, "old", protocol="v311")
    e = make_event()
    sink.publish_event(e, None)
    assert events_of(sub.wait_for(lambda m: m), "tracker/old/events")[0]["id"] == e.id
    sub.close()


def test_corrupt_outbox_is_moved_aside_and_the_sink_runs(broker, sinks, tmp_path, caplog):
    (tmp_path / "outbox.sqlite3").write_bytes(b"this is not a database" * 100)
    sub = Subscriber(broker, ["tracker/cellar/events"])
    sink = open_sink(sinks, broker, tmp_path, "cellar")
    assert sink.outbox.recovered_from is not None and sink.outbox.recovered_from.exists()
    assert any("corrupt" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    e = make_event()
    sink.publish_event(e, None)
    assert events_of(sub.wait_for(lambda m: m), "tracker/cellar/events")[0]["id"] == e.id
    sub.close()


# -- the password file (no broker needed) ----------------------------------------------------------

def _mqtt(tmp_path, **keys):
    from tracker.config import parse_config

    return parse_config({"mqtt": keys}).mqtt


def test_password_file_group_readable_is_warned_about(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    secret.chmod(0o644)
    assert read_password(_mqtt(tmp_path, username="guard", password_file=str(secret))) == "hunter2"
    assert any("readable by group or others" in r.getMessage() for r in caplog.records)
    caplog.clear()
    secret.chmod(0o600)
    assert read_password(_mqtt(tmp_path, username="guard", password_file=str(secret))) == "hunter2"
    assert not caplog.records


def test_a_group_readable_password_file_is_warned_about_once_though_read_twice(tmp_path, caplog, monkeypatch):
    """The guard reads it in its preflight (all that --check-config runs) and again in its sink:
    the warning was printed twice at every start."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    secret.chmod(0o640)
    config = _mqtt(tmp_path, username="guard", password_file=str(secret))
    assert read_password(config) == read_password(config) == "hunter2"
    assert [r.getMessage() for r in caplog.records].count(f"mqtt password file {secret} is readable by group or others "
                                                          f"(mode 640); run: chmod 600 {secret}") == 1


def test_password_from_systemd_credentials_directory(tmp_path, monkeypatch, caplog):
    (tmp_path / "mqtt-password").write_text("from-systemd")
    (tmp_path / "mqtt-password").chmod(0o440)  # systemd's own mode: not warned about
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert read_password(_mqtt(tmp_path, username="guard")) == "from-systemd"
    assert not caplog.records
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert read_password(_mqtt(tmp_path, username="guard")) is None


@pytest.mark.parametrize("content, keys, expected", [
    ("", {"username": "guard"}, "is empty"),
    ("pw", {}, "mqtt.username is null"),
])
def test_password_file_mistakes_are_one_line_config_errors(tmp_path, content, keys, expected):
    secret = tmp_path / "pw"
    secret.write_text(content)
    secret.chmod(0o600)
    with pytest.raises(ConfigError, match=expected) as err:
        read_password(_mqtt(tmp_path, password_file=str(secret), **keys))
    assert "\n" not in str(err.value) and str(secret) in str(err.value)


def test_unreadable_password_file_is_a_config_error(tmp_path):
    secret = tmp_path / "pw"
    secret.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ConfigError, match="cannot read"):
        read_password(_mqtt(tmp_path, username="guard", password_file=str(secret)))


def test_a_puback_after_close_is_not_taken_for_a_full_disk(broker, sinks, tmp_path, caplog):
    """paho's thread can deliver a PUBACK after close() closed the outbox: deleting its event failed
    on the closed database and was logged as the full disk's error."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    sink = open_sink(sinks, broker, tmp_path)
    wait_until(lambda: sink.connected, what="the sink to connect")
    sink.publish_event(make_event())
    wait_until(lambda: len(sink.outbox) == 0, what="the event to be acknowledged")
    sink.close()  # (the PUBACK below comes late)
    sink._inflight[60000] = 1
    with caplog.at_level(logging.WARNING, logger="tracker.sinks.mqtt"):
        sink._on_publish(None, None, 60000, ReasonCode(PacketTypes.PUBACK, "Success"), None)
    assert not caplog.records


def test_a_lasting_publisher_error_is_logged_once_a_minute_not_every_second(broker, sinks, tmp_path, caplog):
    """A failing disk made every turn of the publisher (one a second) log a traceback: journald's
    rate limit then drops the guard's own lines too."""
    sink = open_sink(sinks, broker, tmp_path)
    wait_until(lambda: sink.connected, what="the sink to connect")
    real, calls = sink.outbox.pending, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 3:
            raise sqlite3.OperationalError("disk I/O error")
        return real(*args, **kwargs)

    sink.outbox.pending = failing
    with caplog.at_level(logging.INFO, logger="tracker.sinks.mqtt"):
        sink.publish_event(make_event())
        wait_until(lambda: len(sink.outbox) == 0, what="the event to go once the error is over")
    said = [r.getMessage() for r in caplog.records]
    assert sum("publisher error" in m for m in said) == 1, said
    assert "mqtt: the publisher works again after 3 error(s)" in said
    sink.close()


def test_no_state_goes_out_before_the_guard_gives_one(broker, sinks, tmp_path):
    """On connect the sink published a state of its own counters alone (no tracks, fps or frames),
    retained: what a consumer saw until the guard's first numbers came."""
    sub = Subscriber(broker, ["tracker/pi-new/state", "tracker/pi-new/availability"])  # nothing retained
    sink = open_sink(sinks, broker, tmp_path, device="pi-new")
    sub.wait_for(lambda m: any(t == "tracker/pi-new/availability" and p == b"online" for t, p, _ in m))
    sink.publish_state({"fps": 0.0, "tracks": 0, "frames_dropped": 0, "backend": "caffe-openblas-dl"})
    messages = sub.wait_for(lambda m: any(t == "tracker/pi-new/state" for t, _, _ in m))
    first = next(json.loads(p) for t, p, _ in messages if t == "tracker/pi-new/state")
    assert first["tracks"] == 0 and first["backend"] == "caffe-openblas-dl"
    sink.close()
    sub.close()


@pytest.mark.parametrize("last", [{"tracks": 0, "fps": 9.0}, {"tracks": 1, "fps": 4.0}],
                         ids=["everyone-left", "numbers-only"])
def test_the_last_state_given_before_close_is_the_retained_one(broker, sinks, tmp_path, last):
    """close() stopped the publisher at once when the outbox was empty: a state handed over just
    before it (the guard's last one, "nobody present", just before a SIGTERM) never went, and the
    retained state went on saying someone was there."""
    device = f"closing{last['tracks']}"
    sub = Subscriber(broker, [f"tracker/{device}/state"])
    sink = open_sink(sinks, broker, tmp_path, device, state_interval_s=3600)
    sink.publish_state({"tracks": 1, "fps": 10.0})
    sub.wait_for(lambda m: any(json.loads(p)["tracks"] == 1 for _, p, _ in m))
    sub.close()
    sink.publish_state(last)
    sink.close()
    late = Subscriber(broker, [f"tracker/{device}/state"])
    late.sync()
    retained = [json.loads(p) for t, p, r in late.messages if t == f"tracker/{device}/state" and r]
    assert [(s["tracks"], s["fps"]) for s in retained] == [(last["tracks"], last["fps"])]
    late.close()
