"""`nnpack`: parity with the float64 Caffe engine, and NNPACK really running the convolutions."""

from __future__ import annotations

import numpy as np
import pytest
from backend_parity import CREATE_AND_EXIT, assert_parity, face_inputs, lenet, mnist, run_without, write_quirky

from tracker.backends import create_backend
from tracker.model.spec import default_model

NAME = "nnpack"


def test_fp32_face_cnn():
    with create_backend(NAME, default_model()) as backend:
        assert backend.nnpack_convs == ("conv1", "conv2", "conv3")
        assert_parity(backend, default_model(), face_inputs())
        assert_parity(backend, default_model(), face_inputs()[:1])


def test_fp32_lenet(testdata):
    with create_backend(NAME, lenet(testdata)) as backend:
        assert_parity(backend, lenet(testdata), mnist(testdata))


def test_fp32_quirky_net_falls_back_where_nnpack_cannot(tmp_path):
    """Group 2 and dilation 2 are beyond NNPACK: those convolutions run through F.conv2d."""
    model = write_quirky(tmp_path)
    x = np.random.default_rng(2).standard_normal((3, 2, 23, 17)).astype(np.float32)
    with create_backend(NAME, model) as backend:
        assert backend.nnpack_convs == ()
        assert_parity(backend, model, x)


@pytest.mark.parametrize("batch", [1, 4])
def test_nnpack_runs_every_convolution_at_small_batches(batch):
    """PyTorch's own dispatcher would not use NNPACK below batch 16 (nor with MKLDNN on): the
    profiler shows NNPACK's operator once per convolution, and no other convolution kernel."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with create_backend(NAME, default_model(), threads=2) as backend:
        x = face_inputs()[:batch]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            backend.infer(x)
        calls = {e.key: e.count for e in prof.key_averages()}
    assert calls.get("aten::_nnpack_spatial_convolution") == 3
    assert not any(k in calls for k in ("aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "aten::conv2d"))
    assert torch.get_num_threads() == 1  # OpenMP off for the small ops; NNPACK has its own pool


def test_missing_runtime_exits_3():
    done = run_without("torch", CREATE_AND_EXIT.format(name=NAME))
    assert done.returncode == 3, done.stderr
    assert "pip install -e '.[torch]'" in done.stderr and "Traceback" not in done.stderr
