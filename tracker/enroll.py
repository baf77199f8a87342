"""`tracker enroll NAME IMAGE_OR_FOLDER...`: store a person's mean face embedding.

Each image must show exactly one face: an image with none or several, or a file that is not an
image, is reported on one line and skipped. With `--aligned` each image is taken to be an aligned
face chip (the whole image is the face, as in the synthetic scene's chips), and no detector runs:
Haar needs some context around a face and misses or doubles faces on tight chips. The faces go through the same detector, crop and
backend as the guard, and `tracker.identity.save_person` stores the mean embedding in
`<state_dir>/people/NAME.npz`. Enrolling a name again replaces it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

from tracker.backends import create_backend
from tracker.backends.base import ModelSpec
from tracker.config import Config, load_config
from tracker.crops import CROP_MARGIN, crop_batch
from tracker.detect import HaarDetector
from tracker.errors import InputError
from tracker.identity import file_sha256, save_person, validate_name
from tracker.types import Box

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def image_files(inputs: list[Path]) -> list[Path]:
    """Files named directly, and the image files (by suffix, sorted) of folders named."""
    files: list[Path] = []
    for path in inputs:
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES))
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"enroll: {str(path)!r} does not exist; expected an image file or a folder of images")
    return files


def enroll(name: str, inputs: list[Path], config: Config, *, aligned: bool = False, report=print,
           backend=None) -> tuple[Path, int, int]:
    """Enroll `name` from the images in `inputs` (whole images as faces if `aligned`); returns
    (file written, images used, images skipped). Raises InputError when no image gave one face.
    `backend`: an open backend to use (default: one made from `config` for this call)."""
    validate_name(name)
    files = image_files(inputs)
    detector = None if aligned else HaarDetector.from_config(config.detect)
    crops = []
    for path in files:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            report(f"enroll: {path}: not a readable image; skipped")
            continue
        if detector is None:
            box = Box(0.0, 0.0, float(image.shape[1]), float(image.shape[0]))
        else:
            faces = detector.detect(image)
            if len(faces) != 1:
                report(f"enroll: {path}: {len(faces)} faces found; expected exactly one; skipped")
                continue
            box = faces[0].box
        crops.append(crop_batch(image, [box], margin=0.0 if aligned else CROP_MARGIN))
    if not crops:
        raise InputError(f"enroll: no usable face for {name!r} in {len(files)} image(s); "
                         "expected images showing exactly one face each")
    model = ModelSpec(config.model.prototxt, config.model.weights, config.model.probs, config.model.embedding)
    own_backend = backend is None
    if own_backend:
        backend = create_backend(config.backend.name, model, precision=config.backend.precision,
                                 threads=config.backend.threads)
    try:
        embeddings = backend.infer(np.ascontiguousarray(np.concatenate(crops))).embedding
    finally:
        if own_backend:
            backend.close()
    path = save_person(config.resolved_state_dir(), name, embeddings, file_sha256(config.model.weights))
    return path, len(crops), len(files) - len(crops)


def enroll_command(argv: list[str]) -> int:
    from tracker.cli import _Parser

    parser = _Parser(prog="tracker enroll", description="Store a person's face for identification.")
    parser.add_argument("name", help="the person's name (letters, digits, '_', '.', '-')")
    parser.add_argument("images", nargs="+", type=Path, help="image files or folders of images")
    parser.add_argument("--aligned", action="store_true", help="each image is an aligned face chip (no detection)")
    parser.add_argument("--config", type=Path, help="YAML config (default: config/tracker.yaml)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    path, used, skipped = enroll(args.name, args.images, config, aligned=args.aligned,
                                 report=lambda line: print(line, file=sys.stderr))
    print(f"enrolled {args.name!r} from {used} image(s) ({skipped} skipped) -> {path}")
    return 0
