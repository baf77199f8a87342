"""One person, one story, in the whole guard: re-identification by face with the shipped trained
weights, `left` for every announced track when a video file ends, and where each event happened
in the recording (`seq`, `media_time_s`).

The synthetic scene's first cycle (200 frames at 10 fps): A and B cross mid-frame (B, nearer,
hides A), then C walks behind the pillar. With `tracking.max_age` at 2 both hidings last longer
than the tracker keeps a lost track by position, so without re-identification each hidden person
comes back as a new track with a second `entered`; with it (the default, threshold from the
weights' card) each person is one track: one `entered`, one `left`.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

import tracker.pipeline as pipeline
import tracker.stages as stages
from tracker.config import parse_config
from tracker.sources.synthetic import SyntheticScene
from tracker.tracking.assign import iou_matrix

SCENE = {"width": 640, "height": 480, "fps": 10.0, "seed": 0}
FRAMES = 200


def run(tmp_path: Path, source: dict, tracking: dict) -> list[dict]:
    """The guard (default config otherwise: shipped weights, yunet, aligned crops) run to the end of
    `source`; its events, in order."""
    config = parse_config({"state_dir": str(tmp_path), "tracking": tracking, "source": source,
                           "sinks": {"console": False}})
    assert pipeline.Guard(config, stages.build_stages(config, realtime=False)).run() == 0
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines()]


def person_of(event: dict, scene: SyntheticScene) -> str:
    """The scene's walker (A, B, C = walk ids 1, 2, 3) whose face the event's box covers most."""
    truth = scene.ground_truth(event["seq"])
    box = np.array([[event["box"][k] for k in "xywh"]], np.float64)
    overlap = iou_matrix(box, np.array([[g.box.x, g.box.y, g.box.w, g.box.h] for g in truth], np.float64))[0]
    assert overlap.max() > 0.3, (event, truth)
    return "ABC"[truth[int(overlap.argmax())].track_id - 1]


def stories(events: list[dict]) -> dict[str, list[str]]:
    """walker -> the kinds of the events of the tracks that walker was given, in order."""
    scene = SyntheticScene(SCENE["width"], SCENE["height"], SCENE["fps"], SCENE["seed"])
    walker_of_track = {e["track_id"]: person_of(e, scene) for e in events if e["kind"] == "entered"}
    out: dict[str, list[str]] = {}
    for e in events:
        out.setdefault(walker_of_track[e["track_id"]], []).append(e["kind"])
    return out


@pytest.fixture(scope="module")
def scene_source():
    return {"kind": "synthetic", "frames": FRAMES, "realtime": False, **SCENE}


def test_hidden_longer_than_max_age_and_back_is_one_visit(tmp_path, scene_source):
    events = run(tmp_path, scene_source, {"max_age": 2})
    told = stories(events)
    print(told)
    assert set(told) == {"A", "B", "C"}
    for walker, kinds in told.items():
        assert kinds.count("entered") == 1 and kinds.count("left") == 1, (walker, kinds)
        assert kinds[0] == "entered" and kinds[-1] == "left"
    # The `left` of a person who walked out waits the re-identification window (10 s = 100 frames)
    # after they were last seen, and no longer: A and B leave the frame around seq 66, so their
    # `left`s come at about seq 166, before the run's end (whose last frame would announce every
    # track still kept, a lost one that never expired included).
    left = {e["track_id"]: e["seq"] for e in events if e["kind"] == "left"}
    assert all(160 <= seq < FRAMES - 1 for seq in sorted(left.values())[:2]), left


def test_without_reidentification_a_hidden_person_enters_twice(tmp_path, scene_source):
    """The same run with `tracking.reid: false`: the hidings split tracks (so the test above can fail)."""
    told = stories(run(tmp_path, scene_source, {"max_age": 2, "reid": False}))
    print(told)
    assert told["C"].count("entered") == 2 and told["C"].count("left") == 2
    assert sum(kinds.count("entered") for kinds in told.values()) >= 4


def test_a_video_file_that_ends_leaves_every_announced_track(tmp_path):
    """A real video file (MJPG, 10 fps) that ends while A and B are in view: both get their `left`,
    stamped with the last frame's seq and media time; every event's media time is its frame's."""
    scene = SyntheticScene(SCENE["width"], SCENE["height"], SCENE["fps"], SCENE["seed"])
    video = tmp_path / "door.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), SCENE["fps"], (SCENE["width"], SCENE["height"]))
    assert writer.isOpened()
    for n in range(50):
        writer.write(scene.render(n)[0])
    writer.release()
    events = run(tmp_path / "state", {"kind": "opencv", "uri": str(video)}, {})
    entered = [e for e in events if e["kind"] == "entered"]
    left = [e for e in events if e["kind"] == "left"]
    assert len(entered) == 2 and sorted(e["track_id"] for e in left) == sorted(e["track_id"] for e in entered)
    assert all(e["seq"] == 49 and e["media_time_s"] == pytest.approx(4.9, abs=1e-6) for e in left)
    for e in events:
        assert e["media_time_s"] == pytest.approx(e["seq"] / SCENE["fps"], abs=1e-6)


def test_reidentification_threshold_comes_from_the_card_and_is_off_without_one(caplog):
    config = parse_config({})
    assert stages.reid_threshold(config, {"reid_threshold": 0.79}) == 0.79
    assert stages.reid_threshold(parse_config({"tracking": {"reid_threshold": 0.9}}), {"reid_threshold": 0.79}) == 0.9
    assert stages.reid_threshold(parse_config({"tracking": {"reid": False}}), {"reid_threshold": 0.79}) is None
    # Untrained weights (no card, or a card without the threshold): off, and the log says so.
    for card in (None, {"identity_threshold": 0.7}):
        caplog.clear()
        assert stages.reid_threshold(config, card) is None
        assert "re-identification by face is off" in caplog.text and "tracking.reid_threshold" in caplog.text
