"""`onnxruntime`: the int8 model's layout, threads, bad input. Parity, int8 quality and the missing runtime:
test_parity.py."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.backends import create_backend
from tracker.errors import InputError
from tracker.model.spec import default_model

NAME = "onnxruntime"


@pytest.fixture(scope="module")
def cache(backend_caches):
    return backend_caches(NAME)  # shared with this backend's tests in test_parity.py


def test_int8_model_layout(cache):
    """int8 from conv2 on: conv1..pool1 stay float, and so does the final softmax, on the
    dequantised logits."""
    import onnx

    from tracker.model.convert import convert

    model = onnx.load(convert(default_model(), "onnx", "int8", cache_dir=cache))
    ops = [(n.op_type, n.name) for n in model.graph.node if n.op_type not in ("DequantizeLinear",)]
    assert ops[:4] == [("Conv", "conv1"), ("Relu", "relu1"), ("MaxPool", "pool1"), ("QuantizeLinear", "caffe/pool1_QuantizeLinear")]
    assert ops[-1] == ("Softmax", "prob") and model.graph.node[-2].op_type == "DequantizeLinear"
    assert [o.name for o in model.graph.output] == ["prob", "embedding"]


def test_threads_and_bad_input(cache):
    with create_backend(NAME, default_model(), threads=1, cache_dir=cache) as backend:
        assert backend._session.get_session_options().intra_op_num_threads == 1
        with pytest.raises(InputError, match=r"backend 'onnxruntime': input of shape \(2, 88, 88\); expected \(N, 1, 88, 88\)"):
            backend.infer(np.zeros((2, 88, 88), np.float32))
