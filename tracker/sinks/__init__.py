"""Sinks: where events and the guard's state go (console, JSON lines, MQTT).

Every sink has the same three calls, made from the pipeline's thread:
    publish_event(event: Event, snapshot_jpeg: bytes | None) -> None
    publish_state(state: dict) -> None        # fps, latency percentiles, tracks, drops, backend
    close() -> None                           # flush and release; called once at shutdown
Only `tracker.sinks.mqtt` imports paho.
"""

from __future__ import annotations

from typing import Protocol

from tracker.types import Event


class Sink(Protocol):
    def publish_event(self, event: Event, snapshot_jpeg: bytes | None) -> None: ...

    def publish_state(self, state: dict) -> None: ...

    def close(self) -> None: ...
