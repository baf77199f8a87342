#!/usr/bin/env python3
"""dlib's 128-d face descriptor of every photo of a data set: a teacher file for `tracker train`.

../shared/datasets/lfw-devtrain ships such a file for its photos; this script makes one for any
other data set `tracker train` reads (a `<person>/<image>` folder or an `image identity` list),
the way that file was made (../shared/datasets/README.md): dlib's HOG detector, the face nearest
the photo's centre (a centred box when it finds none, counted in `dlib_face_found`), dlib's 5-point
landmarks, and the ResNet descriptor of the 150 x 150 chip they align:

    scripts/teacher_descriptors.py DATA --out NPZ [--hold-out 0.25] [--seed 0] [--upsample 1] [--jobs 2]

`--hold-out SHARE` leaves SHARE of the data set's people out of the file, drawn with Python's
`random.Random(seed)`, and writes their names to NPZ's name + `.held-out.txt` (written empty
without `--hold-out`, so an earlier run's names never stand beside a new file): `tracker train`
trains only photos that have a teacher descriptor or belong to fc2's classes, so those people
stay unseen unless they become a class (`scripts/heldout_faces.py --teacher NPZ` leaves the
classes and every person of the file out of its evaluation set).

The NPZ holds `paths` (str, relative to the data set's folder, as `tracker train` looks them up),
`descriptor` (float32 (N, 128), not normalised: lengths of 1.3-1.6, as in ../shared's LFW file,
whose descriptors this reproduces to a cosine of 0.998-1.0; `tracker train` builds its targets from
all teacher files together, so their scales must agree) and `dlib_face_found` (bool (N,)).
`--upsample`: the HOG detector's upsampling passes (1 finds faces from about 40 px wide; CelebA's
are 40-50 px).

Training-time only, x86-64 is enough: needs `dlib-bin` and `face_recognition_models` (the `teacher`
extra). The latter's `import` fails without `pkg_resources`, so its model files are found by path.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import random
import sys
from contextlib import nullcontext
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracker.arguments import one_line_errors  # noqa: E402
from tracker.errors import InputError  # noqa: E402
from tracker.files import atomic_write, make_writable_folder  # noqa: E402
from tracker.train.data import data_root, list_samples  # noqa: E402

PREDICTOR = "shape_predictor_5_face_landmarks.dat"
RESNET = "dlib_face_recognition_resnet_model_v1.dat"


def model_file(name: str) -> Path:
    """A model file of the face_recognition_models package, found without importing it."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("teacher: package face_recognition_models is not installed; expected "
                         "pip install '.[teacher]' (training-time only)")
    return Path(list(spec.submodule_search_locations)[0]) / "models" / name


class Teacher:
    """dlib's detector, 5-point landmarks and ResNet descriptor, on RGB uint8 (H, W, 3) photos."""

    def __init__(self, upsample: int):
        try:
            import dlib
        except ImportError:
            raise InputError("teacher: package dlib is not installed; expected pip install '.[teacher]' "
                             "(dlib-bin, training-time only)") from None
        self.dlib = dlib
        self.upsample = upsample
        self.detector = dlib.get_frontal_face_detector()
        self.landmarks = dlib.shape_predictor(str(model_file(PREDICTOR)))
        self.resnet = dlib.face_recognition_model_v1(str(model_file(RESNET)))

    def face_box(self, rgb: np.ndarray):
        """(dlib rectangle, found): the detected face nearest the centre, else the centred square
        of half the shorter side (the face of a photo framed around it, as LFW's and CelebA's are)."""
        h, w = rgb.shape[:2]
        faces = list(self.detector(rgb, self.upsample))
        if faces:
            return min(faces, key=lambda r: (r.center().x - w / 2) ** 2 + (r.center().y - h / 2) ** 2), True
        side = min(h, w) // 2
        left, top = (w - side) // 2, (h - side) // 2
        return self.dlib.rectangle(left, top, left + side, top + side), False

    def describe(self, rgb: np.ndarray) -> tuple[np.ndarray, bool]:
        """(descriptor (128,) float32 as dlib gives it, whether the detector found the face)."""
        box, found = self.face_box(rgb)
        return np.asarray(self.resnet.compute_face_descriptor(rgb, self.landmarks(rgb, box)), np.float32), found


MAX_JOBS = 64
_teacher: Teacher | None = None  # the process's teacher; forked --jobs workers inherit it


def _describe_file(path: Path) -> tuple[np.ndarray, bool] | None:
    """Teacher.describe of one photo file; None when OpenCV cannot read it."""
    assert _teacher is not None, "main() sets the teacher before the first photo"
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        return None
    return _teacher.describe(np.ascontiguousarray(bgr[:, :, ::-1]))


def held_out_people(people: list[str], share: float, seed: int) -> set[str]:
    """`share` of the distinct `people`, drawn with random.Random(seed) from their sorted list."""
    distinct = sorted(set(people))
    return set(random.Random(seed).sample(distinct, int(len(distinct) * share)))


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="a <person>/<image> folder or an 'image identity' list file")
    p.add_argument("--out", type=Path, required=True, help="the teacher file to write (.npz)")
    p.add_argument("--hold-out", type=float, default=0.0, help="share of the people left out (0 to 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--upsample", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="processes (dlib describes on one core each)")
    args = p.parse_args(argv)
    global _teacher
    if not 0.0 <= args.hold_out < 1.0:
        raise InputError(f"teacher: --hold-out {args.hold_out}; expected a share from 0 up to (not including) 1")
    if not 1 <= args.jobs <= MAX_JOBS:  # (a process each: a typo of 1000 would fork a thousand)
        raise InputError(f"teacher: --jobs {args.jobs}; expected 1 to {MAX_JOBS} processes")
    if args.upsample not in (0, 1, 2):
        raise InputError(f"teacher: --upsample {args.upsample}; expected 0, 1 or 2")
    if args.out.is_dir():
        raise InputError(f"teacher: --out {str(args.out)!r} is a folder; expected the path of the .npz to write")
    try:  # now, not after describing every photo (a quarter of an hour on CelebA)
        make_writable_folder(args.out.parent)
    except OSError as err:
        raise InputError(f"teacher: cannot write {str(args.out)!r} ({err.strerror or err}); "
                         "expected a writable file path") from None
    samples = list_samples(args.data)
    root = data_root(args.data)
    held = held_out_people([s.identity for s in samples], args.hold_out, args.seed)
    _teacher = Teacher(args.upsample)
    from tqdm import tqdm

    todo = [s for s in samples if s.identity not in held]
    files = [s.path for s in todo]
    paths, descriptors, found, unreadable = [], [], [], []
    with (multiprocessing.get_context("fork").Pool(args.jobs) if args.jobs > 1 else nullcontext()) as pool:
        results = pool.imap(_describe_file, files, chunksize=8) if pool is not None else map(_describe_file, files)
        for sample, result in zip(todo, tqdm(results, total=len(todo), desc="dlib descriptors", unit="photo")):
            if result is None:
                unreadable.append(str(sample.path))
                continue
            paths.append(sample.path.relative_to(root).as_posix())
            descriptors.append(result[0])
            found.append(result[1])
    if not descriptors:
        raise InputError(f"teacher: no readable photo in {str(args.data)!r}; expected images dlib can describe")

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a path
            np.savez(f, paths=np.array(paths), descriptor=np.stack(descriptors), dlib_face_found=np.array(found))

    try:
        atomic_write(args.out, write)
        names = sorted(i.split(":", 1)[1] for i in held)
        atomic_write(Path(f"{args.out}.held-out.txt"), "".join(f"{n}\n" for n in names).encode())
    except OSError as err:
        raise InputError(f"teacher: cannot write {str(args.out)!r} ({err}); expected a writable file path") from None
    print(f"teacher: {len(paths)} photos described ({sum(found)} faces found by dlib, the others a centred "
          f"box), {len(held)} people held out, {len(unreadable)} unreadable -> {args.out}")
    for path in unreadable:
        print(f"teacher: unreadable, left out: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
