"""Events: the wire form shared by every sink (JSON lines, MQTT, console).

The payload is schema version 1 of DESIGN.md section 4:
    {schema, id, kind, track_id, identity, confidence, box: {x, y, w, h}, ts}
`ts` is the event's wall-clock time as an ISO 8601 UTC string with milliseconds; `box` is in pixels
of the full frame. Consumers de-duplicate by `id`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from tracker.types import Event

SCHEMA_VERSION = 1


def event_payload(event: Event) -> dict:
    """The JSON-ready dict of `event` (schema 1); the same for every sink."""
    return {
        "schema": SCHEMA_VERSION,
        "id": event.id,
        "kind": event.kind,
        "track_id": event.track_id,
        "identity": event.identity,
        "confidence": round(float(event.confidence), 4),
        "box": {k: round(float(getattr(event.box, k)), 1) for k in ("x", "y", "w", "h")},
        "ts": datetime.fromtimestamp(event.wall_time, timezone.utc).isoformat(timespec="milliseconds"),
    }
