"""`tracker identify` on real faces, through the CLI, against the guard's own matching rule.

Data: ../shared/testdata/faces/dlib/johns/, 5 people x 11 aligned 150x150 chips. Four of the five are
enrolled with `tracker enroll --aligned` from their first 6 chips (Haar: box crops of the whole chip,
as tests/test_enroll.py); the fifth is a stranger. Every held-out chip then goes through
`tracker identify --aligned --json`, whose decision must be what `Gallery.match` says for that face.
Recognition accuracy is asserted in tests/test_enroll.py (with the default detector, whose aligned
crops the weights were trained on); here the Haar detector's box crops keep the test to the command.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_enroll import ENROLLED_PER_PERSON, enroll_cli, state_config
from test_pipeline_e2e import isolated_env, tracker_command

from tracker.backends import create_backend
from tracker.cli import main
from tracker.config import load_config
from tracker.crops import crop_batch, crop_definition
from tracker.detect import create_detector
from tracker.enroll import chip_face
from tracker.identify import NEAREST, identify_faces
from tracker.identity import UNKNOWN, Gallery, embeddings_key, identity_threshold
from tracker.model.spec import ModelSpec
from tracker.preflight import embedding_width

LINE = re.compile(r"^(?P<image>.+) face (?P<face>\d+) of (?P<faces>\d+) at (?P<x>-?\d+),(?P<y>-?\d+) (?P<w>\d+)x(?P<h>\d+): "
                  r"(?P<identity>\S+) \(similarity (?P<similarity>-?\d\.\d\d)\); nearest: (?P<nearest>.+)$")


def identify_cli(tmp_path: Path, config: Path, *images, aligned: bool = True, as_json: bool = False
                 ) -> subprocess.CompletedProcess:
    args = [*tracker_command(), "identify", *map(str, images), "--config", str(config)]
    args += ["--aligned"] * aligned + ["--json"] * as_json
    return subprocess.run(args, capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)


@pytest.fixture(scope="module")
def enrolled(tmp_path_factory, johns):
    """Four johns enrolled through the CLI; returns (tmp dir, config path, enrolled names, stranger)."""
    tmp = tmp_path_factory.mktemp("identify")
    config = state_config(tmp)
    *names, stranger = sorted(johns)
    for name in names:
        proc = enroll_cli(tmp, config, name, *johns[name][:ENROLLED_PER_PERSON])
        assert proc.returncode == 0, proc.stderr
    return tmp, config, names, stranger


@pytest.fixture
def grey_image(tmp_path) -> Path:
    path = tmp_path / "grey.png"
    cv2.imwrite(str(path), np.full((120, 160, 3), 128, np.uint8))
    return path


def mirror_mean(backend, crops: np.ndarray) -> np.ndarray:
    """The shipped card's "mirror-mean" embeddings of `crops`, computed here apart from
    tracker.backends.mirror: two calls, the unit-length mean of the two unit embeddings."""
    def unit(rows):
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    mirrored = np.ascontiguousarray(crops[..., ::-1])
    return unit(unit(backend.infer(crops).embedding) + unit(backend.infer(mirrored).embedding))


def held_out(johns) -> list[Path]:
    return [f for files in johns.values() for f in files[ENROLLED_PER_PERSON:]]


def test_json_reports_each_held_out_chip_as_gallery_match_decides(enrolled, johns):
    tmp, config_path, names, _ = enrolled
    chips = held_out(johns)
    proc = identify_cli(tmp, config_path, *chips, as_json=True)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "nobody is enrolled" not in proc.stderr
    records = json.loads(proc.stdout)
    assert [r["image"] for r in records] == list(map(str, chips))  # one face per chip, in input order
    for r in records:
        assert set(r) == {"image", "face", "box", "identity", "similarity", "nearest"}
        assert r["face"] == 1 and set(r["box"]) == {"x", "y", "w", "h"}
        assert r["box"] == {"x": 0, "y": 0, "w": 150, "h": 150}  # Haar on a chip: the whole chip
        assert all(set(n) == {"name", "similarity"} and n["name"] in names for n in r["nearest"])
        sims = [n["similarity"] for n in r["nearest"]]
        assert len(sims) == NEAREST and sims == sorted(sims, reverse=True)
        assert len({n["name"] for n in r["nearest"]}) == NEAREST
        assert r["nearest"][0]["similarity"] == pytest.approx(r["similarity"], abs=1e-6)
        assert r["identity"] in (r["nearest"][0]["name"], UNKNOWN)

    # The guard's rule, applied here to the same faces, gives the same decisions.
    config = load_config(config_path)
    detector = create_detector(config.detect)
    gallery = Gallery.load(config.resolved_state_dir(), embeddings_key(config), identity_threshold(config),
                           crop_definition(detector.gives_landmarks), embedding_width(config))
    assert sorted(gallery.names) == names
    backend = create_backend(config.backend.name, ModelSpec(config.model.prototxt, config.model.weights,
                                                            config.model.probs, config.model.embedding))
    try:
        crops = []
        for path in chips:
            image = cv2.imread(str(path))
            crops.append(crop_batch(image, [chip_face(image, detector)], margin=0.0))
        expected = gallery.match(mirror_mean(backend, np.concatenate(crops)))
    finally:
        backend.close()
    assert [r["identity"] for r in records] == [name for name, _ in expected]
    assert [r["similarity"] for r in records] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_text_lines_and_an_image_without_a_face(enrolled, johns, grey_image, testdata):
    tmp, config_path, names, stranger = enrolled
    chips = [johns[names[0]][-1], johns[stranger][-1]]
    proc = identify_cli(tmp, config_path, *chips)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    for line, chip in zip(lines, chips):
        m = LINE.match(line)
        assert m, line
        assert m["image"] == str(chip) and (m["face"], m["faces"]) == ("1", "1")
        assert (m["x"], m["y"], m["w"], m["h"]) == ("0", "0", "150", "150")
        nearest = [part.rsplit(" ", 1) for part in m["nearest"].split(", ")]
        assert len(nearest) == NEAREST and all(n in names for n, _ in nearest)
        assert [float(s) for _, s in nearest] == sorted((float(s) for _, s in nearest), reverse=True)
        assert nearest[0][1] == m["similarity"] and m["identity"] in (nearest[0][0], UNKNOWN)

    # Without --aligned the detector searches the whole image: a photo of one person, one of three
    # (which Haar finds in the order x = 110, 320, 220: the faces are numbered left to right), a plain wall.
    photo = testdata / "faces" / "dlib" / "faces" / "Tom_Cruise_avp_2014_4.jpg"
    group = testdata / "faces" / "dlib" / "faces" / "2008_002506.jpg"
    proc = identify_cli(tmp, config_path, photo, group, grey_image, aligned=False)
    assert proc.returncode == 0, proc.stderr
    face_line, *group_lines, no_face_line = proc.stdout.splitlines()
    m = LINE.match(face_line)
    assert m and m["image"] == str(photo) and m["faces"] == "1" and int(m["w"]) > 50
    numbered = [LINE.match(line) for line in group_lines]
    assert len(numbered) == 3 and all(numbered), group_lines
    assert [(n["image"], n["face"], n["faces"]) for n in numbered] == [(str(group), str(i), "3") for i in (1, 2, 3)]
    assert [int(n["x"]) for n in numbered] == sorted(int(n["x"]) for n in numbered), group_lines
    assert no_face_line == f"{grey_image}: no face found"
    proc = identify_cli(tmp, config_path, photo, grey_image, aligned=False, as_json=True)
    assert proc.returncode == 0, proc.stderr
    face, no_face = json.loads(proc.stdout)
    assert face["image"] == str(photo) and face["box"]["w"] == int(m["w"])
    assert no_face == {"image": str(grey_image), "faces": 0}


def test_unreadable_file_is_reported_the_others_identified_then_exit_2(enrolled, johns):
    tmp, config_path, names, _ = enrolled
    notes = tmp / "notes.jpg"
    notes.write_text("a note, not a photo")
    chip = johns[names[1]][-1]
    proc = identify_cli(tmp, config_path, notes, chip)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{notes}: not a readable image (damaged, not an image, over 24 megapixels, or a JPEG of over 100 scans)" in proc.stderr.splitlines()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tracker: error:")]
    assert len(errors) == 1 and "notes.jpg" in errors[0] and "1 of 2" in errors[0]
    assert LINE.match(proc.stdout.strip())["image"] == str(chip)


def test_missing_path_is_one_line_exit_2(tmp_path, capsys):
    code = main(["identify", str(tmp_path / "nope.jpg"), "--config", str(state_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tracker: error: identify: ") and "nope.jpg" in err
    assert "does not exist" in err
    # a path that is there but neither a file nor a folder is not called missing
    assert main(["identify", "/dev/null", "--config", str(state_config(tmp_path))]) == 2
    assert "'/dev/null' is neither a file nor a folder" in capsys.readouterr().err


def test_a_state_dir_that_is_a_file_is_one_line_exit_2(tmp_path, capsys, johns):
    """Not "nobody is enrolled" and every face unknown, as if the people were gone."""
    config = state_config(tmp_path)
    (tmp_path / "state").write_text("not a folder")
    assert main(["identify", str(johns["John_Simm"][0]), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"key 'state_dir': {str(tmp_path / 'state')!r} is not a directory" in err, err


def test_folder_without_images_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "empty" / "album.jpg").mkdir(parents=True)  # a folder named like an image is not one
    code = main(["identify", str(tmp_path / "empty"), "--config", str(state_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no image files" in err and "empty" in err


def test_another_embedding_blob_needs_its_own_threshold_and_the_check_says_so(tmp_path, capsys, johns, caplog):
    """`model.embedding: fc2` took the card's identity threshold, a cosine of fc1 embeddings, in
    silence (and its re-identification threshold likewise): refused by the check and the commands
    until identity.threshold is set; re-identification then stays off, said once."""
    from tracker.stages import reid_threshold

    config = tmp_path / "fc2.yaml"
    config.write_text(state_config(tmp_path).read_text() + "model: {embedding: fc2}\n")
    card = str(load_config(config).model.weights) + ".json"
    expected = (f"tracker: error: config: key 'model.embedding': 'fc2': the model card {card!r} holds thresholds "
                "for fc1 embeddings only; expected identity.threshold set for this blob's\n")
    for argv in (["--check-config"], ["identify", str(johns["John_Simm"][0])]):
        assert main([*argv, "--config", str(config)]) == 2
        assert capsys.readouterr().err == expected
    config.write_text(config.read_text() + "identity: {threshold: 0.9}\n")
    assert main(["identify", str(johns["John_Simm"][0]), "--config", str(config)]) == 0
    loaded = load_config(config)
    assert identity_threshold(loaded) == 0.9
    assert reid_threshold(loaded, json.loads(Path(card).read_text())) is None
    assert "re-identification by face is off: the model card's threshold is for fc1 embeddings" in caplog.text
    # weights whose card was measured on fc2 (`tracker train` with model.embedding: fc2 records it)
    weights = tmp_path / "fc2.caffemodel"
    shutil.copyfile(loaded.model.weights, weights)
    Path(f"{weights}.json").write_text(json.dumps(json.loads(Path(card).read_text()) | {"blob": "fc2"}))
    config.write_text(state_config(tmp_path).read_text() + f"model: {{embedding: fc2, weights: {str(weights)!r}}}\n")
    assert main(["--check-config", "--config", str(config)]) == 0
    own = load_config(config)
    assert identity_threshold(own) == json.loads(Path(card).read_text())["identity_threshold"]
    assert reid_threshold(own, json.loads(Path(f"{weights}.json").read_text())) is not None


def test_nobody_enrolled_says_so_once_and_every_face_is_unknown(tmp_path, johns):
    chips = [files[-1] for files in johns.values()][:2]
    proc = identify_cli(tmp_path, state_config(tmp_path), *chips, as_json=True)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "nobody is enrolled" in line]
    assert len(notes) == 1 and str(tmp_path / "state") in notes[0]
    records = json.loads(proc.stdout)
    assert [(r["identity"], r["similarity"], r["nearest"]) for r in records] == [(UNKNOWN, None, [])] * 2
    text = identify_cli(tmp_path, state_config(tmp_path), chips[0])
    assert text.stdout.strip().endswith(f": {UNKNOWN} (nobody enrolled); nearest: none")


@pytest.mark.parametrize("section, said", [
    # the johns were enrolled with box crops (Haar); YuNet gives aligned crops: nobody comparable
    ("detect: {detector: yunet}", ("aligned-v1 crops",)),
    # the note named the weights and crops alone: with only identity.embedding changed, it blamed
    # the weights, which had not changed
    ("identity: {embedding: single}", ("single embeddings", "tracker enroll --refresh")),
], ids=["other crops", "other embedding"])
def test_people_enrolled_for_another_crop_or_embedding_are_not_matched_and_the_note_says_which(enrolled, johns,
                                                                                              section, said):
    tmp, _, names, _ = enrolled
    config = tmp / "other.yaml"
    config.write_text(f"state_dir: {str(tmp / 'state')!r}\n{section}\n", encoding="utf-8")
    proc = identify_cli(tmp, config, johns[names[0]][-1], as_json=True)
    assert proc.returncode == 0, proc.stderr
    assert "nobody is enrolled" in proc.stderr and all(fragment in proc.stderr for fragment in said), proc.stderr
    assert json.loads(proc.stdout)[0]["identity"] == UNKNOWN


def test_identify_faces_agrees_with_match_and_ranks_the_nearest():
    rng = np.random.default_rng(7)
    means = rng.normal(size=(5, 16)).astype(np.float32)
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    # probes near person 2, near person 4, and random ones; the threshold leaves some unknown
    probes = np.concatenate([means[[2, 4]] * 3.0 + rng.normal(scale=0.1, size=(2, 16)),
                             rng.normal(size=(6, 16))]).astype(np.float32)
    gallery = Gallery(("a", "b", "c", "d", "e"), means, threshold=0.3)
    results = identify_faces(probes, gallery)
    assert [(name, sim) for name, sim, _ in results] == gallery.match(probes)
    assert {name for name, _, _ in results} >= {"c", "e", UNKNOWN}
    unit = probes / np.linalg.norm(probes, axis=1, keepdims=True)
    for (_, _, nearest), row in zip(results, unit @ means.T):
        assert [n for n, _ in nearest] == [gallery.names[j] for j in np.argsort(-row)[:3]]
        assert [s for _, s in nearest] == pytest.approx(sorted(row, reverse=True)[:3], abs=1e-6)
    two = Gallery(("a", "b"), means[:2], threshold=0.3)
    assert all(len(nearest) == 2 for _, _, nearest in identify_faces(probes, two))
    nobody = Gallery((), np.zeros((0, 16), np.float32), threshold=0.3)
    assert identify_faces(probes[:2], nobody) == [(UNKNOWN, None, [])] * 2


def test_a_large_photo_is_read_reduced_and_its_boxes_are_in_its_own_pixels(enrolled, testdata):
    """identify decoded a 24-megapixel photo whole (72 MB of BGR, where enroll decodes it at a
    fraction); read reduced, its boxes are still the photo's pixels."""
    tmp, config_path, _, _ = enrolled
    photo = testdata / "faces" / "dlib" / "faces" / "Tom_Cruise_avp_2014_4.jpg"
    small = cv2.imread(str(photo))
    large = tmp / "large.jpg"
    cv2.imwrite(str(large), cv2.resize(small, None, fx=6, fy=6, interpolation=cv2.INTER_CUBIC))  # 4800 px: read at 1/2
    from tracker.images import read_photo

    image, scale = read_photo(large)
    assert image.shape[:2] == (2400, 1695) and scale == 2.0
    boxes = []
    for path in (photo, large):
        proc = identify_cli(tmp, config_path, path, aligned=False, as_json=True)
        assert proc.returncode == 0, proc.stderr
        (face,) = json.loads(proc.stdout)
        boxes.append(face["box"])
    for key in "xywh":
        assert abs(boxes[1][key] - 6 * boxes[0][key]) <= 0.1 * 6 * boxes[0]["w"], (key, boxes)


def test_json_is_written_face_by_face_and_stays_one_document_with_an_unreadable_file(tmp_path, johns, monkeypatch):
    """Every face's record (~1.4 kB) was kept until the run's end: the first image's is out before
    the next file is read now, and the document is whole (as before) when exit 2 follows it."""
    from tracker import identify

    out, read_after = io.StringIO(), []
    monkeypatch.setattr(sys, "stdout", out)
    real_read_photo = identify.read_photo
    monkeypatch.setattr(identify, "read_photo", lambda path: read_after.append(out.getvalue()) or real_read_photo(path))
    notes = tmp_path / "notes.jpg"
    notes.write_text("a note, not a photo")
    chips = johns["John_Simm"][:2]
    args = ["identify", "--aligned", "--json", str(chips[0]), str(notes), str(chips[1]), "--config"]
    assert main([*args, str(state_config(tmp_path))]) == 2
    records = json.loads(out.getvalue())
    assert [r["image"] for r in records] == [str(chips[0]), str(chips[1])]
    assert out.getvalue() == json.dumps(records, indent=1) + "\n"  # the form it had when written at the end
    assert json.loads(read_after[1] + "]") == records[:1]  # out before notes.jpg was read
