"""Console sink: one human-readable line per event on a text stream (stdout by default)."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TextIO

from tracker.types import Event


class ConsoleSink:
    def __init__(self, stream: TextIO | None = None):
        self._stream = stream or sys.stdout

    def publish_event(self, event: Event, snapshot_jpeg: bytes | None) -> None:
        when = datetime.fromtimestamp(event.wall_time).strftime("%H:%M:%S.%f")[:-3]
        b = event.box  # pixels rounded to ints: "{:.0f}" showed a box just past the frame's edge at x=-0
        # In a recording, where to find the moment: minutes:seconds into the video.
        media = "" if event.media_s is None else f", {_minutes_seconds(event.media_s)} into the video"
        print(
            f"{when} {event.kind:<10} track {event.track_id:<4} {event.identity} "
            f"({event.confidence:.2f}) at x={round(b.x)} y={round(b.y)} {round(b.w)}x{round(b.h)}{media}",
            file=self._stream,
            flush=True,
        )

    def publish_state(self, state: dict) -> None:
        """State goes to the latency report on the console, not here."""

    def close(self) -> None:
        """Flush the stream (not closed: the caller's); one that cannot take what is left (a
        closed pipe, a full disk) loses only those lines, its failure already logged by the guard."""
        try:
            self._stream.flush()
        except OSError:
            pass


def _minutes_seconds(seconds: float) -> str:
    """m:ss.s, rounded to a tenth first (119.97 s is 2:00.0, not 1:60.0)."""
    minutes, tenths = divmod(round(seconds * 10), 600)
    return f"{minutes}:{tenths / 10:04.1f}"
