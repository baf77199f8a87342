"""JSON-lines sink: each event's schema-1 payload (tracker.events) as one line of a file.

Each line is written whole as it comes (tracker.files.LineFile): a crash loses at most the line
being written, and a full disk loses the lines it refuses (logged, counted) but never stops the
guard nor leaves half a line.
"""

from __future__ import annotations

import json
from pathlib import Path

from tracker.events import event_payload
from tracker.files import LineFile
from tracker.types import Event


class JsonlSink:
    def __init__(self, path: Path):
        self._file = LineFile(path, "events log")

    def publish_event(self, event: Event, snapshot_jpeg: bytes | None) -> None:
        payload = event_payload(event)
        payload["snapshot"] = event.snapshot
        self._file.append(json.dumps(payload, separators=(",", ":")) + "\n")

    def publish_state(self, state: dict) -> None:
        """The state is published by MQTT and printed by the latency report; not logged here."""

    def close(self) -> None:
        self._file.close()
