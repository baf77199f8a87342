"""The tracker's state machine, identities and determinism (tracker/tracking/sort.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.config import TrackingConfig
from tracker.tracking import Tracker, TrackState, TrackView
from tracker.types import Box, Detection


def det(x, y, w=40, h=40, score=1.0) -> Detection:
    return Detection(Box(float(x), float(y), float(w), float(h)), score)


def by_id(views: list[TrackView]) -> dict[int, TrackView]:
    return {v.track_id: v for v in views}


def test_tentative_then_confirmed_after_min_hits():
    tr = Tracker(min_hits=3, max_age=2, iou_threshold=0.3)
    states, confirmed_now = [], []
    for t in range(5):
        (v,) = tr.update([det(100 + 2 * t, 100)])
        states.append(v.state)
        confirmed_now.append(v.just_confirmed)
        assert v.track_id == 1 and v.detection_index == 0
        assert v.entered == v.just_confirmed
    assert states == [TrackState.TENTATIVE, TrackState.TENTATIVE, TrackState.CONFIRMED, TrackState.CONFIRMED, TrackState.CONFIRMED]
    assert confirmed_now == [False, False, True, False, False]
    assert v.hits == 5 and v.hit_streak == 5 and v.age == 4 and not v.entered


def test_carried_detections_keep_confirmed_tracks_but_confirm_and_start_none():
    """The guard carries the last frame's faces over while nothing moves: a still person stays, but
    one detection repeated is no evidence of a face (it confirmed a false one in min_hits frames)."""
    tr = Tracker(min_hits=3, max_age=2, iou_threshold=0.3)
    for _ in range(3):
        tr.update([det(100, 100)])  # confirmed on its own detections
    (fresh,) = [v for v in tr.update([det(100, 100), det(300, 100)]) if v.track_id == 2]
    assert fresh.state is TrackState.TENTATIVE
    for _ in range(10):  # a still scene: both carried
        views = by_id(tr.update([det(100, 100), det(300, 100), det(500, 100)], carried=True))
        assert views[1].state is TrackState.CONFIRMED and views[1].detection_index == 0
        assert views[2].state is TrackState.TENTATIVE and views[2].hits == 1 and not views[2].entered  # held
        assert set(views) == {1, 2}  # the third carried box starts nothing
    views = by_id(tr.update([det(100, 100), det(300, 100)]))  # motion again, the face detected anew
    assert views[2].state is TrackState.TENTATIVE and views[2].hits == 2
    views = by_id(tr.update([det(100, 100), det(300, 100)]))
    assert views[2].state is TrackState.CONFIRMED and views[2].entered


def test_min_hits_one_confirms_on_birth():
    (v,) = Tracker(min_hits=1).update([det(0, 0)])
    assert v.state is TrackState.CONFIRMED and v.just_confirmed and v.ever_confirmed


def test_lost_then_ended_after_max_age_missed_frames():
    tr = Tracker(min_hits=2, max_age=3, iou_threshold=0.3)
    for t in range(3):
        tr.update([det(10 * t, 0, 60, 60)])
    timeline = []
    for _ in range(5):  # frames without detections: the tracker is still called
        views = tr.update([])
        timeline.append([(v.track_id, v.state, v.misses) for v in views])
    assert timeline == [
        [(1, TrackState.LOST, 1)],
        [(1, TrackState.LOST, 2)],
        [(1, TrackState.LOST, 3)],
        [(1, TrackState.ENDED, 4)],  # reported once, on the frame it ends...
        [],  # ...then forgotten
    ]
    assert tr.live_count == 0


def test_lost_track_keeps_moving_and_is_reacquired_without_new_entry():
    tr = Tracker(min_hits=2, max_age=5, iou_threshold=0.3)
    for t in range(6):
        tr.update([det(100 + 5 * t, 50)])
    for t in range(6, 9):  # occluded for three frames
        (v,) = tr.update([])
        assert v.state is TrackState.LOST and v.detection_index is None and not v.visible
        assert v.box.x == pytest.approx(100 + 5 * t, abs=1.0)  # predicted along its motion
    (v,) = tr.update([det(100 + 5 * 9, 50)])
    assert v.track_id == 1 and v.state is TrackState.CONFIRMED
    assert not v.just_confirmed and v.misses == 0 and v.hit_streak == 1 and v.visible


def test_tentative_track_that_misses_ends_without_leaving():
    tr = Tracker(min_hits=3, max_age=10)
    tr.update([det(0, 0)])
    (v,) = tr.update([])
    assert v.state is TrackState.ENDED and not v.ever_confirmed and not v.left
    assert tr.live_count == 0


def test_confirmed_track_that_ends_leaves():
    tr = Tracker(min_hits=1, max_age=1)
    tr.update([det(0, 0)])
    assert tr.update([])[0].state is TrackState.LOST
    (v,) = tr.update([])
    assert v.left and v.state is TrackState.ENDED


def test_ids_unique_and_increasing_in_birth_order():
    tr = Tracker(min_hits=1, max_age=1)
    seen = []
    for t in range(30):
        dets = [det(300 * k + (t % 7) * 50, 0) for k in range(1 + t % 3)]  # people come and go
        for v in tr.update(dets):
            if v.age == 0:
                seen.append(v.track_id)
    assert seen == sorted(seen) and len(seen) == len(set(seen)) and seen[0] == 1


def test_no_detections_ever():
    tr = Tracker()
    for _ in range(5):
        assert tr.update([]) == []
    assert tr.live_count == 0


def test_crossing_tracks_keep_their_ids():
    """Two people walk towards each other along the same line, overlap fully, and part."""
    tr = Tracker(min_hits=2, max_age=3, iou_threshold=0.3, embedding_weight=0.0)
    first = {}
    for t in range(40):
        a = det(20 + 6 * t, 100)  # left to right
        b = det(260 - 6 * t, 104)  # right to left
        views = by_id(tr.update([a, b]))
        assert len(views) == 2 and all(v.detection_index is not None for v in views.values())
        for v in views.values():
            x = v.box.x
            first.setdefault(v.track_id, x)
        if t == 39:
            # The track born on the left is now on the right, and vice versa.
            left_born = min(first, key=first.get)
            right_born = max(first, key=first.get)
            assert views[left_born].box.x == pytest.approx(20 + 6 * t, abs=2)
            assert views[right_born].box.x == pytest.approx(260 - 6 * t, abs=2)
            assert sorted(views) == [1, 2]


def test_embeddings_separate_two_people_who_stand_still_together():
    """Same box, different faces: the embedding keeps each detection with its track."""
    tr = Tracker(min_hits=1, max_age=3, iou_threshold=0.3, embedding_weight=0.5)
    ea, eb = np.eye(4, dtype=np.float32)[0], np.eye(4, dtype=np.float32)[1]
    tr.update([det(0, 0), det(40, 0)], np.stack([ea, eb]))
    # Both step into the same spot (IoU 1/3 with each track); the detections come in either order.
    views = by_id(tr.update([det(20, 0), det(20, 0)], np.stack([eb, ea])))
    assert views[1].detection_index == 1 and views[2].detection_index == 0
    views = by_id(tr.update([det(20, 0), det(20, 0)], np.stack([ea, eb])))
    assert views[1].detection_index == 0 and views[2].detection_index == 1


def test_embedding_shape_is_checked():
    with pytest.raises(ValueError, match="shape"):
        Tracker().update([det(0, 0)], np.zeros((2, 8), np.float32))


def test_from_config_and_parameter_validation():
    """Every tracker setting of TrackingConfig, each away from its default, reaches the tracker
    (reid_threshold comes as a keyword: the guard takes it from the weights' card unless the config
    sets it, tracker.stages.reid_threshold); each bad value is refused naming its parameter."""
    settings = {"min_hits": 2, "max_age": 7, "iou_threshold": 0.4, "embedding_weight": 0.1, "high_score": 0.6,
                "observation_centric": True, "reid_window_s": 4.5}
    defaults = TrackingConfig()
    assert all(getattr(defaults, name) != value for name, value in settings.items())
    tr = Tracker.from_config(TrackingConfig(**settings), reid_threshold=0.7)
    assert {name: getattr(tr, name) for name in settings} == settings
    assert tr.reid_threshold == 0.7
    for name, value in (("min_hits", 0), ("max_age", 0), ("iou_threshold", 1.5), ("low_iou_threshold", -0.1),
                        ("embedding_weight", -1), ("embedding_momentum", 1.0), ("reid_threshold", 1.5),
                        ("reid_window_s", -1.0)):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            Tracker(**{name: value})


def test_views_are_frozen():
    (v,) = Tracker(min_hits=1).update([det(0, 0)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.state = TrackState.ENDED  # type: ignore[misc]


def _scene(seed: int, frames: int = 40):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(frames):
        dets = [det(rng.uniform(0, 300), rng.uniform(0, 300), rng.uniform(20, 60), rng.uniform(20, 60), rng.uniform(0.1, 1.0))
                for _ in range(rng.integers(0, 6))]
        emb = rng.random((len(dets), 8)).astype(np.float32)
        out.append((dets, emb))
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 6), st.sampled_from([None, 0.5]),
       st.booleans(), st.sampled_from([None, 0.8]))
def test_deterministic_and_consistent(seed, min_hits, max_age, high_score, observation_centric, reid_threshold):
    """Two trackers fed the same frames return equal views; invariants hold on random input, with
    every stage on or off."""
    scene = _scene(seed)
    options = dict(high_score=high_score, observation_centric=observation_centric, reid_threshold=reid_threshold,
                   reid_window_s=1.0)
    a = Tracker(min_hits, max_age, 0.2, 0.3, **options)
    b = Tracker(min_hits, max_age, 0.2, 0.3, **options)
    ended: set[int] = set()
    for t, (dets, emb) in enumerate(scene):
        va, vb = a.update(dets, emb, t_s=0.1 * t), b.update(dets, emb, t_s=0.1 * t)
        assert va == vb
        assert [v.track_id for v in va] == sorted({v.track_id for v in va})
        used = [v.detection_index for v in va if v.detection_index is not None]
        high = [i for i, d in enumerate(dets) if high_score is None or d.score >= high_score]
        assert len(used) == len(set(used)) and set(high) <= set(used)  # a high-score detection feeds one track
        for v in va:
            assert v.track_id not in ended
            assert v.box.w > 0 and v.box.h > 0
            if v.state is TrackState.ENDED:
                ended.add(v.track_id)
            if v.state in (TrackState.CONFIRMED, TrackState.LOST):
                assert v.ever_confirmed
            assert v.misses <= max_age + 1 or (v.dormant and reid_threshold is not None)
            assert v.rejoined is None or v.state is TrackState.CONFIRMED


# -- ByteTrack: low-score detections ---------------------------------------------------------------


def test_a_low_score_detection_continues_a_confirmed_track_but_starts_none():
    tr = Tracker(min_hits=2, max_age=1, high_score=0.6)
    for t in range(3):
        (v,) = tr.update([det(100 + 5 * t, 100, score=0.9)])
    assert v.state is TrackState.CONFIRMED
    # Half turned away: the detector is unsure, the track goes on with it.
    (v,) = tr.update([det(115, 100, score=0.3)])
    assert (v.track_id, v.state, v.detection_index) == (1, TrackState.CONFIRMED, 0)
    # An unsure box elsewhere is not a person the tracker knows: no new track.
    views = tr.update([det(400, 300, score=0.3)])
    assert [(v.track_id, v.state, v.detection_index) for v in views] == [(1, TrackState.LOST, None)]
    # Without a high-score threshold every detection starts a track (plain SORT).
    plain = Tracker(min_hits=2, max_age=1)
    assert [v.track_id for v in plain.update([det(400, 300, score=0.3)])] == [1]


def test_a_low_score_detection_needs_the_stricter_overlap():
    """IoU 0.4 with the prediction: enough for a high-score box (iou_threshold 0.3), not for a
    low-score one (low_iou_threshold 0.5)."""
    def confirmed() -> Tracker:
        tr = Tracker(min_hits=1, max_age=2, high_score=0.6)
        tr.update([det(0, 0, 100, 100, score=0.9)])
        return tr

    shifted = 100 * (1 - 0.4) / (1 + 0.4)  # a 100 px box moved this far right has IoU 0.4
    (v,) = confirmed().update([det(shifted, 0, 100, 100, score=0.9)])
    assert v.detection_index == 0
    views = confirmed().update([det(shifted, 0, 100, 100, score=0.3)])
    assert [(v.track_id, v.detection_index) for v in views] == [(1, None)]


# -- OC-SORT: recovery by the last observation, re-update after a gap ------------------------------


def _walk_then_stop(tr: Tracker) -> list[list[TrackView]]:
    """Walks right at 10 px/frame for 6 frames, is missed for 3 frames while it stops, and is seen
    again where it stopped: the constant-velocity prediction has run 40 px ahead (IoU 0)."""
    frames = [tr.update([det(10 * t, 0)]) for t in range(6)]
    frames += [tr.update([]) for _ in range(3)]
    frames.append(tr.update([det(50, 0)]))
    return frames


def test_a_track_whose_prediction_ran_ahead_is_recovered_by_its_last_observed_box():
    last = _walk_then_stop(Tracker(min_hits=2, max_age=5, embedding_weight=0.0, observation_centric=True))[-1]
    assert [(v.track_id, v.state, v.detection_index) for v in last] == [(1, TrackState.CONFIRMED, 0)]
    # Without observation-centric recovery the prediction no longer overlaps: a new track is born.
    sort_only = _walk_then_stop(Tracker(min_hits=2, max_age=5, embedding_weight=0.0, observation_centric=False))[-1]
    assert [(v.track_id, v.detection_index) for v in sort_only] == [(1, None), (2, 0)]


def test_re_update_after_a_gap_learns_the_speed_of_the_gap():
    """10 px/frame, missed for 4 frames while speeding up to 20 px/frame, seen again: re-updating
    along the straight path of the gap gives a velocity near 20; one update at the end leaves most
    of the old speed in the filter."""
    def velocity(observation_centric: bool) -> float:
        tr = Tracker(min_hits=1, max_age=10, embedding_weight=0.0, observation_centric=observation_centric)
        for t in range(8):
            tr.update([det(10 * t, 0, 200, 200)])
        for _ in range(4):
            tr.update([])
        (v,) = tr.update([det(70 + 5 * 20, 0, 200, 200)])
        assert v.detection_index == 0
        (next_box,) = tr.predicted_boxes()
        return next_box.x - v.box.x

    with_reupdate, without = velocity(True), velocity(False)
    assert abs(with_reupdate - 20) < abs(without - 20)
    assert with_reupdate > 15


# -- re-identification by face -------------------------------------------------------------------


FACE_A, FACE_B = np.eye(8, dtype=np.float32)[0:1], np.eye(8, dtype=np.float32)[1:2]


def _seen_then_hidden(tr: Tracker, hidden_frames: int) -> list[list[TrackView]]:
    """Face A confirmed at (0, 0) over frames 0..2 (0.1 s apart), then hidden for `hidden_frames`."""
    out = [tr.update([det(0, 0)], FACE_A, t_s=0.1 * t) for t in range(3)]
    out += [tr.update([], None, t_s=0.1 * (3 + k)) for k in range(hidden_frames)]
    return out


def test_reidentification_needs_the_frame_time():
    with pytest.raises(ValueError, match="t_s"):
        Tracker(reid_threshold=0.8).update([det(0, 0)])


def test_a_face_back_after_max_age_continues_its_old_track():
    tr = Tracker(min_hits=2, max_age=2, reid_threshold=0.8, reid_window_s=5.0)
    frames = _seen_then_hidden(tr, 6)
    assert [(v.state, v.dormant) for v in frames[-1]] == [(TrackState.LOST, True)]  # not ended: held
    assert tr.predicted_boxes() == []  # a dormant track is not searched for by position
    # The same face comes back elsewhere: a new tentative track first...
    t = 0.9
    (v,) = [v for v in tr.update([det(300, 200)], FACE_A, t_s=t) if v.track_id == 2]
    assert v.state is TrackState.TENTATIVE
    # ...which, when it would be confirmed, is recognised as track 1: no new confirmation.
    views = by_id(tr.update([det(302, 200)], FACE_A, t_s=t + 0.1))
    old, new = views[1], views[2]
    assert (old.state, old.detection_index, old.rejoined, old.just_confirmed) == (TrackState.CONFIRMED, 0, 2, False)
    assert old.box.x == pytest.approx(302, abs=3) and not old.dormant
    assert (new.state, new.ever_confirmed, new.detection_index, new.left) == (TrackState.ENDED, False, None, False)
    (v,) = tr.update([det(304, 200)], FACE_A, t_s=t + 0.2)
    assert (v.track_id, v.state, v.detection_index, v.rejoined) == (1, TrackState.CONFIRMED, 0, None)


def test_a_different_face_is_a_new_person_and_the_held_track_leaves_after_its_window():
    tr = Tracker(min_hits=2, max_age=2, reid_threshold=0.8, reid_window_s=1.0)
    _seen_then_hidden(tr, 4)  # last seen at t 0.2
    entered, left = [], []
    for k in range(12):
        t = 0.7 + 0.1 * k
        for v in tr.update([det(300 + 2 * k, 200)], FACE_B, t_s=t):
            entered += [(v.track_id, round(t, 1))] if v.entered else []
            left += [(v.track_id, round(t, 1))] if v.left else []
    # B is announced as a new person; A's `left` comes once 1 s has passed since A was last seen.
    assert entered == [(2, 0.8)] and left == [(1, 1.3)]


def test_a_lost_track_older_than_the_window_is_not_recognised_though_not_yet_dormant():
    """Misses are counted in frames: frames far apart in time (a camera that came back after an
    outage, a slow recording) left a track LOST, not dormant, past its window, and a face found
    26 s later rejoined it against a window of 10 s."""
    tr = Tracker(min_hits=2, max_age=5, reid_threshold=0.8, reid_window_s=1.0)
    _seen_then_hidden(tr, 0)  # A last seen at t 0.2
    (v,) = tr.update([], None, t_s=5.0)  # one miss, 4.8 s later: LOST, not dormant
    assert (v.state, v.dormant) == (TrackState.LOST, False)
    tr.update([det(300, 200)], FACE_A, t_s=5.1)
    views = by_id(tr.update([det(302, 200)], FACE_A, t_s=5.2))
    assert views[2].entered and views[2].rejoined is None and views[1].state is TrackState.LOST


def test_end_all_ends_every_track_and_new_ids_go_on():
    tr = Tracker(min_hits=2, max_age=2, reid_threshold=0.8, reid_window_s=5.0)
    _seen_then_hidden(tr, 6)  # track 1 dormant
    tr.update([det(300, 200)], FACE_B, t_s=1.0)  # track 2 tentative
    assert tr.end_all() == [1, 2] and tr.live_count == 0 and tr.predicted_boxes() == []
    (v,) = tr.update([det(0, 0)], FACE_A, t_s=1.1)  # A again: a new track, nothing to rejoin
    assert (v.track_id, v.state) == (3, TrackState.TENTATIVE)


@pytest.mark.parametrize("embedding", [None, np.zeros((1, 4), np.float32), np.full((1, 4), np.nan, np.float32)])
def test_a_track_without_an_embedding_ends_at_max_age_even_with_reidentification_on(embedding):
    """An all-zero embedding is none (it was kept as the track's, which then waited the whole
    re-identification window for a face no other can match)."""
    tr = Tracker(min_hits=2, max_age=2, reid_threshold=0.8, reid_window_s=5.0)
    for t in range(3):
        tr.update([det(0, 0)], embedding, t_s=0.1 * t)
    views = [tr.update([], None, t_s=0.3 + 0.1 * k)[0] for k in range(3)]
    assert [v.state for v in views] == [TrackState.LOST, TrackState.LOST, TrackState.ENDED]


def test_new_tracks_confirmed_together_are_paired_with_the_lost_ones_by_one_assignment():
    """Two people hidden, two faces back on one frame. Taken in id order, the first new track took
    B (similarity 0.80), its best, and left the second, which is B for sure (0.98), a stranger
    against A (0.20): a wrong `entered`. One assignment gives A to the first (0.60) and B to the
    second."""
    tr = Tracker(min_hits=2, max_age=2, reid_threshold=0.55, reid_window_s=5.0)
    a, b = FACE_A, FACE_B
    for t in range(3):
        tr.update([det(0, 0), det(300, 0)], np.concatenate([a, b]), t_s=0.1 * t)
    for k in range(6):
        tr.update([], None, t_s=0.1 * (3 + k))
    first = np.array([[0.6, 0.8, 0, 0, 0, 0, 0, 0]], np.float32)
    second = np.array([[0.2, 0.98, 0, 0, 0, 0, 0, 0]], np.float32)
    second /= np.linalg.norm(second)
    entered = []
    for k in range(3):
        views = tr.update([det(100, 200), det(400, 200)], np.concatenate([first, second]), t_s=1.0 + 0.1 * k)
        entered += [v.track_id for v in views if v.entered]
    views = by_id(views)
    assert entered == [] and views[1].detection_index == 0 and views[2].detection_index == 1


def test_a_lost_track_seen_in_one_frame_with_the_new_one_is_another_person():
    """Two people alike (siblings) in view together, the first then missed on the frame the
    second's track is confirmed: the second was recognised as the first, merged into its track,
    which jumped across the room, and the second person's `entered` was never said."""
    tr = Tracker(min_hits=3, max_age=10, reid_threshold=0.8, reid_window_s=5.0)
    for t in range(3):
        tr.update([det(0, 0)], FACE_A, t_s=0.1 * t)  # track 1 confirmed
    for t in range(3, 5):
        tr.update([det(0, 0), det(300, 0)], np.concatenate([FACE_A, FACE_A]), t_s=0.1 * t)  # both in view
    views = by_id(tr.update([det(300, 0)], FACE_A, t_s=0.5))  # the first missed; track 2's third hit
    assert (views[1].state, views[1].detection_index, views[1].rejoined) == (TrackState.LOST, None, None)
    assert views[2].entered and views[2].state is TrackState.CONFIRMED


def test_tracks_past_the_bound_end_the_longest_missed_first(monkeypatch):
    """Ten fresh faces a frame, confirmed at once and kept 1,000 frames: the tracks (and the cost
    matrices over them) grew without bound (eval-mot took 2.2 GB in 40 frames of 1,000 boxes)."""
    import tracker.tracking.sort as sort

    monkeypatch.setattr(sort, "MAX_TRACKS", 25)
    tr = Tracker(min_hits=1, max_age=1000)
    ended = []
    for frame in range(5):
        views = tr.update([det(100 * i, 100 * frame) for i in range(10)])
        ended += [(frame, v.track_id) for v in views if v.state is TrackState.ENDED]
        assert tr.live_count <= 25
    # frames 0-2 make 30 tracks: the 5 of frame 0 missed longest (ids 1-5) end on frame 2; frame 3's
    # ten more end frame 0's other 5 and frame 1's 5, frame 4's the rest of frame 1's and 5 of frame 2's
    assert ended == [(2, i) for i in range(1, 6)] + [(3, i) for i in range(6, 16)] + [(4, i) for i in range(16, 26)]
    assert all(v.left for v in views if v.state is TrackState.ENDED)  # announced: they were confirmed
