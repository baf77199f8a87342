"""scripts/teacher_descriptors.py with the real dlib teacher on dlib's five johns, and
scripts/heldout_faces.py leaving the people of a teacher file out of its evaluation set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def johns_teacher(testdata, tmp_path_factory):
    """The teacher file of the johns with 2 of the 5 held out, described by two processes: (npz path,
    the johns' folder)."""
    johns = testdata / "faces" / "dlib" / "johns"
    out = tmp_path_factory.mktemp("teacher") / "johns.npz"
    result = run("teacher_descriptors.py", str(johns), "--out", str(out), "--hold-out", "0.4", "--seed", "3", "--jobs", "2")
    assert result.returncode == 0, result.stderr
    assert "2 people held out" in result.stdout
    return out, johns


def test_descriptors_cover_the_kept_people_and_tell_them_apart(johns_teacher):
    out, johns = johns_teacher
    held = set(Path(f"{out}.held-out.txt").read_text().split())
    with np.load(out) as data:
        paths, descriptors, found = [str(p) for p in data["paths"]], data["descriptor"], data["dlib_face_found"]
    kept = sorted(p.relative_to(johns).as_posix() for p in johns.glob("*/*.jpg") if p.parent.name not in held)
    assert len(held) == 2 and sorted(paths) == kept
    assert descriptors.shape == (len(kept), 128) and descriptors.dtype == np.float32
    assert found.all()  # 150 px chips of one face each
    people = np.array([p.split("/")[0] for p in paths])
    unit = descriptors / np.linalg.norm(descriptors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    same = people[:, None] == people[None, :]
    off_diagonal = ~np.eye(len(paths), dtype=bool)
    # dlib's descriptor: the worst same-person pair is closer than the best different-person pair
    assert similarity[same & off_diagonal].min() > similarity[~same].max()


def test_descriptors_reproduce_the_shared_lfw_teacher_file(tmp_path, testdata):
    """The teacher of ../shared/datasets/lfw-devtrain was made the same way: for the same photos the
    script's descriptors point the same way (cosine 0.998-1.0 measured) and are as long."""
    lfw = testdata.parent / "datasets" / "lfw-devtrain"
    (tmp_path / "images").mkdir()
    for person in ("Bill_Nelson", "Bill_Parcells", "Bill_Kong"):
        (tmp_path / "images" / person).symlink_to(lfw / "images" / person)
    result = run("teacher_descriptors.py", str(tmp_path / "images"), "--out", str(tmp_path / "lfw.npz"))
    assert result.returncode == 0, result.stderr
    with np.load(lfw / "dlib_descriptors.npz") as shared:
        reference = {str(p): d for p, d in zip(shared["paths"], shared["descriptor"])}
    with np.load(tmp_path / "lfw.npz") as made:
        pairs = [(d, reference[str(p)]) for p, d in zip(made["paths"], made["descriptor"])]
    assert len(pairs) >= 4
    for ours, theirs in pairs:
        assert ours @ theirs / np.linalg.norm(ours) / np.linalg.norm(theirs) > 0.99
        assert abs(np.linalg.norm(ours) / np.linalg.norm(theirs) - 1.0) < 0.05


def test_heldout_faces_leaves_out_every_person_of_a_teacher_file(tmp_path, testdata):
    celeba = testdata.parent / "datasets" / "celeba-10k" / "identity_CelebA_first10000.txt"
    lines = [line.split() for line in celeba.read_text().splitlines()[1:]]
    people: dict[str, list[str]] = {}
    for image, identity in lines:
        people.setdefault(identity, []).append(image)
    distilled = [p for p, images in people.items() if len(images) >= 2][:40]
    teacher = tmp_path / "celeba.npz"
    # one photo of each of 40 people with two or more: the person is left out, not just the photo
    np.savez(teacher, paths=np.array([people[p][0] for p in distilled]), descriptor=np.zeros((40, 128), np.float32))
    card = tmp_path / "card.json"
    card.write_text('{"classes": []}')
    without = run("heldout_faces.py", "--out", str(tmp_path / "all"), "--card", str(card), "--pairs", "5")
    with_teacher = run("heldout_faces.py", "--out", str(tmp_path / "held"), "--card", str(card), "--pairs", "5",
                       "--teacher", str(teacher))
    assert without.returncode == 0 and with_teacher.returncode == 0, without.stderr + with_teacher.stderr
    everyone = {p.name for p in (tmp_path / "all" / "images").iterdir()}
    held = {p.name for p in (tmp_path / "held" / "images").iterdir()}
    assert set(distilled) <= everyone and held == everyone - set(distilled)


def test_bad_settings_are_one_line_and_exit_2(tmp_path, testdata):
    johns = testdata / "faces" / "dlib" / "johns"
    for args, expected in ((["--hold-out", "1.5"], "--hold-out 1.5"), (["--upsample", "5"], "--upsample 5"),
                           (["--jobs", "0"], "--jobs 0"), (["--jobs", "100000"], "--jobs 100000; expected 1 to 64")):
        result = run("teacher_descriptors.py", str(johns), "--out", str(tmp_path / "t.npz"), *args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and expected in result.stderr
    missing = run("teacher_descriptors.py", str(tmp_path / "nowhere"), "--out", str(tmp_path / "t.npz"))
    assert missing.returncode == 2 and "nowhere" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "t.npz").exists()
    (tmp_path / "a_file").write_text("")
    unwritable = run("teacher_descriptors.py", str(johns), "--hold-out", "0.8", "--out", str(tmp_path / "a_file" / "t.npz"))
    assert unwritable.returncode == 2 and "a_file" in unwritable.stderr and "Traceback" not in unwritable.stderr


def test_heldout_faces_mistakes_are_one_line_and_exit_2(tmp_path, testdata):
    """Each was a traceback (a missing card, an .npy as teacher), a useless pairs file (--pairs 0),
    a silent no-op (a teacher of LFW's photos) or a set holding people trained on since (an --out
    of an earlier run)."""
    card = tmp_path / "card.json"
    card.write_text('{"classes": []}')
    np.save(tmp_path / "t.npy", np.zeros((2, 128), np.float32))
    np.savez(tmp_path / "lfw.npz", paths=np.array(["AJ_Cook/AJ_Cook_0001.jpg"]), descriptor=np.zeros((1, 128), np.float32))
    (tmp_path / "used" / "images").mkdir(parents=True)
    out = ["--out", str(tmp_path / "out")]
    for args, words in (
            ([*out, "--card", str(tmp_path / "nowhere.json")], "--card"),
            ([*out, "--card", str(card), "--pairs", "0"], "--pairs 0: expected a positive number"),
            ([*out, "--card", str(card), "--teacher", str(tmp_path / "t.npy")], "unreadable (not a whole .npz archive)"),
            ([*out, "--card", str(card), "--teacher", str(tmp_path / "lfw.npz")], "describes none of CelebA's photos"),
            (["--out", str(tmp_path / "used"), "--card", str(card)], "not empty; expected a new or empty folder"),
            (["--out", str(card), "--card", str(card)], "not a folder; expected a new or empty folder")):
        result = run("heldout_faces.py", *args)
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and "Traceback" not in result.stderr and words in last, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_out_is_refused_before_any_photo_is_read(tmp_path):
    """--out was checked only after every photo was described (a quarter of an hour on CelebA); a
    photo no reader can open shows it is not read now (it gave 'no readable photo' first)."""
    (tmp_path / "data" / "Ann").mkdir(parents=True)
    (tmp_path / "data" / "Ann" / "Ann_0001.jpg").write_bytes(b"not a photo")
    (tmp_path / "a_file").write_text("")
    (tmp_path / "folder").mkdir()
    for out, words in ((tmp_path / "folder", "is a folder"), (tmp_path / "a_file" / "t.npz", "cannot write")):
        result = run("teacher_descriptors.py", str(tmp_path / "data"), "--out", str(out))
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert words in result.stderr and str(out) in result.stderr


def test_a_run_without_hold_out_leaves_no_earlier_held_out_names(tmp_path, testdata):
    """A rerun without --hold-out left the earlier run's .held-out.txt beside the new file, naming
    people the new file describes."""
    (tmp_path / "data").mkdir()
    john = sorted((testdata / "faces" / "dlib" / "johns").iterdir())[0]
    (tmp_path / "data" / john.name).symlink_to(john)
    held_out = tmp_path / "t.npz.held-out.txt"
    held_out.write_text(f"{john.name}\n")
    result = run("teacher_descriptors.py", str(tmp_path / "data"), "--out", str(tmp_path / "t.npz"))
    assert result.returncode == 0, result.stderr
    assert held_out.read_text() == ""
