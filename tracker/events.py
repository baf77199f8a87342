"""Events: when a person entered, was identified or left, and their wire form for every sink.

The payload is schema version 1 of docs/ARCHITECTURE.md, section 4, with two fields added (consumers of
schema 1 ignore fields they do not know):
    {schema, id, kind, track_id, identity, confidence, box: {x, y, w, h}, ts, seq, media_time_s}
`ts` is the event's wall-clock time as an ISO 8601 UTC string with milliseconds; `box` is in pixels
of the full frame; `seq` is the number of the frame that caused it (Frame.seq) and `media_time_s`
that frame's position in its video file in seconds (null for cameras and streams), so the moment
can be found in the recording. Consumers de-duplicate by `id`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from tracker.tracking import TrackState
from tracker.types import Box, Event, EventKind

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
        "ts": datetime.fromtimestamp(event.wall_time, UTC).isoformat(timespec="milliseconds"),
        "seq": event.seq,
        "media_time_s": None if event.media_s is None else round(float(event.media_s), 3),
    }


class EventMaker:
    """Turns each frame's track views and identity votes into events, in this order per frame:
    `entered` (a track was confirmed), `identified` (a confirmed track's identity is decided and
    clear, see IdentityVotes, and differs from the one last announced: a name, or `unknown` once
    the track has enough faces and matches nobody; an ambiguous vote changes nothing), `left` (an
    announced track ended, or is still announced when the run ends: `close_all`).

    An event's box is where the track was last seen by the detector (a track that ends has only
    coasted on predictions since, possibly out of the frame).

    State per live track, forgotten when it ends: the identity last announced (None while it was
    not decided) and the last box
    seen (bounded by the tracker's live tracks). Ids come from `new_id` (uuid4 hex by default).
    """

    def __init__(self, new_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> None:
        self._new_id = new_id
        self._announced: dict[int, str | None] = {}
        self._last_seen: dict[int, Box] = {}

    def _identity(self, track_id: int, votes) -> tuple[str, float]:
        """The track's voted identity and its share of the votes; while the vote is too close to
        call, the one announced last with its share (so a `left` says who the track was announced
        as, and how many of its faces said so: it said 0.0, no face at all, beside the name)."""
        announced = self._announced.get(track_id)
        if votes.ambiguous(track_id) and announced is not None:
            return announced, votes.share(track_id, announced)
        return votes.voted(track_id)

    def frame_events(self, views, votes, t_ns: int, wall_time: float, *, seq: int | None = None,
                     media_s: float | None = None) -> list[Event]:
        """views: the tracker's TrackViews for one frame; votes: IdentityVotes after this frame's
        crops were voted; t_ns / wall_time: the frame's monotonic and wall-clock times; seq /
        media_s: its sequence number and position in its video (Frame.seq, Frame.media_s)."""
        by_kind: dict[str, list[Event]] = {"entered": [], "identified": [], "left": []}
        for view in views:
            if view.detection_index is not None:
                self._last_seen[view.track_id] = view.box
            box = self._last_seen.get(view.track_id, view.box)
            if view.state is TrackState.ENDED:
                self._last_seen.pop(view.track_id, None)
            if not (view.entered or view.left) and (view.detection_index is None or view.track_id not in self._announced):
                continue  # no new face, so no new vote: its identity cannot have changed (nor for a lost or dormant track)
            name, confidence = self._identity(view.track_id, votes)
            decided = votes.decided(view.track_id)
            kind: EventKind
            if view.entered:
                kind = "entered"
                # a vote too close to call announces `unknown` but decides nothing: as if undecided,
                # so the clear `unknown` ("a stranger is at the door") still comes when it is clear
                self._announced[view.track_id] = name if decided and not votes.ambiguous(view.track_id) else None
            elif view.left:
                kind = "left"
                self._announced.pop(view.track_id, None)
            elif decided and not votes.ambiguous(view.track_id) and name != self._announced[view.track_id]:
                # also `unknown`, once clear: "a stranger is at the door"; while the vote is too close
                # to call, the last announcement stands (no flapping between a name and unknown)
                kind = "identified"
                self._announced[view.track_id] = name
            else:
                continue
            event = Event(self._new_id(), kind, view.track_id, name, confidence, box, t_ns, wall_time,
                          seq=seq, media_s=media_s)
            by_kind[kind].append(event)
        return by_kind["entered"] + by_kind["identified"] + by_kind["left"]

    def close_all(self, votes, t_ns: int, wall_time: float, *, seq: int | None = None,
                  media_s: float | None = None) -> list[Event]:
        """A `left` for every track still announced (the source ended or the guard stops: the
        people in view are not followed any more), with its last box; forgets them all. seq /
        media_s: those of the last frame processed."""
        events = []
        for track_id in sorted(self._announced):
            name, confidence = self._identity(track_id, votes)
            box = self._last_seen[track_id]  # announced on a frame it was detected in, so seen
            events.append(Event(self._new_id(), "left", track_id, name, confidence, box, t_ns, wall_time,
                                seq=seq, media_s=media_s))
        self._announced.clear()
        self._last_seen.clear()
        return events
