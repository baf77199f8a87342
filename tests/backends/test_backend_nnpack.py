"""`nnpack`: NNPACK really running the convolutions it can, and only those. Parity and the missing
runtime: test_parity.py."""

from __future__ import annotations

import pytest
from backend_parity import face_inputs, write_quirky

from tracker.backends import create_backend
from tracker.model.spec import default_model

NAME = "nnpack"


def test_nnpack_takes_the_convolutions_it_can(tmp_path):
    with create_backend(NAME, default_model()) as backend:
        assert backend.nnpack_convs == ("conv1", "conv2", "conv3")
    # Group 2 and dilation 2 are beyond NNPACK: those convolutions run through F.conv2d.
    with create_backend(NAME, write_quirky(tmp_path)) as backend:
        assert backend.nnpack_convs == ()


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
