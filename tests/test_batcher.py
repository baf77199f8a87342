import numpy as np
import pytest

from tracker.batcher import Batcher


def crops(k, value=0.0):
    return np.full((k, 1, 88, 88), value, np.float32)


def test_streaming_releases_every_frame_on_arrival():
    b = Batcher(max_batch=1, max_wait_ms=1000)
    for seq, k in enumerate([1, 0, 2, 0]):
        batch = b.add(seq, crops(k), t_ns=seq)
        assert batch is not None and batch.items == (seq,) and batch.counts == (k,)
    assert b.flush() is None


def test_groups_across_frames_until_max_batch_keeping_faceless_frames_in_order():
    b = Batcher(max_batch=4, max_wait_ms=1000)
    assert b.add("a", crops(1, 1), 0) is None
    assert b.add("b", crops(0), 1) is None  # waits behind "a" to keep order
    assert b.add("c", crops(2, 3), 2) is None
    batch = b.add("d", crops(1, 4), 3)
    assert batch.items == ("a", "b", "c", "d")
    assert batch.counts == (1, 0, 2, 1)
    assert batch.crops.shape == (4, 1, 88, 88) and batch.crops.flags.c_contiguous
    parts = batch.split(batch.crops[:, 0, 0, 0])
    assert [p.tolist() for p in parts] == [[1.0], [], [3.0, 3.0], [4.0]]


def test_faceless_frame_with_nothing_pending_passes_straight_through():
    b = Batcher(max_batch=8, max_wait_ms=1000)
    batch = b.add("empty", crops(0), 0)
    assert batch.items == ("empty",) and batch.crops.shape == (0, 1, 88, 88)


def test_deadline_counts_from_first_frame_with_crops():
    """A crop-less frame before it starts no clock, and later frames with crops do not move it: the
    first face waits at most max_wait_ms, however many faces join its run."""
    b = Batcher(max_batch=8, max_wait_ms=30)
    assert b.add("empty", crops(0), t_ns=0) is not None  # nothing waits: no deadline from it
    b.add("a", crops(1), t_ns=1_000_000)
    assert b.deadline_ns() == 31_000_000
    assert b.add("b", crops(2), t_ns=20_000_000) is None
    assert b.deadline_ns() == 31_000_000
    assert b.due(30_999_999) is None
    batch = b.due(31_000_000)
    assert batch.items == ("a", "b") and batch.counts == (1, 2)
    assert b.deadline_ns() is None


def test_a_frame_with_more_faces_than_max_batch_is_kept_whole():
    b = Batcher(max_batch=2, max_wait_ms=10)
    batch = b.add("crowd", crops(5), 0)
    assert batch.counts == (5,) and len(batch.crops) == 5


def test_rejects_nonsense_settings():
    with pytest.raises(ValueError, match="max_batch 0"):
        Batcher(max_batch=0, max_wait_ms=1)


def test_a_run_of_large_frames_with_few_faces_is_released_at_its_byte_bound():
    """The run holds each frame whole until its batch returns: with a large max_batch and a long
    wait, 1080p frames of one face each would wait by the hundred."""
    b = Batcher(max_batch=256, max_wait_ms=5000, max_frame_bytes=30_000_000)
    frame_bytes = 1920 * 1080 * 3
    released = [b.add(seq, crops(1), t_ns=seq, frame_bytes=frame_bytes) for seq in range(12)]
    assert [i for i, batch in enumerate(released) if batch is not None] == [4, 9]
    assert released[4].items == (0, 1, 2, 3, 4) and released[9].items == (5, 6, 7, 8, 9)
    assert b.flush().items == (10, 11)


def releases(batcher: Batcher, gaps_ms: list[int]) -> list[tuple[str, tuple]]:
    """Frames of one face each at these gaps (ms) as the guard's loop feeds them (the run found
    due when the next frame is taken, then the frame added): [(how, the items released)]."""
    released, t_ns = [], 0
    for seq, gap in enumerate([0, *gaps_ms]):
        t_ns += gap * 1_000_000
        for how, batch in (("due", batcher.due(t_ns)), ("add", batcher.add(seq, crops(1), t_ns))):
            if batch is not None:
                released.append((how, batch.items))
    return released


def test_a_run_goes_at_once_when_the_next_frame_cannot_come_before_its_deadline():
    """A camera at 10 frames/s with max_wait_ms 30: every frame with faces waited out the 30 ms,
    though the next frame comes 100 ms later and can never join its run."""
    released = releases(Batcher(max_batch=8, max_wait_ms=30), [100] * 11)
    # until GAPS_KEPT gaps are known each waits for its deadline, found passed by the next frame
    assert released == [("due", (seq,)) for seq in range(8)] + [("add", (seq,)) for seq in range(8, 12)]


def test_frames_that_can_still_join_a_run_keep_it_waiting_whatever_one_late_frame_says():
    """At 10 ms gaps a run of 30 ms takes three frames, the third released on arrival (the fourth
    would come at the deadline); one late frame (45 ms) among them does not make the source look
    slow: the shortest recent gap counts."""
    released = releases(Batcher(max_batch=8, max_wait_ms=30), [10] * 8 + [45] + [10] * 5)
    assert released == [("due", (0, 1, 2)), ("due", (3, 4, 5)),  # GAPS_KEPT gaps not known yet
                        ("add", (6, 7, 8)), ("add", (9, 10, 11)), ("add", (12, 13, 14))]
