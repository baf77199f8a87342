"""No event lost: the broker is killed (SIGKILL) and restarted several times while the guard keeps
producing events; every event id must reach a subscriber at least once, and the outbox must drain.

Each kill hits a broker frozen (SIGSTOP) after everything it had acknowledged reached the
subscriber, while the guard goes on publishing into it: the guard then has events in flight that
the broker never acknowledged and must send again. A broker killed while running could lose
events it had acknowledged but not yet saved (mosquitto saves after it answers), which is the
broker's durability, not the guard's: under emulation that window once failed this test."""

from __future__ import annotations

import json
import threading
import time

from mosquitto import Broker, Subscriber, make_event, sink_config, wait_until

from tracker.sinks.mqtt import MqttSink

KILLS = 4


def test_every_event_survives_repeated_broker_kills(tmp_path):
    broker = Broker(tmp_path / "broker", persistent=True).start()
    # The subscriber's session (its subscription, and QoS 1 messages queued while it reconnects) must
    # survive the kills, or the test would blame the guard for the subscriber's absence: create it,
    # then stop the broker cleanly once so the session is on disk before the first kill.
    sub = Subscriber(broker, ["tracker/flow/events"], persistent=True)
    broker.restart()
    sub.sync()
    config = sink_config(broker, "flow", max_inflight=5)
    sink = MqttSink(config.mqtt, config.device, tmp_path / "state")
    produced: list[str] = []
    stop = threading.Event()
    between_events = threading.Lock()  # held by the test: the guard waits before its next event

    def guard():  # the pipeline: an event every few milliseconds, whatever the broker does
        while not stop.is_set():
            with between_events:
                event = make_event(track_id=len(produced))
                sink.publish_event(event, None)
                produced.append(event.id)
            time.sleep(0.01)

    producer = threading.Thread(target=guard)
    producer.start()
    in_flight_at_kills = []
    try:
        for _ in range(KILLS):
            while not sink.connected:  # let events flow through a live broker first
                time.sleep(0.05)
            time.sleep(0.3)
            with between_events:
                wait_until(lambda: len(sink.outbox) == 0, what="the broker to acknowledge every event")
                sub.sync()  # everything the broker acknowledged has reached the subscriber
                broker.freeze()
            time.sleep(0.3)  # the guard publishes into the frozen broker: nothing is acknowledged
            in_flight_at_kills.append(len(sink.outbox))
            broker.kill()
            time.sleep(0.5)  # events keep coming while the broker is gone
            broker.start()
        while not sink.connected:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        stop.set()
        producer.join()
    try:
        wanted = set(produced)
        messages = sub.wait_for(lambda m: wanted <= {json.loads(p)["id"] for _, p, _ in m if p[:1] == b"{"},
                                timeout=60)
        received = [json.loads(p)["id"] for _, p, _ in messages if p[:1] == b"{"]
        assert wanted <= set(received)
        assert len(produced) > 50  # events really flowed across the outages
        assert min(in_flight_at_kills) > 0  # every kill caught events the broker had not acknowledged
        wait_until(lambda: len(sink.outbox) == 0, what="the outbox to empty")
        assert sink.events_dropped == 0
        print(f"{len(produced)} events, {len(received)} deliveries ({len(received) - len(wanted)} duplicates), "
              f"{KILLS} broker kills with {in_flight_at_kills} events unacknowledged")
    finally:
        sink.close()
        sub.close()
        broker.stop()


def test_a_state_published_across_a_reconnect_does_not_hold_back_the_later_ones(tmp_path):
    """A reconnect between paho's publish() of a state and the sink's record of it: paho dropped the
    unwritten QoS 0 copy without an on_publish, the record waited for it for good, and no later
    state went out (close() then waited its whole flush_timeout_s for it)."""
    from mosquitto import Subscriber

    broker = Broker(tmp_path / "broker").start()
    config = sink_config(broker, "across", state_interval_s=3600, reconnect_min_s=1, reconnect_max_s=1)
    sink = MqttSink(config.mqtt, config.device, tmp_path / "state")
    try:
        wait_until(lambda: sink.connected, what="the first connection")
        publish = sink._client.publish
        armed = threading.Event()

        def reconnecting_publish(topic, payload=None, qos=0, retain=False, properties=None):
            info = publish(topic, payload, qos=qos, retain=retain, properties=properties)
            if armed.is_set() and topic.endswith("/state"):  # the connection goes before the record is made
                armed.clear()
                generation = sink._generation
                broker.restart()
                wait_until(lambda: sink._generation > generation and sink.connected, what="the reconnection")
            return info

        sink._client.publish = reconnecting_publish
        armed.set()
        sink.publish_state({"tracks": 1, "fps": 2.0})  # the first state: due at once
        wait_until(lambda: not armed.is_set(), what="the state's publish")
        sink.publish_state({"tracks": 0, "fps": 3.0})  # a change of presence: due at once
        sub = Subscriber(broker, ["tracker/across/state"])
        sub.wait_for(lambda m: any(json.loads(p)["fps"] == 3.0 for _, p, _ in m))
        sub.close()
    finally:
        sink.close()
        broker.stop()
