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
