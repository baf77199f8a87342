"""Enrolment and identity on real faces: `tracker enroll` through the CLI, then the gallery.

Data: ../shared/testdata/faces/dlib/johns/, 5 people x 11 aligned 150x150 chips, none of them in
the face CNN's training data. Each person is enrolled with `tracker enroll NAME --aligned` from
their first 6 chips (by name; one person from a folder holding them, the others from files), in a
state directory of a config file written here, with the default detector (YuNet: aligned crops,
what the shipped weights were trained on). Each person's other 5 chips then go through the same
crop and backend (caffe-openblas-dl, the default) and `Gallery.match`: at least 24 of the 25 must
be recognised (the issue's bar for the trained weights), and a person left out of the gallery
must come out `unknown` under the guard's track rule (IdentityVotes).

Bad enrolment input: images with no face, several faces or no image at all are reported and
skipped; nothing usable is exit 2; a name with path tricks is exit 2 and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import shutil
import subprocess
import tracemalloc
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_pipeline_e2e import isolated_env, tracker_command

from tracker.cli import main
from tracker.config import load_config
from tracker.crops import crop_batch, crop_definition, face_pixels
from tracker.detect import create_detector
from tracker.enroll import chip_face, open_backend
from tracker.errors import InputError
from tracker.files import file_sha256
from tracker.identity import UNKNOWN, Gallery, IdentityVotes, embeddings_key, identity_threshold
from tracker.images import IMAGE_SUFFIXES, read_image
from tracker.preflight import embedding_width

ENROLLED_PER_PERSON = 6


def enroll_cli(tmp_path: Path, config: Path, name: str, *images, aligned: bool = True) -> subprocess.CompletedProcess:
    args = [*tracker_command(), "enroll", name, *map(str, images), "--config", str(config)]
    if aligned:
        args.append("--aligned")
    return subprocess.run(args, capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)


def state_config(tmp_path: Path, detector: str = "haar") -> Path:
    path = tmp_path / "tracker.yaml"
    path.write_text(f"state_dir: {str(tmp_path / 'state')!r}\ndetect: {{detector: {detector}}}\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def enrolled(tmp_path_factory, johns):
    """Everyone enrolled through the CLI; returns (tmp dir, config path, CLI outputs)."""
    tmp = tmp_path_factory.mktemp("enroll")
    config = state_config(tmp, detector="auto")
    outputs = {}
    for i, (name, files) in enumerate(johns.items()):
        chosen = files[:ENROLLED_PER_PERSON]
        if i == 0:  # one person from a folder, to cover that form too
            folder = tmp / "chips" / name
            folder.mkdir(parents=True)
            for f in chosen:
                shutil.copy(f, folder / f.name)
            chosen = [folder]
        outputs[name] = enroll_cli(tmp, config, name, *chosen)
    return tmp, config, outputs


def test_enroll_cli_writes_each_person(enrolled, johns):
    tmp, config, outputs = enrolled
    key = f"{file_sha256(load_config(config).model.weights)}+mirror-mean"  # the shipped card's embedding
    for name, proc in outputs.items():
        assert proc.returncode == 0, proc.stderr
        # the same photo twice is one face (John_Shimkus's chips hold one file twice, under two names)
        used = len({file_sha256(f) for f in johns[name][:ENROLLED_PER_PERSON]})
        assert f"enrolled {name!r} from {used} image(s) ({ENROLLED_PER_PERSON - used} skipped)" in proc.stdout
        with np.load(tmp / "state" / "people" / f"{name}.npz") as data:
            assert int(data["count"]) == used and str(data["model"]) == key
            assert str(data["crop"]) == "aligned-v1"  # the default detector gives landmarks
            assert data["chips"].shape == (used, 88, 88)  # kept for --refresh
            mean = data["mean"]
            assert mean.shape == (128,) and mean.dtype == np.float32
            assert np.linalg.norm(mean) == pytest.approx(1.0, abs=1e-5)
    assert sorted(p.stem for p in (tmp / "state" / "people").glob("*.npz")) == sorted(johns)


def _held_out_matches(config_path: Path, johns, people=None) -> dict[str, list[tuple[str, float]]]:
    """Each john's held-out chips (those not enrolled) matched against the gallery of `people`
    (default: everyone enrolled), as the guard matches faces: name -> [(match, similarity)]."""
    config = load_config(config_path)
    detector = create_detector(config.detect)
    gallery = Gallery.load(config.resolved_state_dir(), embeddings_key(config), identity_threshold(config),
                           crop_definition(detector.gives_landmarks), embedding_width(config))
    if people is not None:
        keep = [i for i, n in enumerate(gallery.names) if n in people]
        gallery = Gallery(tuple(gallery.names[i] for i in keep), gallery.means[keep], gallery.threshold)
    backend = open_backend(config)  # embeds as the guard does: mirror-mean, as the shipped card says
    try:
        results = {}
        for name, files in johns.items():
            crops = []
            for path in files[ENROLLED_PER_PERSON:]:
                image = cv2.imread(str(path))
                # identified as --aligned enrolment found the face: on the padded chip
                crops.append(crop_batch(image, [chip_face(image, detector)], margin=0.0))
            results[name] = gallery.match(backend.infer(np.concatenate(crops)).embedding)
    finally:
        backend.close()
    return results


def test_each_person_is_recognised_on_held_out_chips(enrolled, johns):
    _, config_path, _ = enrolled
    results = _held_out_matches(config_path, johns)
    counts = {name: Counter(who for who, _ in matches) for name, matches in results.items()}
    correct = sum(c[name] for name, c in counts.items())
    print(f"held-out chips recognised: {correct}/{sum(len(m) for m in results.values())}; "
          + "; ".join(f"{name}: {dict(c)}" for name, c in counts.items()))
    assert correct >= 24, counts


def test_a_person_not_enrolled_is_unknown(enrolled, johns):
    """Four people in the gallery; the fifth walks by: each of their faces is matched, and their
    track (the held-out chips in a row, the guard's vote) is `unknown`; so are the faces mostly."""
    _, config_path, _ = enrolled
    config = load_config(config_path)
    for stranger in johns:
        known = [n for n in johns if n != stranger]
        matches = _held_out_matches(config_path, johns, people=known)[stranger]
        votes = IdentityVotes(config.identity.min_faces, config.identity.margin)
        for name, _ in matches:
            votes.add(1, name)
        print(f"{stranger} among {len(known)} others: {matches} -> {votes.voted(1)}")
        assert votes.voted(1)[0] == UNKNOWN, (stranger, matches)
        assert sum(name == UNKNOWN for name, _ in matches) >= 3, (stranger, matches)


def test_a_large_photo_is_chipped_and_cropped_in_a_fraction_of_its_own_memory(johns):
    """A 12-megapixel chip (a phone photo of one face, 34 MiB of BGR): its padded copy for the
    detector was 3.2 times the photo, and the face's square cut in BGR 3 times; numpy reports
    cv2's arrays to tracemalloc, so the peaks are what the two steps allocate."""
    photo = cv2.resize(cv2.imread(str(johns["John_Simm"][0])), (4000, 3000), interpolation=cv2.INTER_LINEAR)
    detector = create_detector(load_config(None).detect, quiet=True)
    tracemalloc.start()
    try:
        face = chip_face(photo, detector)
        chip_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        face_pixels(photo, face)
        crop_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert face is not None and face.box.w > 2000
    assert chip_peak < 0.75 * photo.nbytes and crop_peak < 1.5 * photo.nbytes, (chip_peak >> 20, crop_peak >> 20)


def test_enrol_with_yunet_aligns_the_chips_and_records_it(tmp_path, johns):
    config = state_config(tmp_path, "yunet")
    files = johns["John_Simm"][:3]
    proc = enroll_cli(tmp_path, config, "John_Simm", *files)
    assert proc.returncode == 0, proc.stderr
    assert "from 3 image(s) (0 skipped)" in proc.stdout
    with np.load(tmp_path / "state" / "people" / "John_Simm.npz") as data:
        assert str(data["crop"]) == "aligned-v1"
    loaded = load_config(config)
    key = embeddings_key(loaded)
    assert Gallery.load(loaded.resolved_state_dir(), key, 0.5, "aligned-v1", 128).names == ("John_Simm",)
    assert Gallery.load(loaded.resolved_state_dir(), key, 0.5, "box-v1", 128).names == ()  # never mixed
    assert Gallery.load(loaded.resolved_state_dir(), file_sha256(loaded.model.weights), 0.5, "aligned-v1", 128).names == ()


def test_enrolling_from_more_faces_than_a_person_keeps_says_which_are_used(tmp_path, johns):
    """The images beyond MAX_KEPT were dropped in silence, though the count said all were used."""
    from tracker.enroll import MAX_KEPT

    folder = tmp_path / "many"
    folder.mkdir()
    chips = johns["John_Simm"]
    for i in range(MAX_KEPT + 2):  # each a photo of its own (a face given twice is used once): other JPEG qualities
        quality = 95 - 5 * (i // len(chips))
        cv2.imwrite(str(folder / f"chip{i:03d}.jpg"), cv2.imread(str(chips[i % len(chips)])), [cv2.IMWRITE_JPEG_QUALITY, quality])
    proc = enroll_cli(tmp_path, state_config(tmp_path, "yunet"), "John_Simm", folder)
    assert proc.returncode == 0, proc.stderr
    assert f"{MAX_KEPT + 2} images show a face; the last {MAX_KEPT} are used (at most {MAX_KEPT} a person)" in proc.stderr
    assert f"from {MAX_KEPT} image(s) (2 skipped)" in proc.stdout
    with np.load(tmp_path / "state" / "people" / "John_Simm.npz") as data:
        assert len(data["chips"]) == int(data["count"]) == MAX_KEPT
        kept = data["chips"]
    photos = sorted(folder.iterdir())  # the CLI's order: a folder's images by name
    detector = create_detector(load_config(state_config(tmp_path, "yunet")).detect, quiet=True)

    def face(path):  # the chip kept for an image: its network input as the file stores it, (88, 88) uint8
        image = read_image(path, reduced=True)
        return np.rint(crop_batch(image, [chip_face(image, detector)], margin=0.0)[0, 0] * 255).astype(np.uint8)

    assert np.array_equal(kept[0], face(photos[2])) and np.array_equal(kept[-1], face(photos[-1]))  # the last used


@pytest.fixture
def no_face_image(tmp_path) -> Path:
    """A plain wall with a door: no face anywhere."""
    image = np.full((240, 320, 3), (180, 190, 200), np.uint8)
    image[60:220, 40:110] = (90, 110, 135)
    path = tmp_path / "wall.png"
    cv2.imwrite(str(path), image)
    return path


def test_enrol_reports_and_skips_images_without_exactly_one_face(tmp_path, testdata, no_face_image):
    faces = testdata / "faces" / "dlib" / "faces"
    not_an_image = tmp_path / "notes.jpg"
    not_an_image.write_text("a note, not a photo")
    config = state_config(tmp_path)
    proc = enroll_cli(tmp_path, config, "Tom", faces / "Tom_Cruise_avp_2014_4.jpg", faces / "bald_guys.jpg",
                      no_face_image, not_an_image, aligned=False)
    assert proc.returncode == 0, proc.stderr
    assert "enrolled 'Tom' from 1 image(s) (3 skipped)" in proc.stdout
    lines = proc.stderr.splitlines()
    several = [line for line in lines if "bald_guys.jpg" in line]
    assert len(several) == 1 and "expected exactly one" in several[0] and "skipped" in several[0]
    assert int(re.search(r"(\d+) faces found", several[0]).group(1)) >= 2
    assert any("wall.png: 0 faces found" in line and "skipped" in line for line in lines)
    assert any("notes.jpg" in line and "not a readable image" in line for line in lines)
    assert (tmp_path / "state" / "people" / "Tom.npz").exists()


def test_enrol_with_no_usable_face_exits_2(tmp_path, no_face_image):
    config = state_config(tmp_path)
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_bytes(b"\x89PNG but not really")
    proc = enroll_cli(tmp_path, config, "Nobody", no_face_image, not_an_image, aligned=False)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tracker: error:")]
    assert len(errors) == 1 and "no usable face" in errors[0] and "'Nobody'" in errors[0]
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "state").rglob("*.npz"))


def test_enrol_from_a_folder_without_image_files_says_so_as_identify_does(tmp_path, capsys):
    """A folder of HEIC photos only was "no usable face for 'newbie' in 0 image(s)"."""
    (tmp_path / "phone").mkdir()
    (tmp_path / "phone" / "IMG_0001.HEIC").write_bytes(b"not read")
    assert main(["enroll", "newbie", str(tmp_path / "phone"), "--config", str(state_config(tmp_path))]) == 2
    assert capsys.readouterr().err == (f"tracker: error: enroll: no image files in {str(tmp_path / 'phone')}; expected "
                                       f"images ({', '.join(IMAGE_SUFFIXES)}) or folders holding them\n")


def test_enrol_missing_file_exits_2(tmp_path):
    proc = enroll_cli(tmp_path, state_config(tmp_path), "Someone", tmp_path / "nope.jpg")
    assert proc.returncode == 2 and "nope.jpg" in proc.stderr and "does not exist" in proc.stderr


def test_options_may_come_between_the_name_and_the_images(tmp_path, testdata, capsys):
    chip = next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))
    config = state_config(tmp_path)
    assert main(["enroll", "Ann", "--aligned", str(chip), "--config", str(config)]) == 0, capsys.readouterr().err
    assert (tmp_path / "state" / "people" / "Ann.npz").is_file()
    assert main(["enroll", "Bob", "--config", str(config), "/dev/null"]) == 2
    assert capsys.readouterr().err == ("tracker: error: enroll: '/dev/null' is neither a file nor a folder; expected "
                                       "an image file or a folder of images\n")


def test_path_trick_name_is_refused_by_the_command(tmp_path, testdata):
    chip = next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))
    proc = enroll_cli(tmp_path, state_config(tmp_path), "../../evil", chip)
    assert proc.returncode == 2
    assert proc.stderr.startswith("tracker: error: enroll: bad name '../../evil'")
    assert not list(tmp_path.rglob("*.npz"))


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", ".hidden", "/tmp/x", "x..y", "", "unknown", "Unknown",
                                  "name\n", "a\\b", "é", "x" * 65])
def test_bad_names_are_refused(tmp_path, testdata, capsys, name):
    """Through `tracker.cli.main`, the console script's entry point (one process per name would
    cost a second each)."""
    chip = next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))
    config = state_config(tmp_path)
    code = main(["enroll", name, str(chip), "--aligned", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tracker: error: "), err
    assert not list(tmp_path.rglob("*.npz"))


def test_refresh_recomputes_people_for_new_weights_from_their_kept_crops(tmp_path, johns):
    """Enrolled under seeded random weights, then the caffemodel changes: `enroll --refresh`
    recomputes the person from the crops kept in their file, equal to enrolling anew; a person
    enrolled without kept crops (a file of an older version) is named as needing enrolment."""
    from tracker.model import face_cnn

    random_weights = face_cnn.generate(tmp_path / "random.caffemodel")
    old = tmp_path / "old.yaml"
    old.write_text(f"state_dir: {str(tmp_path / 'state')!r}\nmodel: {{weights: {str(random_weights)!r}}}\n")
    new = state_config(tmp_path, detector="auto")
    files = johns["John_Simm"][:3]
    assert enroll_cli(tmp_path, old, "simm", *files).returncode == 0
    np.savez(tmp_path / "state" / "people" / "legacy.npz", mean=np.ones(128, np.float32), count=np.int64(1),
             model=np.str_("old-sha"), crop=np.str_("aligned-v1"))
    proc = subprocess.run([*tracker_command(), "enroll", "--refresh", "--config", str(new)], capture_output=True,
                          text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "recomputed 1 person(s) for the weights face_cnn.caffemodel and mirror-mean embeddings: simm" in proc.stdout
    assert "cannot recompute legacy" in proc.stdout
    shipped = load_config(new).model.weights
    with np.load(tmp_path / "state" / "people" / "simm.npz") as data:
        assert str(data["model"]) == f"{file_sha256(shipped)}+mirror-mean" and data["chips"].shape == (3, 88, 88)
        refreshed = data["mean"]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    again = state_config(fresh, detector="auto")
    assert enroll_cli(fresh, again, "simm", *files).returncode == 0
    with np.load(fresh / "state" / "people" / "simm.npz") as data:
        np.testing.assert_allclose(refreshed, data["mean"], atol=1e-5)


def test_refresh_names_whom_it_cannot_use_or_write(tmp_path, johns):
    """A detector without landmarks cannot use aligned crops (nothing to recompute with, and not
    "nothing to recompute"); a file it cannot write (here a file-size limit of 0, as a full disk)
    is named and the exit is 1, the person's file as it was."""
    assert enroll_cli(tmp_path, state_config(tmp_path, detector="auto"), "simm", *johns["John_Simm"][:2]).returncode == 0
    person = tmp_path / "state" / "people" / "simm.npz"
    before = person.read_bytes()
    proc = subprocess.run([*tracker_command(), "enroll", "--refresh", "--config", str(state_config(tmp_path))],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("cannot recompute simm: enrolled from aligned-v1 crops, the detector gives box-v1 crops; enroll simm "
            "afresh from photos (tracker enroll --replace simm PHOTOS)") in proc.stdout
    assert "nothing to recompute" not in proc.stdout
    from tracker.model import face_cnn

    other = tmp_path / "other.yaml"
    other.write_text(f"state_dir: {str(tmp_path / 'state')!r}\nmodel: {{weights: "
                     f"{str(face_cnn.generate(tmp_path / 'random.caffemodel'))!r}}}\n")
    proc = subprocess.run([*tracker_command(), "enroll", "--refresh", "--config", str(other)], capture_output=True,
                          text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)))
    assert proc.returncode == 1, proc.stderr
    assert "could not write simm" in proc.stdout and "File too large" in proc.stderr
    assert person.read_bytes() == before
    # the advice works (without --replace the new faces would be added to crops of another kind: refused)
    haar = state_config(tmp_path)
    assert "cannot add a face to 'simm'" in enroll_cli(tmp_path, haar, "simm", johns["John_Simm"][2]).stderr
    assert enroll_cli(tmp_path, haar, "simm", "--replace", johns["John_Simm"][2]).returncode == 0


def test_enroll_needs_a_name_and_images_or_refresh_alone(tmp_path):
    for args in (["--refresh", "ann"], ["ann"], [], ["--refresh", "--aligned"]):  # --aligned was ignored
        proc = subprocess.run([*tracker_command(), "enroll", *args], capture_output=True, text=True,
                              env=isolated_env(tmp_path), cwd=tmp_path, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "expected" in proc.stderr, proc.stderr


def test_enrolling_from_the_web_page_feeds_the_watchdog_for_every_photo(tmp_path, johns, monkeypatch):
    """The web page's enrolment runs on the guard's thread: twenty large photos held its loop, and
    so its watchdog pings, for tens of seconds on a Pi 3 (WatchdogSec=30 restarts the guard)."""
    import socket

    from tracker.web.server import _enrol_job

    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "2")  # a ping is due at every call
    unreadable = tmp_path / "notes.jpg"
    unreadable.write_bytes(b"not a photo")
    photos = [*next(iter(johns.values()))[:3], unreadable]
    config = load_config(state_config(tmp_path, detector="auto"))
    backend = open_backend(config)
    try:
        _enrol_job(config, "john", {photo: photo.name for photo in photos}, [], None,
                   create_detector(config.detect, quiet=True), backend)
    finally:
        backend.close()
    pings = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            pings += sock.recv(4096).decode().splitlines().count("WATCHDOG=1")
    sock.close()
    assert pings >= len(photos)


def test_enrolling_a_name_again_adds_to_the_faces_kept_and_replace_starts_afresh(tmp_path, johns, capsys):
    """A second `tracker enroll alice photo.jpg` replaced the faces alice was enrolled from with the
    one photo, in silence (the page's uploads add to them)."""
    chips = [str(chip) for chip in johns["John_Simm"][:4]]
    config = state_config(tmp_path)
    people = tmp_path / "state" / "people"

    def kept() -> int:
        with np.load(people / "alice.npz") as data:
            return len(data["chips"])

    assert main(["enroll", "alice", "--aligned", *chips[:2], "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith("enrolled 'alice' from 2 image(s) (0 skipped) -> ") and kept() == 2
    assert main(["enroll", "alice", "--aligned", chips[2], "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith("added 1 image(s) to 'alice' (0 skipped; the faces kept before stay: "
                                              "--replace starts afresh) -> ") and kept() == 3
    assert main(["enroll", "alice", "--aligned", chips[2], "--config", str(config)]) == 2  # nothing new
    assert "every face found is kept for 'alice' already; nothing added" in capsys.readouterr().err and kept() == 3
    assert main(["enroll", "alice", "--aligned", "--replace", chips[3], "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith("enrolled 'alice' from 1 image(s) (0 skipped) -> ") and kept() == 1
    assert main(["enroll", "--refresh", "--replace", "--config", str(config)]) == 2
    assert capsys.readouterr().err == ("tracker: error: tracker enroll: --replace is not taken with --refresh, which "
                                       "reads no image; expected --refresh alone\n")


def test_people_of_another_embedding_blob_are_of_another_key_and_refreshed(tmp_path, johns, capsys, caplog):
    """`model.embedding: fc2` (848 wide) enrolled into a state of fc1 people under one key:
    identify and the guard then stopped on a ValueError traceback, and `enroll --refresh` had
    nothing to recompute. The blob is in the key now (the default's key as it was, so people
    enrolled before keep matching); the other blob's person is skipped, then recomputed."""
    fc1 = state_config(tmp_path)
    fc2 = tmp_path / "fc2.yaml"
    fc2.write_text(fc1.read_text() + "model: {embedding: fc2}\n")
    simm, salley = johns["John_Simm"], johns["John_Salley"]
    assert main(["enroll", "simm", "--aligned", str(simm[0]), "--config", str(fc1)]) == 0
    assert main(["enroll", "salley", "--aligned", str(salley[0]), "--config", str(fc2)]) == 0
    sha256 = file_sha256(load_config(fc1).model.weights)
    for name, key in (("simm", f"{sha256}+mirror-mean"), ("salley", f"{sha256}+mirror-mean@fc2")):
        with np.load(tmp_path / "state" / "people" / f"{name}.npz") as data:
            assert str(data["model"]) == key
    capsys.readouterr()
    assert main(["identify", "--aligned", "--json", str(simm[1]), "--config", str(fc1)]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)[0]["nearest"]] == ["simm"]
    assert "skipping salley: enrolled with other model weights or embedding" in caplog.text
    assert main(["enroll", "--refresh", "--config", str(fc1)]) == 0
    assert "recomputed 1 person(s) for the weights face_cnn.caffemodel and mirror-mean embeddings: salley" in (
        capsys.readouterr().out)
    assert main(["identify", "--aligned", "--json", str(salley[1]), "--config", str(fc1)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["nearest"][0]["name"] == "salley"


def test_the_people_folder_and_names_that_differ_only_in_case(tmp_path, johns, capsys, monkeypatch):
    """'Alice' after 'alice' made a second person (the gallery's votes for her split); a file named
    people was a traceback; an unreadable people folder was "nobody enrolled", every face unknown;
    an image folder that cannot be read was a traceback."""
    from tracker.enroll import image_files

    chip = str(johns["John_Simm"][0])
    config = state_config(tmp_path)
    assert main(["enroll", "alice", "--aligned", chip, "--config", str(config)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["enroll", "Alice", "--aligned", chip, "--config", str(config)]) == 2
    assert capsys.readouterr().err == ("tracker: error: enroll: 'Alice': 'alice' is enrolled, a name that differs only "
                                       "in case; expected 'alice' (to add to them) or another name\n")
    assert main(["enroll", "alice", "--aligned", "--replace", chip, "--config", str(config)]) == 0
    capsys.readouterr()

    other = tmp_path / "other"
    (other / "state").mkdir(parents=True)
    (other / "state" / "people").write_text("not a folder")
    assert main(["enroll", "bob", "--aligned", chip, "--config", str(state_config(other))]) == 2
    assert capsys.readouterr().err.startswith(f"tracker: error: people folder {str(other / 'state' / 'people')!r}: "
                                              "cannot read it (Not a directory)")

    def refused(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", refused)  # as for a folder of another user's (root reads them all)
    with pytest.raises(InputError, match=r"identify: folder '.*': cannot read it \(Permission denied\); expected a folder"):
        image_files([tmp_path], "identify")


@pytest.fixture
def enrolment(tmp_path):
    """(config, a function that enrols as the web page does: one detector and backend for all)."""
    from tracker.enroll import enroll

    config = load_config(state_config(tmp_path, detector="auto"))
    detector, backend = create_detector(config.detect, quiet=True), open_backend(config)

    def enrol(name, photos, said=None, **options):
        return enroll(name, photos, config, aligned=True, report=(said if said is not None else []).append,
                      detector=detector, backend=backend, **options)

    yield config, enrol
    backend.close()


def test_a_change_made_while_the_photos_are_read_is_kept(tmp_path, johns, enrolment):
    """A `tracker enroll` beside the guard while the page added a photo to the same person: the
    page wrote what it had read before its photos plus its face, undoing the other; and a name
    that differs only in case passed the check of both."""
    config, enrol = enrolment
    simm, salley = johns["John_Simm"], johns["John_Salley"]
    enrol("alice", simm[:2])
    meanwhile = iter([lambda: enrol("alice", salley[:3]), lambda: enrol("Bob", salley[:1])])
    enrol("alice", simm[2:3], add=True, alive=lambda: next(meanwhile)())
    with np.load(tmp_path / "state" / "people" / "alice.npz") as data:
        assert int(data["count"]) == 4  # the other enrolment's 3 faces and the one added (it was 2 + 1)
    with pytest.raises(InputError, match="'bob': 'Bob' is enrolled, a name that differs only in case"):
        enrol("bob", simm[:1], alive=lambda: next(meanwhile)())
    assert sorted(p.name for p in (tmp_path / "state" / "people").glob("*.npz")) == ["Bob.npz", "alice.npz"]


def test_a_face_given_twice_is_used_once(tmp_path, johns, enrolment):
    """The same photo twice in one upload was kept twice: the mean leaned to it and it took two of
    the person's 64 places."""
    _, enrol = enrolment
    chips, said = johns["John_Simm"], []
    done = enrol("carol", [chips[0], chips[1], chips[0]], said)
    assert (done.used, done.skipped) == (2, 1) and any("this face is given twice; skipped" in line for line in said)


def test_a_write_cut_short_leaves_no_face_behind(tmp_path, johns, enrolment):
    """A write killed before its rename left `.NAME.<pid>.<random>.tmp.npz`: never a person, but
    a face on the disk that deleting the person did not remove."""
    from tracker.identity import remove_person

    _, enrol = enrolment
    enrol("dave", johns["John_Simm"][:1])
    leftover = tmp_path / "state" / "people" / ".dave.4242.0badc0de.tmp.npz"
    leftover.write_bytes(b"a face")
    assert remove_person(tmp_path / "state", "dave")
    assert sorted(p.name for p in (tmp_path / "state" / "people").iterdir()) == [".lock"]


def test_adding_to_a_person_past_the_faces_kept_says_how_many_earlier_ones_are_dropped(tmp_path, johns, capsys,
                                                                                     monkeypatch, enrolment):
    """Adding to a person of MAX_KEPT faces drops the earliest; `tracker enroll` said "the faces
    kept before stay", and the page's uploads and "This was..." said nothing."""
    monkeypatch.setattr("tracker.enroll.MAX_KEPT", 3)
    chips = johns["John_Simm"][:5]
    (tmp_path / "cli").mkdir()
    config = state_config(tmp_path / "cli")
    assert main(["enroll", "alice", "--aligned", *map(str, chips[:2]), "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["enroll", "alice", "--aligned", *map(str, chips[2:4]), "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("added 2 image(s) to 'alice' (0 skipped; the 1 earliest face(s) kept before are dropped "
                          "(at most 3 a person), the others stay: --replace starts afresh) -> "), out
    assert err == "enroll: 'alice' keeps at most 3 faces: the 1 earliest of the 2 kept before are dropped to make room for these\n"
    _, enrol = enrolment  # the page's way (its own state)
    enrol("bob", chips[:3])
    enrol("new", chips[3:5])  # the faces to be added, as a file of their own keeps them

    def kept(name):
        with np.load(tmp_path / "state" / "people" / f"{name}.npz") as data:
            return data["chips"]

    before, added = kept("bob"), kept("new")
    said = []
    assert enrol("bob", chips[3:5], said, add=True).dropped == 2
    assert said == ["enroll: 'bob' keeps at most 3 faces: the 2 earliest of the 3 kept before are dropped to make "
                    "room for these"]
    assert np.array_equal(kept("bob"), np.concatenate([before[2:], added]))  # the new faces kept, the earliest gone


def test_everything_after_a_double_dash_is_the_name_and_images(tmp_path, testdata, capsys):
    """`tracker enroll -- alice -photo.jpg` was "unrecognized arguments: -photo.jpg": the intermixed
    parse dropped the "--" and then took a photo named with a leading dash for an option."""
    chip = next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))
    shutil.copy(chip, tmp_path / "-chip.jpg")
    config = state_config(tmp_path)
    with contextlib.chdir(tmp_path):
        code = main(["enroll", "--aligned", "--config", str(config), "--", "Ann", "-chip.jpg"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "state" / "people" / "Ann.npz").is_file()
    with contextlib.chdir(tmp_path):
        assert main(["enroll", "--config", str(config), "--", "-bob", "-chip.jpg"]) == 2
    assert capsys.readouterr().err.startswith("tracker: error: enroll: bad name '-bob'")


def test_enrolling_from_many_photos_says_how_far_it_is(tmp_path, johns, capsys, monkeypatch):
    """A folder of 150 phone photos was minutes on a Pi 3 without a word until the end."""
    import tracker.enroll

    monkeypatch.setattr(tracker.enroll, "PROGRESS_EVERY", 2, raising=False)
    chips = next(iter(johns.values()))[:5]
    assert main(["enroll", "ann", *map(str, chips), "--aligned", "--config", str(state_config(tmp_path))]) == 0
    progress = [line for line in capsys.readouterr().err.splitlines() if "images read" in line]
    assert progress == ["enroll: 2 of 5 images read", "enroll: 4 of 5 images read"]
