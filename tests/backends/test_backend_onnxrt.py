"""`onnxruntime`: parity with the float64 Caffe engine (fp32), int8 quality, threads, errors."""

from __future__ import annotations

import numpy as np
import pytest
from backend_parity import (
    CREATE_AND_EXIT,
    assert_int8_quality,
    assert_parity,
    face_inputs,
    lenet,
    mnist,
    real_face_crops,
    run_without,
    write_quirky,
)

from tracker.backends import create_backend
from tracker.bench.quality import int8_quality
from tracker.errors import InputError
from tracker.model.spec import default_model

NAME = "onnxruntime"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_fp32_face_cnn(cache):
    with create_backend(NAME, default_model(), cache_dir=cache) as backend:
        assert_parity(backend, default_model(), face_inputs())
        assert_parity(backend, default_model(), face_inputs()[:1])  # batch 1 after a larger batch


def test_fp32_lenet(testdata, cache):
    with create_backend(NAME, lenet(testdata), cache_dir=cache) as backend:
        assert_parity(backend, lenet(testdata), mnist(testdata))


def test_fp32_quirky_net(tmp_path, cache):
    model = write_quirky(tmp_path)
    x = np.random.default_rng(2).standard_normal((3, 2, 23, 17)).astype(np.float32)
    with create_backend(NAME, model, cache_dir=cache) as backend:
        assert_parity(backend, model, x)


def test_int8_face_cnn_quality(cache):
    assert_int8_quality(int8_quality(NAME, cache_dir=cache))


def test_int8_model_layout(cache):
    """int8 from conv2 on: conv1..pool1 stay float, the softmax runs outside, in float32."""
    import onnx

    from tracker.model.convert import convert

    model = onnx.load(convert(default_model(), "onnx", "int8", cache_dir=cache))
    ops = [(n.op_type, n.name) for n in model.graph.node if n.op_type not in ("DequantizeLinear",)]
    assert ops[:4] == [("Conv", "conv1"), ("Relu", "relu1"), ("MaxPool", "pool1"), ("QuantizeLinear", "caffe/pool1_QuantizeLinear")]
    assert [o.name for o in model.graph.output] == ["logits", "embedding"]


def test_int8_on_real_faces(testdata, cache):
    assert_int8_quality(int8_quality(NAME, crops=real_face_crops(testdata), cache_dir=cache))


def test_int8_lenet_on_mnist(testdata, cache):
    """Calibrated on 32 digits; every one of the 64 keeps its fp32 class."""
    x = mnist(testdata)
    assert_int8_quality(int8_quality(NAME, lenet(testdata), crops=x, cache_dir=cache, calibration=x[:32]), all_crops=True)


def test_threads_and_bad_input(cache):
    with create_backend(NAME, default_model(), threads=1, cache_dir=cache) as backend:
        assert backend._session.get_session_options().intra_op_num_threads == 1
        with pytest.raises(InputError, match=r"backend 'onnxruntime': input of shape \(2, 88, 88\); expected \(N, 1, 88, 88\)"):
            backend.infer(np.zeros((2, 88, 88), np.float32))


def test_missing_runtime_exits_3():
    done = run_without("onnxruntime", CREATE_AND_EXIT.format(name=NAME))
    assert done.returncode == 3, done.stderr
    assert "pip install -e '.[onnx]'" in done.stderr and "Traceback" not in done.stderr
