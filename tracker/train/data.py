"""Training data: face photographs -> the crops the guard would cut from them, cached on disk.

A data set is either a folder of `<person>/<image>` files or a list file of `image identity` lines
(an optional header line `image identity`; image paths relative to the list's folder), as LFW and
CelebA ship them. Identities are namespaced by the data set's name (`lfw-devtrain:Aaron_Peirsol`,
`celeba-10k:2880`: `namespace`) so that two sets never merge people by accident; two sets of one
name are refused (`tracker train`).

Each photo goes through the guard's own detector (`tracker.detect`, from the config) and crop
(`tracker.crops.face_crop`): the face nearest the photo's centre (`tracker.enroll.central_face`),
aligned on its landmarks when the detector gives them. So the network trains on exactly what it
will see. A photo without such a face is left out and counted.

Crops are cached in `<cache_dir>/crops-<definition key>.npz`: the definition key covers the crop
definition, the detector and its settings and model file; inside, each crop is found by its source
file's key (absolute path, size, modification time). A changed photo or another detector is cut
again; everything else is read back (the first cut of the two shipped sets takes minutes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.crops import CROP_SIZE, crop_definition, face_pixels
from tracker.detect import FaceDetector
from tracker.enroll import central_face, image_files
from tracker.errors import InputError
from tracker.files import NPZ_UNREADABLE, atomic_write, load_npz
from tracker.images import IMAGE_SUFFIXES, read_image


@dataclass(frozen=True)
class Sample:
    """One photo of one person: `identity` is '<data set>:<person>'."""

    path: Path
    identity: str


def namespace(source: Path) -> str:
    """The data set's name its identities start with: a list file's folder's, a folder's own (its
    parent's for one named `images`, as `lfw-devtrain/images`)."""
    source = Path(source).absolute()
    if source.is_dir():
        return source.parent.name if source.name == "images" else source.name
    return source.parent.name


def _folder_samples(root: Path) -> list[Sample]:
    """The photos of each `<person>/` folder of `root`, listed as `tracker enroll` lists a folder
    (`image_files`: by suffix, sorted; a folder named like a photo is none); InputError for a
    folder, `root` or a person's, that cannot be read."""
    name = namespace(root)
    try:
        persons = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError as err:
        raise InputError(f"train: data set {str(root)!r}: cannot read it ({err.strerror or err}); expected a folder "
                         "of <person>/<image> files this user can read") from None
    return [Sample(image, f"{name}:{person.name}") for person in persons for image in image_files([person], "train")]


def _list_samples(list_file: Path) -> list[Sample]:
    samples, name = [], namespace(list_file)
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"train: cannot read identity list {str(list_file)!r} ({err}); "
                         "expected a text file of 'image identity' lines") from None
    for number, line in enumerate(lines, 1):
        parts = line.split()
        if not parts or (number == 1 and parts == ["image", "identity"]):
            continue
        if len(parts) != 2:
            raise InputError(f"train: {list_file}:{number}: {line[:80]!r}; expected 'image identity'")
        samples.append(Sample(list_file.parent / parts[0], f"{name}:{parts[1]}"))
    return samples


def list_samples(source: Path) -> list[Sample]:
    """The photos of one data set (a `<person>/<image>` folder or an `image identity` list file);
    InputError when it does not exist or holds no image."""
    source = Path(source)
    if source.is_dir():
        samples = _folder_samples(source)
    elif source.is_file():
        samples = _list_samples(source)
    else:  # (a FIFO or a device was said not to exist)
        problem = "is not a folder or a regular file" if source.exists() else "does not exist"
        raise InputError(f"train: data set {str(source)!r} {problem}; expected a folder of "
                         "<person>/<image> files or a list file of 'image identity' lines")
    if not samples:
        raise InputError(f"train: data set {str(source)!r} holds no images; expected <person>/<image> "
                         f"files with suffixes {', '.join(IMAGE_SUFFIXES)} or 'image identity' lines")
    return samples


def data_root(source: Path) -> Path:
    """The folder a data set's photos are named relative to in a teacher file: the `<person>/<image>`
    folder itself, or an `image identity` list's folder."""
    source = Path(source)
    return source if source.is_dir() else source.parent


def definition_key(detector: FaceDetector, detect_config) -> str:
    """What makes two crops of one photo the same: crop definition and size, detector, its settings
    and its model file (by name and size: the detectors check the sha256 at load)."""
    settings = detect_config.model_dump(mode="json")
    model = getattr(detector, "model_path", None)
    if model is not None:
        settings["model_file"] = [Path(model).name, Path(model).stat().st_size]
    text = json.dumps({"crop": crop_definition(detector.gives_landmarks), "size": CROP_SIZE,
                       "detector": detector.name, "settings": settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def source_key(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


def cut_crop(path: Path, detector: FaceDetector) -> np.ndarray | None:
    """The guard's crop of the central face of the photo at `path`: (88, 88) uint8, or None when
    the file is not an image or holds no central face."""
    image = read_image(path)
    if image is None:
        return None
    face = central_face(image, detector)
    if face is None:
        return None
    return face_pixels(image, face)


class CropCache:
    """The cache file of one crop definition (see the module docstring). Not thread-safe."""

    def __init__(self, cache_dir: Path, key: str):
        self.path = Path(cache_dir) / f"crops-{key}.npz"
        self._rows: dict[str, np.ndarray | None] = {}
        if self.path.exists():
            try:
                with load_npz(self.path) as data:
                    for k, found, crop in zip(data["keys"], data["found"], data["crops"]):
                        self._rows[str(k)] = crop if found else None
            except NPZ_UNREADABLE:
                self._rows = {}  # unreadable: cut again (and rewrite it)
        self._dirty = False

    def get(self, key: str) -> tuple[bool, np.ndarray | None]:
        """(known, crop or None)."""
        return (key in self._rows), self._rows.get(key)

    def put(self, key: str, crop: np.ndarray | None) -> None:
        self._rows[key] = crop
        self._dirty = True

    def save(self) -> None:
        """Write the cache atomically (a crash leaves the previous file). InputError (exit 2) when
        it cannot be written (a full disk): the previous file stays as it was."""
        if not self._dirty:
            return
        try:
            self._write()
        except OSError as err:
            raise InputError(f"train: cannot write the crop cache {str(self.path)!r} ({err.strerror or err}); the "
                             "previous cache is unchanged (the photos cut since are cut again next time); expected a "
                             "writable --work folder with free space") from None
        self._dirty = False

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._rows), dtype=np.str_)
        found = np.array([c is not None for c in self._rows.values()])
        crops = np.stack([c if c is not None else np.zeros((CROP_SIZE, CROP_SIZE), np.uint8)
                          for c in self._rows.values()]) if self._rows else np.zeros((0, CROP_SIZE, CROP_SIZE), np.uint8)
        atomic_write(self.path, lambda tmp: np.savez(tmp, keys=keys, found=found, crops=crops))


def load_crops(samples: list[Sample], detector: FaceDetector, cache: CropCache, progress=None,
               save_every: int = 2000) -> tuple[np.ndarray, list[Sample], int]:
    """(crops (M, 88, 88) uint8, the M samples they belong to, photos left out) for `samples`,
    cut with `detector` or read from `cache`; `progress(n)` is called per photo. The cache is
    saved every `save_every` new crops and at the end, so an interrupted first cut is not lost."""
    crops, kept, new = [], [], 0
    try:
        for sample in samples:
            try:
                key = source_key(sample.path)
            except OSError:  # listed but missing or unreadable: left out, like a photo without a face
                if progress is not None:
                    progress(1)
                continue
            known, crop = cache.get(key)
            if not known:
                crop = cut_crop(sample.path, detector)
                cache.put(key, crop)
                new += 1
                if new % save_every == 0:
                    cache.save()
            if crop is not None:
                crops.append(crop)
                kept.append(sample)
            if progress is not None:
                progress(1)
    finally:
        cache.save()
    stacked = np.stack(crops) if crops else np.zeros((0, CROP_SIZE, CROP_SIZE), np.uint8)
    return stacked, kept, len(samples) - len(kept)
