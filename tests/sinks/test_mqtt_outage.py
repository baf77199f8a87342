"""No event lost: the broker is killed (SIGKILL) and restarted several times while the guard keeps
producing events; every event id must reach a subscriber at least once, and the outbox must drain."""

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

    def guard():  # the pipeline: an event every few milliseconds, whatever the broker does
        while not stop.is_set():
            event = make_event(track_id=len(produced))
            sink.publish_event(event, None)
            produced.append(event.id)
            time.sleep(0.01)

    producer = threading.Thread(target=guard)
    producer.start()
    try:
        for _ in range(KILLS):
            while not sink.connected:  # let events flow through a live broker first
                time.sleep(0.05)
            time.sleep(0.3)
            sub.sync()  # everything queued for the subscriber so far has arrived
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
        wait_until(lambda: len(sink.outbox) == 0, what="the outbox to empty")
        assert sink.events_dropped == 0
        print(f"{len(produced)} events, {len(received)} deliveries ({len(received) - len(wanted)} duplicates), "
              f"{KILLS} broker kills")
    finally:
        sink.close()
        sub.close()
        broker.stop()
