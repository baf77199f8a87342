import itertools

import numpy as np

from tracker.events import EventMaker
from tracker.identity import IdentityVotes
from tracker.tracking import Tracker, TrackState
from tracker.types import Box, Detection


def run(frames, votes_per_frame):
    """Drive the real tracker over `frames` (list of detection lists) and collect events."""
    tracker = Tracker(min_hits=2, max_age=2)
    votes = IdentityVotes()
    ids = (f"e{i}" for i in itertools.count())
    maker = EventMaker(new_id=lambda: next(ids))
    events = []
    for i, (dets, vote) in enumerate(zip(frames, votes_per_frame)):
        views = tracker.update(dets)
        for view in views:
            if view.detection_index is not None and vote:
                votes.add(view.track_id, vote[0])
        events += maker.frame_events(views, votes, t_ns=i, wall_time=1000.0 + i)
    return events


def test_entered_then_identified_then_left_for_one_person():
    frames = [[Detection(Box(100 + 2 * i, 100, 50, 50))] for i in range(6)] + [[]] * 4
    votes = [("unknown", 0.2)] * 2 + [("ann", 0.9)] * 4 + [None] * 4
    events = run(frames, votes)
    assert [(e.kind, e.identity) for e in events] == [("entered", "unknown"), ("identified", "ann"), ("left", "ann")]
    assert [e.id for e in events] == ["e0", "e1", "e2"]
    assert len({e.track_id for e in events}) == 1
    entered, identified, left = events
    assert entered.t_ns == 1 and entered.wall_time == 1001.0
    assert identified.confidence > 0.5 and left.t_ns == 8
    assert abs(left.box.x - 110) < 2  # where it was last seen (coasting would put it near 118)


def test_a_track_that_never_confirms_makes_no_events():
    frames = [[Detection(Box(10, 10, 40, 40))], [], [], [], []]
    assert run(frames, [("ann", 0.9)] + [None] * 4) == []


def test_identity_known_at_confirmation_is_announced_once():
    frames = [[Detection(Box(50, 50, 60, 60))]] * 4
    events = run(frames, [("bob", 0.8)] * 4)
    assert [(e.kind, e.identity) for e in events] == [("entered", "bob")]
    assert np.isclose(events[0].confidence, 1.0)


def test_a_stranger_is_announced_as_unknown_once_the_track_has_enough_faces():
    tracker = Tracker(min_hits=2, max_age=2)
    votes = IdentityVotes(min_faces=4)
    ids = (f"e{i}" for i in itertools.count())
    maker = EventMaker(new_id=lambda: next(ids))
    events = []
    for i in range(10):
        views = tracker.update([Detection(Box(100 + i, 100, 50, 50))] if i < 7 else [])
        for view in views:
            if view.detection_index is not None:
                votes.add(view.track_id, "unknown")
        events += maker.frame_events(views, votes, t_ns=i, wall_time=1000.0 + i)
    assert [(e.kind, e.identity, e.t_ns) for e in events] == [
        ("entered", "unknown", 1), ("identified", "unknown", 3), ("left", "unknown", 9)]


def test_tracks_still_announced_when_the_run_ends_get_their_left():
    tracker = Tracker(min_hits=2, max_age=5)
    votes = IdentityVotes()
    ids = (f"e{i}" for i in itertools.count())
    maker = EventMaker(new_id=lambda: next(ids))
    events = []
    for i in range(4):  # two people, one seen once only (never confirmed, never announced)
        dets = [Detection(Box(100 + i, 100, 50, 50))] + ([Detection(Box(400, 300, 40, 40))] if i == 3 else [])
        views = tracker.update(dets)
        for view in views:
            if view.detection_index is not None:
                votes.add(view.track_id, "ann")
        events += maker.frame_events(views, votes, t_ns=i, wall_time=1000.0 + i)
    closing = maker.close_all(votes, t_ns=99, wall_time=1099.0, seq=3, media_s=0.3)
    assert [(e.kind, e.identity) for e in events] == [("entered", "ann")]
    assert [(e.kind, e.track_id, e.identity, e.t_ns, e.seq, e.media_s) for e in closing] == [
        ("left", events[0].track_id, "ann", 99, 3, 0.3)]
    assert abs(closing[0].box.x - 103) < 0.5 and closing[0].box.y == 100  # where it was last seen
    assert maker.close_all(votes, t_ns=100, wall_time=1100.0) == []  # said once


def test_a_vote_too_close_to_call_does_not_flap_the_announced_identity():
    """ann 3 : bob 2 is ann; 3 : 3 is too close to call, so ann stands (no `identified unknown`);
    then bob pulls clearly ahead: one `identified bob`."""
    tracker = Tracker(min_hits=1, max_age=2)
    votes = IdentityVotes(min_faces=3, margin=0.2)
    ids = (f"e{i}" for i in itertools.count())
    maker = EventMaker(new_id=lambda: next(ids))
    events = []
    for i, name in enumerate(["ann", "ann", "bob", "ann", "bob", "bob", "bob", "bob"]):
        views = tracker.update([Detection(Box(100 + i, 100, 50, 50))])
        votes.add(views[0].track_id, name)
        events += maker.frame_events(views, votes, t_ns=i, wall_time=1000.0 + i)
    assert [(e.kind, e.identity, e.t_ns) for e in events] == [
        ("entered", "unknown", 0), ("identified", "ann", 2), ("identified", "bob", 7)]


def test_a_track_that_leaves_too_close_to_call_leaves_as_what_it_was_announced():
    tracker = Tracker(min_hits=1, max_age=2)
    votes = IdentityVotes(min_faces=3, margin=0.2)
    maker = EventMaker()
    events = []
    for i, name in enumerate(["ann", "ann", "ann", "bob", "bob", "bob"]):  # ann, then 3 : 3
        views = tracker.update([Detection(Box(100 + i, 100, 50, 50))])
        votes.add(views[0].track_id, name)
        events += maker.frame_events(views, votes, t_ns=i, wall_time=1000.0 + i)
    assert votes.ambiguous(views[0].track_id)
    # its confidence is ann's share of the votes, 3 of 6 (the `left` said ann with 0.0)
    assert [(e.kind, e.identity, e.confidence) for e in events + maker.close_all(votes, 9, 1009.0)] == [
        ("entered", "unknown", 0.0), ("identified", "ann", 1.0), ("left", "ann", 0.5)]


def test_a_track_too_close_to_call_at_its_entry_still_gets_its_clear_stranger():
    """ann : bob : unknown at confirmation is too close to call: `entered unknown` with nothing
    decided, so the clear `unknown` later is announced ("a stranger is at the door")."""
    tracker = Tracker(min_hits=3, max_age=2)
    votes = IdentityVotes(min_faces=3, margin=0.2)
    maker = EventMaker()
    events = []
    for i, name in enumerate(["ann", "bob", "unknown"] + ["unknown"] * 6):
        views = tracker.update([Detection(Box(100 + i, 100, 50, 50))])
        votes.add(views[0].track_id, name)
        events += maker.frame_events(views, votes, t_ns=i, wall_time=1000.0 + i)
    assert [(e.kind, e.identity, e.t_ns) for e in events] == [("entered", "unknown", 2), ("identified", "unknown", 3)]


def test_one_frame_s_events_come_entered_identified_left_and_an_ended_track_is_forgotten():
    """Frame 4: X (seen 0-2) ends, Y (born at 3) is confirmed, and Z's vote turns from ann to bob,
    so that frame's events are Y's entered, Z's identified, X's left, in the documented order
    (not the tracks' order, which is X, Z, Y). The maker keeps its per-track state (last box,
    identity announced) for live tracks only: X's goes with it."""
    tracker = Tracker(min_hits=2, max_age=1)
    votes = IdentityVotes()
    ids = (f"e{i}" for i in itertools.count())
    maker = EventMaker(new_id=lambda: next(ids))
    x, z, y = Box(10, 10, 50, 50), Box(150, 10, 50, 50), Box(300, 10, 50, 50)
    script = [[x, z], [x, z], [x, z], [z, y], [z, y]]
    names_of_z = ["ann", "ann", "bob", "bob", "bob"]  # 2 : 2 at frame 3 is a tie: no change yet
    per_frame = []
    for i, boxes in enumerate(script):
        views = tracker.update([Detection(b) for b in boxes])
        for view in views:
            if view.detection_index is not None:
                is_z = boxes[view.detection_index] == z
                votes.add(view.track_id, names_of_z[i] if is_z else "carl")
        per_frame.append(maker.frame_events(views, votes, t_ns=i, wall_time=1000.0 + i))
        live = {v.track_id for v in views if v.state is not TrackState.ENDED}
        assert set(maker._last_seen) <= live and set(maker._announced) <= live, (i, live)
    track_x, track_z, track_y = 1, 2, 3  # born in that order
    assert [(e.kind, e.track_id, e.identity) for e in per_frame[4]] == [
        ("entered", track_y, "carl"), ("identified", track_z, "bob"), ("left", track_x, "carl")]
    assert [(e.kind, e.track_id) for e in per_frame[1]] == [("entered", track_x), ("entered", track_z)]
