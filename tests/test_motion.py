"""The motion gate on the synthetic scene: quiet on static frames (with sensor noise, heavy noise
too), firing where faces move, regions in full-frame pixels, a lasting light change learnt into
the background, configurable and switchable off."""

from __future__ import annotations

import tracemalloc

import cv2
import numpy as np
import pytest

from tracker.config import MotionConfig
from tracker.motion import MotionGate
from tracker.sources.base import LumaFrame
from tracker.sources.synthetic import SyntheticScene
from tracker.types import Frame


@pytest.fixture(scope="module")
def scene() -> SyntheticScene:
    return SyntheticScene(fps=10.0, seed=3)  # nobody in frames 0-11; A and B walk from frame 12


def _overlaps(a, b) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


def test_static_noisy_scene_does_not_fire(scene):
    gate = MotionGate.from_config(MotionConfig())
    verdicts = [gate.update(scene.render(n)[0]) for n in range(12)]
    assert verdicts[0].moving and verdicts[0].regions[0].w == scene.width  # no background yet
    assert not any(v.moving for v in verdicts[1:])
    assert all(v.regions == () for v in verdicts[1:])
    assert max(v.fraction for v in verdicts[1:]) < MotionConfig().min_area_fraction


def test_blur_keeps_heavy_sensor_noise_below_the_threshold():
    """Noise of 20 grey levels (a cheap sensor in dim light): with the blur taken out, 2-5% of the
    small grey image's pixels change by more than the threshold from frame to frame, ten times
    min_area_fraction, and the gate fired on every frame; the 5x5 blur averages it away."""
    noisy = SyntheticScene(fps=10.0, seed=3, noise_sigma=20.0)
    gate = MotionGate.from_config(MotionConfig())
    verdicts = [gate.update(noisy.render(n)[0]) for n in range(12)]
    assert not any(v.moving for v in verdicts[1:])
    assert max(v.fraction for v in verdicts[1:]) < MotionConfig().min_area_fraction


def test_moving_faces_fire_with_regions_on_them(scene):
    gate = MotionGate()
    for n in range(12):
        gate.update(scene.render(n)[0])
    fired = 0
    walking = 0
    for n in range(12, 60):
        image, gts = scene.render(n)
        motion = gate.update(image)
        inside = [g for g in gts if g.visible > 0.5]
        if not inside:
            continue
        walking += 1
        if motion.moving:
            fired += 1
            for g in inside:  # every visible walker is covered by some moving region
                assert any(_overlaps(g.box, r) for r in motion.regions), (n, g)
            for r in motion.regions:
                assert 0 <= r.x and r.x + r.w <= scene.width + 1e-6 and 0 <= r.y and r.y + r.h <= scene.height + 1e-6
    assert walking >= 30 and fired == walking


def test_sudden_light_change_fires_over_the_frame(scene):
    gate = MotionGate()
    image = scene.render(3)[0]
    gate.update(image)
    assert not gate.update(scene.render(4)[0]).moving
    brighter = cv2.add(scene.render(5)[0], np.full_like(image, 40))
    motion = gate.update(brighter)
    assert motion.moving and motion.fraction > 0.9


def test_the_background_learns_a_lasting_light_change(scene):
    """A light switched on changes the whole frame at once (moving), then the running average
    takes it in at learning_rate 0.05 a frame: a 40-level step falls under the 18-level threshold
    after 16 frames (40 * 0.95^16 < 18), so the gate is quiet again well within 30 frames, and
    stays quiet, instead of running detection on every frame for as long as the light stays on."""
    gate = MotionGate()
    for n in range(3):
        gate.update(scene.render(n)[0])
    lit = [cv2.add(scene.render(n % 12)[0], np.full((scene.height, scene.width, 3), 40, np.uint8))
           for n in range(3, 53)]  # the empty room (frames 0-11 over again), 40 levels brighter
    moving = [gate.update(image).moving for image in lit]
    assert moving[0]
    assert not any(moving[30:]), moving


def test_threshold_and_area_are_honoured(scene):
    still = scene.render(2)[0]
    moved = still.copy()
    moved[100:140, 100:140] = 255 - moved[100:140, 100:140]  # a 40x40 change: 0.5% of the frame
    for min_area, expect in ((0.002, True), (0.02, False)):
        gate = MotionGate(min_area_fraction=min_area)
        gate.update(still)
        assert gate.update(moved).moving is expect
    deaf = MotionGate(threshold=250)
    deaf.update(still)
    assert not deaf.update(moved).moving


def test_from_config_takes_every_setting():
    config = MotionConfig(enabled=False, downscale_width=80, threshold=40, min_area_fraction=0.01)
    gate = MotionGate.from_config(config)
    assert (gate.enabled, gate.downscale_width, gate.threshold, gate.min_area_fraction) == (False, 80, 40.0, 0.01)
    defaults = MotionConfig()
    assert all(getattr(config, name) != getattr(defaults, name)
               for name in ("enabled", "downscale_width", "threshold", "min_area_fraction"))


def test_disabled_gate_always_says_moving(scene):
    gate = MotionGate.from_config(MotionConfig(enabled=False))
    image = scene.render(1)[0]
    for _ in range(3):
        motion = gate.update(image)
        assert motion.moving and len(motion.regions) == 1 and motion.regions[0].w == scene.width


def test_frame_size_change_restarts_the_background(scene):
    gate = MotionGate()
    gate.update(scene.render(1)[0])
    assert not gate.update(scene.render(2)[0]).moving
    small = cv2.resize(scene.render(3)[0], (320, 240))
    first = gate.update(small)
    assert first.moving and first.regions[0].w == 320


def test_luma_plane_is_used_and_regions_are_full_frame(scene):
    """A LumaFrame (e.g. the Pi camera's lores Y plane) is judged by its luma plane, in full-frame
    pixels: only the luma shows people walking (the image is the empty scene throughout), and the
    gate finds them where a gate given the moving images does."""
    empty = scene.render(0)[0]
    by_image, by_luma = MotionGate(), MotionGate()
    moving = 0
    for n in range(10, 30):
        image = scene.render(n)[0]
        luma = cv2.resize(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), (320, 240), interpolation=cv2.INTER_AREA)
        a = by_image.update(Frame(n, n, image))
        b = by_luma.update(LumaFrame(n, n, empty, luma=luma))
        assert a.moving == b.moving
        if n > 10 and a.moving:
            moving += 1
            assert all(any(_overlaps(ra, rb) for rb in b.regions) for ra in a.regions)
            assert max(r.x + r.w for r in b.regions) > 320  # scaled to the 640-wide frame
    assert moving >= 10


def test_a_tall_strip_is_reduced_too_and_its_motion_found():
    """A frame taller than wide was reduced to downscale_width wide only: a 160-pixel-wide strip
    from a photo folder was compared at full size (160 x 150,000: 330 MB more). Now its height is
    bounded as the detectors' is (MAX_ASPECT widths)."""
    strip = np.full((40_000, 160, 3), 90, np.uint8)
    moved = strip.copy()
    moved[20_000:25_000] = 200  # 12.5% of it
    gate = MotionGate()
    tracemalloc.start()
    try:
        assert gate.update(strip).moving  # the first frame
        motion = gate.update(moved)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak  # compared whole: a 25.6 MB background, and as much again for the difference
    assert motion.moving and len(motion.regions) == 1
    region = motion.regions[0]
    assert region.y <= 20_000 and region.y + region.h >= 25_000 and region.h < 8_000


@pytest.mark.parametrize("glitch", [0, 128])
def test_the_frame_after_a_black_or_grey_one_is_moving(scene, glitch):
    """The guard carries the faces of the last frame judged moving over still frames. A black or
    grey frame (a camera's glitch) is moving and has no face; the background takes in 5% of it, so
    the scene after it was still against the background and "no face" was carried on: a person
    standing in view was declared gone until they moved. The frame after it differs from it."""
    gate = MotionGate()
    still = scene.render(2)[0]
    for _ in range(5):
        gate.update(still)
    assert not gate.update(still).moving
    assert gate.update(np.full_like(still, glitch)).moving
    after = gate.update(still)
    assert after.moving and after.fraction > 0.5
    assert sum(r.w * r.h for r in after.regions) > 0.5 * scene.width * scene.height
    assert not gate.update(still).moving  # and still again: its faces are carried


def test_a_still_scene_under_flickering_light_stays_still():
    """The background averages out a flicker; two frames of it in a row differ by up to twice its
    amplitude. Comparing every still frame with the last moving one (kept from the last frame that
    fired on that comparison) made a still scene move on two frames of three, each a whole-frame
    search."""
    rng = np.random.default_rng(0)
    still = cv2.GaussianBlur(rng.integers(60, 190, (480, 640), dtype=np.uint8), (31, 31), 0)
    gate = MotionGate()
    moving = []
    for k in range(200):  # a 3-frame cycle of +13, -6, -6 grey levels
        level = int(round(13 * np.cos(2 * np.pi * k / 3)))
        moving.append(gate.update(np.clip(still.astype(np.int16) + level, 0, 255).astype(np.uint8)).moving)
    assert not any(moving[50:]), sum(moving[50:])
