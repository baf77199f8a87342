"""MQTT 5 limits on a real Mosquitto: the broker's Maximum Packet Size and Receive Maximum are
honoured, the guard announces its own Maximum Packet Size, and ordinary broker restarts are not
blamed on a second client."""

from __future__ import annotations

import json
import logging
import signal
import socket
import time
from dataclasses import replace

import paho.mqtt.client as mqtt
import pytest
from mosquitto import Broker, Subscriber, make_event, wait_until
from test_mqtt import events_of, open_sink
from tmpfs import tmpfs

from tracker.sinks.mqtt import CLIENT_MAX_PACKET, MAX_SNAPSHOT_BYTES, publish_packet_size
from tracker.sinks.outbox import Outbox


@pytest.fixture
def sinks():
    made = []
    yield made
    for sink in made:
        sink.close()


def wait(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_publish_packet_size_follows_the_mqtt_encoding():
    # fixed header 1 + remaining length 1 + topic 2+1 + packet id 2 + properties length 1 + payload 3
    assert publish_packet_size("t", 3, qos=1) == 11
    assert publish_packet_size("t", 3, qos=0, v5=False) == 8  # no packet id, no properties
    # remaining length 3 + 200 + 1 + 5 = 209 needs a 2-byte variable byte integer
    assert publish_packet_size("t", 200, qos=0, properties=5) == 1 + 2 + 209


def test_a_broker_maximum_packet_size_is_honoured(tmp_path, sinks, caplog):
    """mosquitto `max_packet_size 1024`: the ~1.9 kB discovery message is never sent (said once with
    size and limit, counted in the state), an event too large for it is dropped and counted, every
    other event arrives, and the guard never reconnects."""
    caplog.set_level(logging.INFO, logger="tracker.sinks")
    with Broker(tmp_path / "b", options=("max_packet_size 1024",)) as broker:
        sub = Subscriber(broker, ["tracker/door/#", "homeassistant/#"])
        sink = open_sink(sinks, broker, tmp_path / "state", "door")
        assert wait(lambda: sink.connected)
        events = [make_event(track_id=i) for i in range(14)]
        huge = replace(make_event(track_id=99), identity="x" * 1200)  # a payload no 1024-byte packet holds
        for event in events[:7] + [huge] + events[7:]:
            sink.publish_event(event, None)
        messages = sub.wait_for(lambda m: len(events_of(m, "tracker/door/events")) >= 14)
        assert [e["id"] for e in events_of(messages, "tracker/door/events")] == [e.id for e in events]
        sink.publish_state({"tracks": 1})
        messages = sub.wait_for(lambda m: any(json.loads(p).get("tracks") == 1 for t, p, _ in m if t.endswith("/state")))
        state = [json.loads(p) for t, p, _ in messages if t.endswith("/state")][-1]
        assert state["events_dropped"] == 1 and state["too_large"]["discovery"] >= 1 and state["too_large"]["event"] == 1
        assert not [t for t, _, _ in messages if t.startswith("homeassistant/")]
        # Sync with the sink before reading its counters: a drop caused by anything it sent so far
        # reaches paho's thread (failed_attempts) before the PUBACK of a last event, which the
        # broker would only send on a new connection (logged as one) and which empties the outbox.
        last = make_event(track_id=100)
        sink.publish_event(last, None)
        sub.wait_for(lambda m: last.id in [e["id"] for e in events_of(m, "tracker/door/events")])
        wait_until(lambda: len(sink.outbox) == 0, what="the last event's PUBACK")
        assert sink.failed_attempts == 0 and broker.log_text().count("New client connected") == 2  # sink + subscriber
        sub.close()
    said = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len([m for m in said if m.startswith("mqtt: discovery message")]) == 1
    assert any("accepts packets of at most 1024 bytes" in m for m in said)
    assert any("event (outbox seq" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)


def test_the_broker_receive_maximum_bounds_the_messages_in_flight(tmp_path, sinks):
    """mosquitto `max_inflight_messages 2` announces Receive Maximum 2: after an outage with 18
    events waiting, never more than 2 QoS 1 publishes are unacknowledged, and all arrive in order."""
    broker = Broker(tmp_path / "b", options=("max_inflight_messages 2",))
    sink = open_sink(sinks, broker, tmp_path / "state", "hall")
    events = [make_event(track_id=i) for i in range(18)]
    for event in events:
        sink.publish_event(event, None)
    # The count of unacknowledged publishes only rises when the sink records one, always with
    # sink._lock held; recording the count there sees its true maximum, which a sampler may miss.
    most = [0]

    def record():
        most[0] = max(most[0], len(sink._inflight) + len(sink._control))

    class Recorded(dict):  # mid -> outbox seq (events) or topic (availability, discovery)
        def __setitem__(self, mid, value):
            super().__setitem__(mid, value)
            record()

    with sink._lock:  # not connected yet: both are empty
        sink._inflight, sink._control = Recorded(), Recorded()
    with broker:
        sub = Subscriber(broker, ["tracker/hall/events"])
        messages = sub.wait_for(lambda m: len(events_of(m, "tracker/hall/events")) >= 18)
        sub.close()
    assert [e["id"] for e in events_of(messages, "tracker/hall/events")] == [e.id for e in events]
    # 1 <= most: some publish was recorded (fails only if all 19 were acknowledged before the sink recorded them)
    assert sink._window == 2 and 1 <= most[0] <= 2


def test_an_oversize_retained_status_message_never_reaches_the_guard(tmp_path, sinks):
    """A 100 kB retained message on homeassistant/status: the guard's CONNECT says it accepts at
    most CLIENT_MAX_PACKET bytes, so an MQTT 5 broker does not deliver it; on MQTT 3.1.1 (no such
    announcement) it arrives and is ignored and counted."""
    with Broker(tmp_path / "b") as broker:
        publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        publisher.connect("127.0.0.1", broker.port)
        publisher.loop_start()
        publisher.publish("homeassistant/status", b"x" * 100_000, qos=1, retain=True).wait_for_publish(10)
        assert 100_000 > CLIENT_MAX_PACKET
        v5 = open_sink(sinks, broker, tmp_path / "a", "v5")
        v311 = open_sink(sinks, broker, tmp_path / "b311", "old", protocol="v311")
        received = []  # payloads of the messages v5 receives (paho's thread)

        def on_message(client, userdata, message):
            received.append(bytes(message.payload))
            v5._on_message(client, userdata, message)

        v5._client.on_message = on_message
        assert wait(lambda: v5.connected and v311.connected)
        assert wait(lambda: v311._inbound_ignored == 1)
        # Mosquitto queues the retained messages for a subscription before it sends the SUBACK, and
        # keeps per-client order: once a marker published after that has reached v5, anything the
        # broker was going to deliver from the retained message has been handled too.
        assert wait(lambda: f"Sending SUBACK to {v5.client_id}" in broker.log_text())
        publisher.publish("homeassistant/status", b"offline", qos=1).wait_for_publish(10)  # ignored by the sink
        assert wait(lambda: b"offline" in received)
        publisher.disconnect()
        publisher.loop_stop()
        assert v5._inbound_ignored == 0 and v5.connected


def test_broker_restarts_are_not_blamed_on_another_client(tmp_path, sinks, caplog):
    """Four broker restarts, each after the guard had been connected a few seconds (the broker of
    2.0.11 gives no reason when it shuts down): lost connections are reported, and the hint about a
    second client (meant for sessions that end within 2 s of every CONNACK) is not given."""
    caplog.set_level(logging.INFO, logger="tracker.sinks")
    broker = Broker(tmp_path / "b")
    with broker:
        sink = open_sink(sinks, broker, tmp_path / "state", "porch", reconnect_max_s=1)
        assert wait(lambda: sink.connected)
        for _ in range(4):
            time.sleep(3.0)  # connected for longer than a flap (_FLAP_S)
            connects = sink._generation  # bumped on every CONNACK
            broker.restart()
            # `connected` may still be the old connection's True until paho notices the drop
            assert wait(lambda connects=connects: sink._generation > connects)
        sub = Subscriber(broker, ["tracker/porch/events"])
        event = make_event()
        sink.publish_event(event, None)
        assert events_of(sub.wait_for(lambda m: m), "tracker/porch/events")[0]["id"] == event.id
        sub.close()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "another client may be using client id" not in text
    assert "lost the connection" in text or "closed the connection" in text


def test_a_mqtt_3_1_1_broker_that_hangs_up_on_a_message_too_large_is_given_as_a_cause(tmp_path, sinks, caplog):
    """MQTT 3.1.1 does not tell the guard the broker's max_packet_size: mosquitto with 1024 bytes
    hangs up on the discovery document (about 2 kB) at every connect, and the hint named only
    another client with the same client id or an ACL. It names a message too large too now."""
    with Broker(tmp_path / "b", options=("max_packet_size 1024",)) as broker:
        open_sink(sinks, broker, tmp_path / "state", "attic", protocol="v311", reconnect_max_s=1)
        assert wait(lambda: any("3 or more times in a row" in r.getMessage() for r in caplog.records))
    hint = next(r.getMessage() for r in caplog.records if "3 or more times in a row" in r.getMessage())
    assert "a message of the guard's is larger than the broker accepts (its max_packet_size" in hint
    assert "mqtt.protocol v5" in hint


def fill(disk) -> None:
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_acknowledgements_the_full_disk_keeps_from_the_outbox_stop_no_delivery(tmp_path, sinks, caplog):
    """PUBACKs that arrive while the disk is full: the outbox cannot delete their events, which stay
    (sent again after a reconnect), said once; paho's network thread goes on (the exception ended
    it, and every delivery after it)."""
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        with Broker(tmp_path / "b") as broker:
            sink = open_sink(sinks, broker, disk, "cellar")
            assert wait(lambda: sink.connected)
            broker.freeze()
            for _ in range(5):
                sink.publish_event(make_event(), None)
            fill(disk)
            broker.proc.send_signal(signal.SIGCONT)  # the PUBACKs come in
            assert wait(lambda: "cannot delete acknowledged events from the outbox" in caplog.text)
            (disk / "filler").unlink()
            sub = Subscriber(broker, ["tracker/cellar/events"])
            later = [make_event() for _ in range(30)]
            for event in later:
                sink.publish_event(event, None)
            sub.wait_for(lambda m: {e.id for e in later} <= {json.loads(p)["id"] for _, p, _ in m})
            assert caplog.text.count("cannot delete acknowledged events") == 1
            sub.close()
            sink.close()
            sinks.remove(sink)


def test_events_the_full_disk_refuses_reach_the_broker_and_the_guard_goes_on(tmp_path, sinks, caplog):
    """The outbox on a 1 MB file system that fills while the guard runs, the broker connected: each
    event the file refused was dropped and counted in events_dropped. They are delivered now (the
    outbox goes on in memory, said once), publish_event never raises, nothing is counted as
    dropped, and at the stop the file is written again: no event waits in it, all were delivered."""
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        with Broker(tmp_path / "b") as broker:
            sub = Subscriber(broker, ["tracker/cellar/events"])
            sink = open_sink(sinks, broker, disk, "cellar")
            assert wait(lambda: sink.connected)
            fill(disk)
            events = [make_event() for _ in range(3)]
            for event in events:
                sink.publish_event(event, None)  # never raises
            sub.wait_for(lambda m: {e.id for e in events} <= {json.loads(p)["id"] for _, p, _ in m})
            assert sink.events_dropped == 0 and not sink.outbox.durable
            assert caplog.text.count("the disk refuses writes (database or disk is full)") == 1
            wait_until(lambda: len(sink.outbox) == 0, what="the PUBACKs")
            (disk / "filler").unlink()
            sub.close()
            sink.close()
            sinks.remove(sink)
        outbox = Outbox(disk / "outbox.sqlite3")
        assert outbox.durable and len(outbox) == 0 and outbox.dropped == 0
        outbox.close()


def test_what_the_brokers_acl_refuses_is_said_once_per_topic(tmp_path, sinks, caplog):
    """An ACL that refuses `availability` left Home Assistant showing the guard unavailable with
    nothing in the guard's log; refused events were one error each. Each refused topic is now one
    line per connection (v5 PUBACK reason codes), the events counted in state.events_dropped.
    That is Home Assistant's *Events dropped*, a total_increasing sensor: the refused events were
    counted from the guard's start only, so a restart took them off again (3 -> 0), which Home
    Assistant takes for a new meter and adds to its statistics again. They are counted in the
    outbox file now, as the bounds' drops are."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite tracker/door/state\ntopic readwrite tracker/door/snapshot\n"
                   "topic readwrite homeassistant/#\n")  # neither availability nor events
    caplog.set_level(logging.INFO, logger="tracker.sinks")
    with Broker(tmp_path / "b", options=(f"acl_file {acl}",)) as broker:
        sink = open_sink(sinks, broker, tmp_path / "state", "door")
        assert wait(lambda: sink.connected)
        for i in range(3):
            sink.publish_event(make_event(track_id=i), None)
        wait_until(lambda: len(sink.outbox) == 0, what="the refused events' PUBACKs")
        assert sink.events_dropped == 3
        sink.close()
        assert open_sink(sinks, broker, tmp_path / "state", "door").events_dropped == 3  # after a restart
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage() and r.levelno == logging.ERROR]
    assert len([m for m in said if "on tracker/door/availability: Not authorized" in m]) == 1, said
    events = [m for m in said if "on tracker/door/events: Not authorized" in m]
    assert len(events) == 1 and "further ones are counted in state.events_dropped" in events[0], said
    assert not [m for m in said if "homeassistant/" in m]


def test_a_slow_link_holds_at_most_one_state_and_one_snapshot_in_paho(tmp_path, sinks):
    """State and snapshot are QoS 0, which nothing acknowledges: paho queued every one of them
    while the link was slower than they came (4.9 MB after 105 s of 1 MB faces, and growing). A
    frozen broker (SIGSTOP) reads nothing, so the first snapshot fills the socket's buffers and
    stays in paho unwritten; every later state and snapshot must wait outside paho, only the latest
    kept, and go once the broker reads again."""
    broker = Broker(tmp_path / "b").start()
    sink = open_sink(sinks, broker, tmp_path / "state", "slow", keepalive_s=600,
                     state_interval_s=3600)
    sub = Subscriber(broker, ["tracker/slow/state"])
    sink.publish_state({"tracks": 0, "fps": -1.0})
    sub.wait_for(lambda m: m)  # connected, and the first state written
    sub.close()
    # small socket buffers: one 1 MB snapshot cannot fit into them and the broker's, whatever the
    # kernel's autotuning (the link is slow, not broken: paho's keepalive is 10 minutes here)
    sink._client.socket().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    topics = {name: sink.topics[name].encode() for name in ("state", "snapshot")}

    def queued(name: str) -> int:
        """`name`'s publishes in paho's out-queue (a packet leaves it once written whole)."""
        packets = list(sink._client._out_packet)
        return sum(p["qos"] == 0 and topics[name] in p["packet"][:64] for p in packets)

    def face(i: int) -> bytes:
        return b"face %03d " % i + bytes(MAX_SNAPSHOT_BYTES - 9)

    def hand_over(i: int) -> None:
        """A state (a presence change: due at once) and an event with its face, as the guard gives
        them; returns once the publisher has taken the event, so everything handed over before
        this call has been dealt with (a publisher turn takes events first, the rest after)."""
        sink.publish_state({"tracks": i % 2, "fps": float(i)})
        sink.publish_event(make_event(track_id=i), face(i))
        seq = sink.outbox.pending(limit=1000)[-1][0]
        wait_until(lambda: sink._cursor >= seq, what=f"the publisher to take event {i}")

    broker.freeze()
    try:
        for i in range(12):  # (the broker's Receive Maximum, 20, bounds the events in flight)
            hand_over(i)
            assert queued("snapshot") <= 1 and queued("state") <= 1, (i, queued("snapshot"), queued("state"))
        wait_until(lambda: queued("snapshot") == 1 and queued("state") == 1, what="one of each unwritten")
    finally:
        broker.thaw()
    sub = Subscriber(broker, ["tracker/slow/state", "tracker/slow/snapshot"])
    sub.wait_for(lambda m: face(11) in [p for t, p, _ in m if t == "tracker/slow/snapshot"]
                 and any(json.loads(p)["fps"] == 11.0 for t, p, _ in m if t == "tracker/slow/state"))
    sub.close()
    broker.stop()
