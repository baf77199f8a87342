"""`tracker eval-faces` through the CLI, on the johns chips laid out as LFW lays out its photos.

Data: ../shared/testdata/faces/dlib/johns/ (5 people x 11 aligned 150x150 chips), linked here as
`<Name>/<Name>_0001.jpg` ... `<Name>_0011.jpg` in the chips' sorted order. YuNet finds the face of
every chip (padded, as `central_face` and `chip_face` look), so the counts of pairs and probes are
known; the figures themselves depend on the weights and are only checked to be rates.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_pipeline_e2e import isolated_env, tracker_command

from tracker.cli import main

PAIRS = [("John_Simm", 1, 2), ("John_Salley", 3, 4), ("John_Savage", 1, 5), ("John_Shimkus", 2, 3), ("John_Schneider", 6, 7)]
MISMATCHED = [("John_Simm", 1, "John_Salley", 2), ("John_Savage", 3, "John_Schneider", 4), ("John_Shimkus", 5, "John_Simm", 6),
              ("John_Salley", 7, "John_Savage", 8), ("John_Schneider", 9, "John_Shimkus", 10)]
RATES = ("accuracy_10fold", "roc_auc", "tar_at_far_1pct", "tar_at_far_0.1pct", "tar_at_threshold", "far_at_threshold")


def pairs_text(matched=PAIRS, mismatched=MISMATCHED) -> str:
    """LFW's View 1 format: the count, then the matched and the mismatched pairs."""
    lines = [str(len(matched))] + ["\t".join(map(str, p)) for p in matched] + ["\t".join(map(str, p)) for p in mismatched]
    return "\n".join(lines) + "\n"


def eval_faces(tmp_path: Path, config: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*tracker_command(), "eval-faces", *map(str, args), "--config", str(config)],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)


def yunet_config(folder: Path, weights: Path | None = None) -> Path:
    """A config in `folder` with YuNet (and these model weights, if given)."""
    path = folder / "tracker.yaml"
    text = f"state_dir: {str(folder / 'state')!r}\ndetect: {{detector: yunet}}\n"
    if weights is not None:
        text += f"model: {{weights: {str(weights)!r}}}\n"
    path.write_text(text, encoding="utf-8")
    return path


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tracker: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def lfw(tmp_path_factory, johns) -> Path:
    """The johns as an LFW image folder of symlinks."""
    root = tmp_path_factory.mktemp("eval-faces") / "lfw"
    for name, files in johns.items():
        (root / name).mkdir(parents=True)
        for i, file in enumerate(files, 1):
            (root / name / f"{name}_{i:04d}.jpg").symlink_to(file)
    return root


def test_pairs_json_has_the_documented_figures(tmp_path, lfw):
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(pairs_text())
    out = tmp_path / "figures.json"
    proc = eval_faces(tmp_path, yunet_config(tmp_path), "--pairs", pairs, "--images", lfw, "--json", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert set(report) == {"backend", "precision", "embedding", "detector", "pairs_file", "pairs_left_out", "pairs", *RATES,
                           "accuracy_std", "threshold_far_1pct", "threshold_far_0.1pct", "threshold", "photos_unreadable"}
    assert report["pairs"] == len(PAIRS) + len(MISMATCHED) and report["pairs_left_out"] == 0
    assert report["photos_unreadable"] == 0
    assert report["pairs_file"] == str(pairs) and report["detector"] == "yunet" and report["embedding"] == "mirror-mean"
    assert all(0.0 <= report[key] <= 1.0 for key in RATES)
    assert -1.0 <= report["threshold"] <= 1.0
    assert f"wrote {out}" in proc.stderr
    table = proc.stdout.splitlines()
    assert table[0].startswith("eval-faces (") and len(table) == 1 + len(report)
    assert any(line.split() == ["pairs", str(report["pairs"])] for line in table)
    # a --json that cannot be written (a file-size limit of 0, as a full disk) keeps the old report
    before = out.read_bytes()
    refused = subprocess.run([*tracker_command(), "eval-faces", "--pairs", str(pairs), "--images", str(lfw), "--json",
                              str(out), "--config", str(yunet_config(tmp_path))], capture_output=True, text=True,
                             env=isolated_env(tmp_path), cwd=tmp_path, timeout=300,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)))
    assert "cannot write --json" in one_error_line(refused) and out.read_bytes() == before


def test_one_pass_embeddings_on_request_with_their_own_threshold(tmp_path, lfw):
    """identity.embedding: single against the card's mirror-mean: other scores, and the threshold
    the card holds for one pass."""
    from tracker.model.card import card_path
    from tracker.model.spec import default_model

    pairs = tmp_path / "pairs.txt"
    pairs.write_text(pairs_text())
    reports = {}
    for embedding in ("mirror-mean", "single"):
        folder = tmp_path / embedding
        folder.mkdir()
        config = yunet_config(folder)
        config.write_text(config.read_text() + f"identity: {{embedding: {embedding}}}\n")
        out = tmp_path / f"{embedding}.json"
        proc = eval_faces(tmp_path, config, "--pairs", pairs, "--images", lfw, "--json", out)
        assert proc.returncode == 0, proc.stderr
        reports[embedding] = json.loads(out.read_text())
    card = json.loads(card_path(default_model().weights).read_text())
    assert reports["single"]["embedding"] == "single"
    assert reports["single"]["threshold"] == card["thresholds_for"]["single"]["identity_threshold"]
    assert reports["mirror-mean"]["threshold"] == card["identity_threshold"] != reports["single"]["threshold"]
    assert reports["single"]["threshold_far_1pct"] != reports["mirror-mean"]["threshold_far_1pct"]  # other scores


def test_folder_of_chips_enrols_every_other_person(tmp_path, lfw, johns):
    """With a damaged photo among a stranger's: left out of the probes, and counted in the report."""
    folder = tmp_path / "people"
    for person in sorted(lfw.iterdir()):
        (folder / person.name).mkdir(parents=True)
        for chip in person.iterdir():
            (folder / person.name / chip.name).symlink_to(chip.resolve())
    second = sorted(folder.iterdir())[1]
    (second / "damaged.jpg").write_bytes(b"\xff\xd8 not the rest of a JPEG")
    out = tmp_path / "figures.json"
    proc = eval_faces(tmp_path, yunet_config(tmp_path), "--folder", folder, "--chips", "--enroll", 6, "--json", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    # 5 people sorted: the 1st, 3rd and 5th are enrolled from 6 chips and probed with their other 5;
    # every chip of the 2nd and 4th is a stranger's
    assert report["people_enrolled"] == 3 and report["images_enrolled_each"] == 6
    assert report["probes_enrolled"] == 3 * (11 - 6) and report["probes_strangers"] == 2 * 11
    assert report["photos_unreadable"] == 1 and "damaged.jpg' is not a readable image" in proc.stderr
    assert 0.0 <= report["identified"] <= report["rank1"] <= 1.0
    assert 0.0 <= report["strangers_unknown"] <= 1.0


def test_a_person_to_enrol_without_a_face_is_left_out_and_the_run_goes_on(tmp_path, johns):
    """The run stopped at such a person, the minutes spent on the people before them lost."""
    folder = tmp_path / "people"
    for name, chips in johns.items():
        (folder / name).mkdir(parents=True)
        for chip in chips:
            (folder / name / chip.name).symlink_to(chip.resolve())
    third = sorted(folder.iterdir())[2]  # enrolled: the 1st, 3rd and 5th
    for i in range(6):  # sorted before the chips: his first six images show no face
        (third / f"-blank{i}.jpg").write_bytes(b"not a photo")
    out = tmp_path / "figures.json"
    proc = eval_faces(tmp_path, yunet_config(tmp_path), "--folder", folder, "--chips", "--enroll", 6, "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert (f"eval-faces: no face found in the first 6 images of {third.name!r}: left out (neither enrolled nor "
            "probed)") in proc.stderr.splitlines()
    report = json.loads(out.read_text())
    assert report["people_enrolled"] == 2 and report["people_left_out"] == 1 and report["photos_unreadable"] == 6
    assert report["probes_enrolled"] == 2 * (11 - 6) and report["probes_strangers"] == 2 * 11


@pytest.mark.parametrize("bad_line, expected", [("John_Simm\t1\t12", "John_Simm_0012.jpg"),  # the johns have 11 chips
                                                ("Nobody\t1\tJohn_Simm\t2", "Nobody_0001.jpg"),
                                                ("John_Simm\tone\t2", "expected 'name i j'")])
def test_bad_pairs_line_is_exit_2_naming_its_line(tmp_path, lfw, bad_line, expected):
    pairs = tmp_path / "pairs.txt"
    lines = pairs_text().splitlines()
    lines[3] = bad_line  # line 4 of the file
    pairs.write_text("\n".join(lines) + "\n")
    error = one_error_line(eval_faces(tmp_path, yunet_config(tmp_path), "--pairs", pairs, "--images", lfw))
    assert f"{pairs}:4:" in error and expected in error


@pytest.mark.parametrize("args", [[], ["--pairs", "p.txt", "--images", "lfw", "--folder", "lfw"]])
def test_neither_or_both_modes_is_exit_2(tmp_path, capsys, args):
    code = main(["eval-faces", *args, "--config", str(yunet_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("tracker: error: eval-faces: ") and "--pairs" in err and "--folder" in err


def test_missing_weights_are_one_line_as_for_identify(tmp_path, capsys, johns):
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\nmodel: {{weights: {str(tmp_path / 'nope.caffemodel')!r}}}\n")
    code = main(["eval-faces", "--config", str(config), "--folder", str(next(iter(johns.values()))[0].parent.parent),
                 "--chips"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "nope.caffemodel" in err, err


def test_folder_with_one_person_is_exit_2(tmp_path, johns):
    folder = tmp_path / "one"
    (folder / "John_Simm").mkdir(parents=True)
    for file in johns["John_Simm"]:
        (folder / "John_Simm" / file.name).symlink_to(file)
    (folder / "Empty_Person").mkdir()  # a folder without images is not a person
    error = one_error_line(eval_faces(tmp_path, yunet_config(tmp_path), "--folder", folder, "--chips"))
    assert str(folder) in error and "1 person folder" in error and "at least two" in error


def test_a_folder_named_like_a_photo_is_no_photo(tmp_path, johns):
    """eval-faces took <person>/old.jpg, a folder, for a photo and stopped; enroll passes over one."""
    from tracker.evaluate_faces import _people

    for person in ("John_Simm", "John_Salley"):
        (tmp_path / person).mkdir()
        (tmp_path / person / "a.jpg").symlink_to(johns[person][0])
    (tmp_path / "John_Simm" / "old.jpg").mkdir()
    assert _people(tmp_path) == {"John_Salley": [tmp_path / "John_Salley" / "a.jpg"],
                                 "John_Simm": [tmp_path / "John_Simm" / "a.jpg"]}


def test_weights_of_another_network_are_exit_2(tmp_path, testdata, lfw):
    lenet = testdata / "caffe" / "lenet" / "lenet_iter_10000.caffemodel"
    config = yunet_config(tmp_path, weights=lenet)
    error = one_error_line(eval_faces(tmp_path, config, "--folder", lfw, "--chips"))
    assert str(lenet) in error and "shape" in error


@pytest.mark.parametrize("args, expected", [
    (["--pairs", "p.txt", "--images", "lfw", "--chips"], "--chips and --enroll apply to --folder only"),
    (["--folder", "lfw", "--images", "lfw"], "--images applies to --pairs only"),
    (["--folder", "lfw", "--json", "no-such-folder/out.json"], "cannot write in 'no-such-folder' (No such file"),
    (["--folder", "lfw", "--json", "."], "--json: bad value '.': a folder; expected a JSON file to write"),
    (["--folder", "lfw", "--json", "/proc/out.json"], "--json: bad value '/proc/out.json': cannot write in '/proc' ("),
    (["--pairs", "p.txt", "--images", "lfw", "--enroll=3"], "--chips and --enroll apply to --folder only"),
])
def test_options_of_the_other_mode_and_an_unwritable_json_are_exit_2_before_any_work(tmp_path, capsys, args, expected):
    code = main(["eval-faces", *args, "--config", str(yunet_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err, err


def test_a_folder_with_no_face_to_test_is_exit_2(tmp_path, johns):
    folder = tmp_path / "people"
    for name in ("A", "B"):
        (folder / name).mkdir(parents=True)
    for file in johns["John_Simm"][:2]:
        (folder / "A" / file.name).symlink_to(file)
    grey = np.full((150, 150, 3), 128, np.uint8)
    cv2.imwrite(str(folder / "A" / "zz_grey.png"), grey)  # A's only image to test: no face
    cv2.imwrite(str(folder / "B" / "grey.png"), grey)  # B, a stranger without a face
    error = one_error_line(eval_faces(tmp_path, yunet_config(tmp_path), "--folder", folder, "--chips", "--enroll", "2"))
    assert "no face found in any image to test" in error


def test_photos_are_held_as_pixels_with_a_progress_line_and_embed_as_the_guard_crops(testdata, capsys, monkeypatch):
    """The cut faces are kept as uint8 pixels (a quarter of float32's memory) and become exactly the
    network input the guard makes of them; long runs say how far they are."""
    import tracker.evaluate_faces as evaluate
    from tracker.config import parse_config
    from tracker.crops import crop_batch
    from tracker.detect import create_detector
    from tracker.enroll import central_face

    files = sorted((testdata / "faces" / "dlib" / "johns").glob("*/*.jpg"))[:5]
    detector = create_detector(parse_config({"detect": {"detector": "yunet"}}).detect, quiet=True)
    monkeypatch.setattr(evaluate, "PROGRESS_EVERY", 2)
    pixels, found = evaluate.photo_crops(files, detector)
    assert pixels.dtype == np.uint8 and pixels.shape == (int(found.sum()), 88, 88) and found.sum() >= 4
    assert capsys.readouterr().err.splitlines() == ["eval-faces: 2 of 5 photos cut", "eval-faces: 4 of 5 photos cut"]
    progress = evaluate.Progress(10)  # a folder's: photo_crops of two people's 5 photos count on
    for _ in range(2):
        evaluate.photo_crops(files, detector, progress=progress)
    assert capsys.readouterr().err.splitlines() == [f"eval-faces: {n} of 10 photos cut" for n in (2, 4, 6, 8)]
    first = files[int(np.flatnonzero(found)[0])]
    image = cv2.imread(str(first))
    expected = crop_batch(image, [central_face(image, detector)])
    assert np.array_equal(evaluate.network_input(pixels[:1]), expected)


def test_pairs_are_embedded_a_part_of_the_photos_at_a_time_with_the_same_scores(tmp_path, lfw, monkeypatch):
    """Every photo of the pairs file was cut before any was embedded: 100,000 pairs' photos held
    1.5 GB of pixels. They are cut PHOTOS_AT_ONCE at a time, each part embedded by every backend."""
    import tracker.evaluate_faces as evaluate
    from tracker.config import parse_config
    from tracker.detect import create_detector
    from tracker.enroll import open_backend

    pairs = tmp_path / "pairs.txt"
    pairs.write_text(pairs_text(), encoding="utf-8")
    config = parse_config({"detect": {"detector": "yunet"}})
    detector = create_detector(config.detect, quiet=True)
    backend = open_backend(config, None, "fp32")
    cut = evaluate.photo_crops
    parts: list[int] = []
    monkeypatch.setattr(evaluate, "photo_crops", lambda files, *args: parts.append(len(files)) or cut(files, *args))
    try:
        [(whole, same, left_out)] = evaluate.pair_scores(pairs, lfw, detector, [backend])
        assert parts == [19] and left_out == 0  # the 19 distinct photos of the 10 pairs, at once
        parts.clear()
        monkeypatch.setattr(evaluate, "PHOTOS_AT_ONCE", 4)
        results = evaluate.pair_scores(pairs, lfw, detector, [backend, backend])
    finally:
        backend.close()
    assert parts == [4, 4, 4, 4, 3]
    for scores, same_again, left_out in results:
        assert np.allclose(scores, whole, atol=1e-6) and np.array_equal(same_again, same) and left_out == 0


def test_an_unreadable_photo_counts_as_one_without_a_face_and_is_named(tmp_path, testdata, capsys, monkeypatch):
    """It stopped the whole evaluation, minutes of LFW's photos, at the first damaged file."""
    import tracker.evaluate_faces as evaluate
    from tracker.config import parse_config
    from tracker.detect import create_detector

    good = sorted((testdata / "faces" / "dlib" / "johns").glob("*/*.jpg"))[:2]
    damaged = [tmp_path / f"damaged{i}.jpg" for i in range(3)]
    for path in damaged:
        path.write_bytes(b"\xff\xd8 not the rest of a JPEG")
    detector = create_detector(parse_config({"detect": {"detector": "yunet"}}).detect, quiet=True)
    monkeypatch.setattr(evaluate, "NAMED_UNREADABLE", 2)
    progress = evaluate.Progress(5)
    pixels, found = evaluate.photo_crops([damaged[0], *good, *damaged[1:]], detector, progress=progress)
    assert found.tolist() == [False, True, True, False, False] and len(pixels) == 2 and progress.unreadable == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"eval-faces: {str(damaged[0])!r} is not a readable image (damaged, not an image, over 24 "
                     "megapixels, or a JPEG of over 100 scans): counted as a photo without a face",
                     f"eval-faces: {str(damaged[1])!r} is not a readable image (damaged, not an image, over 24 "
                     "megapixels, or a JPEG of over 100 scans): counted as a photo without a face; further ones are only "
                     "counted"]


def test_a_json_named_as_the_pairs_file_is_refused_and_the_pairs_kept(tmp_path, lfw, capsys):
    """`--pairs pairs.txt --json pairs.txt` replaced the pairs file with the figures."""
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(pairs_text())
    code = main(["eval-faces", "--pairs", str(pairs), "--images", str(lfw), "--json", str(pairs), "--config",
                 str(yunet_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"tracker: error: output file {str(pairs)!r} is the pairs file; expected another "
                                 "path (writing it would destroy the pairs)\n"), err
    assert pairs.read_text() == pairs_text()


def test_a_json_among_the_photos_is_refused_and_the_photos_kept(tmp_path, johns, capsys):
    """`--folder people --json people/alice/1.jpg` would replace a photo with the figures."""
    people = tmp_path / "people"
    shutil.copytree(next(iter(johns.values()))[0].parent, people / "alice")
    photo = sorted((people / "alice").iterdir())[0]
    before = photo.read_bytes()
    code = main(["eval-faces", "--folder", str(people), "--json", str(photo), "--config", str(yunet_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"tracker: error: eval-faces: --json {str(photo)!r} is inside --folder {str(people)!r}; "
                                 "expected a path outside the photos it reads\n"), err
    assert photo.read_bytes() == before


@pytest.mark.parametrize("args, expected", [
    (["--backend", "nosuch"], "tracker: error: --backend: unknown backend 'nosuch'; expected one of caffe-openblas, "),
    (["--backend", "opencv-dnn", "--precision", "int8"], "tracker: error: --precision: backend 'opencv-dnn' has no "
                                                         "'int8' model; backends with 'int8': "),
])
def test_a_backend_or_precision_refused_is_named_as_the_option_given(tmp_path, johns, capsys, args, expected):
    """They were named as the config's keys ("backend: unknown name 'nosuch'", "precision: ..."),
    which the user had not written."""
    code = main(["eval-faces", "--folder", str(next(iter(johns.values()))[0].parent.parent), *args, "--config",
                 str(yunet_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(expected), err
