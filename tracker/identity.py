"""Identity: who a face is, from the CNN's embedding, and a vote per track.

Enrolled people live in `<state_dir>/people/<name>.npz`: `mean` (D,) float32, the L2-normalised mean
of the person's L2-normalised embeddings, `count` (images used), `model` (sha256 of the caffemodel
that made them) and `crop` (the `tracker.crops` definition their faces were cut with; files from
before it was recorded are box crops). Embeddings of other weights or of another crop are not
comparable, so such people are skipped with a warning: never mixed. A crop is the enrolled person of highest cosine similarity, or `unknown`
when that similarity is below the threshold. A track's identity is the vote over its whole life:
each crop adds its similarity to its name (`unknown` votes with the threshold's margin), the name
with the largest total wins, and its confidence is that total's share of all votes.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.crops import CROP_BOX
from tracker.errors import InputError

UNKNOWN = "unknown"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
log = logging.getLogger(__name__)


def validate_name(name: str) -> str:
    """A person's name as a safe file stem: letters, digits, '_', '.', '-', not 'unknown', no '..'."""
    # fullmatch: with match(), the pattern's "$" also matches before a trailing newline ("x\n")
    if not _NAME.fullmatch(name) or ".." in name or name.lower() == UNKNOWN:
        raise InputError(
            f"enroll: bad name {name!r}; expected 1-64 letters, digits, '_', '.' or '-', "
            f"starting with a letter or digit, without '..', and not {UNKNOWN!r}"
        )
    return name


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32)


def save_person(state_dir: Path, name: str, embeddings: np.ndarray, model_sha256: str, crop: str) -> Path:
    """Store the mean of `embeddings` (k, D) float32, k >= 1, as person `name`, made by the
    weights of `model_sha256` from crops of definition `crop`; returns the file."""
    validate_name(name)
    folder = Path(state_dir) / "people"
    folder.mkdir(parents=True, exist_ok=True)
    mean = _unit(_unit(np.asarray(embeddings, np.float32)).mean(axis=0))
    path = folder / f"{name}.npz"
    tmp = folder / f".{name}.tmp.npz"
    np.savez(tmp, mean=mean, count=np.int64(len(embeddings)), model=np.str_(model_sha256), crop=np.str_(crop))
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class Gallery:
    """Enrolled people: names[i] has unit mean embedding means[i]; means (P, D) float32."""

    names: tuple[str, ...]
    means: np.ndarray
    threshold: float

    @classmethod
    def load(cls, state_dir: Path, model_sha256: str, threshold: float, crop: str) -> "Gallery":
        """The people of `state_dir` enrolled with these weights and crop definition."""
        names, means = [], []
        for path in sorted((Path(state_dir) / "people").glob("*.npz")):
            try:
                with np.load(path) as data:
                    mean, model = data["mean"].astype(np.float32), str(data["model"])
                    made_with = str(data["crop"]) if "crop" in data.files else CROP_BOX
            except (OSError, ValueError, KeyError) as err:
                log.warning("identity: skipping %s: unreadable (%s)", path, err)
                continue
            if model != model_sha256:
                log.warning("identity: skipping %s: enrolled with other model weights; enroll again", path.stem)
                continue
            if made_with != crop:
                log.warning("identity: skipping %s: enrolled from %s crops, the detector now gives %s crops; "
                            "enroll again", path.stem, made_with, crop)
                continue
            names.append(path.stem)
            means.append(mean)
        dim = means[0].shape[0] if means else 0
        return cls(tuple(names), np.asarray(means, np.float32).reshape(len(names), dim), threshold)

    def match(self, embeddings: np.ndarray) -> list[tuple[str, float]]:
        """For each row of `embeddings` (N, D): (name, cosine similarity), or (unknown, best
        similarity) below the threshold or with nobody enrolled."""
        if not self.names:
            return [(UNKNOWN, 0.0)] * len(embeddings)
        sims = _unit(np.asarray(embeddings, np.float32)) @ self.means.T
        best = sims.argmax(axis=1)
        result = []
        for row, j in enumerate(best):
            sim = float(sims[row, j])
            result.append((self.names[j] if sim >= self.threshold else UNKNOWN, sim))
        return result


class IdentityVotes:
    """Per-track votes over the track's life (bounded by the number of live tracks and names)."""

    def __init__(self, threshold: float):
        self._threshold = threshold
        self._votes: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def add(self, track_id: int, name: str, similarity: float) -> None:
        # An `unknown` match votes with how far it fell below the threshold (at least a little),
        # so one lucky frame does not outvote many clear misses.
        weight = similarity if name != UNKNOWN else max(self._threshold - similarity, 0.05)
        self._votes[track_id][name] += max(weight, 1e-3)

    def voted(self, track_id: int) -> tuple[str, float]:
        """(name, confidence in [0, 1]); (unknown, 0.0) for a track with no votes."""
        votes = self._votes.get(track_id)
        if not votes:
            return UNKNOWN, 0.0
        name = max(votes, key=votes.get)
        return name, votes[name] / sum(votes.values())

    def forget(self, track_id: int) -> None:
        self._votes.pop(track_id, None)
