import os

import numpy as np
import pytest

from tracker.errors import InputError
from tracker.identity import UNKNOWN, Gallery, IdentityVotes, save_person, validate_name


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "..", ".hidden", "unknown", "x" * 65, "a b", "a..b"])
def test_names_that_could_escape_or_clash_are_refused(bad):
    with pytest.raises(InputError, match="enroll: bad name"):
        validate_name(bad)


def test_a_name_with_a_letter_beyond_ascii_is_refused_saying_ascii_letters():
    """'Zoë' was refused with "expected 1-64 letters, ...", and ë is a letter."""
    with pytest.raises(InputError, match=r"bad name 'Zoë'; expected 1-64 ASCII letters \(A-Z, a-z\), digits"):
        validate_name("Zoë")


def test_enrolled_people_are_matched_by_cosine_with_unknown_below_threshold(tmp_path):
    rng = np.random.default_rng(0)
    ann, bob = rng.standard_normal(128), rng.standard_normal(128)
    save_person(tmp_path, "ann", ann + 0.1 * rng.standard_normal((5, 128)), "sha-A", "box-v1")
    save_person(tmp_path, "bob", bob + 0.1 * rng.standard_normal((5, 128)), "sha-A", "box-v1")
    gallery = Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=128)
    assert gallery.names == ("ann", "bob") and gallery.means.shape == (2, 128)
    queries = np.stack([3 * ann, bob, rng.standard_normal(128)]).astype(np.float32)
    (n0, s0), (n1, s1), (n2, s2) = gallery.match(queries)
    assert (n0, n1, n2) == ("ann", "bob", UNKNOWN)
    assert s0 > 0.9 and s1 > 0.9 and s2 < 0.5
    # Cosines: the length of a query does not count (a threshold on raw dot products would name
    # anyone whose embedding came out long), and every value lies in [-1, 1].
    sims = gallery.similarities(queries)
    assert np.all(np.abs(sims) <= 1.0 + 1e-6)
    assert gallery.similarities(queries * np.float32([[0.01], [7.0], [100.0]])) == pytest.approx(sims, abs=1e-6)


def test_people_enrolled_with_other_weights_are_skipped(tmp_path, caplog):
    save_person(tmp_path, "ann", np.ones((1, 4)), "old-weights", "box-v1")
    gallery = Gallery.load(tmp_path, "new-weights", threshold=0.5, crop="box-v1", width=4)
    assert gallery.names == ()
    assert gallery.match(np.ones((2, 4), np.float32)) == [(UNKNOWN, 0.0)] * 2
    assert "other model weights" in caplog.text


def test_damaged_enrolment_files_are_skipped_with_a_warning_and_the_others_load(tmp_path, caplog):
    """A file that is not a whole archive of the expected members is one warning, never a crash
    of the guard at start-up (an empty file raised EOFError, a .npy array TypeError) nor a hang (a
    FIFO)."""
    from tracker.identity import kept_crops, person_chip, refresh_people

    save_person(tmp_path, "ann", np.ones((1, 4)), "sha-A", "box-v1", np.zeros((1, 1, 88, 88), np.float32))
    people = tmp_path / "people"
    whole = (people / "ann.npz").read_bytes()
    (people / "empty.npz").write_bytes(b"")
    (people / "cut.npz").write_bytes(whole[: len(whole) // 2])
    with np.load(people / "ann.npz") as data:
        mean_bytes = data["mean"].tobytes()
    flipped = bytearray(whole)
    flipped[whole.index(mean_bytes)] ^= 0xFF  # inside the mean: its member's CRC no longer matches
    (people / "flipped.npz").write_bytes(bytes(flipped))
    np.save(people / "array.npy", np.ones(4))
    (people / "array.npy").rename(people / "array.npz")
    (people / "text.npz").write_text("not an archive")
    np.savez(people / "nomean.npz", model=np.str_("sha-A"))
    os.mkfifo(people / "fifo.npz")  # opened as np.load did, it waited for a writer for ever
    damaged = ("array", "cut", "empty", "fifo", "flipped", "nomean", "text")
    assert Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=4).names == ("ann",)
    for name in damaged:
        assert f"skipping {people / name}.npz: unreadable" in caplog.text
        if name != "flipped":  # whose chips are whole
            assert person_chip(tmp_path, name) is None
            with pytest.raises(InputError, match=f"enroll: cannot add a face to '{name}': .*{name}.npz' is "):
                kept_crops(tmp_path, name, "box-v1")  # adding to it would have replaced it
    assert kept_crops(tmp_path, "nobody", "box-v1") is None and kept_crops(tmp_path, "ann", "box-v1").shape == (1, 1, 88, 88)
    with pytest.raises(InputError, match="'ann'.* is enrolled from 'box-v1' crops, not this detector's 'aligned-v1'"):
        kept_crops(tmp_path, "ann", "aligned-v1")
    done = refresh_people(tmp_path, None, "sha-A", "box-v1", 4)  # ann is current; the others cannot be recomputed
    assert done.recomputed == done.unwritten == () and [name for name, _ in done.stale] == sorted(damaged)
    assert dict(done.stale)["empty"] == "unreadable (BadZipFile)"


def test_the_temporary_file_of_an_interrupted_write_is_not_a_person(tmp_path):
    """atomic_write's `.NAME.PID.HEX.tmp.npz`, left by a kill between its write and its rename."""
    from tracker.identity import Refreshed, people_files, refresh_people

    for name, key in (("ann", "sha-A"), ("carol", "sha-A"), ("old", "sha-B")):
        save_person(tmp_path, name, np.ones((1, 4)), key, "box-v1", np.zeros((1, 1, 88, 88), np.float32))
    people = tmp_path / "people"
    (people / "old.npz").rename(people / ".carol.7812.259c5dfa.tmp.npz")  # carol's, as the weights were before
    assert [p.name for p in people_files(tmp_path)] == ["ann.npz", "carol.npz"]
    assert Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=4).names == ("ann", "carol")
    assert refresh_people(tmp_path, None, "sha-A", "box-v1", 4) == Refreshed()  # nothing to recompute (no backend needed)


def test_a_person_that_cannot_be_written_is_one_line_and_the_refresh_goes_on(tmp_path, caplog):
    """A full disk: `tracker enroll` says so in one line (exit 1); the guard's refresh at start
    leaves that person's file as it was and goes on with the others."""
    from tmpfs import tmpfs

    from tracker.errors import TrackerError
    from tracker.identity import Refreshed, refresh_people

    class Embedder:
        def infer(self, crops):
            return type("Inference", (), {"embedding": np.ones((len(crops), 4), np.float32)})()

    with tmpfs(tmp_path / "state", "size=256k") as state:
        chips = np.zeros((2, 1, 88, 88), np.float32)
        for name in ("ann", "bob"):
            save_person(state, name, np.ones((2, 4)), "sha-A", "box-v1", chips)
        (state / "filler").write_bytes(b"\0" * (os.statvfs(state).f_bavail * os.statvfs(state).f_frsize))
        with pytest.raises(TrackerError, match=r"enroll: cannot write '.*/people/carol.npz' \(No space left on "
                                               r"device\); expected room on the disk"):
            save_person(state, "carol", np.ones((2, 4)), "sha-A", "box-v1", chips)
        assert refresh_people(state, Embedder(), "sha-B", "box-v1", 4) == Refreshed(unwritten=("ann", "bob"))
        assert caplog.text.count("No space left on device") == 2 and "bob stays as it was" in caplog.text
        assert sorted(p.name for p in (state / "people").iterdir()) == [".lock", "ann.npz", "bob.npz"]  # no temporary left
        (state / "filler").unlink()
        assert refresh_people(state, Embedder(), "sha-B", "box-v1", 4) == Refreshed(recomputed=("ann", "bob"))


def test_the_embeddings_key_names_the_weights_how_their_card_embeds_and_the_blob(tmp_path):
    """People enrolled with the same bytes but another embedding recipe or blob are not comparable:
    the key tells them apart, so the guard recomputes them (refresh_people) rather than mixing. The
    default blob's key is as it was before the blob was in it: people enrolled then still match."""
    from tracker.config import parse_config
    from tracker.files import file_sha256
    from tracker.identity import embeddings_key
    from tracker.model.card import write_card

    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(b"weights")
    config = parse_config({"model": {"weights": str(weights)}})
    sha256 = file_sha256(weights)
    assert embeddings_key(config) == sha256  # no card: one pass
    write_card(weights, {"weights_sha256": sha256, "embedding": "mirror-mean"})
    assert embeddings_key(config) == f"{sha256}+mirror-mean"
    fc2 = parse_config({"model": {"weights": str(weights), "embedding": "fc2"}})  # another blob, another width
    assert embeddings_key(fc2) == f"{sha256}+mirror-mean@fc2"
    assert embeddings_key(parse_config({"model": {"weights": str(weights), "embedding": "fc1"}})) == f"{sha256}+mirror-mean"
    save_person(tmp_path, "ann", np.ones((1, 4)), sha256, "box-v1", np.zeros((1, 1, 88, 88), np.float32))
    assert Gallery.load(tmp_path, embeddings_key(config), threshold=0.5, crop="box-v1", width=4).names == ()


def test_a_mean_that_is_not_a_vector_of_the_nets_width_is_skipped_then_recomputed(tmp_path, caplog):
    """Under one key, a person of another embedding blob (848 wide among 128-wide ones) made the
    gallery's stack raise ValueError: identify's traceback, the running guard's death at its next
    reload. Skipped with a warning; a refresh recomputes those whose crops were kept."""
    from tracker.identity import Refreshed, refresh_people

    class Embedder:
        def infer(self, crops):
            return type("Inference", (), {"embedding": np.tile(np.eye(4, dtype=np.float32)[1], (len(crops), 1))})()

    save_person(tmp_path, "ann", np.eye(4)[:1], "sha-A", "box-v1", np.zeros((1, 1, 88, 88), np.float32))
    save_person(tmp_path, "wide", np.ones((1, 6)), "sha-A", "box-v1", np.zeros((1, 1, 88, 88), np.float32))
    np.savez(tmp_path / "people" / "flat.npz", mean=np.ones((2, 2), np.float32), model=np.str_("sha-A"))  # no crops
    gallery = Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=4)
    assert gallery.names == ("ann",) and gallery.means.shape == (1, 4)
    assert ("skipping wide: its mean is float32 of shape (6,), not the net's (4,) float embedding; `tracker enroll "
            "--refresh` recomputes it if its crops were kept") in caplog.text
    assert "skipping flat: its mean is float32 of shape (2, 2)" in caplog.text
    done = refresh_people(tmp_path, Embedder(), "sha-A", "box-v1", 4)
    assert done == Refreshed(recomputed=("wide",), stale=(("flat", "its mean is float32 of shape (2, 2), not the net's "
                                                                   "(4,) float embedding, and enrolled without kept "
                                                                   "crops"),))
    assert Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=4).names == ("ann", "wide")
    assert Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=6).names == ()  # never stacked


def test_a_person_whose_mean_is_not_finite_is_skipped_rather_than_making_every_face_unknown(tmp_path, caplog):
    """argmax picked the NaN column: every face was unknown, the nearest list contradicting it."""
    save_person(tmp_path, "ann", np.eye(4)[:1], "sha-A", "box-v1")
    save_person(tmp_path, "nan", np.full((1, 4), np.nan), "sha-A", "box-v1")
    gallery = Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=4)
    assert gallery.match(np.eye(4, dtype=np.float32)[:1]) == [("ann", pytest.approx(1.0))]
    assert "skipping nan: its mean is not finite (NaN or infinity); `tracker enroll --refresh` recomputes" in caplog.text


def test_people_enrolled_from_another_crop_definition_are_never_mixed(tmp_path, caplog):
    save_person(tmp_path, "ann", np.ones((1, 4)), "sha-A", "box-v1")
    save_person(tmp_path, "bob", np.ones((1, 4)), "sha-A", "aligned-v1")
    np.savez(tmp_path / "people" / "old.npz", mean=np.ones(4, np.float32), count=np.int64(1), model=np.str_("sha-A"))
    assert Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="aligned-v1", width=4).names == ("bob",)
    assert ("ann: enrolled from box-v1 crops, the detector now gives aligned-v1 crops; enroll it afresh (`tracker "
            "enroll --replace ann PHOTOS`)") in caplog.text
    # A file from before the crop was recorded holds box crops.
    assert Gallery.load(tmp_path, "sha-A", threshold=0.5, crop="box-v1", width=4).names == ("ann", "old")


def test_a_rejoined_tracks_votes_count_for_the_old_track():
    """A new track recognised as an old one back brought min_hits - 1 faces' votes that were lost."""
    votes = IdentityVotes(min_faces=3)
    votes.add(1, "alice")
    votes.add(7, "alice")
    votes.add(7, "alice")
    assert not votes.decided(1)
    votes.merge(1, 7)
    assert votes.decided(1) and votes.voted(1) == ("alice", 1.0) and not votes.decided(7)
    votes.merge(1, 8)  # a track without votes: nothing changes
    assert votes.voted(1) == ("alice", 1.0)


def test_votes_accumulate_over_the_track_life():
    votes = IdentityVotes()
    assert votes.voted(1) == (UNKNOWN, 0.0)
    for _ in range(4):
        votes.add(1, "ann")
    votes.add(1, "bob")  # one confusing frame does not flip the track
    assert votes.voted(1) == ("ann", pytest.approx(4 / 5))
    votes.forget(1)
    assert votes.voted(1) == (UNKNOWN, 0.0)


def test_a_track_needs_enough_faces_and_a_clear_lead():
    votes = IdentityVotes(min_faces=3, margin=0.2)
    votes.add(1, "ann")
    votes.add(1, "ann")
    assert not votes.decided(1) and votes.voted(1) == (UNKNOWN, 0.0)  # two faces are not enough
    votes.add(1, "ann")
    assert votes.decided(1) and votes.voted(1) == ("ann", 1.0)
    for name in ("ann", "bob", "ann", "bob", "ann"):
        votes.add(2, name)  # ann leads by 1 of 5 votes: 0.2, just enough
    assert votes.voted(2) == ("ann", pytest.approx(3 / 5))
    votes.add(2, "bob")  # 3 to 3: too close to call
    assert votes.decided(2) and votes.voted(2) == (UNKNOWN, 0.0)
    for name in (UNKNOWN, "ann", UNKNOWN, UNKNOWN, UNKNOWN):
        votes.add(3, name)  # a stranger with one lucky face is still a stranger
    assert votes.voted(3) == (UNKNOWN, pytest.approx(4 / 5))


def test_a_tie_is_too_close_to_call_even_with_no_margin():
    votes = IdentityVotes(min_faces=2, margin=0.0)
    for name in ("ann", "bob"):
        votes.add(1, name)
    assert votes.ambiguous(1) and votes.voted(1) == (UNKNOWN, 0.0)
    votes.add(1, "bob")
    assert not votes.ambiguous(1) and votes.voted(1) == ("bob", pytest.approx(2 / 3))


def test_the_threshold_comes_from_the_config_else_the_weights_card_else_the_untrained_default(tmp_path):
    from tracker.config import parse_config
    from tracker.files import file_sha256
    from tracker.identity import UNTRAINED_THRESHOLD, identity_threshold
    from tracker.model.card import card_path, write_card

    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(b"weights")
    config = parse_config({"model": {"weights": str(weights)}})
    assert identity_threshold(config) == UNTRAINED_THRESHOLD  # no card
    write_card(weights, {"weights_sha256": file_sha256(weights), "identity_threshold": 0.42, "crop": "aligned-v1"})
    assert identity_threshold(config) == 0.42
    assert identity_threshold(parse_config({"model": {"weights": str(weights)}, "identity": {"threshold": 0.7}})) == 0.7
    weights.write_bytes(b"other weights")  # the card now belongs to other bytes: refused
    with pytest.raises(InputError, match=r"model card .*w.caffemodel.json' belongs to other weights"):
        identity_threshold(config)
    assert identity_threshold(parse_config({"model": {"weights": str(weights)}, "identity": {"threshold": 0.7}})) == 0.7
    card_path(weights).write_text("{not json")
    with pytest.raises(InputError, match=r"model card .*w.caffemodel.json.*unreadable"):
        identity_threshold(config)
    card_path(weights).write_text("[" * 200_000 + "]" * 200_000)  # past Python's recursion: a traceback
    with pytest.raises(InputError, match=r"model card .*unreadable \(RecursionError"):
        identity_threshold(config)
    card_path(weights).unlink()
    os.mkfifo(card_path(weights))  # waited on for a writer for ever
    with pytest.raises(InputError, match=r"model card .*unreadable \(OSError: .*not a regular file"):
        identity_threshold(config)
    card_path(weights).unlink()
    card_path(weights).symlink_to("/dev/zero")  # read until memory ran out
    with pytest.raises(InputError, match=r"model card .*unreadable \(OSError: .*not a regular file"):
        identity_threshold(config)
    card_path(weights).unlink()
    card_path(weights).write_text(" " * (1 << 20) + "{}")
    with pytest.raises(InputError, match=r"model card .*unreadable \(OSError: .*larger than 1048576 bytes"):
        identity_threshold(config)
    sha = file_sha256(weights)
    for card, what in (({"identity_threshold": True}, "identity_threshold True"), ({"schema": True}, "schema True")):
        write_card(weights, {"weights_sha256": sha, **card})  # true is 1 to Python: nobody would ever match
        with pytest.raises(InputError, match=rf"model card .*: {what}; expected"):
            identity_threshold(config)


def test_the_thresholds_are_those_of_the_embedding_in_use_and_a_missing_one_is_one_line(tmp_path):
    """identity.embedding chooses the embedding; the card's own thresholds hold for its own one,
    `thresholds_for` for the other, and an embedding it has none for is a config error."""
    from tracker.config import parse_config
    from tracker.files import file_sha256
    from tracker.identity import identity_threshold
    from tracker.model.card import write_card
    from tracker.stages import reid_threshold

    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(b"weights")
    card = {"weights_sha256": file_sha256(weights), "embedding": "mirror-mean", "identity_threshold": 0.75,
            "reid_threshold": 0.8, "thresholds_for": {"single": {"identity_threshold": 0.74, "reid_threshold": 0.79}}}
    write_card(weights, card)
    own = parse_config({"model": {"weights": str(weights)}})
    single = parse_config({"model": {"weights": str(weights)}, "identity": {"embedding": "single"}})
    assert (identity_threshold(own), reid_threshold(own, card)) == (0.75, 0.8)
    assert (identity_threshold(single), reid_threshold(single, card)) == (0.74, 0.79)
    write_card(weights, {**card, "thresholds_for": {}})
    with pytest.raises(InputError, match=r"^config: key 'identity.embedding': 'single': the model card "
                                         r"'.*w.caffemodel.json' holds no thresholds for it; expected one of "
                                         r"mirror-mean, or identity.threshold set$"):
        identity_threshold(single)
    chosen = parse_config({"model": {"weights": str(weights)}, "identity": {"embedding": "single", "threshold": 0.7}})
    assert identity_threshold(chosen) == 0.7


def test_people_enrolled_before_names_were_compared_ignoring_case_are_still_refreshed(tmp_path):
    """A new enrolment may not differ from an enrolled name only in case; a household that has
    'alice' and 'Alice' from before keeps both through a refresh for new weights."""
    from tracker.identity import Refreshed, check_new_name, refresh_people

    class Embedder:
        def infer(self, crops):
            return type("Inference", (), {"embedding": np.ones((len(crops), 4), np.float32)})()

    chips = np.zeros((2, 1, 88, 88), np.float32)
    for name in ("alice", "Alice"):
        save_person(tmp_path, name, np.ones((2, 4)), "sha-A", "box-v1", chips)
    assert refresh_people(tmp_path, Embedder(), "sha-B", "box-v1", 4) == Refreshed(recomputed=("Alice", "alice"))
    check_new_name(tmp_path, "alice")  # the name of an enrolled person: adding to them, or --replace
    with pytest.raises(InputError, match="'ALICE': 'Alice' is enrolled, a name that differs only in case"):
        check_new_name(tmp_path, "ALICE")
