"""The face CNN's Caffe files: the network of docs/ARCHITECTURE.md section 1 derived from the prototxt
itself, the shipped (trained) weights loading in OpenCV, and the seeded random weights that tests
generate on the fly and that regenerate to identical bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from tracker.model import face_cnn
from tracker.model.caffe_io import load_net
from tracker.model.shapes import count_macs, count_params, infer_shapes, layer_costs
from tracker.model.spec import default_model

REPO = Path(__file__).resolve().parents[2]
PROTOTXT = REPO / "models" / "face_cnn.prototxt"
CAFFEMODEL = REPO / "models" / "face_cnn.caffemodel"


def test_the_files_are_where_the_rest_of_the_product_looks():
    assert face_cnn.PROTOTXT == PROTOTXT and face_cnn.CAFFEMODEL == CAFFEMODEL
    spec = default_model()
    assert Path(spec.prototxt).resolve() == PROTOTXT and Path(spec.weights).resolve() == CAFFEMODEL
    assert (spec.probs, spec.embedding) == ("prob", "fc1")


def test_parameters_and_macs_derived_from_the_prototxt():
    net = load_net(PROTOTXT, None)
    assert count_params(net) == face_cnn.PARAMS == 1_039_744
    assert count_macs(net) == face_cnn.MACS == 49_371_200
    costs = {c.name: c for c in layer_costs(net)}
    assert costs["conv2"].macs / count_macs(net) > 0.72  # "conv2 is 73% of the work"
    assert costs["conv2"].macs / count_macs(net) < 0.73
    assert count_macs(net, batch=8) == 8 * face_cnn.MACS
    assert {name: c.params for name, c in costs.items() if c.params} == {
        "conv1": 16 * 1 * 7 * 7 + 16, "conv2": 48 * 16 * 6 * 6 + 48,
        "conv3": 96 * 48 * 5 * 5 + 96, "fc1": 128 * 96 * 8 * 8 + 128, "fc2": 848 * 128 + 848}


def test_architecture_of_design_section_1():
    net = load_net(PROTOTXT, CAFFEMODEL)
    assert net.inputs == {"data": (1, 1, 88, 88)}
    shapes = infer_shapes(net, batch=3)
    assert shapes["conv3"] == (3, 96, 8, 8)  # 96 x 8 x 8 = 6144 into fc1
    assert (shapes["data"], shapes["fc1"], shapes["prob"]) == ((3, 1, 88, 88), (3, 128), (3, 848))
    by_name = {layer.name: layer for layer in net.layers}
    # The embedding is fc1 after its in-place ReLU; pools are MAX 2/2 and 3/3.
    assert by_name["relu4"].bottoms == by_name["relu4"].tops == ("fc1",)
    assert by_name["relu1"].tops == ("conv1",) and by_name["relu3"].tops == ("conv3",)
    for name, k in (("pool1", 2), ("pool2", 3)):
        p = by_name[name].param.pooling_param
        assert (p.pool, p.kernel_size, p.stride) == (0, k, k)
    assert [layer.type for layer in net.layers].count("ReLU") == 4
    assert net.layers[-1].type == "Softmax" and net.layers[-1].tops == ("prob",)


@pytest.fixture(scope="module")
def random_weights(tmp_path_factory) -> Path:
    return face_cnn.generate(tmp_path_factory.mktemp("random") / "face_cnn.caffemodel")


def test_random_weights_follow_the_he_recipe(random_weights):
    net = load_net(PROTOTXT, random_weights)
    for layer in net.layers:
        if not layer.blobs:
            continue
        weight, bias = layer.blobs
        assert weight.dtype == bias.dtype == np.float32
        fan_in = int(np.prod(weight.shape[1:]))
        assert abs(weight.std() / np.sqrt(2.0 / fan_in) - 1) < 0.1, layer.name
        assert abs(weight.mean()) < 0.1 * weight.std(), layer.name
        np.testing.assert_allclose(bias, 0.01 * np.linspace(-1, 1, bias.size), rtol=1e-6)


def test_regenerating_random_weights_gives_identical_bytes(tmp_path, random_weights):
    out = face_cnn.generate(tmp_path / "again.caffemodel")
    assert out.read_bytes() == random_weights.read_bytes()
    other = face_cnn.generate(tmp_path / "seed.caffemodel", seed=face_cnn.SEED + 1)
    assert other.read_bytes() != random_weights.read_bytes()
    assert CAFFEMODEL.read_bytes() != random_weights.read_bytes()  # the shipped weights are trained


def test_module_entry_point_writes_the_same_file(tmp_path, random_weights):
    out = tmp_path / "cli.caffemodel"
    result = subprocess.run([sys.executable, "-m", "tracker.model.face_cnn", "--out", str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == random_weights.read_bytes()


@pytest.mark.parametrize("args, expected", [
    (["--ou", "w.caffemodel"], "python -m tracker.model.face_cnn: the following arguments are required: --out"),
    (["--out", "no-such-folder/w.caffemodel"], "cannot write --out 'no-such-folder/w.caffemodel' (No such file or "
                                               "directory); expected a file in an existing folder this user can write"),
])
def test_module_entry_point_refuses_bad_arguments_in_one_line(tmp_path, args, expected):
    """A missing folder was a traceback (exit 1), and `--ou` was taken for `--out` (abbreviated)."""
    result = subprocess.run([sys.executable, "-m", "tracker.model.face_cnn", *args],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr == f"tracker: error: {expected}\n"
    assert not (tmp_path / "w.caffemodel").exists()


def test_module_entry_point_does_not_overwrite_the_shipped_weights(monkeypatch, capsys):
    """Nothing stopped random weights from replacing the trained ones in a checkout."""
    monkeypatch.setattr(face_cnn, "generate", lambda *args: pytest.fail("the shipped weights were written"))
    for out in (REPO / "models" / "face_cnn.caffemodel", face_cnn.CAFFEMODEL):  # the checkout's and the package's
        assert face_cnn.main(["--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"tracker: error: --out {str(out)!r} is the shipped trained weights; "
                                           "expected another path (random weights would replace them)\n")


def test_opencv_runs_the_committed_files():
    net = load_net(PROTOTXT, CAFFEMODEL)
    cv_net = cv2.dnn.readNetFromCaffe(str(PROTOTXT), str(CAFFEMODEL))
    for layer in net.layers:
        for i, blob in enumerate(layer.blobs):
            theirs = cv_net.getParam(cv_net.getLayerId(layer.name), i)
            np.testing.assert_array_equal(blob.reshape(theirs.shape), theirs)
    x = np.random.default_rng(0).random((4, 1, 88, 88), dtype=np.float32)
    cv_net.setInput(x)
    # OpenCV names outputs by layer: "fc1" is before the in-place ReLU, "relu4" after it (the
    # blob "fc1" of the Caffe net, i.e. the embedding).
    fc1_linear, embedding, prob = cv_net.forward(["fc1", "relu4", "prob"])
    assert embedding.shape == (4, 128) and prob.shape == (4, 848)
    np.testing.assert_array_equal(embedding, np.maximum(fc1_linear, 0))
    assert (embedding > 0).mean() > 0.2 and (fc1_linear < 0).any()
    np.testing.assert_allclose(prob.sum(axis=1), 1.0, atol=1e-5)
    assert not np.allclose(prob[0], prob[1])  # different crops, different outputs
