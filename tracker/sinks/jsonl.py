"""JSON-lines sink: each event's schema-1 payload (tracker.events) as one line of a file.

Each line is written whole as it comes (tracker.files.LineFile): a crash loses at most the line
being written, and a full disk loses the lines it refuses (logged, counted) but never stops the
guard nor leaves half a line. The file rotates by size (`path`, `path.1`, ... `path.<backups>`), so
its disk use is bounded; the web page reads all of them (tracker.web.event_log).
"""

from __future__ import annotations

import json
from pathlib import Path

from tracker.events import event_payload
from tracker.files import LineFile
from tracker.types import Event


class JsonlSink:
    def __init__(self, path: Path, max_bytes: int = 10_000_000, backups: int = 3):
        self._file = LineFile(path, "events log", max_bytes=max_bytes, backups=backups)

    def publish_event(self, event: Event, snapshot_jpeg: bytes | None) -> None:
        payload = event_payload(event)
        payload["snapshot"] = event.snapshot
        self._file.append(json.dumps(payload, separators=(",", ":")) + "\n")

    def publish_state(self, state: dict) -> None:
        """The state is published by MQTT and printed by the latency report; not logged here."""

    def close(self) -> None:
        self._file.end()
