"""`tf-neon-vfpv4` (LiteRT + XNNPACK): the int8 model's layout, XNNPACK applied, one interpreter per batch size
(bounded), a cached model run without TensorFlow. Parity, int8 quality and the missing runtime: test_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
from backend_parity import (
    face_inputs,
    run_without,
)

from tracker.backends import create_backend
from tracker.errors import InputError
from tracker.model.spec import default_model

NAME = "tf-neon-vfpv4"


@pytest.fixture(scope="module")
def cache(backend_caches):
    return backend_caches(NAME)  # shared with this backend's tests in test_parity.py


def test_int8_model_layout(cache):
    """int8 from conv2 on: conv1 and pool1 stay float (one QUANTIZE after pool1), and so does the
    final softmax, on the dequantised logits (the file's outputs are float32 "prob" and "embedding")."""
    from ai_edge_litert.interpreter import Interpreter

    from tracker.model.convert import convert

    interpreter = Interpreter(model_path=str(convert(default_model(), "tflite", "int8", cache_dir=cache)))
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    assert ops[:4] == ["CONV_2D", "MAX_POOL_2D", "QUANTIZE", "CONV_2D"]
    assert ops[-2:] == ["DEQUANTIZE", "SOFTMAX"]  # the softmax reads float32
    outputs = interpreter.get_signature_runner().get_output_details()
    assert sorted(outputs) == ["embedding", "prob"] and all(o["dtype"] == np.float32 for o in outputs.values())


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_xnnpack_is_applied(cache, precision):
    with create_backend(NAME, default_model(), precision=precision, cache_dir=cache) as backend:
        assert backend.xnnpack_nodes >= 1


def test_one_interpreter_per_batch_size_bounded(cache):
    x = face_inputs()
    with create_backend(NAME, default_model(), threads=1, cache_dir=cache, max_interpreters=2) as backend:
        assert backend.threads == 1
        first = backend.infer(x[:2])
        kept = backend._interpreters[2]
        backend.infer(x[:1])
        again = backend.infer(x[:2])
        assert backend._interpreters[2] is kept  # re-used, not rebuilt
        np.testing.assert_array_equal(first.probs, again.probs)
        assert first.probs is not again.probs  # results are the caller's, not interpreter buffers
        backend.infer(x[:3])
        assert list(backend._interpreters) == [2, 3]  # batch 1 was least recently used
        with pytest.raises(InputError, match=r"backend 'tf-neon-vfpv4': input of shape \(2, 88, 88\)"):
            backend.infer(np.zeros((2, 88, 88), np.float32))


def test_the_kept_interpreters_are_bounded_in_images_too(cache, monkeypatch):
    """Three interpreters of about 500 images each (a guard's full batches, mirror-mean doubled)
    took the process past 1 GB; here the bound is lowered to 4 images to keep the test small."""
    import tracker.backends.litert as litert

    monkeypatch.setattr(litert, "MAX_KEPT_IMAGES", 4)
    x = face_inputs()
    with create_backend(NAME, default_model(), threads=1, cache_dir=cache) as backend:
        backend.infer(x[:1])
        backend.infer(x[:2])
        assert list(backend._interpreters) == [1, 2]
        backend.infer(x[:3])  # 1 + 2 + 3 > 4: both older ones go
        assert list(backend._interpreters) == [3]
        backend.infer(x[:1])
        assert list(backend._interpreters) == [3, 1]
        backend.infer(x[:5])  # larger than the bound alone: kept, alone
        assert list(backend._interpreters) == [5]


def test_a_cached_model_runs_without_tensorflow(cache):
    """What the Pi does: TensorFlow only converts; the interpreter alone runs the cached file."""
    with create_backend(NAME, default_model(), cache_dir=cache) as backend:  # warms the cache
        want = backend.infer(face_inputs()[:2]).probs
    np.save(cache / "want.npy", want)
    done = run_without("tensorflow", f"""
import numpy as np
from backend_parity import face_inputs
from tracker.backends import create_backend
got = create_backend({NAME!r}, cache_dir={str(cache)!r}).infer(face_inputs()[:2]).probs
assert "tensorflow" not in sys.modules or sys.modules["tensorflow"] is None
np.testing.assert_array_equal(got, np.load({str(cache / "want.npy")!r}))
print("ok")
""")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
