"""`tracker eval-faces`: the face CNN measured the way the guard uses it (detector, crop, backend).

    tracker eval-faces --pairs FILE --images DIR [--json OUT]        verification on LFW-format pairs
    tracker eval-faces --folder DIR [--enroll N] [--chips] [--json OUT]   identification on <person>/<image>

Pairs: each photo's central face (`tracker.enroll.central_face`) is cut by the guard's crop and run
through the configured backend, embedded as the config or the weights' card says (the shipped
weights: with its mirror image, `tracker.backends.mirror`); the pair's score is the cosine of the
two embeddings. Printed: LFW's 10-fold accuracy, ROC AUC, the true-accept rate at 1% and 0.1%
false accepts with those thresholds, and where the identity threshold in use (the model card's, or
identity.threshold) falls.
A pair whose photo gives no central face, or cannot be read, is counted and left out.

Folder: the people (sorted by name) are split in two: every other person is enrolled from their
first N images (the mean embedding, as `tracker enroll`); the rest are strangers. Every further
image of an enrolled person is a probe: rank-1 is the share whose best match is that person, and
"identified" the share that is also at or above the threshold. Every image of a stranger is a probe
that should come out `unknown`: the share that does. With `--chips` each image is a tight face chip
(as `tracker enroll --aligned`). People with fewer than N + 1 images are strangers only. A person
to enrol whose first N images show no face is named on stderr, counted in `people_left_out` and left
out (neither enrolled nor probed), not the run stopped.

A photo that cannot be read (damaged, not an image) counts as one without a face, is named on
stderr (the first NAMED_UNREADABLE) and counted in the report's `photos_unreadable`: one bad file
among thousands does not throw away the minutes spent on the others.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tracker.crops import CROP_MARGIN, CROP_SIZE, face_pixels, network_input
from tracker.detect import FaceDetector
from tracker.enroll import central_face, chip_face, image_files, open_backend
from tracker.errors import InputError
from tracker.files import atomic_write
from tracker.identity import unit_rows
from tracker.images import read_image, unreadable_reason
from tracker.verification import read_pairs, roc_auc, ten_fold_accuracy, threshold_at_far

PROGRESS_EVERY = 500  # photos between two progress lines
NAMED_UNREADABLE = 10  # unreadable photos named on stderr; the rest are only counted
PHOTOS_AT_ONCE = 512  # photos cut before they are embedded: 4 MB of pixels (see embed_photos)


class Progress:
    """A line on stderr every PROGRESS_EVERY photos of `total` cut, and one for each of the first
    NAMED_UNREADABLE photos that cannot be read (plain lines: a log file or a terminal alike);
    `unreadable` counts them all. Each line starts with `prefix`, the command the user ran
    (`tracker train` measures its thresholds through pair_scores)."""

    def __init__(self, total: int, prefix: str = "eval-faces") -> None:
        self.total, self.done, self.unreadable, self.prefix = total, 0, 0, prefix

    def photo(self) -> None:
        if self.done and self.done % PROGRESS_EVERY == 0:
            print(f"{self.prefix}: {self.done} of {self.total} photos cut", file=sys.stderr, flush=True)
        self.done += 1

    def cannot_read(self, path: Path) -> None:
        self.unreadable += 1
        if self.unreadable <= NAMED_UNREADABLE:
            more = "; further ones are only counted" if self.unreadable == NAMED_UNREADABLE else ""
            print(f"{self.prefix}: {str(path)!r} is not a readable image ({unreadable_reason(path)}): counted as a photo "
                  f"without a face{more}", file=sys.stderr, flush=True)


def photo_crops(files: list[Path], detector: FaceDetector, chips: bool = False,
                progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(face pixels (M, 88, 88) uint8 of the M files with a face, in file order; found (N,) bool)
    of each file's face: the central face of a photo, or the face of a tight chip with `chips`.
    Pixels, not network inputs: LFW's 7,701 photos of View 2 hold 60 MB so, 240 MB as float32 (and
    twice that while they were joined). A file that cannot be read counts as one without a face
    (`Progress.cannot_read`). `progress` counts the photos (default: these files')."""
    progress = progress or Progress(len(files))
    crops = np.empty((len(files), CROP_SIZE, CROP_SIZE), np.uint8)
    found = np.zeros(len(files), bool)
    for i, path in enumerate(files):
        progress.photo()
        image = read_image(path)
        if image is None:
            progress.cannot_read(path)
            continue
        face = chip_face(image, detector) if chips else central_face(image, detector)
        if face is None:
            continue
        crops[found.sum()] = face_pixels(image, face, margin=0.0 if chips else CROP_MARGIN)  # as tracker enroll
        found[i] = True
    return crops[: found.sum()], found


def embed_crops(crops: np.ndarray, backend, batch: int = 64) -> np.ndarray:
    """Unit embeddings (M, D) float32 of `crops` (photo_crops' M > 0 faces)."""
    parts = [backend.infer(network_input(crops[s:s + batch])).embedding for s in range(0, len(crops), batch)]
    return unit_rows(np.concatenate(parts).astype(np.float32))


def embed_photos(files: list[Path], detector: FaceDetector, backends: list, chips: bool = False,
                 progress: Progress | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """(per backend: unit embeddings (N, D) float32, found (N,) bool) of each file's face
    (photo_crops, embed_crops); rows of files without one are zero, and a backend's array is
    (N, 0) when no file has one. The photos are cut PHOTOS_AT_ONCE at a time and each part is
    embedded by every backend before the next is cut: a run holds the embeddings and one part's
    pixels (the pixels of every photo of 100,000 pairs took 1.5 GB)."""
    progress = progress or Progress(len(files))
    found = np.zeros(len(files), bool)
    embeddings: list[np.ndarray | None] = [None] * len(backends)
    for start in range(0, len(files), PHOTOS_AT_ONCE):
        part = slice(start, start + PHOTOS_AT_ONCE)
        crops, found[part] = photo_crops(files[part], detector, chips, progress)
        if not len(crops):
            continue
        rows = start + np.flatnonzero(found[part])
        for k, backend in enumerate(backends):
            part_embeddings = embed_crops(crops, backend)
            whole = embeddings[k]
            if whole is None:
                whole = embeddings[k] = np.zeros((len(files), part_embeddings.shape[1]), np.float32)
            whole[rows] = part_embeddings
    return [np.zeros((len(files), 0), np.float32) if e is None else e for e in embeddings], found


def pair_scores(pairs_file: Path, images: Path, detector: FaceDetector, backends: list,
                progress: Progress | None = None) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """For each of `backends`, (scores, same, pairs left out) of an LFW-format pairs file (see the
    module docstring); the photos are read, detected and cut once for all of them, counted by
    `progress` (default: a new one; its total is set to the pairs' photos)."""
    pairs = read_pairs(pairs_file, images)
    files = sorted({p for a, b, _ in pairs for p in (a, b)})
    index = {p: i for i, p in enumerate(files)}
    progress = progress or Progress(0)
    progress.total = len(files)
    every_embedding, found = embed_photos(files, detector, backends, progress=progress)
    both = [(index[a], index[b], s) for a, b, s in pairs if found[index[a]] and found[index[b]]]
    same = np.array([s for _, _, s in both], bool)
    results = []
    for embeddings in every_embedding:
        scores = np.array([float(embeddings[i] @ embeddings[j]) for i, j, _ in both])
        results.append((scores, same, len(pairs) - len(both)))
    return results


def verification_report(scores: np.ndarray, same: np.ndarray, threshold: float) -> dict:
    """The figures of the module docstring for pair scores."""
    accuracy, std = ten_fold_accuracy(scores, same)
    t1, tar1 = threshold_at_far(scores, same, 0.01)
    t01, tar01 = threshold_at_far(scores, same, 0.001)
    accepted = scores >= threshold
    return {"pairs": int(len(scores)), "accuracy_10fold": accuracy, "accuracy_std": std, "roc_auc": roc_auc(scores, same),
            "tar_at_far_1pct": tar1, "threshold_far_1pct": t1, "tar_at_far_0.1pct": tar01, "threshold_far_0.1pct": t01,
            "threshold": threshold, "tar_at_threshold": float(accepted[same].mean()),
            "far_at_threshold": float(accepted[~same].mean())}


def _people(folder: Path) -> dict[str, list[Path]]:
    """Person name -> their image files (by suffix; a folder named like one is not), of each
    <person>/ folder of `folder`; InputError for a folder that cannot be read or fewer than two."""
    try:
        persons = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError as err:
        raise InputError(f"eval-faces: --folder {str(folder)!r}: cannot read it ({err.strerror or err}); expected "
                         "a folder this user can read") from None
    people = {p.name: image_files([p], "eval-faces") for p in persons}
    people = {name: files for name, files in people.items() if files}
    if len(people) < 2:
        raise InputError(f"eval-faces: --folder {str(folder)!r} has {len(people)} person folder(s) with images; "
                         "expected at least two <person>/<image> folders")
    return people


def identification_report(folder: Path, enroll: int, detector: FaceDetector, backend, threshold: float,
                          chips: bool = False, progress: Progress | None = None) -> dict:
    """The folder figures of the module docstring, the photos counted by `progress` (default: a
    new one; its total is set to the folder's photos)."""
    people = _people(folder)
    names = sorted(people)
    gallery_names = [n for i, n in enumerate(names) if i % 2 == 0 and len(people[n]) > enroll]
    if not gallery_names:
        raise InputError(f"eval-faces: no person in {str(folder)!r} has more than --enroll {enroll} images; "
                         "expected some with enough to enrol and to test")
    means: list[np.ndarray] = []  # of the people in `enrolled_names`, in its order
    enrolled_names: list[str] = []
    left_out = 0
    probes: list[tuple[np.ndarray, str | None]] = []  # (embedding, true name or None for a stranger)
    progress = progress or Progress(0)
    progress.total = sum(len(files) for files in people.values())  # over the folder, not a person
    for name in names:
        [embeddings], found = embed_photos(people[name], detector, [backend], chips, progress)
        if name in gallery_names:
            enrolled = embeddings[:enroll][found[:enroll]]
            if not len(enrolled):  # left out, not the run stopped: the others' minutes of work are kept
                left_out += 1
                print(f"eval-faces: no face found in the first {enroll} images of {name!r}: left out (neither "
                      "enrolled nor probed)", file=sys.stderr, flush=True)
                continue
            enrolled_names.append(name)
            means.append(unit_rows(enrolled.mean(axis=0, keepdims=True))[0])
            probes += [(e, name) for e, f in zip(embeddings[enroll:], found[enroll:]) if f]
        else:
            probes += [(e, None) for e, f in zip(embeddings, found) if f]
    if not means:
        raise InputError(f"eval-faces: no face found in the first {enroll} images of any person to enrol in "
                         f"{str(folder)!r}; expected enrolment images with one face each")
    if not probes:
        raise InputError(f"eval-faces: no face found in any image to test in {str(folder)!r}; expected photos "
                         "with one face each beyond the enrolled ones, or of people not enrolled")
    sims = np.stack([e for e, _ in probes]) @ np.stack(means).T
    best = sims.argmax(axis=1)
    known = [(enrolled_names[j], sims[i, j], truth) for i, (j, (_, truth)) in enumerate(zip(best, probes))]
    members = [(n, s, t) for n, s, t in known if t is not None]
    strangers = [(n, s, t) for n, s, t in known if t is None]
    return {"people_enrolled": len(enrolled_names), "people_left_out": left_out, "images_enrolled_each": enroll,
            "probes_enrolled": len(members), "probes_strangers": len(strangers), "threshold": threshold,
            "rank1": float(np.mean([n == t for n, _, t in members])) if members else None,
            "identified": float(np.mean([n == t and s >= threshold for n, s, t in members])) if members else None,
            "strangers_unknown": float(np.mean([s < threshold for _, s, _ in strangers])) if strangers else None}


def _print_table(report: dict) -> None:
    width = max(len(k) for k in report)
    for key, value in report.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"  {key:<{width}}  {shown}")


def eval_faces_command(argv: list[str]) -> int:
    from tracker.arguments import (
        CONFIG_DEFAULT,
        ArgumentParser,
        config_path,
        file_to_write,
        path_to,
        positive_int,
        refuse_overwriting,
        words,
    )
    from tracker.config import load_config
    from tracker.detect import create_detector
    from tracker.identity import chosen_embedding, identity_threshold

    p = ArgumentParser(prog="tracker eval-faces", description="Measure the face CNN on face pairs or a folder of people.")
    p.add_argument("--pairs", type=path_to("an LFW-format pairs file"), help="LFW-format pairs file (with --images)")
    p.add_argument("--images", type=path_to("the pairs file's image folder"), help="folder of <name>/<name>_NNNN.jpg for --pairs")
    p.add_argument("--folder", type=path_to("a folder of <person>/<image>"), help="folder of <person>/<image> for identification")
    p.add_argument("--enroll", type=positive_int, help="--folder: images enrolled per person (default 5)")
    p.add_argument("--chips", action="store_true", help="--folder: each image is a tight face chip")
    p.add_argument("--json", type=file_to_write("a JSON file to write"),  # checked now: the work takes minutes
                   help="write the figures to this JSON file")
    p.add_argument("--config", type=config_path, help=f"YAML config: detector, model, backend ({CONFIG_DEFAULT})")
    p.add_argument("--backend", type=words("a backend name"), help="backend name (default: the config's)")
    p.add_argument("--precision", choices=("fp32", "int8"), help="model precision (default: the config's)")
    args = p.parse_args(argv)
    if (args.pairs is None) == (args.folder is None):
        raise InputError("eval-faces: give either --pairs FILE --images DIR or --folder DIR")
    if args.pairs is not None and args.images is None:
        raise InputError("eval-faces: --pairs needs --images DIR (the folder of <name>/<name>_NNNN.jpg)")
    if args.pairs is not None and (args.chips or args.enroll is not None):
        raise InputError("eval-faces: --chips and --enroll apply to --folder only")
    if args.folder is not None and args.images is not None:
        raise InputError("eval-faces: --images applies to --pairs only; --folder names the images itself")
    if args.folder is not None and not args.folder.is_dir():
        raise InputError(f"eval-faces: --folder {str(args.folder)!r} is not a folder; expected <person>/<image> folders")
    if args.json is not None:  # `--json pairs.txt` replaced the pairs file with the figures
        refuse_overwriting(args.json, {"pairs": args.pairs, "config": args.config})
        for option, photos in (("--images", args.images), ("--folder", args.folder)):
            if photos is not None and args.json.resolve().is_relative_to(photos.resolve()):  # it could be a photo
                raise InputError(f"eval-faces: --json {str(args.json)!r} is inside {option} {str(photos)!r}; expected a "
                                 "path outside the photos it reads")
    config = load_config(args.config)
    precision = args.precision or config.backend.precision
    if args.backend or args.precision:  # refused under the option's name, as the guard's (tracker.cli.effective_config)
        from tracker.backends import check_request

        check_request(args.backend or config.backend.name, precision, name_from="--backend",
                      precision_from="--precision" if args.precision else "--backend")
    detector = create_detector(config.detect)
    backend = open_backend(config, args.backend, precision)  # first: it refuses missing weights in one line
    progress = Progress(0)
    try:
        threshold = identity_threshold(config)
        if args.pairs is not None:
            [(scores, same, skipped)] = pair_scores(args.pairs, args.images, detector, [backend], progress)
            if len(scores) == 0 or same.all() or not same.any():
                raise InputError(f"eval-faces: {len(scores)} pairs with a face in both photos ({skipped} left out); "
                                 "expected matched and mismatched pairs with faces")
            report = {"pairs_file": str(args.pairs), "pairs_left_out": skipped, **verification_report(scores, same, threshold)}
        else:
            report = {"folder": str(args.folder), **identification_report(args.folder, args.enroll or 5, detector,
                                                                           backend, threshold, args.chips, progress)}
    finally:
        backend.close()
    report = {"backend": backend.name, "precision": precision, "embedding": chosen_embedding(config),
              "detector": detector.name, **report, "photos_unreadable": progress.unreadable}
    print(f"eval-faces ({config.model.weights.name}):")
    _print_table(report)
    if args.json is not None:
        try:
            atomic_write(args.json, (json.dumps(report, indent=1) + "\n").encode())  # a failure keeps the old report
        except OSError as err:  # the figures are on the terminal above: nothing is lost
            raise InputError(f"eval-faces: cannot write --json {str(args.json)!r} ({err.strerror or err}); "
                             "expected a writable file") from None
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
