"""The synthetic scene: deterministic, scripted as documented, ground truth where faces are drawn."""

from __future__ import annotations

import re

import cv2
import numpy as np
import pytest

from tracker.errors import InputError
from tracker.sources import Capture
from tracker.sources.synthetic import CYCLE_S, DEFAULT_CHIPS, SyntheticScene, SyntheticSource

FPS = 10.0
CYCLE = int(CYCLE_S * FPS)  # frames per cycle at 10 fps


@pytest.fixture(scope="module")
def scene() -> SyntheticScene:
    return SyntheticScene(fps=FPS, seed=3)


@pytest.fixture(scope="module")
def tracks(scene) -> dict[int, list[tuple[int, object]]]:
    """track id -> [(frame, GroundTruth)] over the first two cycles."""
    result: dict[int, list] = {}
    for n in range(2 * CYCLE):
        for gt in scene.ground_truth(n):
            result.setdefault(gt.track_id, []).append((n, gt))
    return result


def test_same_seed_gives_identical_frames_and_ground_truth():
    a, b = SyntheticScene(seed=7), SyntheticScene(seed=7)
    for n in (0, 15, 33, 60, 95, 140, 233):
        image_a, gt_a = a.render(n)
        image_b, gt_b = b.render(n)
        assert np.array_equal(image_a, image_b)
        assert gt_a == gt_b
    other = SyntheticScene(seed=8)
    assert not np.array_equal(a.render(40)[0], other.render(40)[0])
    assert [g.box for g in a.ground_truth(40)] != [g.box for g in other.ground_truth(40)]


def test_frames_can_be_rendered_in_any_order(scene):
    fresh = SyntheticScene(fps=FPS, seed=3)
    later = fresh.render(2 * CYCLE + 35)  # far ahead first
    assert np.array_equal(later[0], scene.render(2 * CYCLE + 35)[0])
    assert np.array_equal(fresh.render(12)[0], scene.render(12)[0])


def test_frame_format_and_size():
    scene = SyntheticScene(width=320, height=240, seed=1)
    image, _ = scene.render(30)
    assert image.shape == (240, 320, 3) and image.dtype == np.uint8 and image.flags.c_contiguous
    for n in range(0, CYCLE, 5):
        for gt in scene.ground_truth(n):
            assert 0 <= gt.box.x and gt.box.x + gt.box.w <= 320 and 0 <= gt.box.y and gt.box.y + gt.box.h <= 240
            assert 0 < gt.visible <= 1


def test_scene_time_is_independent_of_fps():
    slow, fast = SyntheticScene(fps=10, seed=5), SyntheticScene(fps=20, seed=5)
    for n in (14, 41, 77, 150):
        assert slow.ground_truth(n) == fast.ground_truth(2 * n)


def test_script_enter_cross_occlude_pause_pillar_leave(scene, tracks):
    # Each cycle has three walkers A, B, C (track ids 3c+1..3c+3), three different people.
    assert sorted(tracks) == [1, 2, 3, 4, 5, 6]
    for c in range(2):
        first = {tid: tracks[tid][0][1] for tid in (3 * c + 1, 3 * c + 2, 3 * c + 3)}
        assert len({gt.identity for gt in first.values()}) == 3
    a, b, c = tracks[1], tracks[2], tracks[3]
    # The scene starts empty and ends each cycle empty (static frames for the motion gate).
    assert scene.ground_truth(0) == [] and scene.ground_truth(9) == []
    assert all(scene.ground_truth(n) == [] for n in range(CYCLE - 5, CYCLE))
    # A enters at the left edge partly visible and leaves at the right edge.
    assert a[0][1].box.x == 0 and a[0][1].visible < 0.5
    assert a[-1][1].box.x + a[-1][1].box.w == scene.width and a[-1][1].visible < 0.5
    assert max(gt.visible for _, gt in a) == 1.0
    # B enters at the right and leaves at the left.
    assert b[0][1].box.x + b[0][1].box.w == scene.width and b[-1][1].box.x == 0
    # A and B cross: while they overlap, B (nearer) is whole and A is partly hidden.
    b_at = dict(b)
    crossing = [(gt, b_at[n]) for n, gt in a if n in b_at and _iou(gt.box, b_at[n].box) > 0.3]
    assert crossing, "A and B never overlap"
    assert min(gt_a.visible for gt_a, _ in crossing) < 0.6
    assert all(gt_b.visible == 1.0 for _, gt_b in crossing)
    # C stands still for at least a second somewhere mid-frame...
    still = _longest_run(c, lambda p, q: p.box == q.box)
    assert still >= FPS
    # ...and passes behind the pillar: partly hidden there while fully inside the frame.
    x0, x1 = scene.pillar
    behind = [gt for _, gt in c if gt.box.x < x0 and gt.box.x + gt.box.w > x1 and gt.box.w == gt.box.h]
    assert behind and min(gt.visible for gt in behind) < 0.7


def test_ground_truth_boxes_are_where_faces_are_drawn():
    scene = SyntheticScene(fps=FPS, seed=3, noise_sigma=0.0)
    empty, gt0 = scene.render(0)
    assert gt0 == []
    checked = 0
    for n in range(12, CYCLE, 7):
        image, gts = scene.render(n)
        changed = np.abs(image.astype(np.int16) - empty).max(axis=2) > 12
        inside = np.zeros_like(changed)
        for gt in gts:
            x, y, w, h = (int(v) for v in (gt.box.x, gt.box.y, gt.box.w, gt.box.h))
            inside[y:y + h, x:x + w] = True
            if gt.visible == 1.0:
                assert changed[y:y + h, x:x + w].mean() > 0.5, f"frame {n}: nothing drawn in {gt}"
                checked += 1
        assert not (changed & ~inside).any(), f"frame {n}: pixels drawn outside every ground-truth box"
    assert checked >= 10


def test_source_yields_the_scene_frames_then_ends():
    source = SyntheticSource(width=160, height=120, frames=25, realtime=False, seed=2)
    with Capture(source, queue_size=3) as capture:
        frames = list(capture)
    assert [f.seq for f in frames] == list(range(25))
    assert all(f.image.shape == (120, 160, 3) for f in frames)
    assert all(b.t_ns >= a.t_ns for a, b in zip(frames, frames[1:]))
    reference = SyntheticScene(160, 120, seed=2)
    assert np.array_equal(frames[17].image, reference.render(17)[0])
    assert source.ground_truth(17) == reference.ground_truth(17)
    assert capture.get() is None  # the end sentinel stays the end


def _iou(p, q) -> float:
    ix = max(0.0, min(p.x + p.w, q.x + q.w) - max(p.x, q.x))
    iy = max(0.0, min(p.y + p.h, q.y + q.h) - max(p.y, q.y))
    inter = ix * iy
    return inter / (p.w * p.h + q.w * q.h - inter)


def _longest_run(items, same) -> int:
    best = run = 1
    for (_, p), (_, q) in zip(items, items[1:]):
        run = run + 1 if same(p, q) else 1
        best = max(best, run)
    return best


def test_a_faces_folder_with_too_few_people_is_a_clear_error(tmp_path):
    import cv2
    import numpy as np
    import pytest

    from tracker.errors import InputError
    from tracker.sources.synthetic import SyntheticScene

    for name in ("ann", "bob"):
        (tmp_path / name).mkdir()
        cv2.imwrite(str(tmp_path / name / "a.jpg"), np.full((150, 150, 3), 128, np.uint8))
    with pytest.raises(InputError, match=r"2 people found in .*expected <person>/<face image> files for at least 3"):
        SyntheticScene(faces_dir=tmp_path)


def test_a_faces_folder_that_is_missing_or_a_file_is_said_to_be_so(tmp_path):
    """Both were "0 people found in ...", as if the folder were there and empty."""
    (tmp_path / "face.png").write_bytes(b"")
    for path, state in ((tmp_path / "none", "does not exist"), (tmp_path / "face.png", "is not a folder")):
        with pytest.raises(InputError, match=f"^config: key 'source.faces_dir': {re.escape(repr(str(path)))} {state}; expected a folder"):
            SyntheticScene(faces_dir=path)


def test_a_large_faces_folder_is_read_only_in_part(tmp_path):
    """Every image of a faces_dir was held decoded: LFW's 9,525 photos took 1.7 GB."""
    from tracker.sources.synthetic import MAX_CHIPS_PER_PERSON, MAX_SCENE_PEOPLE, scene_chips

    grey = np.full((150, 150, 3), 128, np.uint8)
    for person in range(MAX_SCENE_PEOPLE + 3):
        (tmp_path / f"p{person:02d}").mkdir()
        for image in range(MAX_CHIPS_PER_PERSON + 2):
            cv2.imwrite(str(tmp_path / f"p{person:02d}" / f"{image}.jpg"), grey)
    people = scene_chips(tmp_path)
    assert list(people) == [f"p{person:02d}" for person in range(MAX_SCENE_PEOPLE)]
    assert all([p.name for p in chips] == [f"{i}.jpg" for i in range(MAX_CHIPS_PER_PERSON)]
               for chips in people.values())


def test_the_scene_is_bounded_in_size_and_its_faces_in_pixels(tmp_path, johns):
    """4096 x 4096 (the config's largest) took 750 MB to make; a faces_dir of phone photos was
    kept whole (12 photos of 12 megapixels: 590 MB)."""
    with pytest.raises(InputError, match=r"synthetic scene: size 4096x4096 too large; expected at most 2,073,600"):
        SyntheticScene(4096, 4096)
    for person, files in list(johns.items())[:3]:
        (tmp_path / person).mkdir()
        cv2.imwrite(str(tmp_path / person / "big.png"), cv2.resize(cv2.imread(str(files[0])), (4000, 3000)))
    scene = SyntheticScene(640, 480, faces_dir=tmp_path)
    assert [chip.shape for chip in scene.chips] == [(384, 512, 3)] * 3
    assert [chip.shape for chip in SyntheticScene(640, 480).chips] == [(150, 150, 3)] * len(DEFAULT_CHIPS)
