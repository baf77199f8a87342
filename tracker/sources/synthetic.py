"""A deterministic synthetic scene: real faces walking through a room, with ground truth per frame.

The faces are real photographs (see `scene_chips`), drawn with a
soft oval edge over a procedurally drawn room (wall, floor, door, window) and a pillar in the
foreground, plus per-frame sensor noise. The scene is a script that repeats every `CYCLE_S`
seconds of scene time with new random choices (identities, sizes, heights, speeds) per cycle:

    ~1 s   nobody
    A      enters at the left edge, walks right and leaves (in front of the pillar)
    B      enters at the right edge, walks left, crosses A mid-frame and occludes it (B is nearer)
    C      enters at the left, stops for ~2 s mid-frame, walks on BEHIND the pillar and leaves
    ~1-5 s nobody (a static scene: the motion gate must stay quiet)

Everything is a pure function of (seed, frame index n, size, fps): scene time is n / fps, so the
same seed gives identical frames and ground truth whatever the capture speed, any length is
possible, and any frame can be rendered on its own (`render(n)`).

Ground truth per frame (`ground_truth(n)`): one `GroundTruth(track_id, identity, box, visible)` per
face with at least one visible pixel. `box` is the square where the face chip is drawn, clipped to
the frame (the chips are tight face crops, so Haar boxes cover ~90% of it); `visible` is the
fraction of the face's oval that is visible (not outside the frame, not behind the pillar, not
behind a nearer face). `track_id` is unique per walk through the scene (A, B and C of each cycle);
`identity` is the person's name (the chip folder name), the same across cycles.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from tracker import shared_data
from tracker.errors import InputError
from tracker.images import IMAGE_SUFFIXES, read_image, unreadable_reason
from tracker.sources.base import SourceBase
from tracker.types import Box, Frame

# The default faces: twelve public-domain face chips (dlib's examples/johns, 150 x 150, aligned),
# three each of four people, read in place from the shared data (tracker.shared_data); they are
# frontal and evenly lit, so the Haar cascade finds them at the scene's face sizes (80-140 px).
# John_Salley is left out because the cascade misses several of his chips. `source.faces_dir` names
# any other folder of `<person>/<image>` files instead (its first MAX_SCENE_PEOPLE people and
# MAX_CHIPS_PER_PERSON image files of each, by name).
DEFAULT_FACES = "testdata/faces/dlib/johns"
_FACES_DIR_FIX = "set source.faces_dir to a folder of <person>/<face image> files"
DEFAULT_CHIPS = (
    "John_Savage/000264_01099001.jpg", "John_Savage/000274_01099061.jpg", "John_Savage/000277_01099000.jpg",
    "John_Schneider/000288_00925786.jpg", "John_Schneider/000302_00925785.jpg", "John_Schneider/000307_00925823.jpg",
    "John_Shimkus/000373_03228153.jpg", "John_Shimkus/000375_03227651.jpg", "John_Shimkus/000376_02340068.jpg",
    "John_Simm/000288_00470387.jpg", "John_Simm/000297_00470170.jpg", "John_Simm/000300_00470148.jpg",
)
ENROL_CHIPS = 5  # the demo enrols each person from this many chips the scene does not show
CYCLE_S = 20.0
PILLAR_Z = 1  # actors with a smaller z walk behind the pillar
_ACTORS_PER_CYCLE = 3
# A faces_dir's people and images the scene reads, the first by name: every chip is held decoded
# (up to 512 px a side, 0.8 MB), and a faces_dir of LFW's 9,525 photos held 1.7 GB.
MAX_SCENE_PEOPLE = 16
MAX_CHIPS_PER_PERSON = 4
_NOISE_PAD = 64  # the noise field is this much larger than the frame, for per-frame offsets
_LARGEST_FACE = 0.29  # the largest face the scene draws, as a fraction of the frame's height (walker B's)
# The scene's arrays take about 45 bytes a pixel while it is made (the room and its noise, in
# float32): 4096 x 4096 took 750 MB. A demo needs no more than a camera's 1080p.
MAX_SCENE_PIXELS = 1920 * 1080


@dataclass(frozen=True)
class GroundTruth:
    """One face in one frame of the synthetic scene (see the module docstring)."""

    track_id: int
    identity: str
    box: Box  # full-frame pixels, clipped to the frame
    visible: float  # in (0, 1]


@dataclass(frozen=True)
class _Actor:
    track_id: int
    identity: str
    chip: int  # index into SyntheticScene.chips
    size: int  # side of the drawn face square, pixels
    z: int  # drawing order: larger is nearer the camera
    keys: tuple[tuple[float, float, float], ...]  # (t_s, centre x, centre y), piecewise linear

    def centre(self, t: float) -> tuple[float, float] | None:
        keys = self.keys
        if t < keys[0][0] or t > keys[-1][0]:
            return None
        for (t0, x0, y0), (t1, x1, y1) in zip(keys, keys[1:]):
            if t <= t1:
                a = 0.0 if t1 == t0 else (t - t0) / (t1 - t0)
                return x0 + a * (x1 - x0), y0 + a * (y1 - y0)
        return keys[-1][1], keys[-1][2]


def default_faces_dir() -> Path:
    """The folder of DEFAULT_CHIPS: DEFAULT_FACES in the shared data; InputError (exit 2) naming
    where it was looked for when it is not there."""
    return shared_data.locate(DEFAULT_FACES, "synthetic scene", instead=_FACES_DIR_FIX)


def scene_chips(faces_dir: Path | None = None) -> dict[str, list[Path]]:
    """The face images of the scene, per person: `<faces_dir>/<person>/<image>` (the first
    MAX_SCENE_PEOPLE people and MAX_CHIPS_PER_PERSON images of each, by name), or, with faces_dir
    None, DEFAULT_CHIPS in `default_faces_dir()`. InputError (exit 2) if they are missing or name
    fewer people than a scene cycle needs."""
    if faces_dir is None:
        where, fix = default_faces_dir(), f"; {_FACES_DIR_FIX}"
        files = [where / name for name in DEFAULT_CHIPS]
        if not all(f.is_file() for f in files):
            raise InputError(f"synthetic scene: face chips not found in {str(where)!r} (the project's shared "
                             f"test data){fix}")
    else:
        where, fix = Path(faces_dir), ""
        if not os.path.isdir(where):  # (it read "0 people found in" a folder that was not there)
            state = "is not a folder" if os.path.exists(where) else "does not exist"
            raise InputError(f"config: key 'source.faces_dir': {str(where)!r} {state}; expected a folder of "
                             "<person>/<face image> files")
        files = sorted(p for p in where.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES)
    people: dict[str, list[Path]] = {}
    for path in files:  # (sorted: each person's images come together)
        if path.parent.name not in people and len(people) == MAX_SCENE_PEOPLE:
            break
        chips = people.setdefault(path.parent.name, [])
        if len(chips) < MAX_CHIPS_PER_PERSON:
            chips.append(path)
    if len(people) < _ACTORS_PER_CYCLE:
        raise InputError(f"synthetic scene: {len(people)} people found in {str(where)!r}; expected "
                         f"<person>/<face image> files for at least {_ACTORS_PER_CYCLE} people{fix}")
    return people


def enrolment_chips(faces_dir: Path | None = None) -> dict[str, list[Path]]:
    """Chips to enrol the scene's people from. For the default faces, each person's other chips of
    `default_faces_dir()` (up to ENROL_CHIPS, by name), none of which the scene shows: the demo then
    tells its people apart as the guard would, from faces it was not enrolled with. For a
    `faces_dir`, its own images (the scene shows the same ones)."""
    people = scene_chips(faces_dir)
    if faces_dir is not None:
        return people
    folder = default_faces_dir()
    shown = {folder / name for name in DEFAULT_CHIPS}
    return {name: sorted(p for p in (folder / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p not in shown)[:ENROL_CHIPS]
            for name in people}


def fitting_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) scaled down, keeping the aspect, to at most MAX_SCENE_PIXELS pixels (as they
    are if within it): the scene the demo and the detectors' frame budget show at the size of a
    camera that is larger."""
    if width * height <= MAX_SCENE_PIXELS:
        return width, height
    scale = math.sqrt(MAX_SCENE_PIXELS / (width * height))
    return int(width * scale), int(height * scale)


def load_chips(faces_dir: Path | None = None, largest_side: int | None = None) -> tuple[list[np.ndarray], list[str]]:
    """The face chips (BGR uint8) and the identity of each (see `scene_chips`); with
    `largest_side`, a chip whose longer side is past it is shrunk (area-averaged) to it as it is
    read: a faces_dir of phone photos was kept whole (12 of 12 megapixels: 590 MB)."""
    chips, names = [], []
    for name, paths in scene_chips(faces_dir).items():
        for path in paths:
            image = read_image(path)
            if image is None:
                raise InputError(f"scene face {str(path)!r}: not a readable image ({unreadable_reason(path)}); expected a "
                                 "face image")
            longer = max(image.shape[:2])
            if largest_side is not None and longer > largest_side:
                scale = largest_side / longer
                size = (max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale)))
                image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            chips.append(image)
            names.append(name)
    return chips, names


class SyntheticScene:
    """The scene itself: `render(n)` -> (BGR image, ground truth) for frame n (see module doc).

    width, height: frame size in pixels; fps: frames per second of scene time;
    seed: picks everything random; noise_sigma: std of the per-frame Gaussian sensor noise in grey
    levels (0 disables it).
    """

    def __init__(self, width: int = 640, height: int = 480, fps: float = 10.0, seed: int = 0,
                 noise_sigma: float = 2.0, faces_dir: Path | None = None) -> None:
        if width < 64 or height < 64:
            raise InputError(f"synthetic scene: size {width}x{height} too small; expected at least 64x64")
        if width * height > MAX_SCENE_PIXELS:
            raise InputError(f"synthetic scene: size {width}x{height} too large; expected at most "
                             f"{MAX_SCENE_PIXELS:,} pixels (1920x1080)")
        if fps <= 0:
            raise InputError(f"synthetic scene: fps {fps} must be > 0")
        self.width, self.height, self.fps, self.seed = width, height, float(fps), seed
        self.noise_sigma = float(noise_sigma)
        # chips larger than twice the largest face drawn (and 512 px) are shrunk: the default
        # chips (150 px) are used as they are at every size
        self.chips, self.chip_identity = load_chips(faces_dir, max(512, 2 * int(np.ceil(_LARGEST_FACE * height))))
        self.identities: tuple[str, ...] = tuple(sorted(set(self.chip_identity)))
        self.pillar = (round(0.70 * width), round(0.77 * width))  # x range, full height
        self._background = self._draw_background()
        noise = np.random.default_rng([seed, 0, 3]).standard_normal(
            (height + _NOISE_PAD, width + _NOISE_PAD, 3), dtype=np.float32) * self.noise_sigma
        noise = np.rint(noise)
        self._noise_up = np.clip(noise, 0, 255).astype(np.uint8)  # each pixel is in one of the two
        self._noise_down = np.clip(-noise, 0, 255).astype(np.uint8)
        self._cycles: dict[int, tuple[_Actor, ...]] = {}
        self._sprites: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    # -- public --------------------------------------------------------------------------------

    def render(self, n: int) -> tuple[np.ndarray, list[GroundTruth]]:
        """Frame n: its (H, W, 3) uint8 BGR image and its ground truth."""
        placed = self._placed(n)
        image = self._background.copy()
        for actor, x, y in placed:
            if actor.z < PILLAR_Z:
                self._draw_face(image, actor, x, y)
        self._draw_pillar(image)
        for actor, x, y in placed:
            if actor.z > PILLAR_Z:
                self._draw_face(image, actor, x, y)
        if self.noise_sigma > 0:
            # Sensor noise: a window of a fixed noise field at a per-frame random offset (drawing
            # fresh Gaussian noise would cost ~20 ms a frame here, far more than the rest).
            dy, dx = np.random.default_rng([self.seed, n, 1]).integers(0, _NOISE_PAD, 2)
            window = (slice(dy, dy + self.height), slice(dx, dx + self.width))
            cv2.add(image, self._noise_up[window], dst=image)  # saturating, like a sensor
            cv2.subtract(image, self._noise_down[window], dst=image)
        return image, self._ground_truth(placed)

    def ground_truth(self, n: int) -> list[GroundTruth]:
        """The faces visible in frame n (without rendering the image)."""
        return self._ground_truth(self._placed(n))

    # -- script ----------------------------------------------------------------------------------

    def _cycle(self, c: int) -> tuple[_Actor, ...]:
        """The three walkers of cycle c (scene time c*CYCLE_S .. (c+1)*CYCLE_S)."""
        if c in self._cycles:
            return self._cycles[c]
        rng = np.random.default_rng([self.seed, c, 0])
        W, H = self.width, self.height
        t0 = c * CYCLE_S
        people = rng.permutation(len(self.identities))[:_ACTORS_PER_CYCLE]

        def pick(k: int, size_range: tuple[float, float]) -> tuple[str, int, int, float]:
            name = self.identities[int(people[k])]
            chips = [i for i, who in enumerate(self.chip_identity) if who == name]
            size = int(round(H * rng.uniform(*size_range)))
            return name, chips[int(rng.integers(len(chips)))], size, W * rng.uniform(0.17, 0.22)

        # A: left to right, in front of the pillar.
        name, chip, s, v = pick(0, (0.19, 0.25))
        ta = t0 + 1.0 + rng.uniform(0.0, 0.5)
        ya = H * rng.uniform(0.30, 0.42)
        a_end = (ta + (W + s) / v, W + s / 2, ya + H * rng.uniform(-0.04, 0.04))
        a = _Actor(3 * c + 1, name, chip, s, PILLAR_Z + 1, ((ta, -s / 2, ya), a_end))
        a_mid = a.keys[0][0] + (W / 2 + s / 2) / v  # when A's centre is mid-frame
        # B: right to left, nearer (larger, drawn over A) and crossing A mid-frame.
        name, chip, sb, vb = pick(1, (0.24, _LARGEST_FACE))
        tb_mid = a_mid + rng.uniform(-0.3, 0.3)
        a_centre = a.centre(a_mid)
        assert a_centre is not None  # a_mid lies on A's walk by construction
        yb = float(a_centre[1]) + rng.uniform(-0.3, 0.3) * s
        tb = tb_mid - (W / 2 + sb / 2) / vb
        b = _Actor(3 * c + 2, name, chip, sb, PILLAR_Z + 2,
                   ((tb, W + sb / 2, yb), (tb + (W + sb) / vb, -sb / 2, yb)))
        # C: left to right behind the pillar, standing still for a while mid-frame.
        name, chip, sc, vc = pick(2, (0.17, 0.21))
        tc = max(a.keys[-1][0], b.keys[-1][0]) + rng.uniform(0.5, 1.0)
        yc = H * rng.uniform(0.35, 0.50)
        xs = W * rng.uniform(0.35, 0.45)
        t_stop = tc + (xs + sc / 2) / vc
        t_go = t_stop + rng.uniform(1.5, 2.5)
        cc = _Actor(3 * c + 3, name, chip, sc, PILLAR_Z - 1,
                    ((tc, -sc / 2, yc), (t_stop, xs, yc), (t_go, xs, yc), (t_go + (W + sc / 2 - xs) / vc, W + sc / 2, yc)))
        actors = (a, b, cc)
        if len(self._cycles) > 8:  # bound the cache: frames are rendered in order
            self._cycles.clear()
        self._cycles[c] = actors
        return actors

    def _placed(self, n: int) -> list[tuple[_Actor, int, int]]:
        """Actors on screen in frame n with the integer top-left of their face square, by z."""
        t = n / self.fps
        c = int(t // CYCLE_S)
        placed = []
        for cycle in (c - 1, c):  # a late walker of the previous cycle may still be on screen
            if cycle < 0:
                continue
            for actor in self._cycle(cycle):
                centre = actor.centre(t)
                if centre is None:
                    continue
                x, y = int(round(centre[0] - actor.size / 2)), int(round(centre[1] - actor.size / 2))
                if x < self.width and y < self.height and x + actor.size > 0 and y + actor.size > 0:
                    placed.append((actor, x, y))
        placed.sort(key=lambda p: p[0].z)
        return placed

    # -- drawing -------------------------------------------------------------------------------

    def _sprite(self, chip: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The chip resized to size x size (float32 BGR) and its soft oval alpha (float32 0..1)."""
        key = (chip, size)
        if key not in self._sprites:
            # Frames come in order and every walk has its own size, so only the walkers of this
            # cycle and the last are reused: keep those, dropping the oldest (a sprite is up to
            # ~300 kB; 33 of them, cleared at once, made the demo's RSS saw-tooth by ~7 MB).
            if len(self._sprites) >= 2 * _ACTORS_PER_CYCLE:
                del self._sprites[next(iter(self._sprites))]
            face = cv2.resize(self.chips[chip], (size, size), interpolation=cv2.INTER_AREA).astype(np.float32)
            yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
            # An oval just inside the square, feathered over ~6% of the size: the face keeps its
            # cheeks and chin (which the Haar cascade needs), the corners show the room.
            r = np.hypot((xx - size / 2) / (0.50 * size), (yy - size * 0.52) / (0.56 * size))
            alpha = np.clip((1.0 - r) / 0.06, 0.0, 1.0).astype(np.float32)
            self._sprites[key] = (face, alpha)
        return self._sprites[key]

    def _draw_face(self, image: np.ndarray, actor: _Actor, x: int, y: int) -> None:
        face, alpha = self._sprite(actor.chip, actor.size)
        H, W = image.shape[:2]
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + actor.size, W), min(y + actor.size, H)
        f = face[y0 - y:y1 - y, x0 - x:x1 - x]
        a = alpha[y0 - y:y1 - y, x0 - x:x1 - x, None]
        roi = image[y0:y1, x0:x1]
        roi[...] = (roi * (1.0 - a) + f * a + 0.5).astype(np.uint8)

    def _draw_pillar(self, image: np.ndarray) -> None:
        x0, x1 = self.pillar
        image[:, x0:x1] = (70, 88, 96)
        image[:, x0 + (x1 - x0) // 4:x0 + (x1 - x0) // 3] = (96, 116, 126)  # a highlight edge

    def _draw_background(self) -> np.ndarray:
        """A plain room, drawn once: wall gradient, floor, door, window, a little texture."""
        W, H = self.width, self.height
        rng = np.random.default_rng([self.seed, 0, 2])
        ramp = np.linspace(0.0, 1.0, H, dtype=np.float32)[:, None, None]
        wall = np.array([178, 190, 200], np.float32) * (1 - ramp) + np.array([150, 160, 172], np.float32) * ramp
        image = np.broadcast_to(wall, (H, W, 3)).copy()
        floor_y = round(0.78 * H)
        image[floor_y:] = (80, 100, 125)
        image[floor_y:floor_y + max(2, H // 120)] = (60, 70, 85)  # skirting board
        dx0, dx1, dy0 = round(0.06 * W), round(0.22 * W), round(0.14 * H)
        image[dy0:floor_y, dx0:dx1] = (90, 110, 135)  # door
        image[dy0:floor_y, dx0:dx0 + 4] = image[dy0:dy0 + 4, dx0:dx1] = (60, 70, 85)
        image[dy0:floor_y, dx1 - 4:dx1] = (60, 70, 85)
        wx0, wx1, wy0, wy1 = round(0.82 * W), round(0.96 * W), round(0.10 * H), round(0.42 * H)
        image[wy0:wy1, wx0:wx1] = (235, 215, 190)  # window (sky)
        image[wy0:wy1, (wx0 + wx1) // 2 - 2:(wx0 + wx1) // 2 + 2] = (200, 200, 200)
        image[(wy0 + wy1) // 2 - 2:(wy0 + wy1) // 2 + 2, wx0:wx1] = (200, 200, 200)
        texture = cv2.GaussianBlur(rng.standard_normal((H, W), dtype=np.float32) * 6.0, (0, 0), 2.0)
        image += texture[:, :, None]
        return np.clip(image + 0.5, 0, 255).astype(np.uint8)

    # -- ground truth ----------------------------------------------------------------------------

    def _ground_truth(self, placed: list[tuple[_Actor, int, int]]) -> list[GroundTruth]:
        W, H = self.width, self.height
        result = []
        for i, (actor, x, y) in enumerate(placed):
            s = actor.size
            mask = self._sprite(actor.chip, s)[1] > 0.5
            total = int(mask.sum())
            shown = np.zeros((s, s), bool)
            x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + s, W), min(y + s, H)
            shown[y0 - y:y1 - y, x0 - x:x1 - x] = mask[y0 - y:y1 - y, x0 - x:x1 - x]
            if actor.z < PILLAR_Z:
                px0, px1 = self.pillar
                shown[:, max(px0 - x, 0):max(px1 - x, 0)] = False
            for nearer, nx, ny in placed[i + 1:]:  # sorted by z: later ones are nearer
                if nearer.z <= actor.z:
                    continue
                other = self._sprite(nearer.chip, nearer.size)[1] > 0.5
                ox0, oy0 = max(nx - x, 0), max(ny - y, 0)
                ox1, oy1 = min(nx + nearer.size - x, s), min(ny + nearer.size - y, s)
                if ox0 < ox1 and oy0 < oy1:
                    shown[oy0:oy1, ox0:ox1] &= ~other[oy0 + y - ny:oy1 + y - ny, ox0 + x - nx:ox1 + x - nx]
            visible = int(shown.sum()) / total
            if visible > 0:
                result.append(GroundTruth(actor.track_id, actor.identity,
                                          Box(float(x0), float(y0), float(x1 - x0), float(y1 - y0)), visible))
        return result


class SyntheticSource(SourceBase):
    """The synthetic scene as a Source: frame `seq` is scene frame `seq`.

    frames: length of the run (None: endless). realtime: release frames at `fps` like a camera
    (the demo; the capture queue then drops the oldest when the consumer is slow) or as fast as they
    are rendered (tests and benchmarks; the queue then waits, so every frame is processed).
    `ground_truth(seq)` gives the faces in frame `seq`; faces_dir: see `scene_chips`.
    """

    def __init__(self, width: int = 640, height: int = 480, fps: float = 10.0, seed: int = 0, *,
                 frames: int | None = None, realtime: bool = True, noise_sigma: float = 2.0,
                 faces_dir: Path | None = None) -> None:
        super().__init__()
        self.scene = SyntheticScene(width, height, fps, seed, noise_sigma, faces_dir)
        self.frames = frames
        self.live = False  # it never fails, so there is nothing to reopen
        self.pace_fps = self.scene.fps if realtime else None
        self.description = f"synthetic scene {width}x{height} @ {self.scene.fps:g} fps (seed {seed})"

    def read(self) -> Frame | None:
        if self.frames is not None and self._seq >= self.frames:
            return None
        image, _ = self.scene.render(self._seq)
        return self._frame(image, media_s=self._seq / self.scene.fps)

    def ground_truth(self, seq: int) -> list[GroundTruth]:
        return self.scene.ground_truth(seq)
