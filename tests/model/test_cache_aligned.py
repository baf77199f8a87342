"""tracker.model.cache_aligned: arrays on a 64-byte cache line."""

import numpy as np
import pytest

from tracker.model import cache_aligned


@pytest.mark.parametrize("shape", [(1,), (3, 5), (7, 1, 9)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_empty_starts_on_a_line(shape, dtype):
    for _ in range(8):  # numpy's own buffers land on every 16-byte offset; each must be moved
        a = cache_aligned.empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % cache_aligned.CACHE_LINE == 0


def test_copy_keeps_values_casts_and_never_shares():
    source = np.arange(24, dtype=np.float64).reshape(2, 3, 4).transpose(2, 0, 1)  # not contiguous
    same = cache_aligned.copy(source)
    cast = cache_aligned.copy(source, np.float32)
    for a, dtype in ((same, np.float64), (cast, np.float32)):
        assert a.dtype == dtype and a.flags.c_contiguous and a.ctypes.data % cache_aligned.CACHE_LINE == 0
        np.testing.assert_array_equal(a, source)
        assert not np.shares_memory(a, source)
