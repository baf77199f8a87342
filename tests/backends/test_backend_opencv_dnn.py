"""`opencv-dnn` (OpenCV reads the Caffe files itself): the embedding read after the in-place ReLU, results
owned by the caller. Parity and the missing runtime: test_parity.py."""

from __future__ import annotations

import numpy as np
from backend_parity import face_inputs, lenet, mnist

from tracker.backends import create_backend
from tracker.model.spec import default_model

NAME = "opencv-dnn"


def test_embedding_after_the_in_place_relu(testdata):
    with create_backend(NAME, default_model()) as backend:
        assert backend._outputs == ["prob", "relu4"]
    with create_backend(NAME, lenet(testdata)) as backend:
        out = backend.infer(mnist(testdata))
        assert (out.embedding >= 0).all()  # ip1 after relu1, as Caffe leaves the blob


def test_results_are_not_overwritten_by_the_next_call():
    with create_backend(NAME, default_model()) as backend:
        x = face_inputs()
        first = backend.infer(x[:2])
        kept = first.probs.copy()
        backend.infer(x[2:4])
        np.testing.assert_array_equal(first.probs, kept)
