"""`tracker train` end to end on a small subset of ../shared/datasets (a few steps, not an epoch of
the real thing): the loss falls, the exported caffemodel loads and matches the trained torch net on
the project's Caffe engine, the card holds a threshold measured on pairs; --resume, a checkpoint of
another run, a full disk during checkpointing or at the export, data without faces, and mistakes
that must fail before any work. Needs PyTorch (native only)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_hardening import without_root_overrides
from test_pipeline_e2e import isolated_env, tracker_command
from tmpfs import tmpfs

from tracker.backends import create_backend
from tracker.files import file_sha256
from tracker.model.caffe_io import load_net
from tracker.model.card import read_card
from tracker.model.convert.graph import lower
from tracker.model.face_cnn import he_weights
from tracker.model.spec import ModelSpec, default_model

torch = pytest.importorskip("torch", reason="tracker train needs PyTorch (the train extra; not on the Pi)")

from tracker.train.net import TrainableNet, export_netdef  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LFW = REPO.parent / "shared" / "datasets" / "lfw-devtrain"
PHOTOS = 80  # more than the teacher target needs (64 principal axes)


def need_lfw() -> None:
    """Skipped with a reason where the training data is absent (a checkout without the shared
    datasets), but never in CI, which has them."""
    if not LFW.is_dir():
        if os.environ.get("CI"):
            raise RuntimeError(f"training data missing at {LFW}; CI must have it")
        pytest.skip(f"training data not found at {LFW}")


def run_train(tmp_path: Path, *args: str, work: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*tracker_command(), "train", "--data", str(LFW / "images"), "--limit", str(PHOTOS),
                           "--teacher", str(LFW / "dlib_descriptors.npz"), "--batch", "16",
                           "--work", str(work or tmp_path / "work"), *args],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=timeout)


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The error line: progress lines (photos cut, epochs) come before it on stderr."""
    return proc.stderr.strip().splitlines()[-1]


def small_pairs(path: Path) -> Path:
    """LFW-format pairs among the first people of the LFW set that have two photos or more."""
    people = [p.name for p in sorted((LFW / "images").iterdir()) if len(list(p.iterdir())) >= 2][:6]
    lines = [f"{p}\t1\t2" for p in people] + [f"{a}\t1\t{b}\t1" for a, b in zip(people, people[1:])]
    path.write_text(f"{len(people)}\n" + "\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    need_lfw()
    tmp = tmp_path_factory.mktemp("train")
    out = tmp / "face.caffemodel"
    proc = run_train(tmp, "--steps", "24", "--epochs", "10", "--lr", "0.01", "--out", str(out),
                     "--pairs", str(small_pairs(tmp / "pairs.txt")), "--pairs-images", str(LFW / "images"))
    return tmp, out, proc


def test_training_lowers_the_loss_and_writes_a_caffemodel_with_its_card(trained):
    tmp, out, proc = trained
    assert proc.returncode == 0, proc.stderr[-2000:]
    card = read_card(out, file_sha256(out))
    training = card["training"]
    assert training["steps"] == 24 and training["photos"] <= PHOTOS
    assert training["last_loss"] < training["first_loss"], training
    assert card["crop"] == "aligned-v1"  # the default detector gives landmarks
    assert card["embedding"] == "mirror-mean" and card["blob"] == "fc1"  # (model.embedding: the thresholds' blob)
    assert -1.0 <= card["identity_threshold"] <= 1.0 and card["threshold_far"] == 0.01
    assert len(card["classes"]) <= 848 and all(c.startswith("lfw-devtrain:") for c in card["classes"])
    net = load_net(REPO / "models" / "face_cnn.prototxt", out)  # every shape fits the prototxt
    assert [layer.name for layer in net.layers if layer.blobs] == ["conv1", "conv2", "conv3", "fc1", "fc2"]
    assert "Caffe engine parity" in proc.stdout


def test_the_cards_thresholds_are_those_eval_faces_measures_with_each_embedding(trained):
    """The card's thresholds were set on mirror-mean embeddings (its own) and one-pass ones
    (thresholds_for), as the guard and eval-faces make them: eval-faces on the same pairs puts the
    1% false-accept threshold at the same cosines."""
    tmp, out, _ = trained
    card = read_card(out, file_sha256(out))
    assert set(card["thresholds_for"]) == {"single"}
    expected = {"mirror-mean": card["identity_threshold"], "single": card["thresholds_for"]["single"]["identity_threshold"]}
    for embedding, threshold in expected.items():
        config = tmp / f"{embedding}.yaml"
        config.write_text(f"model: {{weights: {str(out)!r}}}\nidentity: {{embedding: {embedding}}}\n")
        figures = tmp / f"{embedding}.json"
        proc = subprocess.run([*tracker_command(), "eval-faces", "--config", str(config), "--pairs",
                               str(tmp / "pairs.txt"), "--images", str(LFW / "images"), "--json", str(figures)],
                              capture_output=True, text=True, env=isolated_env(tmp), cwd=tmp, timeout=300)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(figures.read_text())
        assert report["embedding"] == embedding
        assert report["threshold_far_1pct"] == pytest.approx(threshold, abs=1e-4)
    assert expected["mirror-mean"] != expected["single"]


def test_the_exported_caffemodel_matches_the_checkpoint_on_the_caffe_engine(trained):
    """Independent of the command's own check: the checkpoint's net (BatchNorm in eval mode) against
    the caffemodel (BatchNorm folded) on real face photos."""
    tmp, out, _ = trained
    state = torch.load(tmp / "work" / "checkpoint.pt", weights_only=True)  # as --resume loads it
    model = default_model()
    net = TrainableNet(lower(he_weights(load_net(model.prototxt, None)), "prob", "fc1"))
    net.load_state_dict(state["net"])
    net.eval()
    x = np.random.default_rng(1).random((8, 1, 88, 88), dtype=np.float32)
    with torch.no_grad():
        logits, embedding = (t.numpy() for t in net(torch.from_numpy(x)))
    backend = create_backend("caffe-openblas-dl", ModelSpec(model.prototxt, out))
    try:
        result = backend.infer(x)
    finally:
        backend.close()
    np.testing.assert_allclose(result.embedding, embedding, rtol=1e-4, atol=1e-4 * np.abs(embedding).max())
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(result.probs, probs / probs.sum(axis=1, keepdims=True), atol=1e-5)


def test_batchnorm_folds_exactly_into_the_exported_weights():
    model = default_model()
    structure = load_net(model.prototxt, None)
    net = TrainableNet(lower(he_weights(structure), "prob", "fc1"))
    with torch.no_grad():  # non-trivial statistics and affine parameters
        for norm in net.norms.values():
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.2, 0.2)
    net.eval()
    exported = export_netdef(net, structure)
    blobs = {layer.name: layer.blobs for layer in exported.layers if layer.blobs}
    x = torch.from_numpy(np.random.default_rng(2).random((4, 1, 88, 88), dtype=np.float32)).double()
    with torch.no_grad():
        reference = net.double()(x)[1].numpy()
        h = x
        for name in ("conv1", "conv2", "conv3"):
            w, b = (torch.from_numpy(a).double() for a in blobs[name])
            h = torch.relu(torch.nn.functional.conv2d(h, w, b))
            if name != "conv3":
                h = torch.nn.functional.max_pool2d(h, 2 if name == "conv1" else 3, ceil_mode=True)
        w, b = (torch.from_numpy(a).double() for a in blobs["fc1"])
        folded = torch.relu(h.flatten(1) @ w.T + b).numpy()
    np.testing.assert_allclose(folded, reference, rtol=1e-5, atol=1e-6)


def test_a_layer_without_a_bias_before_a_relu_is_refused_before_any_photo_is_cut(tmp_path):
    """BatchNorm folds into a bias at export: with `bias_term: false` the export dropped it, and the
    run failed its parity check only after the whole training, for good (--resume exported the same)."""
    from tracker.errors import ModelError
    from tracker.train.command import train_command

    need_lfw()
    prototxt = tmp_path / "net.prototxt"
    text = default_model().prototxt.read_text()
    prototxt.write_text(text.replace("num_output: 16 kernel_size: 7 stride: 1", "num_output: 16 kernel_size: 7 stride: 1 bias_term: false", 1))
    assert prototxt.read_text() != text
    (tmp_path / "net.yaml").write_text(f"model: {{prototxt: {json.dumps(str(prototxt))}}}\n")
    with pytest.raises(ModelError, match=r"^train: layer 'conv1' has no bias \(bias_term: false\) and feeds a ReLU") as err:
        train_command(["--data", str(LFW / "images"), "--limit", "16", "--teacher", str(LFW / "dlib_descriptors.npz"),
                       "--out", str(tmp_path / "x.caffemodel"), "--work", str(tmp_path / "work"),
                       "--config", str(tmp_path / "net.yaml")])
    assert "expected bias_term true" in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.rglob("crops-*.npz"))


def test_resume_continues_the_same_run_and_refuses_another(trained, tmp_path):
    tmp, _, _ = trained
    work = tmp_path / "work"
    first = run_train(tmp_path, "--steps", "3", "--epochs", "2", "--out", str(tmp_path / "a.caffemodel"),
                      "--pairs", str(small_pairs(tmp_path / "pairs.txt")), "--pairs-images", str(LFW / "images"), work=work)
    assert first.returncode == 0, first.stderr[-2000:]
    # as a version whose schedule computed in numpy wrote it: numpy floats (weights_only refused them)
    state = torch.load(work / "checkpoint.pt", weights_only=True)
    state["schedule"]["_last_lr"] = [np.float64(lr) for lr in state["schedule"]["_last_lr"]]
    state["optimizer"]["param_groups"][0]["lr"] = np.float64(state["optimizer"]["param_groups"][0]["lr"])
    torch.save(state, work / "checkpoint.pt")
    again = run_train(tmp_path, "--steps", "5", "--epochs", "2", "--resume", "--out", str(tmp_path / "b.caffemodel"),
                      "--pairs", str(tmp_path / "pairs.txt"), "--pairs-images", str(LFW / "images"), work=work)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stderr
    assert json.loads((tmp_path / "b.caffemodel.json").read_text())["training"]["steps"] == 5
    other = run_train(tmp_path, "--steps", "5", "--epochs", "2", "--resume", "--lr", "0.5",
                      "--out", str(tmp_path / "c.caffemodel"), work=work)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr
    assert last_line(other).startswith("tracker: error: train: --resume: checkpoint") and "of another run" in last_line(other)
    assert not (tmp_path / "c.caffemodel").exists()
    wider = tmp_path / "wider.yaml"  # the same arguments, but crops from other detector settings
    wider.write_text("detect: {detect_width: 480}\n")
    crops = run_train(tmp_path, "--steps", "5", "--epochs", "2", "--resume", "--config", str(wider),
                      "--out", str(tmp_path / "d.caffemodel"), "--pairs", str(tmp_path / "pairs.txt"),
                      "--pairs-images", str(LFW / "images"), work=work)
    assert crops.returncode == 2 and "of another run" in last_line(crops), crops.stderr[-2000:]


def test_resume_refuses_a_teacher_file_rewritten_in_place(tmp_path):
    """The checkpoint knew its teacher files by path only: one whose descriptors changed (here, moved
    to other photos) was resumed as the same run, towards other targets."""
    from tracker.errors import InputError
    from tracker.train.command import train_command

    need_lfw()
    teacher = tmp_path / "teacher.npz"
    with np.load(LFW / "dlib_descriptors.npz") as shared:
        paths, descriptors = shared["paths"], shared["descriptor"]
    np.savez(teacher, paths=paths, descriptor=descriptors)
    argv = ["--data", str(LFW / "images"), "--limit", str(PHOTOS), "--teacher", str(teacher), "--batch", "16",
            "--steps", "1", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "x.caffemodel"),
            "--pairs", str(small_pairs(tmp_path / "pairs.txt")), "--pairs-images", str(LFW / "images")]
    assert train_command(argv) == 0
    np.savez(teacher, paths=paths, descriptor=np.roll(descriptors, 1, axis=0))
    with pytest.raises(InputError, match=r"^train: --resume: checkpoint .* is of another run \(other data, teacher files"):
        train_command([*argv, "--resume"])


def test_resume_takes_a_checkpoint_written_before_the_teacher_files_counted(tmp_path, monkeypatch, capsys):
    """The fingerprint's form changed (resolved paths, the teacher files' sha256): a run interrupted
    before the change was refused as "another run" with the same arguments."""
    import tracker.train.command as command

    need_lfw()
    argv = ["--data", str(LFW / "images"), "--limit", str(PHOTOS), "--teacher", str(LFW / "dlib_descriptors.npz"),
            "--batch", "16", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "x.caffemodel"),
            "--pairs", str(small_pairs(tmp_path / "pairs.txt")), "--pairs-images", str(LFW / "images")]
    def fingerprint_of_76282ba(args, samples, classes, prototxt, crops):  # that commit's, as it was
        facts = {"data": [str(p.absolute()) for p in args.data], "teacher": [str(p.absolute()) for p in args.teacher],
                 "photos": [str(s.path.absolute()) for s in samples], "classes": classes, "epochs": args.epochs,
                 "crops": crops,
                 "batch": args.batch, "lr": args.lr, "seed": args.seed, "limit": args.limit,
                 "prototxt": hashlib.sha256(Path(prototxt).read_bytes()).hexdigest()}
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()

    current = command._fingerprint
    monkeypatch.setattr(command, "_fingerprint", lambda *a, **k: fingerprint_of_76282ba(*a))
    assert command.train_command([*argv, "--steps", "1"]) == 0  # as the earlier tracker train wrote it
    monkeypatch.setattr(command, "_fingerprint", current)
    capsys.readouterr()
    assert command.train_command([*argv, "--steps", "2", "--resume"]) == 0
    assert "train: resumed from" in capsys.readouterr().err


def test_resume_takes_the_same_files_named_another_way_for_the_same_run(tmp_path, monkeypatch, capsys):
    """The checkpoint knew its data and teacher by absolute path, `..` and links kept: the same files
    named from another folder, through `..` or a link, were refused as another run."""
    from tracker.train.command import train_command

    need_lfw()
    pairs = small_pairs(tmp_path / "pairs.txt")
    common = ["--limit", str(PHOTOS), "--batch", "16", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "x.caffemodel"),
              "--pairs", str(pairs), "--pairs-images", str(LFW / "images")]
    assert train_command(["--data", str(LFW / "images"), "--teacher", str(LFW / "dlib_descriptors.npz"), "--steps", "1",
                          *common]) == 0
    (tmp_path / "sets").symlink_to(LFW.parent)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert train_command(["--data", "../sets/lfw-devtrain/images", "--teacher", "../sets/lfw-devtrain/../lfw-devtrain/"
                          "dlib_descriptors.npz", "--steps", "2", "--resume", *common]) == 0
    assert "train: resumed from" in capsys.readouterr().err
    training = read_card(tmp_path / "x.caffemodel", file_sha256(tmp_path / "x.caffemodel"))["training"]
    assert training["steps"] == 2
    # the card names them as they are, not as typed ("../sets/...": nothing from another folder)
    assert training["data"] == [str((LFW / "images").resolve())]
    assert training["teacher"] == [str((LFW / "dlib_descriptors.npz").resolve())]


def test_the_crops_key_counts_the_detectors_model_file_through_the_face_cap():
    """The per-frame face cap (create_detector's wrapper) hid the detector's model file from the
    key that names the crop cache and a checkpoint's run: every checkpoint written before it was
    refused as another run's, and the crops were cut again."""
    from tracker.config import DetectConfig
    from tracker.detect import create_detector
    from tracker.train.data import definition_key

    config = DetectConfig(detector="yunet")
    capped = create_detector(config, quiet=True)
    assert capped.model_path is not None
    assert definition_key(capped, config) == definition_key(capped.detector, config)


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path):
    need_lfw()
    pairs = small_pairs(tmp_path / "pairs.txt")
    with tmpfs(tmp_path / "work", "size=20m") as work:
        args = ("--steps", "2", "--epochs", "3", "--out", str(tmp_path / "w.caffemodel"), "--pairs", str(pairs),
                "--pairs-images", str(LFW / "images"))
        first = run_train(tmp_path, *args, work=work)
        assert first.returncode == 0, first.stderr[-2000:]
        before = (work / "checkpoint.pt").read_bytes()
        filler = work / "filler"
        free = int(subprocess.run(["df", "--output=avail", "-B1", str(work)], capture_output=True,
                                  text=True).stdout.split()[-1])
        filler.write_bytes(b"\0" * max(0, free - len(before) // 2))  # less room than one checkpoint
        full = run_train(tmp_path, *args[:1], "3", *args[2:], "--resume", work=work)
        assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
        assert "cannot write checkpoint" in last_line(full) and "previous checkpoint is unchanged" in last_line(full)
        assert (work / "checkpoint.pt").read_bytes() == before
        assert not [p.name for p in work.iterdir() if p.name.startswith(".checkpoint.")]  # atomic_write's


def test_data_without_faces_is_one_line_and_exit_2(tmp_path, testdata):
    need_lfw()
    folder = tmp_path / "people" / "dog"
    folder.mkdir(parents=True)
    (folder / "dog_0001.jpg").write_bytes((testdata / "faces" / "dlib" / "faces" / "dogs.jpg").read_bytes())
    (folder / "dog_0002.jpg").write_bytes(b"not a jpeg at all")
    proc = subprocess.run([*tracker_command(), "train", "--data", str(tmp_path / "people"), "--teacher",
                           str(LFW / "dlib_descriptors.npz"), "--work", str(tmp_path / "work"),
                           "--out", str(tmp_path / "x.caffemodel")],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert last_line(proc).startswith("tracker: error: train: 0 usable photos"), proc.stderr
    assert last_line(proc).endswith("expected at least one batch of 128: give more --data"), proc.stderr
    assert "2 left out" in proc.stderr and not (tmp_path / "x.caffemodel").exists()


def test_a_data_set_or_person_folder_that_cannot_be_read_is_one_line_before_any_photo_is_cut(tmp_path):
    """A person's folder the user cannot list was a PermissionError's traceback (exit 1)."""
    need_lfw()
    people = tmp_path / "people"
    (people / "Ann").mkdir(parents=True)
    (people / "Ann" / "Ann_0001.jpg").symlink_to(next((LFW / "images" / "AJ_Cook").iterdir()))
    (people / "Bob").mkdir()
    pairs = small_pairs(tmp_path / "pairs.txt")
    for locked, said in ((people / "Bob", f"folder {str(people / 'Bob')!r}: cannot read it (Permission denied)"),
                         (people, f"data set {str(people)!r}: cannot read it (Permission denied)")):
        locked.chmod(0)
        try:
            proc = without_root_overrides(tmp_path, "train", "--data", str(people), "--out", str(tmp_path / "x.caffemodel"),
                                          "--work", str(tmp_path / "work"), "--pairs", str(pairs),
                                          "--pairs-images", str(LFW / "images"))
        finally:
            locked.chmod(0o755)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert last_line(proc).startswith(f"tracker: error: train: {said}; expected a folder"), proc.stderr
        assert not list(tmp_path.rglob("crops-*.npz"))


def test_a_list_naming_missing_photos_and_an_unusable_pairs_file(tmp_path):
    """A list file's missing photo is left out and counted like a photo without a face; a pairs
    file naming a missing image fails at once, naming its line, before any training."""
    need_lfw()
    photos = sorted((LFW / "images").glob("A*/*.jpg"))[:80]
    listing = tmp_path / "set" / "list.txt"
    listing.parent.mkdir()
    lines = ["image identity"] + [f"{os.path.relpath(p, listing.parent)} {p.parent.name}" for p in photos]
    listing.write_text("\n".join(lines + ["missing.jpg someone"]) + "\n")
    bad_pairs = tmp_path / "pairs.txt"
    bad_pairs.write_text("1\nNobody\t1\t2\nNobody\t1\tSomeone\t1\n")
    proc = subprocess.run([*tracker_command(), "train", "--data", str(listing), "--teacher", str(LFW / "dlib_descriptors.npz"),
                           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "x.caffemodel"), "--pairs",
                           str(bad_pairs), "--pairs-images", str(LFW / "images")],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "pairs.txt:2: image" in last_line(proc) and "Nobody_0001.jpg" in last_line(proc)
    assert "photos with a central face" not in proc.stderr  # refused before any photo was cut
    assert not (tmp_path / "work").exists()  # nor made: the folders are made once everything is checked
    good_pairs = small_pairs(tmp_path / "good.txt")  # (LFW's teacher names these photos by other paths: none)
    proc = subprocess.run([*tracker_command(), "train", "--data", str(listing),
                           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "x.caffemodel"), "--steps", "1",
                           "--batch", "16", "--pairs", str(good_pairs), "--pairs-images", str(LFW / "images")],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 left out" in proc.stderr and (tmp_path / "x.caffemodel.json").exists()


@pytest.mark.parametrize("case", ["out is a folder", "work is a file", "teacher is a .npy", "teacher is cut short",
                                  "teacher has a NaN", "teacher paths are one string", "teachers of two lengths", "an earlier run in work",
                                  "resume without a checkpoint", "a trial over trained weights",
                                  "a resumed trial over trained weights", "a teacher too short", "two sets of one name",
                                  "an embedding blob wider than fc1", "teacher is a folder", "a data set that is a FIFO"])
def test_mistakes_in_the_outputs_and_teachers_fail_before_any_photo_is_cut(tmp_path, case):
    """In-process (the CLI's one line and exit 2 for an InputError are tested with the other
    commands): each mistake used to surface only after the photos were cut or the training ran."""
    from tracker.errors import InputError
    from tracker.train.command import train_command

    need_lfw()
    teacher = LFW / "dlib_descriptors.npz"
    args = {"--out": str(tmp_path / "x.caffemodel"), "--work": str(tmp_path / "work"), "--teacher": str(teacher)}
    if case == "out is a folder":
        args["--out"], expected = str(tmp_path), "is a folder; expected the caffemodel file to write"
    elif case == "work is a file":
        (tmp_path / "afile").write_text("")
        args["--work"], expected = str(tmp_path / "afile"), "--work '" + str(tmp_path / "afile") + "' is a file; expected a folder to write in"
    elif case == "teacher is a .npy":
        np.save(tmp_path / "t.npy", np.zeros((3, 128), np.float32))
        args["--teacher"], expected = str(tmp_path / "t.npy"), "unreadable (not a whole .npz archive)"
    elif case == "teacher is cut short":
        (tmp_path / "t.npz").write_bytes(teacher.read_bytes()[:100_000])
        args["--teacher"], expected = str(tmp_path / "t.npz"), "unreadable (not a whole .npz archive)"
    elif case == "teacher has a NaN":
        np.savez(tmp_path / "t.npz", paths=np.array(["a/a_0001.jpg"]), descriptor=np.full((1, 128), np.nan, np.float32))
        args["--teacher"], expected = str(tmp_path / "t.npz"), "1 descriptors with a NaN or an infinity; expected finite"
    elif case == "teacher paths are one string":  # a 0-d array: len() of it was a TypeError's traceback
        np.savez(tmp_path / "t.npz", paths=np.array("a/a_0001.jpg"), descriptor=np.ones((1, 128), np.float32))
        args["--teacher"], expected = str(tmp_path / "t.npz"), "paths of shape () and descriptors of shape (1, 128); expected"
    elif case == "teachers of two lengths":
        np.savez(tmp_path / "t.npz", paths=np.array(["a/a_0001.jpg"]), descriptor=np.ones((1, 512), np.float32))
        expected = "--teacher files with descriptors of 128 and 512 values; expected one length in all"
    elif case == "an earlier run in work":
        (tmp_path / "work").mkdir()
        (tmp_path / "work" / "checkpoint.pt").write_bytes(b"an earlier run")
        expected = "checkpoint.pt' holds an earlier run; expected --resume to continue it"
    elif case == "resume without a checkpoint":
        expected = "--resume: no checkpoint '" + str(tmp_path / "work" / "checkpoint.pt") + "'; expected one written"
    elif case == "a teacher too short":  # its targets take 64 principal axes: a broadcast error after the cut
        np.savez(tmp_path / "t.npz", paths=np.array(["a/a_0001.jpg"]), descriptor=np.ones((1, 16), np.float32))
        args["--teacher"], expected = str(tmp_path / "t.npz"), "descriptors of 16 values; expected at least 64 (half"
    elif case == "an embedding blob wider than fc1":  # its width was fc1's: a RuntimeError's traceback once the photos were cut
        (tmp_path / "conv3.yaml").write_text("model: {embedding: conv3}\n")
        expected = "--teacher descriptors of 128 values; expected at least 3072 (half the embedding's 6144, model.embedding 'conv3')"
    elif case == "teacher is a folder":  # was said not to exist
        args["--teacher"], expected = str(tmp_path), f"--teacher {str(tmp_path)!r} is a folder; expected an .npz"
    elif case == "a data set that is a FIFO":  # was said not to exist
        os.mkfifo(tmp_path / "list.txt")
        expected = f"data set {str(tmp_path / 'list.txt')!r} is not a folder or a regular file; expected a folder"
    elif case == "two sets of one name":  # both sets' Bob would be one person
        for office in ("home", "office"):
            (tmp_path / office / "people" / "Bob").mkdir(parents=True)
        expected = f"--data '{tmp_path / 'office' / 'people'}' and '{tmp_path / 'home' / 'people'}' are both named 'people'"
    else:  # --limit 16 makes every case a trial; --resume let one replace the shipped weights
        (tmp_path / "x.caffemodel").write_bytes(b"trained weights")
        expected = "x.caffemodel' exists, and a trial (--steps, --limit) does not replace trained weights"
    extra = {"teachers of two lengths": ["--teacher", str(tmp_path / "t.npz")],
             "resume without a checkpoint": ["--resume"], "a resumed trial over trained weights": ["--resume"],
             "an embedding blob wider than fc1": ["--config", str(tmp_path / "conv3.yaml")],
             "a data set that is a FIFO": ["--data", str(tmp_path / "list.txt")],
             "two sets of one name": ["--data", str(tmp_path / "home" / "people"),
                                      "--data", str(tmp_path / "office" / "people")]}.get(case, [])
    with pytest.raises(InputError, match=r"^train: ") as err:
        train_command(["--data", str(LFW / "images"), "--limit", "16", *[x for kv in args.items() for x in kv], *extra])
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.rglob("crops-*.npz"))


@pytest.mark.parametrize("what", ["pairs", "prototxt", "checkpoint"])
def test_out_naming_a_file_the_run_reads_is_refused_before_any_photo_is_cut(tmp_path, what):
    """A full run (no --steps, no --limit) wrote its caffemodel over --out whatever it was: `--out
    pairs.txt` destroyed the pairs file (and the config's prototxt, the net itself) after the training."""
    from tracker.errors import InputError
    from tracker.train.command import train_command

    need_lfw()
    people = tmp_path / "people"
    for person in ("AJ_Cook", "Aaron_Peirsol"):  # named unlike the teacher's paths: trained on classes alone
        (people / person).mkdir(parents=True)
        for i, photo in enumerate(sorted((LFW / "images" / person).iterdir())[:2]):
            (people / person / f"photo_{i}.jpg").symlink_to(photo)
    pairs = small_pairs(tmp_path / "pairs.txt")
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_bytes(default_model().prototxt.read_bytes())
    config = tmp_path / "net.yaml"
    config.write_text(f"model: {{prototxt: {json.dumps(str(prototxt))}}}\n")
    out = {"pairs": pairs, "prototxt": prototxt, "checkpoint": tmp_path / "work" / "checkpoint.pt"}[what]
    before = out.read_bytes() if out.exists() else None
    with pytest.raises(InputError, match=r"^train: --out: ") as err:
        train_command(["--data", str(people), "--out", str(out), "--work", str(tmp_path / "work"), "--epochs", "1",
                       "--batch", "2", "--threads", "1", "--pairs", str(pairs), "--pairs-images", str(LFW / "images"),
                       "--config", str(config)])
    assert f"is the {what} file; expected another path" in str(err.value) and "\n" not in str(err.value)
    assert (out.read_bytes() if out.exists() else None) == before
    assert not list(tmp_path.rglob("crops-*.npz"))


class _RunsCode:
    """Pickled as a call of os.mkdir: loading it runs that call unless the loader refuses code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.mark.parametrize("case", ["a teacher of other photos", "a checkpoint of another program",
                                  "a checkpoint that runs code", "a learning rate that diverges",
                                  "a batch larger than the photos"])
def test_mistakes_found_once_the_photos_are_cut_are_one_line(tmp_path, case):
    """A --teacher the user named that describes none of the photos would train without its targets;
    a checkpoint torch loads but tracker train did not write was an AttributeError's traceback; one
    that calls a function when unpickled ran it; a diverged run trained on and checkpointed NaN
    weights over the last good ones; too few photos for a batch did not say which option to change."""
    from tracker.errors import InputError
    from tracker.train.command import train_command

    need_lfw()
    args = ["--data", str(LFW / "images"), "--limit", str(PHOTOS), "--batch", "4", "--steps", "1", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "x.caffemodel"), "--pairs", str(small_pairs(tmp_path / "pairs.txt")),
            "--pairs-images", str(LFW / "images")]
    if case == "a teacher of other photos":
        np.savez(tmp_path / "t.npz", paths=np.array(["Nobody/Nobody_0001.jpg"]), descriptor=np.ones((1, 128), np.float32))
        args += ["--teacher", str(tmp_path / "t.npz")]
        expected = f"--teacher '{tmp_path / 't.npz'}' has a descriptor of none of the {PHOTOS} photos; expected its 'paths'"
    elif case == "a checkpoint of another program":
        (tmp_path / "work").mkdir()
        torch.save([1, 2], tmp_path / "work" / "checkpoint.pt")
        args += ["--teacher", str(LFW / "dlib_descriptors.npz"), "--resume"]
        expected = "is not one tracker train wrote (a list without epoch, fingerprint"
    elif case == "a checkpoint that runs code":
        (tmp_path / "work").mkdir()
        torch.save({"net": _RunsCode(tmp_path / "ran")}, tmp_path / "work" / "checkpoint.pt")
        args += ["--teacher", str(LFW / "dlib_descriptors.npz"), "--resume"]
        expected = "checkpoint.pt' is unreadable (UnpicklingError); expected one written by tracker train"
    elif case == "a learning rate that diverges":  # its loss was finite, and its weights were saved (1e30 each)
        args += ["--teacher", str(LFW / "dlib_descriptors.npz"), "--lr", "1e30"]
        expected = "after step 1 (--lr 1e+30): the training diverged; its weights are not saved"
    else:  # all the photos cut have a face, and a teacher descriptor
        args += ["--teacher", str(LFW / "dlib_descriptors.npz"), "--batch", "128"]
        expected = f"expected at least one batch of 128: lower --batch to {PHOTOS} or less, or raise --limit"
    with pytest.raises(InputError, match=r"^train: ") as err:
        train_command(args)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "x.caffemodel").exists()
    assert (tmp_path / "work" / "checkpoint.pt").exists() == ("checkpoint" in case)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("option, value, expected", [
    ("--batch", "1", "--batch: bad value '1'; expected an integer >= 2"),
    ("--seed", "-1", "--seed: bad value '-1'; expected an integer from 0 to 9223372036854775807"),
    ("--seed", str(2**64), f"--seed: bad value '{2**64}'; expected an integer from 0 to"),  # torch's overflow
    ("--threads", "100000000000", "--threads: bad value '100000000000'; expected an integer from 1 to 1024")])
def test_numbers_out_of_range_are_refused_by_the_parser(option, value, expected):
    from tracker.errors import InputError
    from tracker.train.command import _parser

    with pytest.raises(InputError, match=re.escape(expected)):
        _parser().parse_args(["--out", "x.caffemodel", option, value])


def test_cutting_photos_says_how_far_it_is_in_a_log_too(tmp_path, capsys, monkeypatch):
    """tqdm is off when stderr is no terminal (a log, nohup): plain lines then. The run stops after
    the cut (16 photos have too few teacher descriptors)."""
    import tracker.train.command as command
    from tracker.errors import InputError

    need_lfw()
    monkeypatch.setattr(command, "CUT_LINE_EVERY", 5)
    with pytest.raises(InputError, match="16 teacher descriptors; expected more than 64 to find the principal axes: "
                                         "raise --limit$"):
        command.train_command(["--data", str(LFW / "images"), "--limit", "16", "--teacher", str(LFW / "dlib_descriptors.npz"),
                               "--out", str(tmp_path / "x.caffemodel"), "--work", str(tmp_path / "work")])
    lines = [line for line in capsys.readouterr().err.splitlines() if "photos cut" in line]
    assert lines == [f"train: {n} of 16 photos cut" for n in (5, 10, 15)]


def test_pairs_without_a_mismatched_pair_with_faces_are_one_line(monkeypatch, tmp_path):
    """The threshold is set after the training: the line says the checkpoint holds it."""
    import tracker.evaluate_faces
    from tracker.errors import InputError
    from tracker.train.command import threshold_cards

    scores, same = np.array([0.9, 0.8]), np.array([True, True])
    monkeypatch.setattr(tracker.evaluate_faces, "pair_scores", lambda *a, **k: [(scores, same, 3)])
    with pytest.raises(InputError, match=r"2 matched and 0 mismatched pairs with a face in both photos \(3 left out\); "
                                         r"expected some of each .* run again with --resume"):
        threshold_cards(tmp_path / "pairs.txt", tmp_path, None, {"single": None})


def test_the_threshold_stage_is_announced_and_its_lines_say_train(tmp_path, capsys, monkeypatch):
    """Measuring the pairs takes minutes after the training: it began without a word, and its
    progress lines, and an unreadable photo's, said "eval-faces:", a command the user never ran."""
    import tracker.evaluate_faces
    from tracker.config import load_config
    from tracker.detect import create_detector
    from tracker.train.command import threshold_cards

    need_lfw()
    pairs = small_pairs(tmp_path / "pairs.txt")
    people = {word for line in pairs.read_text().splitlines()[1:] for word in line.split() if not word.isdigit()}
    images = tmp_path / "images"
    for person in people:  # the pairs' photos, one of them damaged
        (images / person).mkdir(parents=True)
        for photo in (LFW / "images" / person).iterdir():
            (images / person / photo.name).symlink_to(photo)
    damaged = images / min(people) / f"{min(people)}_0001.jpg"
    damaged.unlink()
    damaged.write_bytes(b"not a jpeg")
    monkeypatch.setattr(tracker.evaluate_faces, "PROGRESS_EVERY", 5)
    backend = create_backend("caffe-openblas-dl", default_model())
    try:
        cards = threshold_cards(pairs, images, create_detector(load_config(None).detect), {"single": backend})
    finally:
        backend.close()
    assert set(cards) == {"single"}
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"train: measuring the identity threshold on {pairs} ..."
    assert f"train: {str(damaged)!r} is not a readable image" in lines[1]
    assert "train: 5 of " in lines[2] and lines[2].endswith(" photos cut")
    assert not [line for line in lines if not line.startswith("train: ")], lines


@pytest.mark.parametrize("lr", ["-1", "0", "nan", "inf", "fast"])
def test_the_learning_rate_must_be_a_positive_number(lr):
    from tracker.errors import InputError
    from tracker.train.command import _parser

    with pytest.raises(InputError, match=f"--lr: bad value '{lr}'; expected a number > 0"):
        _parser().parse_args(["--out", "x.caffemodel", "--lr", lr])


def test_a_damaged_crop_cache_is_cut_again(tmp_path):
    from tracker.train.data import CropCache

    cache = CropCache(tmp_path, "key")
    cache.put("a.jpg", np.full((88, 88), 7, np.uint8))
    cache.put("b.jpg", None)
    cache.save()
    assert CropCache(tmp_path, "key").get("a.jpg")[0] and CropCache(tmp_path, "key").get("b.jpg") == (True, None)
    whole = cache.path.read_bytes()
    cache.path.write_bytes(whole[: len(whole) // 2])
    assert CropCache(tmp_path, "key").get("a.jpg") == (False, None)  # unknown: cut again, and rewritten


def test_a_crop_cache_that_cannot_be_written_is_one_line_and_the_previous_stays(tmp_path):
    """A full disk while the cache is saved (every 2,000 new photos and at the end) was a zipfile
    traceback; the previous file is kept whole (atomic_write)."""
    from tracker.errors import InputError
    from tracker.train.data import CropCache

    with tmpfs(tmp_path / "work", "size=64k") as work:
        cache = CropCache(work, "key")
        cache.put("a.jpg", np.full((88, 88), 7, np.uint8))
        cache.save()
        before = cache.path.read_bytes()
        for i in range(20):  # 155 kB of crops: more than the file system holds
            cache.put(f"{i}.jpg", np.full((88, 88), i, np.uint8))
        with pytest.raises(InputError, match=r"^train: cannot write the crop cache .*crops-key.npz' \(No space left on "
                                             r"device\); the previous cache is unchanged"):
            cache.save()
        assert cache.path.read_bytes() == before and [p.name for p in work.iterdir()] == ["crops-key.npz"]


def test_a_full_disk_at_the_export_keeps_the_training_for_resume(tmp_path):
    """The caffemodel that cannot be written is one line naming it and the checkpoint; the next
    run with --resume writes it (to a folder it makes) without training again."""
    need_lfw()
    pairs = small_pairs(tmp_path / "pairs.txt")
    args = ("--steps", "1", "--epochs", "1", "--pairs", str(pairs), "--pairs-images", str(LFW / "images"))
    with tmpfs(tmp_path / "small", "size=1m") as small:  # the caffemodel is about 4 MB
        full = run_train(tmp_path, *args, "--out", str(small / "face.caffemodel"))
        assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
        assert last_line(full).startswith(f"tracker: error: train: cannot write '{small / 'face.caffemodel'}'")
        assert "run again with --resume" in last_line(full)
        assert list(small.iterdir()) == []  # no staged file left behind
    out = tmp_path / "new" / "folder" / "face.caffemodel"
    again = run_train(tmp_path, *args, "--resume", "--out", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stderr and "epoch 1/1" not in again.stderr  # not trained again
    assert out.is_file() and json.loads(out.with_name(out.name + ".json").read_text())["training"]["steps"] == 1


def test_a_stop_while_exporting_keeps_the_training_for_resume(tmp_path, capsys, monkeypatch):
    """Measuring the pairs cuts thousands of photos: a Ctrl-C (or SIGTERM) there ended the run with
    exit 130 and not a word of the checkpoint that holds the training."""
    import tracker.train.command as command

    need_lfw()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "threshold_cards", stopped)
    out = tmp_path / "face.caffemodel"
    argv = ["--data", str(LFW / "images"), "--limit", str(PHOTOS), "--teacher", str(LFW / "dlib_descriptors.npz"),
            "--batch", "16", "--steps", "1", "--epochs", "1", "--work", str(tmp_path / "work"), "--out", str(out),
            "--pairs", str(small_pairs(tmp_path / "pairs.txt")), "--pairs-images", str(LFW / "images")]
    try:
        stopped_with = command.train_command(argv)
    except KeyboardInterrupt:  # (raised on, it would stop the whole test session)
        pytest.fail("the stop while exporting went past tracker train")
    assert stopped_with == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == (f"train: interrupted while exporting; the checkpoint ({tmp_path / 'work' / 'checkpoint.pt'}) "
                    "holds the training: continue with --resume (it exports without training again)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.txt", "work"]  # nothing staged left, no --out


def test_a_stop_held_through_the_renames_says_the_weights_are_written(tmp_path, capsys, monkeypatch):
    """A stop that comes during the card's and the weights' renames is held until both are done:
    then the weights are in place, and the line says so (not "continue with --resume")."""
    import contextlib

    import tracker.train.command as command

    need_lfw()

    @contextlib.contextmanager
    def stop_held_until_the_end():
        yield
        raise KeyboardInterrupt  # as interrupts_held raises a signal that came within

    monkeypatch.setattr(command, "interrupts_held", stop_held_until_the_end)
    out = tmp_path / "face.caffemodel"
    argv = ["--data", str(LFW / "images"), "--limit", str(PHOTOS), "--teacher", str(LFW / "dlib_descriptors.npz"),
            "--batch", "16", "--steps", "1", "--epochs", "1", "--work", str(tmp_path / "work"), "--out", str(out),
            "--pairs", str(small_pairs(tmp_path / "pairs.txt")), "--pairs-images", str(LFW / "images")]
    assert command.train_command(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"train: interrupted after writing {out} and its card"
    assert read_card(out, file_sha256(out))["training"]["trial"] is True

@pytest.mark.timeout(300)
def test_a_kill_while_cutting_photos_keeps_the_crops_cut(tmp_path):
    """SIGTERM (systemd, kill) stops the run as Ctrl-C does: the crops cut so far are saved in the
    cache and said so (before, the process ended at once and every crop since the last save was
    lost: up to 1,999)."""
    need_lfw()
    work = tmp_path / "work"
    proc = subprocess.Popen([*tracker_command(), "train", "--data", str(LFW / "images"), "--limit", "1500",
                             "--teacher", str(LFW / "dlib_descriptors.npz"), "--work", str(work),
                             "--out", str(tmp_path / "x.caffemodel"), "--pairs", str(small_pairs(tmp_path / "pairs.txt")),
                             "--pairs-images", str(LFW / "images")],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=isolated_env(tmp_path),
                            cwd=tmp_path)
    try:
        for line in proc.stderr:  # a log's progress lines (stderr is not a terminal): every 1,000 photos
            if line.startswith("train: 1000 of 1500 photos cut"):
                break
        else:
            pytest.fail(f"no progress line; exit {proc.wait()}")
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "train: interrupted while cutting photos; the crops cut so far are kept in" in rest and "Traceback" not in rest
    (cache,) = work.glob("crops-*.npz")
    with np.load(cache) as data:
        assert len(data["keys"]) >= 1000  # every photo cut is in it, with or without a face


def test_the_default_data_without_its_teacher_is_refused(tmp_path, monkeypatch):
    """An install whose shared data lacks the teacher file trained another recipe without a word
    but a count of targets on stderr (and a card saying "teacher": [])."""
    import tracker.shared_data as shared_data
    from tracker.errors import InputError
    from tracker.train.command import DEFAULT_DATA, train_command

    need_lfw()
    shared = tmp_path / "shared"
    for name in DEFAULT_DATA:  # the data sets, not the teacher beside them
        (shared / name).parent.mkdir(parents=True, exist_ok=True)
        (shared / name).symlink_to(LFW.parent.parent / name)
    monkeypatch.setenv("TRACKER_SHARED_DIR", str(shared))
    monkeypatch.setattr(shared_data, "_CHECKOUT", tmp_path)  # not a source checkout: no ../shared
    with pytest.raises(InputError, match=r"^train: datasets/lfw-devtrain/dlib_descriptors.npz not found in the "
                                         r"shared data .*, or give --teacher$"):
        train_command(["--out", str(tmp_path / "x.caffemodel"), "--work", str(tmp_path / "work")])
