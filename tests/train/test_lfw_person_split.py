"""scripts/lfw_person_split.py on a small LFW-shaped folder: the held-out people are absent from the
training folder and from the training pairs, the held-out pairs are readable by `tracker
eval-faces`'s reader and name only held-out people, and bad settings exit 2 with one line."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracker.verification import read_pairs

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lfw_person_split.py"


def lfw_like(root: Path) -> Path:
    """20 people with 1-4 photos (empty files: the script reads names only) and a pairsDevTrain.txt
    naming all of them."""
    lfw = root / "lfw"
    counts = {f"Person_{k:02d}": 1 + k % 4 for k in range(20)}
    for name, count in counts.items():
        (lfw / "images" / name).mkdir(parents=True)
        for i in range(1, count + 1):
            (lfw / "images" / name / f"{name}_{i:04d}.jpg").write_bytes(b"")
    matched = [f"{n}\t1\t2" for n, c in counts.items() if c >= 2]
    mismatched = [f"Person_{k:02d}\t1\tPerson_{k + 1:02d}\t1" for k in range(19)]
    (lfw / "pairsDevTrain.txt").write_text(f"{len(matched)}\n" + "\n".join(matched + mismatched) + "\n")
    return lfw


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_split_keeps_held_out_people_out_of_training(tmp_path):
    lfw, out = lfw_like(tmp_path), tmp_path / "split"
    result = run("--out", str(out), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4")
    assert result.returncode == 0, result.stderr
    held = set((out / "heldout_people.txt").read_text().split())
    trained = {p.name for p in (out / "images").iterdir()}
    assert len(held) == 7  # half of the 15 people with 2+ photos, rounded down
    assert not held & trained and len(held | trained) == 20
    assert all((out / "images" / name).resolve() == (lfw / "images" / name).resolve() for name in trained)
    pairs = read_pairs(out / "pairsHeldout.txt", lfw / "images")
    assert len(pairs) == 8 and sum(same for _, _, same in pairs) == 4
    assert len({(a, b) for a, b, _ in pairs}) == 8
    for a, b, same in pairs:
        assert a.parent.name in held and b.parent.name in held
        assert (a.parent == b.parent) == same and a != b
    train_pairs = read_pairs(out / "pairsTrainPeople.txt", out / "images")
    assert train_pairs and all(a.parent.name in trained and b.parent.name in trained for a, b, _ in train_pairs)


def test_same_seed_same_split_other_seed_other_split(tmp_path):
    lfw = lfw_like(tmp_path)
    texts = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        assert run("--out", str(tmp_path / name), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4", "--seed", seed).returncode == 0
        texts.append((tmp_path / name / "pairsHeldout.txt").read_text())
    assert texts[0] == texts[1] != texts[2]


def test_bad_settings_exit_2_with_one_line(tmp_path):
    lfw = lfw_like(tmp_path)
    for args, words in ((["--share", "1.5"], "--share 1.5"), (["--pairs", "1000"], "--pairs 1000"),
                        (["--lfw", str(tmp_path / "nowhere")], "no images/ folder")):
        result = run("--out", str(tmp_path / "out"), "--lfw", str(lfw), *args)
        assert result.returncode == 2 and words in result.stderr.splitlines()[-1], result.stderr


def test_a_second_split_into_the_same_folder_trains_none_of_its_held_out_people(tmp_path):
    """Links were only ever added: people held out by the second split still trained from the
    first's links, and its held-out figures were of people the net had seen."""
    lfw, out = lfw_like(tmp_path), tmp_path / "split"
    for seed in ("3", "4"):
        assert run("--out", str(out), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4", "--seed", seed).returncode == 0
    held = set((out / "heldout_people.txt").read_text().split())
    trained = {p.name for p in (out / "images").iterdir()}
    assert not held & trained and len(held | trained) == 20


def test_more_mismatched_pairs_than_the_held_out_people_have_is_refused(tmp_path):
    """Held out a person of 30 photos and one of 2: 436 matched pairs but 60 mismatched ones, and the
    mismatched draw went on for ever; other files in a person's folder are not photos (a Thumbs.db
    was an IndexError's traceback)."""
    lfw = tmp_path / "lfw"
    for name, count in (("Ann", 30), ("Bob", 2), ("Cid", 2)):
        (lfw / "images" / name).mkdir(parents=True)
        for i in range(1, count + 1):
            (lfw / "images" / name / f"{name}_{i:04d}.jpg").write_bytes(b"")
        (lfw / "images" / name / "Thumbs.db").write_bytes(b"")
    (lfw / "pairsDevTrain.txt").write_text("1\nAnn\t1\t2\nAnn\t1\tBob\t1\n")
    for seed in ("1", "2", "3"):  # two of the three held out, whichever
        result = run("--out", str(tmp_path / "out"), "--lfw", str(lfw), "--share", "0.99", "--pairs", "100", "--seed", seed)
        assert result.returncode == 2 and "--pairs 100: the held-out people have only" in result.stderr.splitlines()[-1]
    assert run("--out", str(tmp_path / "out"), "--lfw", str(lfw), "--share", "0.99", "--pairs", "1").returncode == 0


def test_a_failing_run_leaves_an_earlier_split_as_it_was(tmp_path):
    """The links were swapped and pairsHeldout.txt written before pairsDevTrain.txt was read: a
    missing or malformed one left a half-new split and a traceback."""
    lfw, out = lfw_like(tmp_path), tmp_path / "split"
    assert run("--out", str(out), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4", "--seed", "3").returncode == 0
    before = {p.relative_to(out): (p.read_text() if p.is_file() and not p.is_symlink() else "link") for p in out.rglob("*")}
    text = (lfw / "pairsDevTrain.txt").read_text()
    for content, words in ((None, "cannot read"), (text + "Person_01\t1\n", "pairsDevTrain.txt:")):
        if content is None:
            (lfw / "pairsDevTrain.txt").unlink()
        else:
            (lfw / "pairsDevTrain.txt").write_text(content)
        result = run("--out", str(out), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4", "--seed", "4")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert words in result.stderr.strip().splitlines()[-1]
        after = {p.relative_to(out): (p.read_text() if p.is_file() and not p.is_symlink() else "link") for p in out.rglob("*")}
        assert after == before


def test_an_out_that_cannot_be_a_split_is_one_line(tmp_path):
    lfw = lfw_like(tmp_path)
    (tmp_path / "a_file").write_text("")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "diary.txt").write_text("mine")
    for out, words in ((tmp_path / "a_file", "not a folder"), (tmp_path / "a_file" / "x", "cannot write"),
                       (tmp_path / "notes", "expected a new or earlier split's folder")):
        result = run("--out", str(out), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert words in result.stderr.strip().splitlines()[-1] and str(out) in result.stderr
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["diary.txt"]


def test_the_default_lfw_is_found_through_the_shared_data_folder(tmp_path):
    """The default --lfw was ../shared beside the checkout whatever $TRACKER_SHARED_DIR said."""
    lfw = tmp_path / "shared" / "datasets" / "lfw-devtrain"
    lfw.parent.mkdir(parents=True)
    lfw_like(tmp_path).rename(lfw)
    env = {**os.environ, "TRACKER_SHARED_DIR": str(tmp_path / "shared")}
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "split"), "--share", "0.5", "--pairs", "4"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    links = list((tmp_path / "split" / "images").iterdir())
    assert links and all(link.resolve().parent == lfw.resolve() / "images" for link in links)


def test_a_write_failing_midway_leaves_no_list_of_the_earlier_split(tmp_path, monkeypatch, capsys):
    """A write that failed after the links were swapped (a full disk: pairsTrainPeople.txt's write
    fails here) left the earlier split's heldout_people.txt beside the new links, naming as held
    out people who now train."""
    from repo_scripts import load_script

    lfw, out = lfw_like(tmp_path), tmp_path / "split"
    assert run("--out", str(out), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4", "--seed", "3").returncode == 0
    script = load_script("lfw_person_split")
    write = script.atomic_write

    def full_disk(path, content):
        if path.name == "pairsTrainPeople.txt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(path, content)

    monkeypatch.setattr(script, "atomic_write", full_disk)
    with pytest.raises(SystemExit) as exit_:
        script.main(["--out", str(out), "--lfw", str(lfw), "--share", "0.5", "--pairs", "4", "--seed", "4"])
    assert exit_.value.code == 2
    assert "cannot write the split" in capsys.readouterr().err.strip().splitlines()[-1]
    trained = {p.name for p in (out / "images").iterdir()}
    pairs = read_pairs(out / "pairsHeldout.txt", lfw / "images")  # this run's, written before the failure
    assert not (out / "heldout_people.txt").exists()
    assert pairs and not {a.parent.name for a, _, _ in pairs} & trained
