"""The tracker: SORT (Bewley et al. 2016) with optional appearance, as a per-frame state machine.

Each frame, every live track's Kalman filter predicts its box; detections are assigned to tracks
(`assign.associate`: 1 - IoU plus weighted embedding distance, IoU-gated, Hungarian); matched
tracks are corrected, unmatched detections start new tracks, and states advance:

    TENTATIVE --(min_hits consecutive hits)--> CONFIRMED --(miss)--> LOST --(hit)--> CONFIRMED
        |                                                             |
        +--(any miss: probably a false detection)--> ENDED <--(more than max_age misses in a row)

A LOST track is still predicted and can be re-acquired; it ends on its (max_age + 1)-th
consecutive missed frame, so `max_age` is the number of frames a confirmed track survives without
a detection. A track ends exactly once: the frame it ends it is returned with state ENDED, then it
is forgotten. Track ids start at 1, are unique and increase in order of birth (a tentative track
that dies still used its id).

`Tracker.update` must be called once per frame, also when there are no detections (so that tracks
age and end). The tracker is pure and deterministic: no I/O, no clock (time is the frame count),
no globals, no randomness; the same inputs give the same outputs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from tracker.tracking.assign import associate
from tracker.tracking.kalman import DEFAULT_NOISE, BoxKalman, KalmanNoise
from tracker.types import Box, Detection


class TrackState(str, enum.Enum):
    TENTATIVE = "tentative"
    CONFIRMED = "confirmed"
    LOST = "lost"
    ENDED = "ended"


@dataclass(frozen=True)
class TrackView:
    """One track as it stands after a frame's update.

    track_id:        unique, increasing from 1 in order of birth.
    state:           after this frame.
    box:             Kalman posterior if a detection was assigned this frame, else the prediction.
    detection_index: index into this frame's `detections` assigned to the track, or None.
    hits:            frames with an assigned detection over the track's life.
    hit_streak:      consecutive frames with a detection, up to and including this one.
    misses:          consecutive frames without a detection, up to and including this one.
    age:             frames since birth (0 on the frame the track is born).
    ever_confirmed:  the track has been CONFIRMED at some frame (so it was announced).
    just_confirmed:  the track became CONFIRMED this frame (-> an `entered` event). Re-acquiring a
                     LOST track is not a new confirmation.
    velocity:        centre velocity (du, dv) in px/frame, from the filter.
    embedding:       smoothed unit-norm appearance (D,) float32 (read-only), or None if the track
                     never received one. Not part of equality.
    """

    track_id: int
    state: TrackState
    box: Box
    detection_index: int | None
    hits: int
    hit_streak: int
    misses: int
    age: int
    ever_confirmed: bool
    just_confirmed: bool
    velocity: tuple[float, float]
    embedding: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def entered(self) -> bool:
        """This frame the track was confirmed: announce it."""
        return self.just_confirmed

    @property
    def left(self) -> bool:
        """This frame an announced track ended: announce its departure. (A tentative track that
        ends was never announced, so it does not leave.)"""
        return self.state is TrackState.ENDED and self.ever_confirmed

    @property
    def visible(self) -> bool:
        """Confirmed and seen this frame: the track's box is backed by a detection now."""
        return self.state is TrackState.CONFIRMED and self.detection_index is not None


class _Track:
    """Mutable bookkeeping of one live track (private to Tracker)."""

    __slots__ = ("track_id", "kf", "state", "hits", "hit_streak", "misses", "age", "ever_confirmed", "embedding")

    def __init__(self, track_id: int, box: Box, noise: KalmanNoise):
        self.track_id = track_id
        self.kf = BoxKalman(box, noise)
        self.state = TrackState.TENTATIVE
        self.hits = 1
        self.hit_streak = 1
        self.misses = 0
        self.age = 0
        self.ever_confirmed = False
        self.embedding: np.ndarray | None = None


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0.0 else v


class Tracker:
    """SORT-style multi-object tracker; see the module docstring for the state machine.

    min_hits:          consecutive hits (birth frame included) before a track is CONFIRMED; >= 1.
    max_age:           consecutive missed frames a confirmed track survives as LOST; >= 1.
    iou_threshold:     minimum IoU between a track's predicted box and a detection to pair them.
    embedding_weight:  weight of the cosine distance of embeddings in the cost (0 = IoU only).
    embedding_momentum: share of the old embedding kept when a track's embedding is smoothed
                        (exponential moving average of unit vectors, renormalised).
    noise:             the Kalman filter's noise model.
    """

    def __init__(
        self,
        min_hits: int = 3,
        max_age: int = 10,
        iou_threshold: float = 0.3,
        embedding_weight: float = 0.3,
        *,
        embedding_momentum: float = 0.9,
        noise: KalmanNoise = DEFAULT_NOISE,
    ):
        if int(min_hits) != min_hits or min_hits < 1:
            raise ValueError(f"min_hits must be an integer >= 1, got {min_hits!r}")
        if int(max_age) != max_age or max_age < 1:
            raise ValueError(f"max_age must be an integer >= 1, got {max_age!r}")
        if not 0.0 <= iou_threshold <= 1.0:
            raise ValueError(f"iou_threshold must be in [0, 1], got {iou_threshold!r}")
        if not 0.0 <= embedding_weight:
            raise ValueError(f"embedding_weight must be >= 0, got {embedding_weight!r}")
        if not 0.0 <= embedding_momentum < 1.0:
            raise ValueError(f"embedding_momentum must be in [0, 1), got {embedding_momentum!r}")
        self.min_hits = int(min_hits)
        self.max_age = int(max_age)
        self.iou_threshold = float(iou_threshold)
        self.embedding_weight = float(embedding_weight)
        self.embedding_momentum = float(embedding_momentum)
        self.noise = noise
        self._tracks: list[_Track] = []
        self._next_id = 1
        self._frames = 0

    @classmethod
    def from_config(cls, config, **kwargs) -> "Tracker":
        """Build from anything with min_hits, max_age, iou_threshold and embedding_weight
        attributes (e.g. `tracker.config.TrackingConfig`)."""
        return cls(config.min_hits, config.max_age, config.iou_threshold, config.embedding_weight, **kwargs)

    @property
    def frame_count(self) -> int:
        """Number of `update` calls so far."""
        return self._frames

    @property
    def live_count(self) -> int:
        """Tracks not yet ended (tentative, confirmed or lost)."""
        return len(self._tracks)

    def predicted_boxes(self) -> list[Box]:
        """Where each live track (tentative, confirmed or lost) is expected in the next frame:
        its Kalman state moved one frame at constant velocity; nothing is changed. For searching
        around people the motion gate no longer sees (someone standing still)."""
        return [t.kf.peek() for t in self._tracks]

    def update(self, detections: Sequence[Detection], embeddings: np.ndarray | None = None) -> list[TrackView]:
        """Advance one frame.

        detections: this frame's detections (possibly empty).
        embeddings: None, or (len(detections), D) float array, one appearance vector per
                    detection; a row with NaN means that detection has no embedding.
        Returns a view of every track that is live after this frame plus every track that ended
        this frame (state ENDED), sorted by track_id. Raises ValueError for a malformed
        `embeddings` array (a programming error, not user input).
        """
        n_det = len(detections)
        if embeddings is not None:
            embeddings = np.asarray(embeddings, dtype=np.float32)
            if embeddings.ndim != 2 or embeddings.shape[0] != n_det:
                raise ValueError(f"embeddings must have shape ({n_det}, D), got {embeddings.shape}")
        self._frames += 1

        for track in self._tracks:
            track.kf.predict()
            track.age += 1

        det_boxes = np.array([[d.box.x, d.box.y, d.box.w, d.box.h] for d in detections], dtype=np.float64).reshape(-1, 4)
        track_boxes = np.array([list(_xywh(t.kf.box)) for t in self._tracks], dtype=np.float64).reshape(-1, 4)
        track_emb = None
        if embeddings is not None and self._tracks:
            dim = embeddings.shape[1]
            track_emb = np.full((len(self._tracks), dim), np.nan)
            for i, t in enumerate(self._tracks):
                if t.embedding is not None and t.embedding.shape == (dim,):
                    track_emb[i] = t.embedding
        result = associate(
            track_boxes,
            det_boxes,
            iou_threshold=self.iou_threshold,
            embedding_weight=self.embedding_weight,
            track_embeddings=track_emb,
            detection_embeddings=embeddings,
        )

        assigned: dict[int, int] = {}
        just_confirmed: set[int] = set()
        for ti, di in result.matches:
            track = self._tracks[ti]
            track.kf.update(detections[di].box)
            track.hits += 1
            track.hit_streak += 1
            track.misses = 0
            self._absorb_embedding(track, embeddings, di)
            if track.state is TrackState.TENTATIVE and track.hit_streak >= self.min_hits:
                track.state = TrackState.CONFIRMED
                track.ever_confirmed = True
                just_confirmed.add(track.track_id)
            elif track.state is TrackState.LOST:
                track.state = TrackState.CONFIRMED
            assigned[track.track_id] = di

        for ti in result.unmatched_tracks:
            track = self._tracks[ti]
            track.misses += 1
            track.hit_streak = 0
            if track.state is TrackState.TENTATIVE or track.misses > self.max_age:
                track.state = TrackState.ENDED
            else:
                track.state = TrackState.LOST

        for di in result.unmatched_detections:
            track = _Track(self._next_id, detections[di].box, self.noise)
            self._next_id += 1
            self._absorb_embedding(track, embeddings, di)
            if self.min_hits <= 1:
                track.state = TrackState.CONFIRMED
                track.ever_confirmed = True
                just_confirmed.add(track.track_id)
            assigned[track.track_id] = di
            self._tracks.append(track)

        views = [self._view(t, assigned.get(t.track_id), t.track_id in just_confirmed) for t in self._tracks]
        self._tracks = [t for t in self._tracks if t.state is not TrackState.ENDED]
        views.sort(key=lambda v: v.track_id)
        return views

    def _absorb_embedding(self, track: _Track, embeddings: np.ndarray | None, di: int) -> None:
        """Fold detection di's embedding into the track's smoothed unit embedding."""
        if embeddings is None:
            return
        e = embeddings[di].astype(np.float64)
        if not np.isfinite(e).all():
            return
        e = _unit(e)
        if track.embedding is None or track.embedding.shape != e.shape:
            track.embedding = e
        else:
            m = self.embedding_momentum
            track.embedding = _unit(m * track.embedding + (1.0 - m) * e)

    @staticmethod
    def _view(track: _Track, detection_index: int | None, just_confirmed: bool) -> TrackView:
        emb = None
        if track.embedding is not None:
            emb = track.embedding.astype(np.float32)
            emb.setflags(write=False)
        return TrackView(
            track_id=track.track_id,
            state=track.state,
            box=track.kf.box,
            detection_index=detection_index,
            hits=track.hits,
            hit_streak=track.hit_streak,
            misses=track.misses,
            age=track.age,
            ever_confirmed=track.ever_confirmed,
            just_confirmed=just_confirmed,
            velocity=track.kf.velocity,
            embedding=emb,
        )


def _xywh(box: Box) -> tuple[float, float, float, float]:
    return (box.x, box.y, box.w, box.h)
