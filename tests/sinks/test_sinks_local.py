import dataclasses
import io
import json

import pytest

from tracker.sinks.console import ConsoleSink
from tracker.sinks.jsonl import JsonlSink
from tracker.types import Box, Event


def event(kind="entered", identity="unknown"):
    return Event("e1", kind, 7, identity, 0.8125, Box(10.0, 20.0, 30.0, 40.0), 5, 1_767_225_600.25, "/s/7.jpg",
                 seq=41, media_s=4.1)


def test_jsonl_writes_schema_1_payload_per_line(tmp_path):
    sink = JsonlSink(tmp_path / "events" / "e.jsonl")
    sink.publish_event(event(), None)
    sink.publish_event(event("left", "ann"), None)
    sink.close()
    rows = [json.loads(x) for x in (tmp_path / "events" / "e.jsonl").read_text().splitlines()]
    assert rows[0] == {
        "schema": 1, "id": "e1", "kind": "entered", "track_id": 7, "identity": "unknown",
        "confidence": 0.8125, "box": {"x": 10.0, "y": 20.0, "w": 30.0, "h": 40.0},
        "ts": "2026-01-01T00:00:00.250+00:00", "seq": 41, "media_time_s": 4.1, "snapshot": "/s/7.jpg"}
    assert rows[1]["kind"] == "left" and rows[1]["identity"] == "ann"


def test_console_prints_one_readable_line_per_event():
    out = io.StringIO()
    ConsoleSink(out).publish_event(event("identified", "ann"), None)
    line = out.getvalue()
    assert line.count("\n") == 1
    assert "identified" in line and "track 7" in line and "ann (0.81)" in line and "30x40" in line
    assert line.endswith("30x40, 0:04.1 into the video\n")


def test_console_never_shows_a_negative_zero():
    out = io.StringIO()
    ConsoleSink(out).publish_event(dataclasses.replace(event(), box=Box(-0.4, -0.2, 30.0, 40.0)), None)
    assert " at x=0 y=0 30x40," in out.getvalue()


@pytest.mark.parametrize("media_s, shown", [(119.97, "2:00.0"), (59.94, "0:59.9"), (3599.96, "60:00.0"), (0.0, "0:00.0")])
def test_console_times_into_a_video_never_read_60_seconds(media_s, shown):
    out = io.StringIO()
    ConsoleSink(out).publish_event(dataclasses.replace(event("entered", "ann"), media_s=media_s), None)
    assert out.getvalue().endswith(f", {shown} into the video\n")
