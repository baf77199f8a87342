"""Arrays that start on a 64-byte cache line: the engine's workspace and every copy of a weight
it makes in another layout (the caffemodel's own arrays it reads where they are: copying them
all would hold the face CNN's 4 MB of weights twice).

numpy aligns its buffers to 16 bytes only (a large one comes from mmap, 16 bytes past a page
start), and OpenBLAS's GEMMs too small for it to pack their operands ran faster when the weights
started on a cache line: on the Intel Xeon Emerald Rapids VM of the README, one thread, the face
CNN's conv2 as one GEMM per output row ((36, 576) @ (576, 48)) took 0.39 against 0.48-0.50 ms
per image, conv3's ((8, 1200) @ (1200, 96)) 0.082-0.085 against 0.114-0.120, in Nets whose
weights had landed on a line or not (a trial script); the whole "dl" pass at batch 8 and 64 took
0.85-0.89x the time with every GEMM weight on a line against 16 or 48 bytes off (interleaved; no
change at batch 1 nor in the "caffe" mode, whose convolutions' GEMMs are larger). The cause inside
OpenBLAS was not looked into.
"""

from __future__ import annotations

import numpy as np

CACHE_LINE = 64  # bytes


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` and `dtype` whose data starts on a cache
    line."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + CACHE_LINE, np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def copy(a, dtype=None) -> np.ndarray:
    """A C-contiguous copy of `a` (cast to `dtype` if given) on a cache line."""
    a = np.asarray(a)
    out = empty(a.shape, dtype or a.dtype)
    np.copyto(out, a, casting="unsafe")
    return out
