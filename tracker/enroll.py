"""`tracker enroll NAME IMAGE_OR_FOLDER...`: store a person's mean face embedding.

Each image must show exactly one face: an image with none or several, or a file that is not an
image, is reported on one line and skipped; a line every PROGRESS_EVERY images says how far it is.
With `--aligned` each image is taken to be a tight face chip (the whole image is the face, as in
the synthetic scene's chips): a detector with landmarks runs on the chip with a replicated border
around it (a tight chip has too little context for it) and its largest face is taken; with Haar (no
landmarks; it misses or doubles faces on tight chips) the whole chip is the box. The faces go
through the same detector, crop (`tracker.crops`) and backend as the guard, and
`tracker.identity.save_person` stores the mean embedding in `<state_dir>/people/NAME.npz` with the
crop definition, the weights' sha256 and the crops themselves. Enrolling a name again adds the new
faces to those kept (as the web page's uploads do; past MAX_KEPT the earliest make room, and it
says how many); `--replace` starts the person afresh from the new ones. `tracker enroll --refresh`
(and the guard at start) recomputes the people enrolled with other weights from those kept crops.
"""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np

from tracker.backends import create_backend, run_options
from tracker.backends.mirror import embedder
from tracker.config import Config, load_config
from tracker.crops import CROP_MARGIN, crop_batch, crop_definition
from tracker.detect import FaceDetector, create_detector
from tracker.errors import EXIT_UNEXPECTED, InputError
from tracker.identity import (
    Refreshed,
    check_new_name,
    chosen_embedding,
    embeddings_key,
    kept_crops,
    people_files,
    people_lock,
    refresh_people,
    save_person,
    validate_name,
)
from tracker.images import IMAGE_SUFFIXES, read_image, unreadable_reason
from tracker.preflight import embedding_width, prepare_state_dir
from tracker.types import Box, Detection

# --aligned chips are padded by this fraction of their side on every side before detection.
CHIP_PAD = 0.4
PAD_MAX_WIDTHS = 4  # a photo to pad is first shrunk to at most this many detector widths (see _detect_padded)
MAX_KEPT = 64  # faces a person's enrolment is made from and keeps, the latest (7.7 kB each)
# Images between two progress lines of `tracker enroll`: ~13 phone photos a second on a 2-core x86,
# a few on a Pi 3, where a folder of 150 was minutes without a word.
PROGRESS_EVERY = 20


class AlreadyKept(InputError):
    """Every face found to add to a person is one kept for them already (the same crop)."""


class Enrolment(NamedTuple):
    """What `enroll` did: the person's file written, the images whose face it used, the images
    it skipped, and how many of the faces kept for the person before it dropped (the earliest) to
    keep at most MAX_KEPT."""

    path: Path
    used: int
    skipped: int
    dropped: int


def image_files(inputs: list[Path], what: str = "enroll") -> list[Path]:
    """Files named directly, and the image files (by suffix, sorted; a folder named like one is not) of folders named;
    InputError, its message starting with `what` (the command), for what is neither or cannot be read."""
    files: list[Path] = []
    for path in inputs:
        if path.is_dir():
            try:
                files.extend(sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir()))
            except OSError as err:
                raise InputError(f"{what}: folder {str(path)!r}: cannot read it ({err.strerror or err}); expected a "
                                 "folder of images this user can read") from None
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise InputError(f"{what}: {str(path)!r} is neither a file nor a folder; expected an image file or a "
                             "folder of images")
        else:
            raise InputError(f"{what}: {str(path)!r} does not exist; expected an image file or a folder of images")
    return files


def required_image_files(inputs: list[Path], what: str) -> list[Path]:
    """`image_files(inputs, what)`, and InputError when that finds none (a folder of HEIC photos
    only): the command has nothing to read, which is the user's to hear rather than "no usable face
    in 0 image(s)"."""
    files = image_files(inputs, what)
    if not files:
        raise InputError(f"{what}: no image files in {', '.join(map(str, inputs))}; "
                         f"expected images ({', '.join(IMAGE_SUFFIXES)}) or folders holding them")
    return files


def _detect_padded(image: np.ndarray, detector: FaceDetector) -> list[Detection]:
    """The detector's faces on `image` padded by CHIP_PAD of its side (edge-replicated: a photo
    cropped close around a face has too little context for a CNN detector), in `image` pixels.
    A photo wider than PAD_MAX_WIDTHS detector widths is shrunk to that first (the detector
    searches at its own width anyway): the padded copy of a 24-megapixel photo would be 230 MB."""
    h, w = image.shape[:2]
    k = min(1.0, PAD_MAX_WIDTHS * detector.detect_width / w)  # image pixels -> searched pixels
    if k < 1.0:
        image = cv2.resize(image, (max(1, round(w * k)), max(1, round(h * k))), interpolation=cv2.INTER_AREA)
        k = image.shape[1] / w
    px, py = round(image.shape[1] * CHIP_PAD), round(image.shape[0] * CHIP_PAD)
    padded = cv2.copyMakeBorder(image, py, py, px, px, cv2.BORDER_REPLICATE)
    return [Detection(Box((d.box.x - px) / k, (d.box.y - py) / k, d.box.w / k, d.box.h / k), d.score,
                      None if d.landmarks is None else tuple(((x - px) / k, (y - py) / k) for x, y in d.landmarks))
            for d in detector.detect(padded)]


def chip_face(chip: np.ndarray, detector: FaceDetector) -> Detection | None:
    """The face of a tight face chip (BGR uint8): with a landmark detector, its largest detection
    on the chip padded by CHIP_PAD (edge-replicated), in chip pixels, or None when it finds none;
    otherwise the whole chip as the box."""
    h, w = chip.shape[:2]
    if not detector.gives_landmarks:
        return Detection(Box(0.0, 0.0, float(w), float(h)))
    faces = _detect_padded(chip, detector)
    return max(faces, key=lambda d: d.box.w * d.box.h) if faces else None


def central_face(photo: np.ndarray, detector: FaceDetector) -> Detection | None:
    """The face of a photo centred on one person (a data set's portrait, e.g. LFW's or CelebA's):
    the detection (on the photo padded as for chips) whose box centre is nearest the photo's
    centre, if that centre lies in the middle half of the photo; otherwise None."""
    h, w = photo.shape[:2]
    faces = _detect_padded(photo, detector) if detector.gives_landmarks else detector.detect(photo)

    def offset(d: Detection) -> float:
        return max(abs(d.box.x + d.box.w / 2 - w / 2) / w, abs(d.box.y + d.box.h / 2 - h / 2) / h)

    best = min(faces, key=offset, default=None)
    return best if best is not None and offset(best) <= 0.25 else None


def enroll(name: str, inputs: list[Path], config: Config, *, aligned: bool = False, add: bool = False, report=print,
           backend=None, detector: FaceDetector | None = None, alive=lambda: None,
           progress=lambda done, total: None) -> Enrolment:
    """Enroll `name` from the images in `inputs` (tight face chips if `aligned`); returns what it
    did (`Enrolment`). Raises InputError when no image gave one face.
    At most the last MAX_KEPT faces are used (and kept for a later refresh); the images beyond
    are reported and counted as skipped.
    `add`: keep the faces `name` was enrolled from (the latest MAX_KEPT in all: the earliest kept
    make room for these, reported and counted as dropped) and add these, rather than replace them
    (the web page's uploads and its "this was alice" on an event's snapshot);
    a face kept already (the same crop: the same photo or snapshot again) is reported and skipped,
    and AlreadyKept is raised when that leaves none. A face given twice in one call is used once.
    The photos are read first; the name's check, the faces kept, the embedding and the write are
    then done under `identity.people_lock`, so that a change made meanwhile is kept.
    `backend`, `detector`: open ones to use (default: made from `config` for this call).
    `alive`: called before each image (the guard's thread passes its watchdog ping: an upload of
    large photos holds its loop for tens of seconds on a Pi 3, past the unit's WatchdogSec).
    `progress(done, total)`: called before each image with the images read before it and the
    number of images (tracker enroll's progress lines)."""
    validate_name(name)
    state_dir = config.resolved_state_dir()
    check_new_name(state_dir, name)
    files = required_image_files(inputs, "enroll")
    detector = detector or create_detector(config.detect, quiet=True)
    crop = crop_definition(detector.gives_landmarks)
    found: deque[tuple[Path, np.ndarray]] = deque(maxlen=MAX_KEPT)  # memory for MAX_KEPT faces, however many images
    faces_found = repeated = 0
    for done, path in enumerate(files):
        alive()
        progress(done, len(files))
        image = read_image(path, reduced=True)  # a phone photo decoded at a fraction of its size
        if image is None:
            report(f"enroll: {path}: not a readable image ({unreadable_reason(path)}); skipped")
            continue
        if aligned:
            face = chip_face(image, detector)
            if face is None:
                report(f"enroll: {path}: no face found on the chip; skipped")
                continue
        else:
            faces = detector.detect(image)
            if len(faces) != 1:
                report(f"enroll: {path}: {len(faces)} faces found; expected exactly one; skipped")
                continue
            face = faces[0]
        new = crop_batch(image, [face], margin=0.0 if aligned else CROP_MARGIN)
        if any((new == earlier).all() for _, earlier in found):
            report(f"enroll: {path}: this face is given twice; skipped")
            repeated += 1
            continue
        found.append((path, new))
        faces_found += 1
    own_backend = backend is None
    if own_backend and found:
        backend = open_backend(config)
    try:
        with people_lock(state_dir):  # from the name's check to the write (identity.people_lock)
            check_new_name(state_dir, name)  # again: an enrolment may have taken it, in another case, meanwhile
            kept = kept_crops(state_dir, name, crop) if add else None
            crops = []
            for path, new in found:
                if kept is not None and (kept == new).all(axis=(1, 2, 3)).any():
                    report(f"enroll: {path}: this face is kept for {name!r} already; skipped")
                    repeated += 1
                else:
                    crops.append(new)
            if not crops and repeated:
                raise AlreadyKept(f"enroll: every face found is kept for {name!r} already; nothing added")
            if not crops:
                raise InputError(f"enroll: no usable face for {name!r} in {len(files)} image(s); "
                                 "expected images showing exactly one face each")
            batch = np.ascontiguousarray(np.concatenate(([kept] if kept is not None else []) + crops)[-MAX_KEPT:])
            embeddings = backend.infer(batch).embedding
            path = save_person(state_dir, name, embeddings, embeddings_key(config), crop, batch)
    finally:
        if own_backend and found:
            backend.close()
    used = len(crops)
    kept_before = 0 if kept is None else len(kept)
    dropped = max(0, kept_before + used - MAX_KEPT)  # (used <= MAX_KEPT: only faces kept before are dropped)
    if faces_found > MAX_KEPT:
        report(f"enroll: {faces_found} images show a face; the last {MAX_KEPT} are used (at most {MAX_KEPT} a person)")
    if dropped:
        report(f"enroll: {name!r} keeps at most {MAX_KEPT} faces: the {dropped} earliest of the {kept_before} kept "
               "before are dropped to make room for these")
    return Enrolment(path, used, len(files) - used, dropped)


def open_backend(config: Config, name: str | None = None, precision: str | None = None):
    """The config's backend (or backend `name`, at `precision`) for its model files, embedding
    faces as the config or the weights' card says (tracker.identity.chosen_embedding); the caller
    closes it."""
    model = config.model.spec()
    name = name or config.backend.name
    backend = create_backend(name, model, precision=precision or config.backend.precision,
                             threads=config.backend.threads, **run_options(name, config.resolved_state_dir()))
    try:  # created first: it refuses missing or mismatched weights with one line, before they are hashed
        return embedder(backend, chosen_embedding(config))
    except BaseException:
        backend.close()
        raise


def refresh(config: Config, detector: FaceDetector, backend, report=print) -> Refreshed:
    """Recompute every person enrolled with other weights, or whose mean is not one of this net,
    from their kept crops (`tracker.identity.refresh_people`); reports what it did, who must be
    enrolled again and who could not be written."""
    done = refresh_people(config.resolved_state_dir(), backend, embeddings_key(config),
                          crop_definition(detector.gives_landmarks), embedding_width(config))
    if done.recomputed:
        report(f"enroll: recomputed {len(done.recomputed)} person(s) for the weights {config.model.weights.name} and "
               f"{chosen_embedding(config)} embeddings: {', '.join(done.recomputed)}")
    for name, why in done.stale:
        report(f"enroll: cannot recompute {name}: {why}; enroll {name} afresh from photos (tracker enroll --replace "
               f"{name} PHOTOS)")
    if done.unwritten:
        report(f"enroll: could not write {', '.join(done.unwritten)} (said above); they stay enrolled with the old "
               "weights, which the guard skips")
    return done


def _progress_line(done: int, total: int) -> None:
    """tracker enroll's line on stderr every PROGRESS_EVERY images read."""
    if done and done % PROGRESS_EVERY == 0:
        print(f"enroll: {done} of {total} images read", file=sys.stderr, flush=True)


def _intermixed_arguments(parser, argv: list[str]):
    """`parser.parse_intermixed_args(argv)`, with every word after a first "--" taken as NAME or an
    image, as "--" means: parse_intermixed_args (Python 3.11) drops the "--" in its pass over the
    options and then refused `enroll -- alice -photo.jpg` as an unknown option '-photo.jpg'."""
    if "--" not in argv:
        return parser.parse_intermixed_args(argv)
    cut = argv.index("--")
    args = parser.parse_intermixed_args(argv[:cut])
    before = [*([args.name] if args.name is not None else []), *map(str, args.images)]
    return parser.parse_args(["--", *before, *argv[cut + 1:]], namespace=args)  # positionals only: the options kept


def enroll_command(argv: list[str]) -> int:
    from tracker.arguments import CONFIG_DEFAULT, ArgumentParser, config_path, path_to

    parser = ArgumentParser(prog="tracker enroll", description="Store a person's face for identification.")
    parser.add_argument("name", nargs="?", help="the person's name (ASCII letters, digits, '_', '.', '-')")
    parser.add_argument("images", nargs="*", type=path_to("an image file or a folder of images"), help="image files or folders of images")
    parser.add_argument("--aligned", action="store_true", help="each image is a tight face chip (the whole image is the face)")
    parser.add_argument("--replace", action="store_true",
                        help="start NAME afresh from these images (default: add them to the faces NAME was enrolled from)")
    parser.add_argument("--refresh", action="store_true",
                        help="recompute everyone enrolled with other weights from their kept crops (no NAME)")
    parser.add_argument("--config", type=config_path, help=f"YAML config ({CONFIG_DEFAULT})")
    args = _intermixed_arguments(parser, argv)  # options after NAME too: `enroll alice --aligned DIR`
    if args.refresh == (args.name is not None):
        raise InputError("tracker enroll: expected NAME IMAGE_OR_FOLDER... or --refresh alone")
    if args.refresh and (args.aligned or args.replace):  # it reads no image: the option would be ignored in silence
        option = "--aligned" if args.aligned else "--replace"
        raise InputError(f"tracker enroll: {option} is not taken with --refresh, which reads no image; expected "
                         "--refresh alone")
    if not args.refresh and not args.images:
        raise InputError(f"tracker enroll: no images for {args.name!r}; expected NAME IMAGE_OR_FOLDER...")
    config = load_config(args.config)
    prepare_state_dir(config.resolved_state_dir())
    if args.refresh:
        backend = open_backend(config)
        try:
            done = refresh(config, create_detector(config.detect, quiet=True), backend)
        finally:
            backend.close()
        if done == Refreshed():
            print("enroll: nothing to recompute: everyone is enrolled with these weights and crops")
        return EXIT_UNEXPECTED if done.unwritten else 0
    enrolled = args.name in {p.stem for p in people_files(config.resolved_state_dir())}
    result = enroll(args.name, args.images, config, aligned=args.aligned, add=not args.replace,
                    report=lambda line: print(line, file=sys.stderr), progress=_progress_line)
    if enrolled and not args.replace:
        before = (f"the {result.dropped} earliest face(s) kept before are dropped (at most {MAX_KEPT} a person), the "
                  "others stay" if result.dropped else "the faces kept before stay")
        print(f"added {result.used} image(s) to {args.name!r} ({result.skipped} skipped; {before}: --replace starts "
              f"afresh) -> {result.path}")
    else:
        print(f"enrolled {args.name!r} from {result.used} image(s) ({result.skipped} skipped) -> {result.path}")
    return 0
