"""Identity: who a face is, from the CNN's embedding, and a vote per track.

Enrolled people live in `<state_dir>/people/<name>.npz`: `mean` (D,) float32, the L2-normalised
mean of the person's L2-normalised embeddings, `count` (images used), `model` (what made them:
`embeddings_key`: the caffemodel's sha256, the embedding in use and its blob), `crop` (the `tracker.crops`
definition their faces were cut with; files from before it was recorded are box crops) and
`chips` ((count, 88, 88) uint8, the crops themselves, so that new weights can recompute the mean:
`refresh_people`; files from before have none). Embeddings of other weights, made another way or
from another crop are not comparable, so such people are skipped with a warning: never mixed; so is
a `mean` that is not a finite vector of the net's embedding width (`mean_fault`: a damaged file, or
one made from another `model.embedding` blob before the key named it), which `refresh_people`
recomputes from its crops.
A crop is the enrolled person of highest cosine similarity, or `unknown` when that similarity is
below the threshold. A track's identity is the vote over its whole life: each crop votes once for
its match (a name or `unknown`), the name with the most votes wins once the track has
`identity.min_faces` faces and the winner leads the runner-up by `identity.margin` of all votes,
and its confidence is its share of all votes.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.crops import CROP_BOX, network_input
from tracker.errors import ConfigError, InputError, TrackerError
from tracker.files import NPZ_UNREADABLE, atomic_write, file_sha256, load_npz

UNKNOWN = "unknown"
UNTRAINED_THRESHOLD = 0.5  # weights that bring no calibrated threshold
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
log = logging.getLogger(__name__)


def validate_name(name: str, what: str = "enroll") -> str:
    """A person's name as a safe file stem: ASCII letters and digits, '_', '.', '-', not 'unknown',
    no '..'. InputError otherwise, its message starting with `what` (where the name came from); it
    says ASCII: "expected letters" refused 'Zoë', whose ë is one."""
    # fullmatch: with match(), the pattern's "$" also matches before a trailing newline ("x\n")
    if not _NAME.fullmatch(name) or ".." in name or name.lower() == UNKNOWN:
        raise InputError(
            f"{what}: bad name {name!r}; expected 1-64 ASCII letters (A-Z, a-z), digits, '_', '.' or '-', "
            f"starting with a letter or digit, without '..', and not {UNKNOWN!r}"
        )
    return name


def _is_name(name: str) -> bool:
    try:
        validate_name(name)
    except InputError:
        return False
    return True


def identity_threshold(config, card: dict | None = None) -> float:
    """The cosine at or above which a face is an enrolled person: `identity.threshold` when the
    config sets it, else the one the weights' card was calibrated with for the embedding in use
    (`chosen_embedding`; tracker.model.card; `card` if the caller has read it already), else
    UNTRAINED_THRESHOLD (weights without a card, e.g. the seeded random ones tests generate).
    ConfigError when `identity.embedding` names an embedding the card holds no thresholds for, or
    `model.embedding` a blob other than the one the card's thresholds are cosines of."""
    from tracker.model.card import card_path, embedding_recipe, thresholds, thresholds_blob

    if config.identity.threshold is not None:
        return float(config.identity.threshold)
    card = card if card is not None else weights_card(config)
    if card is not None and config.model.embedding != thresholds_blob(card):
        raise ConfigError(f"config: key 'model.embedding': {config.model.embedding!r}: the model card "
                          f"{str(card_path(config.model.weights))!r} holds thresholds for {thresholds_blob(card)} "
                          "embeddings only; expected identity.threshold set for this blob's")
    embedding = chosen_embedding(config, card)
    threshold = thresholds(card, embedding).get("identity_threshold")
    if threshold is not None:
        return float(threshold)
    if card is not None and embedding != embedding_recipe(card):
        calibrated = [embedding_recipe(card), *card.get("thresholds_for", {})]
        raise ConfigError(f"config: key 'identity.embedding': {embedding!r}: the model card "
                          f"{str(card_path(config.model.weights))!r} holds no thresholds for it; expected one of "
                          f"{', '.join(calibrated)}, or identity.threshold set")
    return UNTRAINED_THRESHOLD


def chosen_embedding(config, card: dict | None = None) -> str:
    """How faces become embeddings (tracker.backends.mirror): `identity.embedding` when the config
    sets it, else as the weights' card says (`card` if the caller has read it); "single" without one."""
    from tracker.model.card import embedding_recipe

    if config.identity.embedding is not None:
        return config.identity.embedding
    return embedding_recipe(card if card is not None else weights_card(config))


def weights_card(config) -> dict | None:
    """The card of the config's caffemodel (tracker.model.card), or None; ModelError if malformed
    or of other weights."""
    from tracker.model.card import read_card

    return read_card(config.model.weights, file_sha256(config.model.weights))


def embeddings_key(config, card: dict | None = None) -> str:
    """What makes embeddings comparable, stored as an enrolled person's `model`: the sha256 of the
    config's caffemodel, followed by "+mirror-mean" when faces are embedded with their mirror image
    (`chosen_embedding`; `card` if the caller has read it), then by "@BLOB" when the embedding is
    read from a blob other than EMBEDDING_BLOB (`model.embedding`: fc2's 848 wide are not fc1's).
    The default blob adds nothing, so the key of every person enrolled before it was named stands
    (a file without kept crops could not be recomputed); the blob comes last, after fixed-form
    parts, so no two keys read alike. People of another key are recomputed from their kept crops
    (`refresh_people`) or skipped, never mixed."""
    from tracker.model.spec import EMBEDDING_BLOB

    sha256 = file_sha256(config.model.weights)
    embedding = chosen_embedding(config, card)
    key = sha256 if embedding == "single" else f"{sha256}+{embedding}"
    return key if config.model.embedding == EMBEDDING_BLOB else f"{key}@{config.model.embedding}"


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """`rows` (..., D) scaled to unit L2 length (zero rows stay zero), float32."""
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32)


def people_folder(state_dir: Path) -> Path:
    """Where the enrolled people are kept: one `<name>.npz` each, in `<state_dir>/people`."""
    return Path(state_dir) / "people"


@contextmanager
def people_lock(state_dir: Path) -> Iterator[None]:
    """Hold `<state_dir>/people/.lock` (flock, exclusive; waits for the holder). Every change to a
    person reads, computes and writes their file under it (`save_person` and `remove_person` are
    called in it), so that two changes at once (the web page's and a `tracker enroll` beside the
    running guard) cannot undo one another, nor a refresh bring back a person removed meanwhile.
    No photo is read under it: it is held for the embedding of at most MAX_KEPT faces and a
    write. Whoever holds it is the only writer, so a temporary file left there (a write killed
    between its start and its rename, `.NAME.<pid>.<random>.tmp.npz`) is deleted: a face the user
    removed must not stay on the disk. TrackerError if the folder cannot be made or locked."""
    folder = people_folder(state_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise TrackerError(f"people folder {str(folder)!r}: cannot lock it ({err.strerror or err}); expected a "
                           "folder this user can write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for leftover in folder.glob(".*.tmp.npz"):
            leftover.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def save_person(state_dir: Path, name: str, embeddings: np.ndarray, model_key: str, crop: str,
                crops: np.ndarray | None = None) -> Path:
    """Store the mean of `embeddings` (k, D) float32, k >= 1, as person `name`, made by the
    weights and embedding of `model_key` (`embeddings_key`) from crops of definition `crop`;
    `crops` (k, 1, 88, 88) float32 in [0, 1], the network inputs they came from, are kept (as
    uint8) so that `refresh_people` can recompute the mean for other weights. Returns the file.
    Called under `people_lock`."""
    validate_name(name)
    folder = people_folder(state_dir)
    mean = unit_rows(unit_rows(np.asarray(embeddings, np.float32)).mean(axis=0))
    path = folder / f"{name}.npz"
    extra = {}
    if crops is not None:  # the crops are pixel / 255 of uint8 pixels: this is lossless
        extra["chips"] = np.clip(np.rint(np.asarray(crops, np.float32)[:, 0] * 255.0), 0, 255).astype(np.uint8)
    try:
        folder.mkdir(parents=True, exist_ok=True)  # (here: a file named people is a write error too)
        atomic_write(path, lambda tmp: np.savez(tmp, mean=mean, count=np.int64(len(embeddings)), model=np.str_(model_key),
                                                crop=np.str_(crop), **extra), mode=0o600)  # a face: private
    except OSError as err:  # the file as it was is kept (atomic_write)
        raise TrackerError(f"enroll: cannot write {str(path)!r} ({err.strerror or err}); expected room on the disk "
                           "and a folder this user can write") from None
    return path


def check_new_name(state_dir: Path, name: str) -> None:
    """InputError if `name` differs only in case from an enrolled person's: two files for one
    person, whose gallery votes split (checked for a new enrolment, not for a refresh, which
    rewrites the people there are). The name of an enrolled person is never refused."""
    names = [p.stem for p in people_files(state_dir)]
    same = [other for other in names if other.casefold() == name.casefold()]
    if same and name not in names:
        raise InputError(f"enroll: {name!r}: {same[0]!r} is enrolled, a name that differs only in case; expected "
                         f"{same[0]!r} (to add to them) or another name")


PeopleStamp = tuple[int, tuple[tuple[str, int, int], ...]]


def people_stamp(state_dir: Path) -> PeopleStamp | None:
    """What moves when the people change: the people folder's modification time (ns), which every
    person's write and removal (a rename or an unlink in it) moves, and each person file's (name,
    size, modification time in ns), which a file rewritten in place moves too (`cp other.npz
    people/bob.npz` leaves the folder's time alone), and a file still being copied in when the
    stamp was taken moves again when the copy ends (the folder's time did not, and the person
    stayed unreadable). None without a folder to list. One listing and a stat per person file: for a
    running guard to see, within its one-second poll, a `tracker enroll` or a copy made beside it."""
    folder = people_folder(state_dir)
    try:
        folder_time = os.stat(folder).st_mtime_ns
        with os.scandir(folder) as entries:
            people = []
            for entry in entries:
                if not _is_person_file(entry.name):
                    continue
                try:
                    stat = entry.stat()
                except FileNotFoundError:  # removed since the listing: the folder's time has moved
                    continue
                people.append((entry.name, stat.st_size, stat.st_mtime_ns))
    except OSError:
        return None
    return folder_time, tuple(sorted(people))


def people_files(state_dir: Path) -> list[Path]:
    """The enrolled people's files, `<state_dir>/people/NAME.npz`, sorted by name: only those named
    as `validate_name` allows (the temporary file of a write a crash interrupted, `.NAME.*.npz`, is
    not a person). No folder: nobody. InputError for a folder that cannot be read (glob said
    nobody, and every face was unknown without a word)."""
    folder = people_folder(state_dir)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    except OSError as err:
        raise InputError(f"people folder {str(folder)!r}: cannot read it ({err.strerror or err}); expected a folder "
                         "this user can read") from None
    return sorted(folder / n for n in names if _is_person_file(n))


def _is_person_file(name: str) -> bool:
    """Whether the file `name` in the people folder is a person's: NAME.npz, NAME as `validate_name`
    allows (not the lock, nor a write's temporary file `.NAME.*.npz`)."""
    return name.endswith(".npz") and _is_name(name[: -len(".npz")])


@dataclass(frozen=True)
class PersonFile:
    """A person's file as read (module docstring): `mean` as stored, of any shape and dtype
    (`mean_fault` says whether it is usable), `model` their `embeddings_key`, `crop` their crop
    definition (CROP_BOX for a file from before it was recorded), `chips` (k, 88, 88) uint8, or
    None when none were kept or they were not asked for."""

    mean: np.ndarray
    model: str
    crop: str
    chips: np.ndarray | None


def read_person(path: Path, chips: bool = False) -> PersonFile:
    """The person's file at `path`, with their kept faces only if `chips` (7.7 kB each, which
    matching never needs). FileNotFoundError if there is none; one of NPZ_UNREADABLE (of which it
    is one) if it is not a whole person's file."""
    with load_npz(path) as data:
        return PersonFile(np.asarray(data["mean"]), str(data["model"]),
                          str(data["crop"]) if "crop" in data.files else CROP_BOX,
                          data["chips"] if chips and "chips" in data.files else None)


def mean_fault(mean: np.ndarray, width: int) -> str | None:
    """Why `mean` cannot be a person's mean for a net whose embeddings are `width` wide, or None
    when it can (a finite (width,) float vector). Another width made the gallery's stack fail,
    the guard with it; a NaN made every face unknown (argmax picked it)."""
    if mean.dtype.kind != "f" or mean.shape != (width,):
        return f"its mean is {mean.dtype} of shape {mean.shape}, not the net's ({width},) float embedding"
    if not np.isfinite(mean).all():
        return "its mean is not finite (NaN or infinity)"
    return None


def kept_crops(state_dir: Path, name: str, crop: str) -> np.ndarray | None:
    """The network inputs person `name` was enrolled from, (k, 1, 88, 88) float32 in [0, 1]; None
    if nobody of that name is enrolled. InputError if they are, but their faces cannot be added to:
    a file that cannot be read, or one enrolled without kept faces or from another crop definition
    than `crop` (adding to it would replace the whole enrolment by the new faces)."""
    path = people_folder(state_dir) / f"{validate_name(name)}.npz"
    try:
        person = read_person(path, chips=True)
    except FileNotFoundError:
        return None
    except NPZ_UNREADABLE as err:
        why = f"unreadable ({err.__class__.__name__})"
    else:
        if person.chips is None:
            why = "enrolled without kept faces"
        elif person.crop != crop:
            why = f"enrolled from {person.crop!r} crops, not this detector's {crop!r}"
        else:
            return network_input(person.chips)
    raise InputError(f"enroll: cannot add a face to {name!r}: {str(path)!r} is {why}; expected an enrolment to "
                     f"add to: enrol {name!r} afresh from photos (tracker enroll --replace; on the page, Delete them "
                     "first)")


def person_chip(state_dir: Path, name: str) -> np.ndarray | None:
    """The first face chip person `name` was enrolled from, (88, 88) grey uint8, or None (not
    enrolled, unreadable, or enrolled without kept crops)."""
    try:
        with load_npz(people_folder(state_dir) / f"{validate_name(name)}.npz") as data:
            return data["chips"][0] if "chips" in data.files and len(data["chips"]) else None
    except NPZ_UNREADABLE:
        return None


def remove_person(state_dir: Path, name: str) -> bool:
    """Forget person `name` (their file and kept crops); False if nobody of that name is enrolled."""
    path = people_folder(state_dir) / f"{validate_name(name)}.npz"
    with people_lock(state_dir):
        try:
            path.unlink()
        except FileNotFoundError:
            return False
    return True


@dataclass(frozen=True)
class Refreshed:
    """What `refresh_people` did: `recomputed` (names), `stale` (name -> why it cannot be
    recomputed: it must be enrolled again from photos) and `unwritten` (names whose new file could
    not be written, a full disk: their file stays as it was, of the old weights)."""

    recomputed: tuple[str, ...] = ()
    stale: tuple[tuple[str, str], ...] = ()
    unwritten: tuple[str, ...] = ()


def refresh_people(state_dir: Path, backend, model_key: str, crop: str, width: int) -> Refreshed:
    """Recompute, with `backend` (embedding as `model_key` says: `embeddings_key`; `width` wide),
    the mean embedding of every person enrolled with another key, or whose mean is not one of this
    net (`mean_fault`), from kept crops of definition `crop`. People the gallery cannot use and
    this cannot recompute (enrolled without kept crops, from another crop definition, or an
    unreadable file) are `stale`; a file that cannot be written is logged, left as it was and
    `unwritten`."""
    recomputed, stale, unwritten = [], [], []
    for path in people_files(state_dir):
        with people_lock(state_dir):  # one person at a time: read, recompute, write
            try:
                person = read_person(path, chips=True)
            except FileNotFoundError:  # removed since the folder was listed
                continue
            except NPZ_UNREADABLE as err:
                stale.append((path.stem, f"unreadable ({err.__class__.__name__})"))
                continue
            if person.crop != crop:
                stale.append((path.stem, f"enrolled from {person.crop} crops, the detector gives {crop} crops"))
                continue
            fault = mean_fault(person.mean, width)
            if person.model == model_key and fault is None:
                continue
            if person.chips is None:
                stale.append((path.stem, "enrolled without kept crops" if person.model != model_key
                              else f"{fault}, and enrolled without kept crops"))
                continue
            crops = network_input(person.chips)
            embeddings = backend.infer(crops).embedding
            try:
                save_person(state_dir, path.stem, embeddings, model_key, person.crop, crops)
            except TrackerError as err:  # the file as it was stays: Gallery.load skips it as of other weights
                log.error("%s; %s stays as it was", err, path.stem)
                unwritten.append(path.stem)
                continue
            recomputed.append(path.stem)
    return Refreshed(tuple(recomputed), tuple(stale), tuple(unwritten))


@dataclass(frozen=True)
class Gallery:
    """Enrolled people: names[i] has unit mean embedding means[i]; means (P, D) float32."""

    names: tuple[str, ...]
    means: np.ndarray
    threshold: float

    @classmethod
    def load(cls, state_dir: Path, model_key: str, threshold: float, crop: str, width: int) -> Gallery:
        """The people of `state_dir` enrolled with the weights and embedding of `model_key`
        (`embeddings_key`) and crop definition `crop`, whose mean is a finite vector of `width`,
        the net's embedding width (`mean_fault`); the others are skipped with a warning each."""
        names, means = [], []
        for path in people_files(state_dir):
            try:
                person = read_person(path)
            except NPZ_UNREADABLE as err:
                log.warning("identity: skipping %s: unreadable (%s)", path, err)
                continue
            if person.crop != crop:
                log.warning("identity: skipping %s: enrolled from %s crops, the detector now gives %s crops; "
                            "enroll it afresh (`tracker enroll --replace %s PHOTOS`)", path.stem, person.crop, crop,
                            path.stem)
                continue
            fault = mean_fault(person.mean, width)
            if person.model != model_key or fault is not None:
                why = "enrolled with other model weights or embedding" if person.model != model_key else fault
                log.warning("identity: skipping %s: %s; `tracker enroll --refresh` recomputes it if its crops were "
                            "kept, else enroll it afresh (`tracker enroll --replace %s PHOTOS`)", path.stem, why,
                            path.stem)
                continue
            names.append(path.stem)
            means.append(person.mean)
        return cls(tuple(names), np.asarray(means, np.float32).reshape(len(names), width), threshold)

    def similarities(self, embeddings: np.ndarray) -> np.ndarray:
        """Cosine similarity of each row of `embeddings` (N, D) to each person: (N, P) float32."""
        return unit_rows(np.asarray(embeddings, np.float32)) @ self.means.T

    def match(self, embeddings: np.ndarray) -> list[tuple[str, float]]:
        """For each row of `embeddings` (N, D): (name, cosine similarity), or (unknown, best
        similarity) below the threshold or with nobody enrolled."""
        if not self.names:
            return [(UNKNOWN, 0.0)] * len(embeddings)
        sims = self.similarities(embeddings)
        best = sims.argmax(axis=1)
        result = []
        for row, j in enumerate(best):
            sim = float(sims[row, j])
            result.append((self.names[j] if sim >= self.threshold else UNKNOWN, sim))
        return result


class IdentityVotes:
    """Per-track votes over the track's life (bounded by the number of live tracks and names).

    Each face of a track votes once, for the name `Gallery.match` gave it (a person, or `unknown`
    below the threshold). A track is `decided` once it has `min_faces` faces; before that its
    identity is `unknown` with confidence 0. Then the name with the most votes wins when it leads
    every other name by at least `margin` (a share of all votes; a tie never wins, even with a
    margin of 0); otherwise the track is `unknown`
    with confidence 0: two people too alike for this track's faces are not told apart by a guess.
    One vote per face, not votes weighted by similarity: measured on the trained weights, a
    stranger's one face above the threshold (similarity 0.76) outweighed four below it when each
    of those voted only by how far it fell short (0.03-0.11)."""

    def __init__(self, min_faces: int = 1, margin: float = 0.0):
        self._min_faces = min_faces
        self._margin = margin
        self._votes: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, track_id: int, name: str) -> None:
        """One face of `track_id` matched `name` (or UNKNOWN)."""
        self._votes[track_id][name] += 1

    def decided(self, track_id: int) -> bool:
        """Whether the track has the faces its identity needs (one vote each)."""
        return sum(self._votes.get(track_id, {}).values()) >= self._min_faces

    def _lead(self, track_id: int) -> tuple[str, float, float]:
        """(leading name, its share of the votes, its lead over the runner-up as a share)."""
        votes = self._votes[track_id]
        total = sum(votes.values())
        ranked = sorted(votes.items(), key=lambda item: -item[1])
        runner_up = ranked[1][1] if len(ranked) > 1 else 0
        return ranked[0][0], ranked[0][1] / total, (ranked[0][1] - runner_up) / total

    def ambiguous(self, track_id: int) -> bool:
        """Decided, but no name leads by `margin` (a tie never leads, whatever the margin): too
        close to call."""
        if not self.decided(track_id):
            return False
        lead = self._lead(track_id)[2]
        return lead == 0 or lead < self._margin

    def voted(self, track_id: int) -> tuple[str, float]:
        """(name, confidence in [0, 1]: the name's share of the votes); (unknown, 0.0) for a track
        that is not decided or is ambiguous."""
        if not self.decided(track_id) or self.ambiguous(track_id):
            return UNKNOWN, 0.0
        name, share, _ = self._lead(track_id)
        return name, share

    def share(self, track_id: int, name: str) -> float:
        """`name`'s share of the track's votes, in [0, 1] (0.0 for a track without votes)."""
        votes = self._votes.get(track_id, {})
        total = sum(votes.values())
        return votes.get(name, 0) / total if total else 0.0

    def forget(self, track_id: int) -> None:
        self._votes.pop(track_id, None)

    def merge(self, into: int, source: int) -> None:
        """Track `source` was track `into` all along (re-identified by face): its votes count for
        `into`, and it has none left."""
        for name, count in self._votes.pop(source, {}).items():
            self._votes[into][name] += count
