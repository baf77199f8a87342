"""`tf-vanilla`: one trace for every batch size, bad input, int8 refused. Parity and the missing runtime:
test_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
from backend_parity import face_inputs

from tracker.backends import create_backend
from tracker.errors import InputError
from tracker.model.spec import default_model

NAME = "tf-vanilla"


@pytest.fixture(scope="module")
def cache(backend_caches):
    return backend_caches(NAME)  # shared with this backend's tests in test_parity.py


def test_one_trace_for_every_batch_size_and_bad_input(cache):
    with create_backend(NAME, default_model(), cache_dir=cache) as backend:
        for n in (1, 3, 5):
            backend.infer(face_inputs()[:n])
        assert backend._fn.experimental_get_tracing_count() == 1
        with pytest.raises(InputError, match=r"backend 'tf-vanilla': input of shape \(1, 1, 28, 28\)"):
            backend.infer(np.zeros((1, 1, 28, 28), np.float32))


def test_int8_is_refused_listing_backends_that_have_it():
    with pytest.raises(InputError, match=r"backend 'tf-vanilla' has no 'int8' model; backends with 'int8': .*tf-neon-vfpv4.*onnxruntime"):
        create_backend(NAME, precision="int8")
