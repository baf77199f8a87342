"""Sinks: where events and the guard's state go (console, JSON lines, MQTT).

Every sink has the same three calls, made from the pipeline's thread:
    publish_event(event: Event, snapshot_jpeg: bytes | None) -> None
    publish_state(state: dict) -> None        # fps, latency percentiles, tracks, drops, backend
    close() -> None                           # flush and release; called once at shutdown
Only `tracker.sinks.mqtt` imports paho.

MQTT (docs/ARCHITECTURE.md, section 4, schema 1): `MqttSink(config.mqtt, config.device, state_dir)`.
`publish_event` stores the event in a durable SQLite outbox (`outbox.py`) and returns; a background
thread delivers it at QoS 1 and deletes it on the broker's PUBACK, so outages and restarts lose
nothing. `publish_state` is cheap (it keeps the latest dict; the sink publishes it every
mqtt.state_interval_s, and at once when `tracks` goes between 0 and >0), so call it as often as is
convenient. `close` flushes for at most mqtt.flush_timeout_s, publishes `offline` and disconnects.
Home Assistant discovery documents are built in `homeassistant.py`.
"""

from __future__ import annotations

from typing import Protocol

from tracker.types import Event


class Sink(Protocol):
    def publish_event(self, event: Event, snapshot_jpeg: bytes | None) -> None: ...

    def publish_state(self, state: dict) -> None: ...

    def close(self) -> None: ...
