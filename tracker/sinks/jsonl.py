"""JSON-lines sink: each event's schema-1 payload (tracker.events) as one line of a file.

Lines are flushed as written (line buffering), so a crash loses at most the line being written.
"""

from __future__ import annotations

import json
from pathlib import Path

from tracker.events import event_payload
from tracker.types import Event


class JsonlSink:
    def __init__(self, path: Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8", buffering=1)

    def publish_event(self, event: Event, snapshot_jpeg: bytes | None) -> None:
        payload = event_payload(event)
        payload["snapshot"] = event.snapshot
        self._file.write(json.dumps(payload, separators=(",", ":")) + "\n")

    def publish_state(self, state: dict) -> None:
        """The state is published by MQTT and printed by the latency report; not logged here."""

    def close(self) -> None:
        self._file.close()
