"""`tracker identify IMAGE_OR_FOLDER... [--aligned] [--json] [--config F]`: who each face is.

Every face of every image (files named, and the image files of folders named, as `tracker enroll`
takes them) goes through the guard's detector, crop (`tracker.crops`) and backend, and is matched
against the people enrolled for these weights and this crop definition by `Gallery.match`, the
guard's own rule: the decision is the enrolled person of highest cosine similarity, or `unknown`
below the identity threshold (`tracker.identity.identity_threshold`). With `--aligned` each image
is a tight face chip, whose face is found as `tracker enroll --aligned` finds it.

Text output, one line per face on stdout, faces numbered left to right (boxes in image pixels):

    photo.jpg face 1 of 2 at 120,80 64x64: alice (similarity 0.83); nearest: alice 0.83, bob 0.41, carol 0.12
    wall.jpg: no face found

`--json`: one JSON document on stdout instead, written face by face as they are found (memory for
one image's records, not the whole run's), a list with, per face,
    {"image": path as given, "face": number from 1, "box": {"x", "y", "w", "h"} (int pixels),
     "identity": name or "unknown", "similarity": the best cosine similarity (null with nobody
     enrolled), "nearest": [{"name", "similarity"}, ...] the (at most) three most similar enrolled
     people, most similar first}
and, per image without a face, {"image": path as given, "faces": 0}. The list is closed when every
image has been read, unreadable ones included (exit 2 then follows a whole document); a run that
fails part-way leaves it open, so that it cannot be taken for a whole answer.

With nobody enrolled (for these weights and crop), a note naming the state directory goes to stderr
once and every face is `unknown`. A file that is not a readable image is reported on stderr
(`photo.jpg: not a readable image`) and the others are still identified; the command then ends
with exit 2. A path that does not exist, or no image at all, is exit 2 before anything runs.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np

from tracker.crops import CROP_MARGIN, crop_batch, crop_definition
from tracker.detect import FaceDetector
from tracker.enroll import chip_face, open_backend, required_image_files
from tracker.errors import InputError
from tracker.identity import UNKNOWN, Gallery
from tracker.images import read_photo, unreadable_reason
from tracker.types import Detection

NEAREST = 3  # enrolled people listed per face


def _faces(image: np.ndarray, detector: FaceDetector, aligned: bool) -> list[Detection]:
    """The faces of `image`, left to right (top to bottom among equal x)."""
    if aligned:
        face = chip_face(image, detector)
        return [] if face is None else [face]
    return sorted(detector.detect(image), key=lambda d: (d.box.x, d.box.y))


def identify_faces(embeddings: np.ndarray, gallery: Gallery) -> list[tuple[str, float | None, list[tuple[str, float]]]]:
    """Per row of `embeddings` (N, D): (decision, its similarity, nearest), the decision and
    similarity being `gallery.match`'s (similarity None with nobody enrolled) and nearest the
    (name, cosine similarity) of the NEAREST most similar enrolled people, most similar first
    (a tie goes to the earlier name in `gallery.names`, as in `match`)."""
    if not gallery.names:
        return [(UNKNOWN, None, []) for _ in embeddings]
    sims = gallery.similarities(embeddings)
    order = np.argsort(-sims, axis=1, kind="stable")[:, :NEAREST]
    return [(name, similarity, [(gallery.names[j], float(sims[i, j])) for j in order[i]])
            for i, (name, similarity) in enumerate(gallery.match(embeddings))]


def _face_record(path: Path, number: int, face: Detection, scale: float, result) -> dict:
    """One face's record; `scale`: the decoded image's pixels -> the photo's (read_photo)."""
    name, similarity, nearest = result
    box = face.box
    return {"image": str(path), "face": number,
            "box": {"x": round(box.x * scale), "y": round(box.y * scale), "w": round(box.w * scale),
                    "h": round(box.h * scale)},
            "identity": name, "similarity": similarity,
            "nearest": [{"name": n, "similarity": s} for n, s in nearest]}


def _text_lines(records: list[dict]) -> list[str]:
    """The text form (module docstring) of the records of one image."""
    if records[0].get("faces") == 0:
        return [f"{records[0]['image']}: no face found"]
    lines = []
    for r in records:
        b = r["box"]
        decision = (f"{r['identity']} (nobody enrolled)" if r["similarity"] is None
                    else f"{r['identity']} (similarity {r['similarity']:.2f})")
        nearest = ", ".join(f"{n['name']} {n['similarity']:.2f}" for n in r["nearest"]) or "none"
        lines.append(f"{r['image']} face {r['face']} of {len(records)} at {b['x']},{b['y']} {b['w']}x{b['h']}: "
                     f"{decision}; nearest: {nearest}")
    return lines


class _JsonList:
    """A JSON list written to `stream` one record at a time, as `json.dumps(records, indent=1)`
    would write the whole list: every face's record (~1.4 kB) was kept until the run's end."""

    def __init__(self, stream) -> None:
        self._stream, self._written = stream, 0
        stream.write("[")

    def add(self, records: list[dict]) -> None:
        for record in records:
            self._stream.write(("," if self._written else "") + "\n" + textwrap.indent(json.dumps(record, indent=1), " "))
            self._written += 1
        self._stream.flush()

    def close(self) -> None:
        self._stream.write("\n]\n" if self._written else "]\n")


def identify_command(argv: list[str]) -> int:
    from tracker.arguments import CONFIG_DEFAULT, ArgumentParser, config_path, path_to
    from tracker.config import load_config
    from tracker.detect import create_detector
    from tracker.identity import chosen_embedding, embeddings_key, identity_threshold
    from tracker.preflight import embedding_width

    p = ArgumentParser(prog="tracker identify", description="Say who each face in the images is, as the guard would.")
    p.add_argument("images", nargs="+", type=path_to("an image file or a folder of images"), help="image files or folders of images")
    p.add_argument("--aligned", action="store_true", help="each image is a tight face chip (as tracker enroll --aligned)")
    p.add_argument("--json", action="store_true", help="print one JSON document (see the module docstring)")
    p.add_argument("--config", type=config_path, help=f"YAML config ({CONFIG_DEFAULT})")
    args = p.parse_args(argv)
    files = required_image_files(args.images, "identify")
    config = load_config(args.config)
    state_dir = config.resolved_state_dir()
    if state_dir.exists() and not state_dir.is_dir():  # it is only read: the guard's writability check is not for it
        raise InputError(f"config: key 'state_dir': {str(state_dir)!r} is not a directory; expected the folder "
                         "the enrolled people are in")
    detector = create_detector(config.detect, quiet=True)
    # The backend first: it refuses missing or mismatched weights with one line, before they are hashed.
    backend = open_backend(config)
    unreadable: list[Path] = []
    try:
        crop = crop_definition(detector.gives_landmarks)
        gallery = Gallery.load(state_dir, embeddings_key(config), identity_threshold(config), crop,
                               embedding_width(config))
        if not gallery.names:
            print(f"identify: nobody is enrolled in {state_dir} for weights {config.model.weights.name}, "
                  f"{chosen_embedding(config)} embeddings and {crop} crops; every face is {UNKNOWN} (enrol people "
                  "with tracker enroll, or recompute them with tracker enroll --refresh)", file=sys.stderr)
        output = _JsonList(sys.stdout) if args.json else None  # opened after what refuses the whole run
        for path in files:
            photo = read_photo(path)  # a large JPEG decoded at a fraction of its size, as tracker enroll does
            if photo is None:
                print(f"{path}: not a readable image ({unreadable_reason(path)})", file=sys.stderr)
                unreadable.append(path)
                continue
            image, scale = photo
            faces = _faces(image, detector, args.aligned)
            if not faces:
                records = [{"image": str(path), "faces": 0}]
            else:
                crops = crop_batch(image, faces, margin=0.0 if args.aligned else CROP_MARGIN)  # as tracker enroll
                results = identify_faces(backend.infer(crops).embedding, gallery)
                records = [_face_record(path, i, f, scale, r) for i, (f, r) in enumerate(zip(faces, results), 1)]
            if output is not None:
                output.add(records)
            else:
                print("\n".join(_text_lines(records)), flush=True)
    finally:
        backend.close()
    if output is not None:
        output.close()
    if unreadable:
        raise InputError(f"identify: {len(unreadable)} of {len(files)} file(s) not readable images "
                         f"(first: {str(unreadable[0])!r}); expected JPEG, PNG or other images OpenCV reads")
    return 0
