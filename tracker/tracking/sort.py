"""The tracker: SORT (Bewley et al. 2016) with ByteTrack's low-score association, OC-SORT's
observation-centric recovery and re-identification by face, as a per-frame state machine.

Each frame, every live track's Kalman filter predicts its box; then detections are assigned in
three stages (`assign.associate`: 1 - IoU plus weighted embedding distance, IoU-gated, Hungarian):

1. every live track against the *high-score* detections (score >= `high_score`; all of them when
   `high_score` is None), with the embedding term;
2. ByteTrack (Zhang et al., ECCV 2022): the confirmed tracks still unmatched against the
   *low-score* detections, IoU only, gated at `low_iou_threshold` (a face half turned away or
   half hidden scores low but is still the person the track follows; a low-score box never starts
   a track);
3. OC-SORT's observation-centric recovery (Cao et al., CVPR 2023), when `observation_centric`: the
   tracks still unmatched against the high-score detections still unmatched, by IoU with the
   track's *last observed* box instead of its prediction (after a stop or a turn the constant-
   velocity prediction has drifted away from where the person is).

A track re-acquired after a gap of k missed frames is re-updated along a virtual path
(observation-centric re-update, also OC-SORT): its filter goes back to its state at the last
observation and is corrected with k boxes interpolated linearly between the last observed box and
the new one, so the coasting on a stale velocity does not leave a wrong velocity behind.
Matched tracks are corrected, unmatched high-score detections start new tracks, and states advance:

    TENTATIVE --(min_hits consecutive hits)--> CONFIRMED --(miss)--> LOST --(hit)--> CONFIRMED
        |                                                             |
        +--(any miss: probably a false detection)--> ENDED <--(more than max_age misses in a row)

A LOST track is still predicted and can be re-acquired; it ends on its (max_age + 1)-th
consecutive missed frame, so `max_age` is the number of frames a confirmed track survives without
a detection.

Re-identification by face (`reid_threshold` set; needs embeddings and each frame's time): a
confirmed track with an embedding that passes `max_age` does not end but becomes *dormant* (still
LOST, no longer predicted or matched by position) for up to `reid_window_s` seconds after it was
last seen. When a new track is confirmed and its embedding's cosine similarity with a LOST track's
(dormant or not) is at least `reid_threshold`, and the LOST track was last seen before the new one
was born (two tracks seen in one frame are two people, however alike), the new track is the old
person back: the old track
takes over the new one's filter and detection and continues under its old id (CONFIRMED again, no
new confirmation), and the new track ends unannounced. New tracks confirmed on one frame are paired
with LOST tracks by one assignment of greatest total similarity (taken in id order, the first could
take the old track that was the second's much better match). So a face hidden for a moment is one track,
one `entered` and one `left`; the `left` of a track that does not come back is held back until its
window has passed.

Past MAX_TRACKS tracks, the LOST ones missed longest (dormant ones first) end early, so a crowd of
short-lived detections (eval-mot with --min-hits 1 and a long --max-age) cannot grow the tracks,
and the cost matrices over them, without bound: the tracks are at most MAX_TRACKS plus one
frame's detections (at most 1,000 in eval-mot's files; in the guard at most tracker.detect.MAX_FACES,
a handful in a home).

A track ends exactly once: the frame it ends it is returned with state ENDED, then it is
forgotten. Track ids start at 1, are unique and increase in order of birth (a tentative track
that dies, or joins an old track, still used its id).

`Tracker.update` must be called once per frame, also when there are no detections (so that tracks
age and end). The tracker is pure and deterministic: no I/O, no clock (time is the frame count,
and the frame's time in seconds only where the caller passes it), no globals, no randomness; the
same inputs give the same outputs.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from tracker.tracking.assign import associate, box_rows, cosine_distance
from tracker.tracking.kalman import DEFAULT_NOISE, BoxKalman, KalmanNoise
from tracker.types import Box, Detection

# Tracks kept, live, lost and dormant (module docstring): a home's faces are a handful; each frame's
# cost matrices are (tracks x detections), 16 MB of float64 each at 1,000 detections.
MAX_TRACKS = 2000


class TrackState(enum.StrEnum):
    TENTATIVE = "tentative"
    CONFIRMED = "confirmed"
    LOST = "lost"
    ENDED = "ended"


@dataclass(frozen=True)
class TrackView:
    """One track as it stands after a frame's update.

    track_id:        unique, increasing from 1 in order of birth.
    state:           after this frame.
    box:             Kalman posterior if a detection was assigned this frame, else the prediction
                     (a dormant track is no longer predicted: its last prediction before it went dormant).
    detection_index: index into this frame's `detections` assigned to the track, or None.
    hits:            frames with an assigned detection over the track's life.
    hit_streak:      consecutive frames with a detection, up to and including this one.
    misses:          consecutive frames without a detection, up to and including this one.
    age:             frames since birth (0 on the frame the track is born).
    ever_confirmed:  the track has been CONFIRMED at some frame (so it was announced).
    just_confirmed:  the track became CONFIRMED this frame (-> an `entered` event). Re-acquiring a
                     LOST track is not a new confirmation.
    dormant:         LOST past max_age, kept only to be re-identified by face (not predicted).
    rejoined:        this frame a new track was recognised as this one by face and merged into
                     it: the id of that new track (which ends this frame), else None.
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
    dormant: bool = False
    rejoined: int | None = None

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

    __slots__ = ("track_id", "kf", "state", "hits", "hit_streak", "misses", "age", "ever_confirmed", "embedding",
                 "observed", "at_observed", "seen_s", "dormant")

    def __init__(self, track_id: int, box: Box, noise: KalmanNoise, t_s: float | None, keep_filter: bool):
        self.track_id = track_id
        self.kf = BoxKalman(box, noise)
        self.state = TrackState.TENTATIVE
        self.hits = 1
        self.hit_streak = 1
        self.misses = 0
        self.age = 0
        self.ever_confirmed = False
        self.embedding: np.ndarray | None = None
        self.observed = box  # the last detection's box
        # the filter right after that detection, kept only for the observation-centric re-update
        self.at_observed: BoxKalman | None = self.kf.copy() if keep_filter else None
        self.seen_s = t_s  # the time of that detection (None: the caller gives no times)
        self.dormant = False


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0.0 else v


def _lerp(a: Box, b: Box, f: float) -> Box:
    return Box(a.x + f * (b.x - a.x), a.y + f * (b.y - a.y), a.w + f * (b.w - a.w), a.h + f * (b.h - a.h))


class Tracker:
    """Online multi-object tracker; see the module docstring for the stages and the state machine.

    min_hits:          consecutive hits (birth frame included) before a track is CONFIRMED; >= 1.
    max_age:           consecutive missed frames a confirmed track survives as LOST; >= 1.
    iou_threshold:     minimum IoU between a track's box and a high-score detection to pair them.
    embedding_weight:  weight of the cosine distance of embeddings in the cost (0 = IoU only).
    high_score:        detections scoring below this only continue confirmed tracks (ByteTrack);
                       None: every detection is high-score (plain SORT).
    low_iou_threshold: minimum IoU for pairing a low-score detection.
    observation_centric: OC-SORT's recovery by last observed box and re-update after a gap.
    reid_threshold:    cosine similarity at which a new track is a lost one back (None: off).
    reid_window_s:     how long after it was last seen a lost track can come back, seconds.
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
        high_score: float | None = None,
        low_iou_threshold: float = 0.5,
        observation_centric: bool = False,
        reid_threshold: float | None = None,
        reid_window_s: float = 10.0,
        embedding_momentum: float = 0.9,
        noise: KalmanNoise = DEFAULT_NOISE,
    ):
        if int(min_hits) != min_hits or min_hits < 1:
            raise ValueError(f"min_hits must be an integer >= 1, got {min_hits!r}")
        if int(max_age) != max_age or max_age < 1:
            raise ValueError(f"max_age must be an integer >= 1, got {max_age!r}")
        for name, value in (("iou_threshold", iou_threshold), ("low_iou_threshold", low_iou_threshold)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if not 0.0 <= embedding_weight:
            raise ValueError(f"embedding_weight must be >= 0, got {embedding_weight!r}")
        if not 0.0 <= embedding_momentum < 1.0:
            raise ValueError(f"embedding_momentum must be in [0, 1), got {embedding_momentum!r}")
        if reid_threshold is not None and not -1.0 <= reid_threshold <= 1.0:
            raise ValueError(f"reid_threshold must be in [-1, 1] or None, got {reid_threshold!r}")
        if not reid_window_s >= 0.0:
            raise ValueError(f"reid_window_s must be >= 0, got {reid_window_s!r}")
        self.min_hits = int(min_hits)
        self.max_age = int(max_age)
        self.iou_threshold = float(iou_threshold)
        self.embedding_weight = float(embedding_weight)
        self.high_score = None if high_score is None else float(high_score)
        self.low_iou_threshold = float(low_iou_threshold)
        self.observation_centric = bool(observation_centric)
        self.reid_threshold = None if reid_threshold is None else float(reid_threshold)
        self.reid_window_s = float(reid_window_s)
        self.embedding_momentum = float(embedding_momentum)
        self.noise = noise
        self._tracks: list[_Track] = []
        self._next_id = 1

    @classmethod
    def from_config(cls, config, **kwargs) -> Tracker:
        """Build from a `tracker.config.TrackingConfig` (or anything with its attributes).
        `kwargs` override, e.g. reid_threshold, which the guard takes from the weights' card."""
        settings = dict(
            min_hits=config.min_hits, max_age=config.max_age, iou_threshold=config.iou_threshold,
            embedding_weight=config.embedding_weight, high_score=config.high_score,
            observation_centric=config.observation_centric, reid_window_s=config.reid_window_s,
        )
        settings.update(kwargs)
        return cls(**settings)

    @property
    def live_count(self) -> int:
        """Tracks not yet ended (tentative, confirmed, lost or dormant)."""
        return len(self._tracks)

    def end_all(self) -> list[int]:
        """End every track at once (the frames stopped coming: nothing is followed any more) and
        return their ids; new tracks' ids go on from the last one."""
        ids = [t.track_id for t in self._tracks]
        self._tracks.clear()
        return ids

    def predicted_boxes(self) -> list[Box]:
        """Where each live track (tentative, confirmed or lost, not dormant) is expected in the next
        frame: its Kalman state moved one frame at constant velocity; nothing is changed. For
        searching around people the motion gate no longer sees (someone standing still)."""
        return [t.kf.peek() for t in self._tracks if not t.dormant]

    def update(self, detections: Sequence[Detection], embeddings: np.ndarray | None = None,
               t_s: float | None = None, carried: bool = False) -> list[TrackView]:
        """Advance one frame.

        detections: this frame's detections (possibly empty).
        embeddings: None, or (len(detections), D) float array, one appearance vector per
                    detection; a row with NaN means that detection has no embedding.
        t_s:        the frame's time in seconds (any fixed origin, non-decreasing); needed only
                    for re-identification, whose window is in seconds.
        carried:    the detections are an earlier frame's, carried over because nothing moved
                    (the guard's motion gate): they keep the confirmed tracks they match alive,
                    but are no evidence of a new face: a tentative track they match is held
                    (neither a hit nor a miss) and none starts a track. Counted as hits, one
                    false detection carried through a still scene reached min_hits on its own.
        Returns a view of every track that is live after this frame plus every track that ended
        this frame (state ENDED), sorted by track_id. Raises ValueError for a malformed
        `embeddings` array or a missing `t_s` with re-identification on (programming errors).
        """
        n_det = len(detections)
        if embeddings is not None:
            embeddings = np.asarray(embeddings, dtype=np.float32)
            if embeddings.ndim != 2 or embeddings.shape[0] != n_det:
                raise ValueError(f"embeddings must have shape ({n_det}, D), got {embeddings.shape}")
        if self.reid_threshold is not None and t_s is None:
            raise ValueError("t_s (the frame's time) is needed when reid_threshold is set")

        for track in self._tracks:
            if not track.dormant:
                track.kf.predict()
            track.age += 1

        matches = self._associate(detections, embeddings)
        assigned: dict[int, int] = {}
        just_confirmed: set[int] = set()
        for track, di in matches:
            if carried and track.state is TrackState.TENTATIVE:
                continue  # held: matched, so not missed either
            self._observe(track, detections[di].box, t_s)
            self._absorb_embedding(track, embeddings, di)
            if track.state is TrackState.TENTATIVE and track.hit_streak >= self.min_hits:
                just_confirmed.add(track.track_id)
            elif track.state is TrackState.LOST:
                track.state = TrackState.CONFIRMED
            assigned[track.track_id] = di

        matched = {id(t) for t, _ in matches}
        for track in self._tracks:
            if id(track) not in matched:
                self._miss(track, t_s)

        taken = {di for _, di in matches}
        for di in range(n_det):
            if carried or di in taken or not self._is_high(detections[di]):
                continue
            track = _Track(self._next_id, detections[di].box, self.noise, t_s, self.observation_centric)
            self._next_id += 1
            self._absorb_embedding(track, embeddings, di)
            if self.min_hits <= 1:
                just_confirmed.add(track.track_id)
            assigned[track.track_id] = di
            self._tracks.append(track)

        rejoined = self._confirm(just_confirmed, assigned, t_s)
        self._end_excess(assigned)
        views = [self._view(t, assigned.get(t.track_id), t.track_id in just_confirmed, rejoined.get(t.track_id))
                 for t in self._tracks]
        self._tracks = [t for t in self._tracks if t.state is not TrackState.ENDED]
        views.sort(key=lambda v: v.track_id)
        return views

    def _is_high(self, detection: Detection) -> bool:
        return self.high_score is None or detection.score >= self.high_score

    def _associate(self, detections: Sequence[Detection], embeddings: np.ndarray | None) -> list[tuple[_Track, int]]:
        """The three association stages of the module docstring: (track, detection index) pairs."""
        high = [i for i, d in enumerate(detections) if self._is_high(d)]
        low = [i for i, d in enumerate(detections) if not self._is_high(d)]
        boxes = box_rows([d.box for d in detections])
        active = [t for t in self._tracks if not t.dormant]
        pairs: list[tuple[_Track, int]] = []

        def stage(tracks: list[_Track], dets: list[int], track_boxes: np.ndarray, threshold: float,
                  with_embeddings: bool) -> tuple[list[_Track], list[int]]:
            track_emb = det_emb = None
            if with_embeddings and embeddings is not None and tracks and dets:
                det_emb = embeddings[dets]
                track_emb = np.full((len(tracks), embeddings.shape[1]), np.nan)
                for k, t in enumerate(tracks):
                    if t.embedding is not None and t.embedding.shape == (embeddings.shape[1],):
                        track_emb[k] = t.embedding
            result = associate(track_boxes, boxes[dets], iou_threshold=threshold,
                               embedding_weight=self.embedding_weight if with_embeddings else 0.0,
                               track_embeddings=track_emb, detection_embeddings=det_emb)
            pairs.extend((tracks[ti], dets[di]) for ti, di in result.matches)
            return [tracks[ti] for ti in result.unmatched_tracks], [dets[di] for di in result.unmatched_detections]

        predicted = box_rows([t.kf.box for t in active])
        rest, high = stage(active, high, predicted, self.iou_threshold, True)
        if low:
            confirmed = [t for t in rest if t.state is TrackState.CONFIRMED]
            stage(confirmed, low, box_rows([t.kf.box for t in confirmed]), self.low_iou_threshold, False)
            paired = {id(t) for t, _ in pairs}
            rest = [t for t in rest if id(t) not in paired]
        if self.observation_centric and rest and high:
            stage(rest, high, box_rows([t.observed for t in rest]), self.iou_threshold, True)
        return pairs

    def _observe(self, track: _Track, box: Box, t_s: float | None) -> None:
        """Correct `track` with a detection's box (after its prediction this frame)."""
        gap = track.misses
        if gap > 0 and track.at_observed is not None:
            # Re-update: back to the last observation, then along the straight path to this one.
            kf = track.at_observed
            for k in range(1, gap + 1):
                kf.predict()
                kf.update(_lerp(track.observed, box, k / (gap + 1)))
            kf.predict()
            track.kf = kf
        track.kf.update(box)
        track.observed, track.seen_s = box, t_s
        track.at_observed = track.kf.copy() if self.observation_centric else None
        track.hits += 1
        track.hit_streak += 1
        track.misses = 0

    def _miss(self, track: _Track, t_s: float | None) -> None:
        """A frame without a detection for `track`: LOST, dormant or ENDED."""
        track.misses += 1
        track.hit_streak = 0
        if track.state is TrackState.TENTATIVE:
            track.state = TrackState.ENDED
        elif track.misses <= self.max_age:
            track.state = TrackState.LOST
        elif self._can_come_back(track) and self._within_window(track, t_s):
            track.state, track.dormant = TrackState.LOST, True
        else:
            track.state = TrackState.ENDED

    def _end_excess(self, assigned: dict[int, int]) -> None:
        """End the LOST tracks not seen this frame that were missed longest, as many as the
        tracks exceed MAX_TRACKS (module docstring)."""
        excess = sum(t.state is not TrackState.ENDED for t in self._tracks) - MAX_TRACKS
        if excess > 0:
            waiting = [t for t in self._tracks if t.state is TrackState.LOST and t.track_id not in assigned]
            for track in sorted(waiting, key=lambda t: (-t.misses, t.track_id))[:excess]:
                track.state = TrackState.ENDED

    def _can_come_back(self, track: _Track) -> bool:
        return self.reid_threshold is not None and track.ever_confirmed and track.embedding is not None

    def _within_window(self, track: _Track, t_s: float | None) -> bool:
        """The track was last seen at most reid_window_s before t_s (times are given whenever
        re-identification is on: `update` checks)."""
        return t_s is not None and track.seen_s is not None and t_s - track.seen_s <= self.reid_window_s

    def _confirm(self, just_confirmed: set[int], assigned: dict[int, int], t_s: float | None) -> dict[int, int]:
        """Confirm the tracks in `just_confirmed`, except those recognised by face as a LOST track
        back: those are merged into it (and removed from `just_confirmed` and `assigned`).
        Returns {old track id: new track id} of the merges."""
        if not just_confirmed:  # most frames: nothing to confirm
            return {}
        by_id = {t.track_id: t for t in self._tracks}
        new_tracks = [by_id[i] for i in sorted(just_confirmed)]
        recognised = self._recognise(new_tracks, t_s)
        rejoined: dict[int, int] = {}
        for new in new_tracks:
            if new.track_id not in recognised:
                new.state, new.ever_confirmed = TrackState.CONFIRMED, True
                continue
            new_id = new.track_id
            old, embedding = recognised[new_id]
            old.kf, old.observed, old.at_observed, old.seen_s = new.kf, new.observed, new.at_observed, new.seen_s
            old.state, old.dormant, old.misses = TrackState.CONFIRMED, False, 0
            old.hits += new.hits
            old.hit_streak = new.hit_streak
            old.embedding = embedding
            new.state = TrackState.ENDED
            assigned[old.track_id] = assigned.pop(new_id)
            just_confirmed.discard(new_id)
            rejoined[old.track_id] = new_id
        return rejoined

    def _recognise(self, new_tracks: list[_Track], t_s: float | None) -> dict[int, tuple[_Track, np.ndarray]]:
        """{new track id: (the LOST track it is, the embedding the two share from now on: the unit
        mean of both)}: the pairs of one assignment that maximises the total cosine similarity of
        their embeddings, each at least reid_threshold, of LOST tracks last seen within the window
        before t_s (one not yet dormant can be older: its misses are counted in frames) and before
        the new track was born (not in one frame with it)."""
        if self.reid_threshold is None:
            return {}
        new = [(t, t.embedding) for t in new_tracks if t.embedding is not None]
        if not new:
            return {}
        shape = new[0][1].shape
        lost = [(t, t.embedding) for t in self._tracks if t.state is TrackState.LOST and t.ever_confirmed
                and t.embedding is not None and t.embedding.shape == shape and self._within_window(t, t_s)]
        if not lost:
            return {}
        similarity = 1.0 - cosine_distance(np.stack([e for _, e in new]), np.stack([e for _, e in lost]))
        # A lost track seen on a frame the new one was already alive in (its last detection is
        # misses frames back, the new track's birth age frames back) was another face in the same
        # frame: two people, however alike, never one (two siblings in view were merged into one).
        together = np.array([[old.misses <= t.age for old, _ in lost] for t, _ in new], bool)
        possible = (similarity >= self.reid_threshold) & ~together
        # a pair that must not be made must not win the assignment either
        rows, cols = linear_sum_assignment(np.where(possible, similarity, -1.0), maximize=True)
        return {new[r][0].track_id: (lost[c][0], _unit(new[r][1] + lost[c][1]))
                for r, c in zip(rows, cols) if possible[r, c]}

    def _absorb_embedding(self, track: _Track, embeddings: np.ndarray | None, di: int) -> None:
        """Fold detection di's embedding into the track's smoothed unit embedding."""
        if embeddings is None:
            return
        e = embeddings[di].astype(np.float64)
        if not np.isfinite(e).all() or not e.any():  # no embedding: a zero one is like no other, itself included
            return
        e = _unit(e)
        if track.embedding is None or track.embedding.shape != e.shape:
            track.embedding = e
        else:
            m = self.embedding_momentum
            track.embedding = _unit(m * track.embedding + (1.0 - m) * e)

    @staticmethod
    def _view(track: _Track, detection_index: int | None, just_confirmed: bool, rejoined: int | None) -> TrackView:
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
            dormant=track.dormant,
            rejoined=rejoined,
        )
