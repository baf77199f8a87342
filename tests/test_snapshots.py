import os

import cv2
import numpy as np

from tracker.snapshots import SnapshotStore
from tracker.types import Box


def frame(value):
    image = np.zeros((240, 320, 3), np.uint8)
    image[:, :, 1] = value
    return image


def test_keeps_the_largest_face_and_writes_it_as_jpeg(tmp_path):
    store = SnapshotStore(tmp_path / "snaps", side=64)
    store.offer(1, frame(50), Box(10, 10, 40, 40))
    store.offer(1, frame(200), Box(10, 10, 100, 100))  # larger: kept
    store.offer(1, frame(90), Box(10, 10, 60, 60))  # smaller: ignored
    path, jpeg = store.save(1, "ev1")
    assert path.endswith("ev1.jpg") and open(path, "rb").read() == jpeg
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (64, 64, 3) and abs(int(image[:, :, 1].mean()) - 200) < 5
    assert store.save(2, "ev2") == (None, None)


def test_disk_use_is_bounded_oldest_first(tmp_path):
    store = SnapshotStore(tmp_path, keep=3)
    for i in range(5):
        store.offer(i, frame(i), Box(0, 0, 50, 50))
        store.save(i, f"ev{i}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev2.jpg", "ev3.jpg", "ev4.jpg"]


def test_the_bound_holds_across_restarts_counting_the_files_already_there_oldest_first(tmp_path):
    """A guard started again finds the last run's snapshots: they count against `keep` and go first,
    oldest by modification time (not by name, which is a random event id)."""
    for name, modified in (("c", 1000), ("a", 2000), ("b", 3000)):  # names in another order than times
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(b"an earlier run's snapshot")
        os.utime(path, (modified, modified))
    store = SnapshotStore(tmp_path, keep=3)
    for i in range(2):
        store.offer(i, frame(i), Box(0, 0, 50, 50))
        store.save(i, f"ev{i}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jpg", "ev0.jpg", "ev1.jpg"]


def test_a_removed_folder_is_made_again_and_a_partial_file_of_a_kill_is_removed(tmp_path):
    folder = tmp_path / "snaps"
    store = SnapshotStore(folder)
    store.offer(1, frame(50), Box(10, 10, 40, 40))
    assert store.save(1, "ev1")[0] == str(folder / "ev1.jpg")
    for path in folder.iterdir():  # a clean-up by hand while the guard runs
        path.unlink()
    folder.rmdir()
    path, jpeg = store.save(1, "ev2")  # every snapshot after it was lost, for the rest of the run
    assert path == str(folder / "ev2.jpg") and open(path, "rb").read() == jpeg
    (folder / ".ev3.jpg.partial").write_bytes(jpeg[:100])  # a guard killed mid-write
    SnapshotStore(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["ev2.jpg"]


def test_a_rejoined_tracks_best_face_is_kept_if_it_is_larger(tmp_path):
    store = SnapshotStore(tmp_path / "snaps", side=64)
    store.offer(1, frame(50), Box(10, 10, 40, 40))
    store.offer(2, frame(200), Box(10, 10, 100, 100))  # the same person, seen larger while a new track
    store.offer(3, frame(90), Box(10, 10, 20, 20))
    store.merge(1, 2)
    store.merge(1, 3)  # smaller: 1 keeps its own
    path, jpeg = store.save(1, "ev1")
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert abs(int(image[:, :, 1].mean()) - 200) < 5
    assert store.save(2, "ev2") == store.save(3, "ev3") == (None, None)  # nothing left under the new ids
    store.merge(4, 1)  # into a track without a face yet
    assert store.save(4, "ev4")[1] == jpeg
