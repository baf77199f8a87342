"""`tf-vanilla`: parity with the float64 Caffe engine, threads, errors."""

from __future__ import annotations

import numpy as np
import pytest
from backend_parity import CREATE_AND_EXIT, assert_parity, face_inputs, lenet, mnist, run_without, write_quirky

from tracker.backends import create_backend
from tracker.errors import InputError
from tracker.model.spec import default_model

NAME = "tf-vanilla"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_fp32_face_cnn(cache):
    with create_backend(NAME, default_model(), cache_dir=cache) as backend:
        assert_parity(backend, default_model(), face_inputs())
        assert_parity(backend, default_model(), face_inputs()[:1])


def test_fp32_lenet(testdata, cache):
    with create_backend(NAME, lenet(testdata), cache_dir=cache) as backend:
        assert_parity(backend, lenet(testdata), mnist(testdata))


def test_fp32_quirky_net(tmp_path, cache):
    model = write_quirky(tmp_path)
    x = np.random.default_rng(2).standard_normal((3, 2, 23, 17)).astype(np.float32)
    with create_backend(NAME, model, cache_dir=cache) as backend:
        assert_parity(backend, model, x)


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


def test_missing_runtime_exits_3():
    done = run_without("tensorflow", CREATE_AND_EXIT.format(name=NAME))
    assert done.returncode == 3, done.stderr
    assert "pip install -e '.[tf]'" in done.stderr and "Traceback" not in done.stderr
