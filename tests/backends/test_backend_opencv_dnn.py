"""`opencv-dnn`: parity with the float64 Caffe engine (OpenCV reads the Caffe files itself)."""

from __future__ import annotations

import numpy as np
from backend_parity import CREATE_AND_EXIT, assert_parity, face_inputs, lenet, mnist, run_without, write_quirky

from tracker.backends import create_backend
from tracker.model.spec import default_model

NAME = "opencv-dnn"


def test_fp32_face_cnn_embedding_after_the_in_place_relu():
    with create_backend(NAME, default_model()) as backend:
        assert backend._outputs == ["prob", "relu4"]
        assert_parity(backend, default_model(), face_inputs())
        assert_parity(backend, default_model(), face_inputs()[:1])


def test_fp32_lenet(testdata):
    with create_backend(NAME, lenet(testdata)) as backend:
        out = backend.infer(mnist(testdata))
        assert (out.embedding >= 0).all()  # ip1 after relu1, as Caffe leaves the blob
        assert_parity(backend, lenet(testdata), mnist(testdata))


def test_fp32_quirky_net(tmp_path):
    model = write_quirky(tmp_path)
    x = np.random.default_rng(2).standard_normal((3, 2, 23, 17)).astype(np.float32)
    with create_backend(NAME, model) as backend:
        assert_parity(backend, model, x)


def test_results_are_not_overwritten_by_the_next_call():
    with create_backend(NAME, default_model()) as backend:
        x = face_inputs()
        first = backend.infer(x[:2])
        kept = first.probs.copy()
        backend.infer(x[2:4])
        np.testing.assert_array_equal(first.probs, kept)


def test_missing_runtime_exits_3():
    done = run_without("cv2", CREATE_AND_EXIT.format(name=NAME))
    assert done.returncode == 3, done.stderr
    assert "opencv-python-headless" in done.stderr and "Traceback" not in done.stderr
