"""Caffe's layer arithmetic as numpy functions (inference only).

Every function reproduces the forward pass of the BVLC Caffe layer of the same name, including
its rounding and edge rules, for any float dtype (the engine runs float32; float64 is the
reference). Arrays are NCHW-shaped (N, C, H, W) but may have any strides: the engine's
"dl" mode keeps a convolution's output in (C, N, H, W) memory (channel-major) or in (N, H, W, C)
memory (pixel-major) and hands layers its NCHW-shaped transposed view, so nothing here assumes
C-contiguity unless it says so.

Functions that take `out=` write their result there (it may alias the input: Caffe's in-place
layers) and return it; with `out=None` they allocate. Geometry helpers are pure integer maths.
No function here imports anything but numpy and Python's `math`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Caffe's enum values (caffe.proto): PoolingParameter.PoolMethod, EltwiseParameter.EltwiseOp,
# LRNParameter.NormRegion.
POOL_MAX, POOL_AVE, POOL_STOCHASTIC = 0, 1, 2
ELTWISE_PROD, ELTWISE_SUM, ELTWISE_MAX = 0, 1, 2
LRN_ACROSS_CHANNELS, LRN_WITHIN_CHANNEL = 0, 1


# --------------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------------


def ave_pool_divisors(size: int, kernel: int, pad: int, stride: int, out: int) -> np.ndarray:
    """Per output position along one axis, the cell count Caffe divides an AVE window's sum by.

    The window [o*stride - pad, o*stride - pad + kernel) is clipped to the padded image
    [-pad, size + pad): padded cells inside the padded image count, cells beyond it (from ceil
    rounding) do not. The 2-D divisor is the outer product of the two axes' counts. int64 (out,).
    """
    start = np.arange(out) * stride - pad
    end = np.minimum(start + kernel, size + pad)
    return end - start


# --------------------------------------------------------------------------------------------
# Padding and sliding windows
# --------------------------------------------------------------------------------------------


def pad_into(x: np.ndarray, before: tuple[int, int], after: tuple[int, int], value: float, out: np.ndarray | None = None) -> np.ndarray:
    """x (..., H, W) copied into (..., before_h + H + after_h, before_w + W + after_w) filled with `value`.

    A negative `after` crops instead (windows that never reach the last rows). `out`, if given,
    must have the padded shape; only its border is written besides the copied interior.
    """
    *lead, h, w = x.shape
    bh, bw = before
    ah, aw = after
    hp, wp = bh + h + ah, bw + w + aw
    if out is None:
        out = np.empty((*lead, hp, wp), dtype=x.dtype)
    h_in, w_in = min(h, h + ah), min(w, w + aw)
    if bh:
        out[..., :bh, :] = value
    if ah > 0:
        out[..., bh + h :, :] = value
    if bw:
        out[..., bh : bh + h_in, :bw] = value
    if aw > 0:
        out[..., bh : bh + h_in, bw + w :] = value
    np.copyto(out[..., bh : bh + h_in, bw : bw + w_in], x[..., :h_in, :w_in])
    return out


def windows(xp: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """Read-only view (..., kh, kw, OH, OW) of the sliding windows of a padded map xp (..., Hp, Wp).

    Element [..., i, j, y, x] = xp[..., y*sh + i*dh, x*sw + j*dw]. No copy; xp may have any strides.
    """
    kh, kw = kernel
    sh, sw = stride
    dh, dw = dilation
    oh, ow = out_hw
    if (oh - 1) * sh + (kh - 1) * dh >= xp.shape[-2] or (ow - 1) * sw + (kw - 1) * dw >= xp.shape[-1]:
        raise ValueError("windows: padded map too small for the requested windows")
    *lead_strides, s_h, s_w = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp,
        shape=(*xp.shape[:-2], kh, kw, oh, ow),
        strides=(*lead_strides, s_h * dh, s_w * dw, s_h * sh, s_w * sw),
        writeable=False,
    )


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------


# Input bytes per block of pool2d: about one core's L2, so that the passes over a block's output
# find it in cache. Whole-batch passes over the face CNN's pool1 and pool2 at batch 256 ("caffe"
# mode's blobs, 110 and 64 MB) took 0.10 ms per image each; blocks of at most this size, 0.065
# and 0.051 (AMD EPYC dev machine, one thread).
POOL_BLOCK_BYTES = 1 << 20


def pool_block_len(shape: Sequence[int], itemsize: int) -> int:
    """How many items of the first axis of an input of this shape (ndim >= 3) `pool2d` pools at
    a time: as many as fit in POOL_BLOCK_BYTES, at least one, at most all."""
    item_bytes = math.prod(shape[1:]) * itemsize
    return max(1, min(shape[0], POOL_BLOCK_BYTES // max(item_bytes, 1)))


def pool_scratch_len(shape: Sequence[int], itemsize: int, method: int, kernel: tuple[int, int],
                     stride: tuple[int, int], pad: tuple[int, int], out_hw: tuple[int, int]) -> int:
    """Elements of the `scratch` buffer `pool2d` uses on an input of this shape and dtype size:
    for one block (`pool_block_len`; a 2-D input is one), its padded copy if the windows leave
    the image, and for MAX its row maxima (..., OH, Wp)."""
    lead = shape[:-2] if len(shape) < 3 else (pool_block_len(shape, itemsize), *shape[1:-2])
    need_h, need_w, after = _window_extent(shape[-2:], kernel, stride, pad, out_hw)
    padded = need_h * need_w if _pads(pad, after) else 0
    rows = out_hw[0] * need_w if method == POOL_MAX else 0
    return math.prod(lead) * (padded + rows)


def pool2d(
    x: np.ndarray,
    method: int,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    pad: tuple[int, int],
    out_hw: tuple[int, int],
    out: np.ndarray | None = None,
    scratch: np.ndarray | None = None,
) -> np.ndarray:
    """Caffe MAX or AVE pooling of x (..., H, W) to (..., OH, OW) = out_hw, which the caller takes
    from `shapes.pool_geometry` (Caffe's output size: its rounding mode, its clipping of a last
    window that would start in the padding).

    MAX: padded cells never win (Caffe clips the window to the image). AVE: the window sum over
    image cells divided by `ave_pool_divisors` (padding inside the padded image counts). Computed
    in blocks along x's first axis (`pool_block_len`; a 2-D x is one block), reading a padded copy
    of a block only when the windows leave the image: MAX as a max over each window's rows, then
    over its columns (`_max_by_rows_then_columns`); AVE as kh*kw strided passes over the output,
    adding the window's cells in Caffe's order (row by row), so that the sum rounds as Caffe's
    does. `scratch`, if given, is a buffer of at least `pool_scratch_len` elements of x's dtype,
    reused for the padded copy and the row maxima (the engine passes its workspace).
    """
    if method not in (POOL_MAX, POOL_AVE):
        raise ValueError(f"pool2d: unsupported pooling method {method}")
    kh, kw = kernel
    sh, sw = stride
    ph, pw = pad
    oh, ow = out_hw
    *lead, h, w = x.shape
    if out is None:
        out = np.empty((*lead, oh, ow), dtype=x.dtype)
    if scratch is None:
        scratch = np.empty(pool_scratch_len(x.shape, x.dtype.itemsize, method, kernel, stride, pad, out_hw), dtype=x.dtype)
    div = None
    if method == POOL_AVE:
        div = np.multiply.outer(ave_pool_divisors(h, kh, ph, sh, oh), ave_pool_divisors(w, kw, pw, sw, ow)).astype(x.dtype)
    if x.ndim == 2:
        _pool2d_block(x, method, kernel, stride, pad, out_hw, out, scratch, div)
        return out
    step = pool_block_len(x.shape, x.dtype.itemsize)
    for start in range(0, x.shape[0], step):
        _pool2d_block(x[start : start + step], method, kernel, stride, pad, out_hw, out[start : start + step], scratch, div)
    return out


def _window_extent(hw: Sequence[int], kernel: tuple[int, int], stride: tuple[int, int], pad: tuple[int, int],
                   out_hw: tuple[int, int]) -> tuple[int, int, tuple[int, int]]:
    """The padded extent (need_h, need_w) that the windows read, and the padding after the image
    along H and W that gives it (negative: the last rows or columns are never read)."""
    need_h = (out_hw[0] - 1) * stride[0] + kernel[0]
    need_w = (out_hw[1] - 1) * stride[1] + kernel[1]
    return need_h, need_w, (need_h - hw[0] - pad[0], need_w - hw[1] - pad[1])


def _pads(pad: tuple[int, int], after: tuple[int, int]) -> bool:
    """True if the windows read cells outside the image (a padded copy is needed)."""
    return bool(pad[0] or pad[1] or after[0] > 0 or after[1] > 0)


# What MAX pooling pads with: Caffe's -FLT_MAX, which a ceil-mode window wholly past the input
# (kernel 1, stride 5 on 12) gives as its value (-inf, which a later layer adding opposite
# infinities turns into NaN, was not Caffe's).
_FLT_LOWEST = float(np.finfo(np.float32).min)


def _pool2d_block(x, method, kernel, stride, pad, out_hw, out, scratch, div) -> None:
    """`pool2d` of one block into out; div: the AVE divisors (OH, OW), None for MAX."""
    *lead, h, w = x.shape
    count = math.prod(lead)
    need_h, need_w, after = _window_extent((h, w), kernel, stride, pad, out_hw)
    if _pads(pad, after):
        fill = _FLT_LOWEST if method == POOL_MAX else 0.0
        size = count * need_h * need_w
        xp = pad_into(x, pad, after, fill, out=scratch[:size].reshape(*lead, need_h, need_w))
        scratch = scratch[size:]
    else:
        xp = x[..., :need_h, :need_w]
    if method == POOL_MAX:
        rows = _in_memory_order_of(xp, scratch[: count * out_hw[0] * need_w], (*lead, out_hw[0], need_w))
        _max_by_rows_then_columns(xp, kernel, stride, out_hw, out, rows)
        return
    win = windows(xp, kernel, stride, (1, 1), out_hw)
    np.copyto(out, win[..., 0, 0, :, :])
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            if i or j:
                np.add(out, win[..., i, j, :, :], out=out)
    out /= div


def _in_memory_order_of(like: np.ndarray, buf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The flat buf as an array of `shape` (like's number of axes) whose axes lie in memory in the
    order of like's (largest stride outermost), so that passes over the two stream together: a
    pooling of the "dl" mode's (N, H, W, C) memory keeps whole pixels contiguous."""
    order = sorted(range(like.ndim), key=lambda axis: -like.strides[axis])
    return buf.reshape([shape[axis] for axis in order]).transpose(np.argsort(order))


def _max_by_rows_then_columns(xp: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
                              out_hw: tuple[int, int], out: np.ndarray, rows: np.ndarray) -> None:
    """MAX pooling of the padded map xp (..., need_h, need_w) into out (..., OH, OW) in two 1-D
    passes, exact because a max may be taken in any order: into rows (..., OH, need_w), the max
    of each window's kh rows at every column; then into out, the max of each window's kw columns
    of that. The row pass reads whole rows, contiguous in NCHW memory, which numpy's maximum runs
    in SIMD, and only the column pass, over 1/kh of the data, reads at stride sw; taking each of
    the kh*kw window cells in turn, as AVE does, reads every operand at stride sw. The face CNN's
    pool1 (2x2) and pool2 (3x3) of NCHW blobs at batch 64 took 0.036 and 0.023 ms per image
    against 0.054 and 0.040 (Intel Xeon, one thread, a trial script); of the "dl" mode's
    (N, H, W, C) memory, whose pixels are contiguous runs either way, pool2 took the same time
    (0.021-0.034 against 0.022-0.038 ms at batch 1 to 8)."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out_hw

    def rows_from(i: int) -> np.ndarray:
        return xp[..., i : i + (oh - 1) * sh + 1 : sh, :]

    if kh == 1:
        rows = rows_from(0)
    else:
        np.maximum(rows_from(0), rows_from(1), out=rows)
        for i in range(2, kh):
            np.maximum(rows, rows_from(i), out=rows)

    def columns_from(j: int) -> np.ndarray:
        return rows[..., j : j + (ow - 1) * sw + 1 : sw]

    if kw == 1:
        np.copyto(out, columns_from(0))
    else:
        np.maximum(columns_from(0), columns_from(1), out=out)
        for j in range(2, kw):
            np.maximum(out, columns_from(j), out=out)


# --------------------------------------------------------------------------------------------
# Element-wise activations
# --------------------------------------------------------------------------------------------


def relu(x: np.ndarray, negative_slope: float = 0.0, out: np.ndarray | None = None) -> np.ndarray:
    """Caffe ReLU: max(x, 0) + negative_slope * min(x, 0).

    The max is taken against zeros shaped like x's last two axes (its last axis for 1-D and
    2-D x), broadcast over the others: numpy 2.4 runs maximum against a scalar about 5x slower than
    against an array whose rows it streams (the face CNN's conv1 output, (8, 16, 82, 82) float32,
    on the EPYC dev machine: 1.04-1.08 ms against 0.19-0.21, `scripts/engine_timing.py
    --elementwise`). The values are the same, NaN included."""
    zeros = np.zeros(x.shape[-2:] if x.ndim > 2 else x.shape[-1:], dtype=x.dtype)
    if negative_slope == 0.0:
        return np.maximum(x, zeros, out=out)
    neg = np.minimum(x, zeros)
    res = np.maximum(x, zeros, out=out)
    neg *= x.dtype.type(negative_slope)
    res += neg
    return res


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Caffe Sigmoid: 1 / (1 + exp(-x)), computed as 0.5 * tanh(0.5 x) + 0.5 (no overflow)."""
    half = x.dtype.type(0.5)
    out = np.multiply(x, half, out=out)
    np.tanh(out, out=out)
    out *= half
    out += half
    return out


def tanh(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Caffe TanH."""
    return np.tanh(x, out=out)


# --------------------------------------------------------------------------------------------
# Dense layers
# --------------------------------------------------------------------------------------------


def inner_product(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, axis: int, transpose: bool,
                  out: np.ndarray | None = None) -> np.ndarray:
    """Caffe InnerProduct: x flattened to (M, K) at `axis` times W^T (weight (N, K)), or times W
    (weight (K, N)) when `transpose`; plus bias (N,). Returns shape x.shape[:axis] + (N,)."""
    m, k = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    x2 = x.reshape(m, k)
    w = weight if transpose else weight.T
    n_out = w.shape[1]
    res = np.matmul(x2, w, out=None if out is None else out.reshape(m, n_out))
    if bias is not None:
        np.add(res, bias, out=res)
    return res.reshape(*x.shape[:axis], n_out)


def softmax(x: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """Caffe Softmax along `axis`: exp(x - max) / sum(exp(x - max))."""
    out = np.subtract(x, np.max(x, axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    np.divide(out, np.sum(out, axis=axis, keepdims=True), out=out)
    return out


# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------


def lrn_across_channels(x: np.ndarray, size: int, alpha: float, beta: float, k: float, out: np.ndarray | None = None) -> np.ndarray:
    """Caffe LRN ACROSS_CHANNELS on x (N, C, ...):
    x / (k + alpha/size * sum_{c' in [c - (size-1)/2, c + size/2]} x[c']^2) ** beta,
    channels outside [0, C) contributing zero."""
    dt = x.dtype.type
    sq = np.square(x)
    pre = (size - 1) // 2
    c = x.shape[1]
    acc = np.zeros_like(sq)
    # window channel c+off; offsets of C or more reach no channel (a local_size of 400 million
    # looped for minutes over nothing)
    for off in range(max(-pre, 1 - c), min(size - pre, c)):
        lo, hi = max(0, -off), min(c, c - off)
        acc[:, lo:hi] += sq[:, lo + off : hi + off]
    acc *= dt(alpha / size)
    acc += dt(k)
    np.power(acc, dt(-beta), out=acc)
    return np.multiply(x, acc, out=out)


def lrn_within_channel(x: np.ndarray, size: int, alpha: float, beta: float, out: np.ndarray | None = None) -> np.ndarray:
    """Caffe LRN WITHIN_CHANNEL on x (..., H, W): x * (1 + alpha * avepool(x^2)) ** -beta.

    Caffe builds it from AVE pooling of x^2 (kernel size x size, stride 1, pad (size-1)/2, so the
    divisor is size^2 everywhere, i.e. alpha/size^2 times the window sum) and a Power layer with
    shift 1: `k` plays no part. `size` must be odd (Caffe's check). The window sums are taken
    from running sums (float64) along H, then W, clipped to the image: no padded copy, whose size
    grew with local_size (20,001 asked for 15 GB on an 88 x 88 input)."""
    dt = x.dtype.type
    sums = _window_sums(_window_sums(np.square(x), size, -2), size, -1)
    sums *= alpha / size**2
    sums += 1
    np.power(sums, -beta, out=sums)
    return np.multiply(x, sums.astype(dt, copy=False), out=out)


def _window_sums(a: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Along `axis` (length n), for every i in [0, n): the sum of a over [i - (size-1)//2,
    i - (size-1)//2 + size) clipped to [0, n), as float64 (a running sum, so any size costs the
    same)."""
    n = a.shape[axis]
    running = np.cumsum(a, axis=axis, dtype=np.float64)
    running = np.concatenate([np.zeros_like(np.take(running, [0], axis=axis)), running], axis=axis)
    starts = np.arange(n) - (size - 1) // 2
    return np.take(running, np.clip(starts + size, 0, n), axis=axis) - np.take(running, np.clip(starts, 0, n), axis=axis)


def batch_norm(
    x: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    scale_factor: float,
    eps: float,
    use_global_stats: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Caffe BatchNorm on x (N, C, ...): (x - mean[c]) / sqrt(var[c] + eps).

    With use_global_stats the stored mean and variance are divided by the stored scale factor
    (0 means 0). Otherwise the statistics are the batch's (over N and the spatial axes, biased
    variance), as Caffe does when use_global_stats is explicitly false.
    """
    c = x.shape[1]
    bshape = (1, c) + (1,) * (x.ndim - 2)
    dt = x.dtype.type
    if use_global_stats:
        factor = 0.0 if scale_factor == 0 else 1.0 / scale_factor
        mu = (mean.astype(x.dtype) * dt(factor)).reshape(bshape)
        sigma2 = (var.astype(x.dtype) * dt(factor)).reshape(bshape)
    else:
        axes = (0,) + tuple(range(2, x.ndim))
        mu = x.mean(axis=axes, keepdims=True)
        sigma2 = np.square(x - mu).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(sigma2 + dt(eps))
    out = np.subtract(x, mu, out=out)
    out *= inv
    return out


def scale_shape(x_shape: Sequence[int], axis: int, factor_shape: Sequence[int]) -> tuple[int, ...]:
    """The broadcast shape of a Scale/Bias factor of `factor_shape` aligned at `axis` of x."""
    return (1,) * axis + tuple(factor_shape) + (1,) * (len(x_shape) - axis - len(factor_shape))


def scale(x: np.ndarray, factor: np.ndarray, axis: int, bias: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Caffe Scale: x * factor (+ bias), factor's axes aligned with x's axes axis..axis+factor.ndim."""
    bshape = scale_shape(x.shape, axis, factor.shape)
    out = np.multiply(x, factor.reshape(bshape).astype(x.dtype, copy=False), out=out)
    if bias is not None:
        out += bias.reshape(bshape).astype(x.dtype, copy=False)
    return out


# --------------------------------------------------------------------------------------------
# Shape and combination layers
# --------------------------------------------------------------------------------------------


def eltwise(xs: Sequence[np.ndarray], op: int, coeffs: Sequence[float] = (), out: np.ndarray | None = None) -> np.ndarray:
    """Caffe Eltwise over equally shaped inputs: PROD, SUM (with per-input coefficients, default 1)
    or MAX."""
    if op == ELTWISE_SUM:
        cs = list(coeffs) if coeffs else [1.0] * len(xs)
        dt = xs[0].dtype.type
        out = np.multiply(xs[0], dt(cs[0]), out=out)
        for x, c in zip(xs[1:], cs[1:]):
            if c == 1.0:
                out += x
            else:
                out += x * dt(c)
        return out
    combine = {ELTWISE_PROD: np.multiply, ELTWISE_MAX: np.maximum}[op]
    out = combine(xs[0], xs[1], out=out)
    for x in xs[2:]:
        combine(out, x, out=out)
    return out
