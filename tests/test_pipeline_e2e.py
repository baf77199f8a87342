"""End to end: `tracker --demo` as a real process, its events and every line of its latency log.

Each run gets a config file written here (state_dir in tmp_path, HOME pointed into tmp_path too,
so nothing lands in the real ~/.local/state or ~/.cache) with `source.realtime: false`: the
synthetic scene is rendered as fast as the guard takes it, so every frame is processed and the
run is reproducible; the demo enrolls the scene's four people itself. What is checked:

- exit status 0 and no traceback;
- events.jsonl: the schema-1 payload of docs/ARCHITECTURE.md section 4 (plus the snapshot path), unique ids,
  per track `entered` first, `identified` only after it, `left` last and at most once; every
  event's snapshot JPEG exists and decodes; the console sink printed the same events; the three
  walkers of the scene's first cycle entered and left; the demo's own score of the identities it
  announced against the scene's truth (enrolled from chips the scene does not show);
- latency.jsonl, every line: exactly the keys of README's "Latency log" in order, seq 0..N-1 in
  order (nothing dropped by an unpaced run), t_ns non-decreasing, every stage >= 0, total_ms >=
  the sum of the frame's own stages (they are disjoint intervals of its life, so by
  construction), each stage measured where its work ran (capture, motion and track on every
  frame, detection on every frame whose crops were inferred, publishing on every frame with an
  `entered`: > 0, as a monotonic-clock difference around real work is) and total_ms more than
  infer_ms, `dropped` non-decreasing, `batch`/`faces`/`infer_ms` consistent: the frames
  that shared one backend call carry its crop count as `batch` and their faces add up to it,
  and a call holds fewer than max_batch crops before its last frame's; a call's first frame waited
  (batch_wait_ms) at least as long as the gate and detection of its batch's later frames took.
Runs: pure streaming (max_batch 1), and batching across frames (max_batch 16, long max_wait).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import cv2
import pytest

LATENCY_KEYS = ["seq", "t_ns", "backend", "batch", "faces", "capture_ms", "motion_ms", "detect_ms", "batch_wait_ms",
                "infer_ms", "track_ms", "publish_ms", "total_ms", "dropped"]
OWN_STAGES = ["capture_ms", "motion_ms", "detect_ms", "batch_wait_ms", "infer_ms", "track_ms", "publish_ms"]
EVENT_KEYS = {"schema", "id", "kind", "track_id", "identity", "confidence", "box", "ts", "seq", "media_time_s", "snapshot"}
SCENE_PEOPLE = {"John_Savage", "John_Schneider", "John_Shimkus", "John_Simm"}
BACKEND = "caffe-openblas-dl"


def tracker_command() -> list[str]:
    """The installed `tracker` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("tracker")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracker"]


def isolated_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["TRACKER_CACHE_DIR"] = str(tmp_path / "cache")
    env.pop("STATE_DIRECTORY", None)
    return env


def write_config(tmp_path: Path, **sections) -> Path:
    """A config file with state in tmp_path/state, the scene unpaced, plus `sections`."""
    data = {"state_dir": str(tmp_path / "state"), "source": {"realtime": False}, "backend": {"name": BACKEND}}
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    path = tmp_path / "tracker.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")  # JSON is YAML
    return path


def run_demo(tmp_path: Path, frames: int, **sections) -> tuple[subprocess.CompletedProcess, Path]:
    config = write_config(tmp_path, **sections)
    started = datetime.now(UTC)
    proc = subprocess.run([*tracker_command(), "--demo", "--frames", str(frames), "--config", str(config)],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    proc.started = started  # type: ignore[attr-defined]
    proc.ended = datetime.now(UTC)  # type: ignore[attr-defined]
    state = tmp_path / "state" / "demo"  # --demo keeps its state apart from real enrolments
    assert not (tmp_path / "home" / ".local").exists()
    return proc, state


# -- checks shared by the runs -------------------------------------------------------------------


def check_latency_log(path: Path, frames: int, max_batch: int) -> list[dict]:
    """Every line of the latency log (see the module docstring); returns the records."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == frames
    rows = [json.loads(line) for line in lines]
    previous = None
    group: dict | None = None  # the backend call being followed: its batch, infer_ms, faces so far
    for row in rows:
        assert list(row) == LATENCY_KEYS, row
        assert row["backend"] == BACKEND
        assert all(isinstance(row[k], int) and not isinstance(row[k], bool)
                   for k in ("seq", "t_ns", "batch", "faces", "dropped")), row
        for key in OWN_STAGES + ["total_ms"]:
            assert isinstance(row[key], float) and row[key] >= 0.0, (key, row)
        assert row["total_ms"] >= sum(row[k] for k in OWN_STAGES) - 1e-3, row
        # Each stage is a monotonic-clock difference around real work, so more than 0 where that
        # work ran: the capture queue's hand-over between threads, the gate's resize and blur,
        # the tracker's update on every frame; detection on a frame whose crops were inferred;
        # and the frame's life holds more than the backend call alone.
        assert min(row["capture_ms"], row["motion_ms"], row["track_ms"]) > 0.0, row
        assert row["total_ms"] > row["infer_ms"], row
        assert row["faces"] >= 0 and row["batch"] >= 0
        if group is not None:  # a later frame of an open call's batch: looked at while its first waited
            group["later_ms"] += row["motion_ms"] + row["detect_ms"]
            assert group["wait_ms"] >= group["later_ms"] - 1e-3, (row, group)
        if row["batch"] == 0:
            assert row["infer_ms"] == 0.0, row  # no crops of this frame went to the backend
        else:
            assert row["infer_ms"] > 0.0 and row["detect_ms"] > 0.0 and 1 <= row["faces"] <= row["batch"], row
            if group is None:
                group = {"batch": row["batch"], "infer_ms": row["infer_ms"], "faces": 0, "wait_ms": row["batch_wait_ms"],
                         "later_ms": 0.0}
            assert (row["batch"], row["infer_ms"]) == (group["batch"], group["infer_ms"]), (row, group)
            before = group["faces"]
            group["faces"] += row["faces"]
            assert group["faces"] <= group["batch"], (row, group)
            if group["faces"] == group["batch"]:  # the call's last frame
                assert before < max_batch, (row, group)
                group = None
        if previous is not None:
            assert row["seq"] == previous["seq"] + 1, (previous, row)
            assert row["t_ns"] >= previous["t_ns"]
            assert row["dropped"] >= previous["dropped"]
        previous = row
    assert group is None, f"a backend call's frames do not add up to its batch: {group}"
    assert [r["seq"] for r in rows] == list(range(frames))
    assert rows[-1]["dropped"] == 0  # unpaced: the capture queue waits instead of dropping
    return rows


def check_events(state: Path, started: datetime, ended: datetime) -> list[dict]:
    """events.jsonl (see the module docstring); returns the events in order."""
    events = [json.loads(line) for line in (state / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len({e["id"] for e in events}) == len(events)
    tracks: dict[int, list[str]] = {}
    last_ts = None
    for e in events:
        assert set(e) == EVENT_KEYS, e
        assert e["schema"] == 1 and e["kind"] in ("entered", "identified", "left")
        assert re.fullmatch(r"[0-9a-f]{32}", e["id"])
        assert isinstance(e["track_id"], int) and e["track_id"] >= 1
        assert e["identity"] in SCENE_PEOPLE | {"unknown"}
        assert 0.0 <= e["confidence"] <= 1.0
        assert set(e["box"]) == {"x", "y", "w", "h"} and e["box"]["w"] > 0 and e["box"]["h"] > 0
        ts = datetime.fromisoformat(e["ts"])
        assert ts.utcoffset() == timedelta(0)
        assert started - timedelta(seconds=1) <= ts <= ended + timedelta(seconds=1)
        assert last_ts is None or ts >= last_ts
        last_ts = ts
        # Where in the scene (10 fps) it happened: its frame's number and media time.
        assert isinstance(e["seq"], int) and e["media_time_s"] == pytest.approx(e["seq"] / 10.0, abs=1e-3)
        kinds = tracks.setdefault(e["track_id"], [])
        if e["kind"] == "entered":
            assert kinds == [], f"track {e['track_id']} entered twice or after other events"
        else:
            assert kinds and kinds[0] == "entered" and "left" not in kinds, (e, kinds)
        kinds.append(e["kind"])
        snapshot = Path(e["snapshot"])
        assert snapshot.parent == state / "snapshots" and snapshot.name == f"{e['id']}.jpg"
        image = cv2.imread(str(snapshot))
        assert image is not None and image.ndim == 3 and min(image.shape[:2]) >= 8
    return events


# -- the runs ---------------------------------------------------------------------------------------


def test_demo_streaming_events_and_latency_log(tmp_path):
    """max_batch 1: every frame's crops go to the backend alone, at once. 170 frames cover the
    scene's first cycle: A and B cross (frames 15-71), C stops mid-frame and walks behind the
    pillar (78-150), then the room is empty."""
    frames = 170
    proc, state = run_demo(tmp_path, frames, batcher={"max_batch": 1})
    rows = check_latency_log(state / "latency.jsonl", frames, max_batch=1)
    assert all(r["batch"] in (0, r["faces"]) for r in rows)
    assert sum(r["batch"] > 0 for r in rows) > 50  # faces were seen and inferred on many frames
    events = check_events(state, proc.started, proc.ended)
    entered = [e for e in events if e["kind"] == "entered"]
    assert all(rows[e["seq"]]["publish_ms"] > 0.0 for e in entered)  # its event and snapshot were written then
    left = [e for e in events if e["kind"] == "left"]
    assert len(entered) >= 3 and len(left) >= 3  # A, B and C came and went
    assert {e["track_id"] for e in left} == {e["track_id"] for e in entered}  # the room ends empty
    # The demo enrolled the scene's people in its own state directory, and the console sink
    # printed one line per event.
    assert {p.stem for p in (state / "people").glob("*.npz")} == SCENE_PEOPLE
    assert "given twice" not in proc.stderr  # the built-in chips' duplicate is no warning of the user's
    printed = [line for line in proc.stdout.splitlines() if re.search(r"\b(entered|identified|left)\s+track", line)]
    assert [(m.group(1), int(m.group(2))) for m in
            (re.search(r"(entered|identified|left)\s+track (\d+)", line) for line in printed)] == \
           [(e["kind"], e["track_id"]) for e in events]
    # It was enrolled from chips the scene does not show, and says how it did against the truth:
    # every announced track judged, and the trained weights name the scene's people right.
    score = re.search(r"identities against the scene's truth: (\d+) right, (\d+) wrong, (\d+) unknown", proc.stderr)
    assert score, proc.stderr[-2000:]
    right, wrong, unknown = map(int, score.groups())
    assert right + wrong + unknown <= len(entered)  # tracks on a true face when they entered
    assert right >= 2 and wrong == 0, score.group(0)


def test_demo_batches_crops_across_frames(tmp_path):
    """max_batch 16 with a long max_wait_ms: crops of several frames share one backend call."""
    frames = 90
    _, state = run_demo(tmp_path, frames, batcher={"max_batch": 16, "max_wait_ms": 5000},
                        sinks={"console": False})
    rows = check_latency_log(state / "latency.jsonl", frames, max_batch=16)
    assert max(r["batch"] for r in rows) > 1
    # At least one call carried the crops of several frames.
    shared = [r for r in rows if r["batch"] > r["faces"] > 0]
    assert shared, "no backend call held more than one frame's crops"
    assert (state / "events.jsonl").exists()


def test_demo_zero_wait_sends_each_frame_alone(tmp_path):
    """max_wait_ms 0 with a large max_batch: a frame's crops are due as soon as the next frame is
    taken, so no call ever holds two frames' crops, however busy the guard is. (A guard that
    checked the deadline only when no frame came used to wait for max_batch crops here.)"""
    frames = 60
    _, state = run_demo(tmp_path, frames, batcher={"max_batch": 16, "max_wait_ms": 0},
                        sinks={"console": False})
    rows = check_latency_log(state / "latency.jsonl", frames, max_batch=16)
    assert any(r["batch"] for r in rows)
    assert all(r["batch"] in (0, r["faces"]) for r in rows)
