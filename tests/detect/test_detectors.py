"""The CNN face detectors (YuNet, BlazeFace) and the choice between detectors: recall and false
positives against dlib's human-annotated photos compared face by face with Haar, landmarks,
aligned crops, model-file checks, bad input, and a person standing still under region search.

dlib's photos (../shared/testdata/faces/dlib/faces, README there): a detection matches a face at
IoU >= 0.3; Haar is run as that README's reference (image upsampled x2, scaleFactor 1.1,
minNeighbors 5). The CNN detectors run at their defaults (score threshold 0.6) at each photo's
own width, as the guard does with detect_width = the frame's width.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from test_detect import MATCH_IOU, annotations, iou

from tracker.cli import main
from tracker.config import DetectConfig, parse_config
from tracker.crops import CROP_MARGIN, CROP_SIZE, aligned_face, aligned_region_side, crop_batch, similarity_to_template
from tracker.detect import HaarDetector, create_detector, model_files, resolve_detector
from tracker.detect.blazeface import BlazeFaceDetector, weighted_nms
from tracker.detect.regions import search_windows
from tracker.detect.windowed import WindowedDetector
from tracker.detect.yunet import YuNetDetector
from tracker.errors import InputError, ModelError
from tracker.types import Box, Detection

DETECTORS = {"yunet": YuNetDetector, "blazeface": BlazeFaceDetector}


def matched_faces(truth: list[Box], found: list[Box]) -> tuple[set[int], int]:
    """(indices of the annotated faces matched one-to-one at IoU >= 0.3, false positives)."""
    if not truth or not found:
        return set(), len(found)
    ok = np.array([[iou(t, f) >= MATCH_IOU for f in found] for t in truth], dtype=float)
    rows, cols = linear_sum_assignment(-ok)
    hits = {int(r) for r, c in zip(rows, cols) if ok[r, c]}
    return hits, len(found) - len(hits)


@pytest.fixture(scope="module")
def dlib_photos(testdata) -> list[tuple[str, np.ndarray, list[Box]]]:
    folder = testdata / "faces" / "dlib" / "faces"
    return [(f"{name}/{file}", cv2.imread(str(folder / file)), boxes)
            for name in ("testing", "training") for file, boxes in annotations(folder / f"{name}.xml")]


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_finds_every_face_haar_finds_with_no_more_false_positives(name, dlib_photos, capsys):
    missed, haar_fp, own_fp, own_found, total = [], 0, 0, 0, 0
    for label, image, boxes in dlib_photos:
        haar = HaarDetector(detect_width=image.shape[1] * 2, min_face_px=12)
        haar_hits, fp = matched_faces(boxes, [d.box for d in haar.detect(image)])
        haar_fp += fp
        found = DETECTORS[name](detect_width=image.shape[1]).detect(image)
        hits, fp = matched_faces(boxes, [d.box for d in found])
        own_fp, own_found, total = own_fp + fp, own_found + len(hits), total + len(boxes)
        missed += [f"{label} face {i}" for i in sorted(haar_hits - hits)]
    with capsys.disabled():
        print(f"\n{name} on dlib's photos: {own_found}/{total} faces, {own_fp} false positives "
              f"(Haar x2: {haar_fp} false positives)")
    assert not missed, f"{name} misses faces Haar finds: {missed}"
    assert own_fp <= haar_fp


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_landmarks_lie_in_their_box_in_order(name, testdata):
    image = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))
    (face,) = DETECTORS[name](detect_width=512).detect(image)
    assert iou(face.box, Box(177, 66, 95, 95)) > 0.6 and 0.6 <= face.score <= 1.0
    b = face.box
    assert all(b.x <= x <= b.x + b.w and b.y <= y <= b.y + b.h for x, y in face.landmarks)
    right_eye, left_eye, nose, mouth_right, mouth_left = face.landmarks
    assert right_eye[0] < nose[0] < left_eye[0]  # the person's right eye is on the image's left
    assert max(right_eye[1], left_eye[1]) < nose[1] < min(mouth_right[1], mouth_left[1])
    assert mouth_right[0] <= mouth_left[0]


CORNERS = np.array([[0, 0], [CROP_SIZE, 0], [0, CROP_SIZE], [CROP_SIZE, CROP_SIZE]], np.float64)


def _apply(m: np.ndarray, points: np.ndarray) -> np.ndarray:
    return points @ m[:, :2].T + m[:, 2]


def _inverse(m: np.ndarray) -> np.ndarray:
    a = np.linalg.inv(m[:, :2])
    return np.hstack([a, -(a @ m[:, 2])[:, None]])


def _box_transform(box: Box) -> np.ndarray:
    """The box crop's image -> crop transform (tracker.crops: square of side max(w, h) * 1.2)."""
    k = CROP_SIZE / (max(box.w, box.h) * (1 + 2 * CROP_MARGIN))
    cx, cy = box.x + box.w / 2, box.y + box.h / 2
    return np.array([[k, 0, CROP_SIZE / 2 - k * cx], [0, k, CROP_SIZE / 2 - k * cy]])


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_aligned_crops_agree_across_scale_and_tilt(name, testdata):
    """The measure: the astronaut is shrunk (0.5, 0.7) or tilted (12 degrees) by a known transform
    T; the corners of the original's aligned crop are carried through T into the new image and
    through the new image's alignment into its crop; how far (crop pixels) they land from where
    they were is the crops' disagreement. Aligned crops must agree within a tenth of the crop's
    side (measured: 2-9 px, landmark noise at 45 px faces being the worst) and, under the tilt,
    better than box crops do."""
    image = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))
    detector = DETECTORS[name](detect_width=512)
    (face,) = detector.detect(image)
    aligned_corners = _apply(_inverse(similarity_to_template(face.landmarks)), CORNERS)
    box_corners = _apply(_inverse(_box_transform(face.box)), CORNERS)
    errors = {}
    for scale, degrees in ((0.5, 0.0), (0.7, 0.0), (1.0, 12.0)):
        t = cv2.getRotationMatrix2D((256, 256), degrees, scale)
        (moved,) = detector.detect(cv2.warpAffine(image, t, (512, 512), borderMode=cv2.BORDER_REPLICATE))
        aligned = np.abs(_apply(similarity_to_template(moved.landmarks), _apply(t, aligned_corners)) - CORNERS)
        boxed = np.abs(_apply(_box_transform(moved.box), _apply(t, box_corners)) - CORNERS)
        errors[(scale, degrees)] = (float(aligned.max()), float(boxed.max()))
    print(f"{name}: corner disagreement in crop px (aligned, box): {errors}")
    assert all(aligned < 0.1 * CROP_SIZE for aligned, _ in errors.values())
    assert errors[(1.0, 12.0)][0] < errors[(1.0, 12.0)][1]


def test_crop_batch_aligns_faces_with_landmarks_only(testdata):
    image = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))
    (face,) = YuNetDetector(detect_width=512).detect(image)
    batch = crop_batch(image, [face, face.box, Detection(face.box, face.score)])
    assert batch.shape == (3, 1, CROP_SIZE, CROP_SIZE) and batch.dtype == np.float32
    assert np.allclose(batch[0, 0], aligned_face(image, face.landmarks) / 255.0)
    assert np.array_equal(batch[1], batch[2]) and not np.allclose(batch[0], batch[1])


def test_an_aligned_crop_of_a_face_it_shrinks_is_the_face_warped_and_area_averaged(testdata):
    """A face 4x larger than crop scale (the astronaut at 320 px, each pixel made 4 x 4) is cropped
    as a warp of the face at crop scale (bilinear is right there: scale >= 1) would be, and a
    one-pixel checkerboard laid on it, which area-averaging cancels, hardly shows in the crop:
    a bilinear warp straight from the large image samples it (aliasing, mean 7.7 grey levels)."""
    small = cv2.resize(cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png")), (320, 320),
                       interpolation=cv2.INTER_AREA)
    (face,) = YuNetDetector(detect_width=320).detect(small)
    grey = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
    at_crop_scale = similarity_to_template(face.landmarks)
    assert np.hypot(*at_crop_scale[:, 0]) >= 1.0
    expected = cv2.warpAffine(grey, at_crop_scale, (CROP_SIZE, CROP_SIZE), flags=cv2.INTER_LINEAR,
                              borderMode=cv2.BORDER_REPLICATE).astype(np.float64)
    large = cv2.resize(grey, None, fx=4, fy=4, interpolation=cv2.INTER_NEAREST)
    points = [(4 * x + 1.5, 4 * y + 1.5) for x, y in face.landmarks]  # pixel centres: small x is large 4x + 1.5
    crop = aligned_face(large, points).astype(np.float64)
    assert np.abs(crop - expected).mean() < 8  # measured 3.9 (resampling twice); a crop of elsewhere: 65
    checker = np.where(np.indices(large.shape).sum(axis=0) % 2 == 0, 30, -30)
    checkered = np.clip(large.astype(np.int16) + checker, 0, 255).astype(np.uint8)
    assert np.abs(aligned_face(checkered, points) - crop).mean() < 3  # measured 0.9


def test_detections_whose_landmarks_could_not_be_their_faces_are_dropped():
    """Landmarks far outside their box, or both eyes on one point, would make the aligned crop
    copy a region of their spread's size or find no transform (tracker.crops.aligned_face); a box
    mostly outside the frame is the model's garbage, not a face cut by the edge."""
    from tracker.detect.windowed import _to_detections

    good = [100, 80, 40, 40, 110, 95, 130, 95, 120, 105, 112, 112, 128, 112, 0.9]
    far = list(good)
    far[4:6] = (3000, -2000)
    same_eyes = list(good)
    same_eyes[6:8] = same_eyes[4:6]
    at_edge = list(good)
    at_edge[4] = 100 - 20  # half the box's side outside it: still kept
    mouth_above_eyes = list(good)
    mouth_above_eyes[10:14] = (120, 76.57, 120, 76.57)  # inside the box, yet no face's: a transform of no scale
    mostly_outside = [v - 128 if i in (0, 4, 6, 8, 10, 12) else v for i, v in enumerate(good)]  # 70% left of x = 0
    rows = np.array([good, far, same_eyes, at_edge, mouth_above_eyes, mostly_outside], np.float32)
    kept = _to_detections(rows, 1.0, 1.0, 0.0, 0.0, 320, 240, 0.5)
    assert [d.landmarks[0][0] for d in kept] == [110, 80]
    points = tuple(zip(mouth_above_eyes[4:14:2], mouth_above_eyes[5:14:2]))
    assert aligned_region_side(points) > 10**6  # a region 1.6 million pixels a side: terabytes to copy
    image = np.full((240, 320, 3), 128, np.uint8)
    assert all(aligned_face(image, d.landmarks).shape == (CROP_SIZE, CROP_SIZE) for d in kept)


def test_weighted_nms_averages_overlapping_boxes_by_score():
    rows = np.zeros((3, 15), np.float32)
    rows[0, :4], rows[0, 14] = (10, 10, 20, 20), 0.9
    rows[1, :4], rows[1, 14] = (12, 10, 20, 20), 0.3
    rows[2, :4], rows[2, 14] = (100, 100, 20, 20), 0.8
    merged = weighted_nms(rows, 0.3)
    assert len(merged) == 2
    assert merged[0, 0] == pytest.approx((10 * 0.9 + 12 * 0.3) / 1.2) and merged[0, 14] == pytest.approx(0.9)
    assert merged[1, 0] == pytest.approx(100)


# -- where to search --------------------------------------------------------------------------------

def test_search_windows_grow_merge_and_respect_the_edges():
    assert search_windows([], 640, 480, min_side=64) == []
    (w,) = search_windows([Box(630, 470, 20, 20)], 640, 480, min_side=64)  # at the corner, partly outside
    assert w[2] == 640 and w[3] == 480 and w[2] - w[0] >= 64 and w[3] - w[1] >= 64 and w[0] >= 0
    assert search_windows([Box(700, 10, 20, 20), Box(float("nan"), 0, 5, 5)], 640, 480, min_side=64) == []
    two = search_windows([Box(100, 100, 20, 20), Box(125, 100, 20, 20)], 640, 480, min_side=10)
    assert len(two) == 1  # overlapping windows merge
    assert search_windows([Box(0, 0, 600, 400)], 640, 480, min_side=64) == [(0, 0, 640, 480)]
    # grown to (80, 30)-(560, 450), 66% of the frame yet short of every edge: the whole frame instead
    assert search_windows([Box(200, 150, 240, 180)], 640, 480, min_side=64) == [(0, 0, 640, 480)]
    assert search_windows([Box(220, 170, 200, 140)], 640, 480, min_side=64) == [(120, 70, 520, 410)]  # 44%


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_regions_restrict_the_search_and_edges_are_safe(name, testdata):
    image = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))
    detector = DETECTORS[name](detect_width=512)
    (whole,) = detector.detect(image)
    b = whole.box
    middle = Box(b.x + 0.2 * b.w, b.y + 0.2 * b.h, 0.6 * b.w, 0.6 * b.h)  # only the middle of the face moved
    (found,) = detector.detect(image, regions=[middle])
    assert iou(found.box, whole.box) > 0.8
    assert detector.detect(image, regions=[]) == []
    assert detector.detect(image, regions=[Box(480, 480, 40, 40)]) == []  # a corner: no face, no crash
    assert detector.detect(image, regions=[Box(-50, -50, 10, 10)]) == []  # outside the frame


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_frames_of_every_shape(name, testdata):
    detector = DETECTORS[name](detect_width=320)
    image = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    assert len(detector.detect(grey)) == 1 and len(detector.detect(grey[:, :, None])) == 1
    assert detector.detect(np.zeros((40, 40, 3), np.uint8)) == []  # smaller than the detector's minimum
    for bad in (np.zeros((0, 0, 3), np.uint8), np.zeros((50, 50, 4), np.uint8), np.zeros((50, 50), np.float32)):
        with pytest.raises(InputError, match="face detector: bad frame"):
            detector.detect(bad)


def test_a_frame_is_never_scaled_past_four_detection_widths_along_its_longer_side():
    """A strip of an image is not scaled up to a window of gigabytes (16 x 12,000 px: 320 x 240,000
    before, 14 s and 5.8 GB in YuNet); a portrait camera's frame is scaled as ever."""
    shapes = []

    class Recorder(WindowedDetector):
        def _detect_window(self, bgr):
            shapes.append(bgr.shape)
            return np.zeros((0, 15), np.float32)

    detector = Recorder(detect_width=320, score_threshold=0.5)
    for height, width in ((1920, 1080), (2000, 100), (12000, 16), (16, 12000)):
        detector.detect(np.zeros((height, width, 3), np.uint8))
    assert shapes == [(569, 320, 3), (1280, 64, 3)]  # the last two: no side of 64 px, nothing to search
    haar = HaarDetector(640)  # its own grey copy, bounded the same way (a tall strip was 640 x 480,000: 438 MB)
    assert haar._detect_image(np.zeros((12000, 16, 3), np.uint8)).shape == (2560, 3)
    assert haar._detect_image(np.zeros((1920, 1080, 3), np.uint8)).shape == (1138, 640)
    assert haar.detect(np.zeros((12000, 16, 3), np.uint8)) == []


def test_boxes_from_a_luma_plane_map_back_from_where_the_cut_really_is():
    """A Pi camera frame carries a small luma plane; a window's cut from it starts on a whole luma
    pixel, not at the window's corner: mapped back from the corner, boxes moved by up to 3.5 px."""

    class BrightSquare(WindowedDetector):  # the box of the bright pixels, as a perfect detector would find it
        def _detect_window(self, bgr):
            ys, xs = np.nonzero(bgr[:, :, 0] > 127)
            x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            w, h = x1 - x0, y1 - y0  # landmarks where a face's would be
            points = [(0.3, 0.4), (0.7, 0.4), (0.5, 0.6), (0.35, 0.8), (0.65, 0.8)]
            return np.array([[x0, y0, w, h, *[v for px, py in points for v in (x0 + px * w, y0 + py * h)], 0.99]],
                            np.float32)

    full = np.zeros((1080, 1920, 3), np.uint8)
    full[480:528, 984:1032] = 255  # 48 px, a whole number of luma pixels (6 x 6 of them)
    luma = cv2.resize(full[:, :, 0], (320, 180), interpolation=cv2.INTER_AREA)
    from tracker.sources.base import LumaFrame

    frame = LumaFrame(0, 0, full, None, luma)
    detector = BrightSquare(320, 0.5)
    for regions in (None, *([Box(float(x), 440.0, 60.0, 60.0)] for x in range(880, 1000, 7))):
        (found,) = detector.detect(frame, regions)
        assert found.box.x == pytest.approx(984, abs=0.5) and found.box.w == pytest.approx(48, abs=0.5), regions


def test_a_model_file_is_read_once_and_built_from_its_checked_bytes_whatever_its_name(tmp_path, testdata,
                                                                                      monkeypatch):
    """OpenCV took YuNet's format from the file name's extension: the right file named `.bin`
    was refused (blaming the OpenCV version), and --check-config had passed it. The file is
    replaced by junk as soon as it is read: a detector that read it again would not run the
    bytes whose sha256 was checked."""
    load = model_files.ModelFile.load

    def load_then_replaced(spec, override=None):
        path, content = load(spec, override)
        path.write_bytes(b"junk")
        return path, content

    monkeypatch.setattr(model_files.ModelFile, "load", load_then_replaced)
    image = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))
    for name, spec in (("yunet", model_files.YUNET), ("blazeface", model_files.BLAZEFACE)):
        renamed = tmp_path / f"{name}_model.bin"
        renamed.write_bytes(spec.find().read_bytes())
        detector = DETECTORS[name](model=renamed)
        assert detector.model_path == renamed and len(detector.detect(image)) == 1


# -- faces a frame ----------------------------------------------------------------------------------

def tiled_faces(testdata, width: int, height: int, side: int) -> np.ndarray:
    """A width x height BGR frame tiled with the astronaut's face at side x side pixels."""
    face = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))[40:200, 150:300]
    tile = cv2.resize(face, (side, side), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(np.tile(tile, (height // side + 1, width // side + 1, 1))[:height, :width])


def test_a_frame_of_many_faces_gives_the_max_faces_of_highest_score(testdata):
    """Nothing bounded a frame's faces: 130 from this frame, 4,987 from a 1920 x 1080 one (a 154 MB
    crop batch, 1.3 GB in the tracker)."""
    from tracker.detect import MAX_FACES

    frame = tiled_faces(testdata, 320, 240, 24)
    every = YuNetDetector(320).detect(frame)
    assert len(every) > MAX_FACES
    kept = create_detector(DetectConfig(detector="yunet", detect_width=320)).detect(frame)
    assert len(kept) == MAX_FACES
    assert sorted(d.score for d in kept) == sorted(d.score for d in every)[-MAX_FACES:]


def test_the_cap_keeps_the_detectors_order_and_says_what_it_drops_at_most_once_a_minute(monkeypatch, caplog):
    import tracker.detect as detect

    # the lowest at 1, 5 and the end; the highest at 4, after faces it outscores
    scores = [0.6, 0.1, 0.8, 0.7, 0.9, 0.2, *[0.5] * (detect.MAX_FACES - 4), 0.3]

    class Crowd:  # MAX_FACES + 3 faces
        name, gives_landmarks, detect_width = "crowd", False, 320

        def detect(self, frame, regions=None):
            return [Detection(Box(float(i), 0.0, 10.0, 10.0), s) for i, s in enumerate(scores)]

    clock = [1000.0]
    monkeypatch.setattr(detect.time, "monotonic", lambda: clock[0])
    capped = detect.CappedDetector(Crowd())
    assert (capped.name, capped.gives_landmarks, capped.detect_width) == ("crowd", False, 320)
    caplog.set_level("WARNING")
    kept = capped.detect(None)
    assert [d.box.x for d in kept] == [i for i in range(len(scores)) if i not in (1, 5, len(scores) - 1)]
    assert caplog.text.count("crowd found 35 faces in a frame; only the 32 of highest score are kept") == 1
    clock[0] += detect.CAPPED_WARNING_EVERY_S - 1
    capped.detect(None)
    capped.detect(None)
    assert len(caplog.records) == 1
    clock[0] += 1
    capped.detect(None)
    assert len(caplog.records) == 2
    assert "9 face(s) dropped in 3 frame(s) since the last such line" in caplog.records[1].getMessage()


# -- model files and the choice of detector ---------------------------------------------------------

def test_the_configs_thresholds_reach_the_detector_it_creates(testdata):
    """detect.score_threshold, scale_factor, min_neighbors and min_face_px are the guard's only
    say in what counts as a face: each must reach the detector (the astronaut's face scores about
    0.93, is 95 px and found by Haar at the defaults)."""
    image = cv2.imread(str(testdata / "faces" / "skimage" / "astronaut.png"))
    for name in sorted(DETECTORS):
        assert len(create_detector(DetectConfig(detector=name, detect_width=512)).detect(image)) == 1
        assert create_detector(DetectConfig(detector=name, detect_width=512, score_threshold=0.999)).detect(image) == []
    assert len(create_detector(DetectConfig(detector="haar", detect_width=512)).detect(image)) == 1
    for strict in ({"min_neighbors": 50}, {"min_face_px": 120}):
        assert create_detector(DetectConfig(detector="haar", detect_width=512, **strict)).detect(image) == [], strict
    haar = create_detector(DetectConfig(detector="haar", scale_factor=1.25, min_neighbors=7, min_face_px=40)).detector
    assert (haar.scale_factor, haar.min_neighbors, haar.min_face_px) == (1.25, 7, 40)


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_model_file_must_have_its_sha256(name, tmp_path):
    spec = model_files.YUNET if name == "yunet" else model_files.BLAZEFACE
    good = spec.find()
    assert good is not None, f"{spec.filename} not installed: scripts/setup puts it on the search path"
    truncated = tmp_path / spec.filename
    truncated.write_bytes(good.read_bytes()[:1000])
    text = tmp_path / "notes.onnx"
    text.write_text("not a model")
    for path in (truncated, text):
        with pytest.raises(ModelError, match=f"{name} detector: model .* has sha256 .*; expected {spec.sha256}"):
            DETECTORS[name](model=path)
    with pytest.raises(ModelError, match=f"cannot read .*expected the file with sha256 {spec.sha256}"):
        DETECTORS[name](model=tmp_path)


def test_a_model_file_over_the_bound_is_refused_as_too_large_by_load_and_check_alike(tmp_path):
    """load hashed only the first MAX_MODEL_BYTES + 1 bytes and quoted that as the file's sha256,
    which check (hashing it all) contradicted."""
    large = tmp_path / "large.onnx"
    with large.open("wb") as f:
        f.truncate(model_files.MAX_MODEL_BYTES + 1)
    spec = model_files.YUNET
    expected = f"yunet detector: model {str(large)!r} is larger than 16 MB; expected {spec.filename} (sha256 {spec.sha256})"
    for read in (spec.load, spec.check):
        with pytest.raises(ModelError) as err:
            read(large)
        assert str(err.value).startswith(expected) and "has sha256" not in str(err.value)


def test_missing_model_names_the_search_path_the_sha256_and_the_source(monkeypatch, tmp_path):
    missing = model_files.ModelFile("yunet", "absent.onnx", "ab" * 32, "nowhere", "the model's home page")
    with pytest.raises(ModelError) as err:
        missing.locate()
    text = str(err.value)
    assert "absent.onnx not found" in text and str(Path("nowhere") / "absent.onnx") in text
    assert "ab" * 32 in text and "the model's home page" in text and "detect.model" in text


def test_auto_takes_yunet_then_blazeface_then_haar(monkeypatch, caplog):
    import tracker.detect as detect

    config = DetectConfig()
    assert config.detector == "auto" and resolve_detector(config) == "yunet"
    caplog.set_level("INFO")
    assert create_detector(config).name == "yunet" and "auto chose yunet" in caplog.text
    absent = model_files.ModelFile("x", "absent", "0" * 64, "nowhere", "nowhere")
    monkeypatch.setattr(detect, "YUNET", absent)
    assert resolve_detector(config) == "blazeface"
    monkeypatch.setattr(detect, "BLAZEFACE", absent)
    assert resolve_detector(config) == "haar" and create_detector(config).name == "haar"



def test_a_score_threshold_is_refused_with_haar_and_warned_about_when_auto_chooses_haar(monkeypatch, caplog):
    """Haar has no face scores: the threshold was ignored in silence."""
    import tracker.detect as detect

    with pytest.raises(InputError, match="key 'detect': score_threshold 0.7 given for detector 'haar', which has no "
                                         "face scores to compare it with; expected detector yunet or blazeface"):
        parse_config({"detect": {"detector": "haar", "score_threshold": 0.7}})
    absent = model_files.ModelFile("x", "absent", "0" * 64, "nowhere", "nowhere")
    monkeypatch.setattr(detect, "YUNET", absent)
    monkeypatch.setattr(detect, "BLAZEFACE", absent)
    caplog.set_level("WARNING")
    assert create_detector(DetectConfig(score_threshold=0.7), quiet=True).name == "haar"
    assert "auto chose haar, which has no face scores: detect.score_threshold 0.7 does not apply" in caplog.text


def test_the_advice_for_weights_of_other_crops_follows_the_direction_of_the_mismatch(tmp_path, caplog):
    """Weights trained on box crops under a detector with landmarks were told to use a detector
    with landmarks, which is what they had."""
    import json
    import shutil

    from tracker.files import file_sha256
    from tracker.model.card import card_path, write_card
    from tracker.model.spec import MODELS_DIR
    from tracker.stages import build_stages

    shipped = MODELS_DIR / "face_cnn.caffemodel"
    box_weights = tmp_path / "box.caffemodel"
    shutil.copyfile(shipped, box_weights)
    card = json.loads(card_path(shipped).read_text(encoding="utf-8"))
    assert card["crop"] == "aligned-v1"
    write_card(box_weights, {**card, "crop": "box-v1", "weights_sha256": file_sha256(box_weights)})
    caplog.set_level("WARNING", logger="tracker.stages")
    for detector, weights, advice in (
            ("yunet", box_weights, "(use detect.detector haar, or retrain the weights with detector yunet)"),
            ("haar", shipped, "(use a detector with landmarks: detect.detector yunet or blazeface)")):
        caplog.clear()
        config = parse_config({"state_dir": str(tmp_path / detector), "web": {"enabled": False},
                               "sinks": {"console": False}, "detect": {"detector": detector},
                               "model": {"prototxt": str(MODELS_DIR / "face_cnn.prototxt"), "weights": str(weights)}})
        build_stages(config).close()
        assert [r.getMessage().endswith(advice) for r in caplog.records if "crops" in r.getMessage()] == [True]


def test_config_errors_for_detectors(tmp_path):
    with pytest.raises(InputError, match=r"detect\.detector.*'auto', 'yunet', 'blazeface' or 'haar'"):
        parse_config({"detect": {"detector": "mtcnn"}})
    other = tmp_path / "m.onnx"
    other.write_bytes(b"x")
    with pytest.raises(InputError, match="model given for detector 'haar'; expected detector yunet or blazeface"):
        parse_config({"detect": {"detector": "haar", "model": str(other)}})
    with pytest.raises(InputError, match="detect.model.*expected an existing file"):
        parse_config({"detect": {"detector": "yunet", "model": str(tmp_path / "nope.onnx")}})
    with pytest.raises(InputError, match="makes the 640x480 frame 64x48 detection pixels; expected at least 64 on each"):
        parse_config({"detect": {"detect_width": 64}})
    # a tall camera: its width was never checked, and yunet found nothing in it, without a word
    with pytest.raises(InputError, match="makes the 100x4096 frame 31x1280 detection pixels; expected at least 64"):
        parse_config({"source": {"width": 100, "height": 4096}, "detect": {"detector": "yunet"}})
    # 12.6 megapixels to search: 968 MB at yunet's peak
    with pytest.raises(InputError, match=r"detect_width 4096 makes the 320x240 frame 12.6 megapixels to search; "
                                         r"expected at most 2.1 \(a detect_width of at most 1662\)"):
        parse_config({"source": {"width": 320, "height": 240}, "detect": {"detector": "yunet", "detect_width": 4096}})
    parse_config({"source": {"width": 320, "height": 240}, "detect": {"detector": "yunet", "detect_width": 1662}})
    with pytest.raises(InputError, match="min_face_px 1024 is larger than the 640x480 frame's shorter side; expected at most 480"):
        parse_config({"detect": {"detector": "haar", "min_face_px": 1024}})  # every window skipped, nothing found


def test_no_frame_is_searched_at_more_detection_pixels_than_the_bound():
    """A frame of another size than the camera's (an image folder's photo) at a large detect_width
    is searched at MAX_DETECT_PIXELS at most, the aspect bound and the detect_width otherwise."""
    from tracker.detection_scale import MAX_DETECT_PIXELS, detection_scale

    for width, height, detect_width in ((320, 240, 4096), (16, 12_000, 640), (4000, 3000, 4096), (640, 480, 320)):
        k = detection_scale(width, height, detect_width)
        assert (width * k) * (height * k) <= MAX_DETECT_PIXELS * 1.0001
        assert k <= detect_width / width and height * k <= 4 * detect_width * 1.0001
    assert detection_scale(640, 480, 320) == 0.5  # the default: the detect_width alone


def test_a_wrong_model_file_stops_the_guard_with_exit_2(tmp_path, capsys):
    wrong = tmp_path / "yunet.onnx"
    wrong.write_bytes(b"\x08\x01 not the model")
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\ndetect: {{detector: yunet, model: {str(wrong)!r}}}\n")
    assert main(["--check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"model {str(wrong)!r} has sha256" in err
    assert main(["--demo", "--frames", "3", "--config", str(config)]) == 2
    assert "has sha256" in capsys.readouterr().err


def test_a_missing_haar_cascade_is_one_line_and_exit_2_for_check_config_and_guard(tmp_path, monkeypatch, capfd):
    """--check-config passed haar without its cascade (a wheel that ships none, as OpenCV 5's),
    which the run then refused, after OpenCV's own [ERROR] line."""
    monkeypatch.setattr(cv2.data, "haarcascades", str(tmp_path / "no-cascades") + "/")
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\nweb: {{enabled: false}}\ndetect: {{detector: haar}}\n")
    expected = f"Haar cascade {str(tmp_path / 'no-cascades' / 'haarcascade_frontalface_default.xml')!r} is not a readable file"
    for command in (["--check-config"], ["--demo", "--frames", "3"]):
        assert main([*command, "--config", str(config)]) == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and expected in err, command
    with pytest.raises(ModelError, match=f"Haar cascade {str(tmp_path)!r} is not a readable file"):
        HaarDetector(cascade=tmp_path)  # a folder
    assert "[ERROR" not in capfd.readouterr().err


# -- a person standing still ------------------------------------------------------------------------

def test_a_person_standing_still_keeps_their_track_under_region_search(tmp_path, testdata):
    """A face that never moves (so the motion gate stops seeing it once it fades into the
    background) while something else moves: searched around its track, it is found in every
    frame and keeps one track."""
    from test_scene_golden import run_recorded

    chip = cv2.imread(str(next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))))
    room = np.full((240, 320, 3), (150, 160, 170), np.uint8)
    room[60:200, 20:80] = (90, 110, 135)  # a door
    face = cv2.resize(chip, (90, 90))
    room[70:160, 180:270] = face
    frames = tmp_path / "frames"
    frames.mkdir()
    for n in range(120):
        image = room.copy()
        x = 10 + (n * 7) % 120  # a ball rolling along the floor
        cv2.circle(image, (x, 220), 10, (40, 40, 200), -1)
        cv2.imwrite(str(frames / f"{n:04d}.png"), image)
    config = parse_config({"state_dir": str(tmp_path / "state"), "sinks": {"console": False},
                           "source": {"kind": "folder", "uri": str(frames), "width": 320, "height": 240}})
    calls = run_recorded(config).stages.tracker.calls
    assert len(calls) == 120
    on_face = [[d for d in detections if iou(d.box, Box(180, 70, 90, 90)) > 0.3] for detections, _, _ in calls]
    assert all(len(found) == 1 for found in on_face)
    ids = {v.track_id for _, _, views in calls[5:] for v in views if v.visible}
    assert len(ids) == 1


def test_a_still_face_missed_once_is_searched_around_its_track_next(tmp_path, testdata, monkeypatch):
    """The frame after a miss has no previous detection of the face and no motion on it: only its
    track's predicted box brings the search back to it (the test above passes on the previous
    frame's faces alone, so it could not fail without the tracks' boxes)."""
    from test_scene_golden import run_recorded

    import tracker.stages as stages

    chip = cv2.imread(str(next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))))
    room = np.full((240, 320, 3), (150, 160, 170), np.uint8)
    room[70:160, 180:270] = cv2.resize(chip, (90, 90))
    frames = tmp_path / "frames"
    frames.mkdir()
    for n in range(60):
        image = room.copy()
        cv2.circle(image, (10 + (n * 7) % 120, 220), 10, (40, 40, 200), -1)  # something moves each frame
        cv2.imwrite(str(frames / f"{n:04d}.png"), image)
    real = stages.create_detector

    def missing_the_face_once(config):
        detector = real(config)
        calls = iter(range(10**6))

        class Blinking:  # the real detector, blind on its 40th call
            name, gives_landmarks = detector.name, detector.gives_landmarks

            def detect(self, frame, regions=None):
                return [] if next(calls) == 40 else detector.detect(frame, regions)

        return Blinking()

    monkeypatch.setattr(stages, "create_detector", missing_the_face_once)
    config = parse_config({"state_dir": str(tmp_path / "state"), "sinks": {"console": False},
                           "source": {"kind": "folder", "uri": str(frames), "width": 320, "height": 240}})
    calls = run_recorded(config).stages.tracker.calls
    on_face = [len([d for d in detections if iou(d.box, Box(180, 70, 90, 90)) > 0.3]) for detections, _, _ in calls]
    assert on_face[40] == 0 and on_face[41] == 1 and sum(on_face) == 59
