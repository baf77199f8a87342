"""scripts/heldout_faces.py on a tiny CelebA-shaped shared-data folder ($TRACKER_SHARED_DIR): the
card's teacher files leave their people out, links point at the photos from anywhere, pairs are
distinct, and mistakes are one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "heldout_faces.py"
PHOTOS = {"11": 4, "12": 3, "13": 2, "14": 2, "15": 1}  # CelebA identity: photos


def celeba_like(shared: Path, extra_line: str = "") -> dict[str, list[str]]:
    """A shared-data folder holding the CelebA list of PHOTOS (empty photo files); {identity: photos}."""
    folder = shared / "datasets" / "celeba-10k"
    folder.mkdir(parents=True)
    people: dict[str, list[str]] = {}
    number = 0
    for identity, count in PHOTOS.items():
        for _ in range(count):
            number += 1
            people.setdefault(identity, []).append(f"{number:06d}.jpg")
            (folder / f"{number:06d}.jpg").write_bytes(b"")
    lines = [f"{image} {identity}" for identity, images in people.items() for image in images]
    (folder / "identity_CelebA_first10000.txt").write_text("image identity\n" + "\n".join(lines) + "\n" + extra_line)
    return people


def card(path: Path, teachers: list[str] | None = None) -> Path:
    content: dict = {"classes": ["celeba-10k:14"]}
    if teachers is not None:
        content["training"] = {"teacher": teachers}
    path.write_text(json.dumps(content))
    return path


def run(shared: Path | str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRACKER_SHARED_DIR": str(shared)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd)


def test_the_cards_teacher_files_leave_their_people_out_without_teacher(tmp_path):
    """The card lists the teacher files the weights trained with; they were only heeded when
    --teacher repeated them, so a CelebA teacher's people were 'held out' though trained on."""
    people = celeba_like(tmp_path / "shared")
    teacher = tmp_path / "celeba.npz"
    np.savez(teacher, paths=np.array([people["11"][0]]), descriptor=np.zeros((1, 128), np.float32))
    result = run(tmp_path / "shared", "--out", str(tmp_path / "out"), "--pairs", "1",
                 "--card", str(card(tmp_path / "card.json", [str(teacher)])))
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (tmp_path / "out" / "images").iterdir()} == {"12", "13"}  # 14 a class, 15 one photo


def test_a_missing_teacher_file_of_the_card_is_one_line_naming_it(tmp_path):
    celeba_like(tmp_path / "shared")
    missing = tmp_path / "gone.npz"
    result = run(tmp_path / "shared", "--out", str(tmp_path / "out"),
                 "--card", str(card(tmp_path / "card.json", [str(missing)])))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert str(missing) in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_a_relative_shared_folder_gives_links_to_the_photos(tmp_path):
    """The links' targets were as relative as $TRACKER_SHARED_DIR, so from DIR/images/<id>/ they
    named nothing; the run still reported success."""
    celeba_like(tmp_path / "shared")
    result = run("shared", "--out", "out", "--pairs", "1", "--card", str(card(tmp_path / "card.json")), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    links = list((tmp_path / "out").glob("*/*/*.jpg"))
    assert len(links) == 4 + 3 + 2 + 4 + 3 and all(link.exists() for link in links)


def test_pairs_are_distinct_and_more_than_the_people_have_are_refused(tmp_path):
    """Matched pairs were drawn with replacement: asking for many repeated pairs, which landed in
    different folds of `tracker eval-faces`."""
    celeba_like(tmp_path / "shared")
    card_file = card(tmp_path / "card.json")
    result = run(tmp_path / "shared", "--out", str(tmp_path / "out"), "--pairs", "10", "--card", str(card_file))
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "out" / "pairs.txt").read_text().splitlines()[1:]
    matched = [(n, *sorted((int(i), int(j)))) for n, i, j in (line.split() for line in lines if len(line.split()) == 3)]
    mismatched = [tuple(sorted([(a, i), (b, j)])) for a, i, b, j in (line.split() for line in lines if len(line.split()) == 4)]
    assert len(matched) == 10 == len(set(matched))  # all of 11's 6, 12's 3 and 13's 1 pairs
    assert len(mismatched) == 10 == len(set(mismatched))
    too_many = run(tmp_path / "shared", "--out", str(tmp_path / "out2"), "--pairs", "11", "--card", str(card_file))
    assert too_many.returncode == 2 and "Traceback" not in too_many.stderr
    assert "--pairs 11: the held-out people have only 10 matched" in too_many.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out2").exists()


def test_a_malformed_identity_list_is_one_line(tmp_path):
    celeba_like(tmp_path / "shared", extra_line="000099.jpg\n")
    result = run(tmp_path / "shared", "--out", str(tmp_path / "out"), "--card", str(card(tmp_path / "card.json")))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "expected 'image identity'" in result.stderr.strip().splitlines()[-1]


def test_an_out_below_a_file_is_one_line(tmp_path):
    celeba_like(tmp_path / "shared")
    (tmp_path / "a_file").write_text("")
    result = run(tmp_path / "shared", "--out", str(tmp_path / "a_file" / "x"), "--pairs", "1",
                 "--card", str(card(tmp_path / "card.json")))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--out" in result.stderr.strip().splitlines()[-1]


def test_a_set_that_does_not_fit_is_one_line_and_leaves_nothing_half_made(tmp_path):
    """A link that failed midway (here: a file system out of inodes) was a traceback and left a
    half set behind, which a rerun then refused as 'not empty'."""
    from tmpfs import tmpfs

    celeba_like(tmp_path / "shared")
    with tmpfs(tmp_path / "small", "size=1m,nr_inodes=8") as small:
        result = run(tmp_path / "shared", "--out", str(small / "out"), "--pairs", "1",
                     "--card", str(card(tmp_path / "card.json")))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert str(small / "out") in last and "No space left on device" in last, result.stderr
        assert list((small / "out").iterdir()) == []
