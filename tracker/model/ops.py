"""The engine's operators: one per Caffe layer, parsed once from its LayerDef and ready to run.

An operator holds its parameters in the engine's dtype (weights cast once, in the layout its
GEMM wants) and runs on NCHW-shaped arrays of any strides. The engine (`tracker.model.engine`)
decides where every top lives: it passes `outs` (a view of its workspace, or the bottom itself
for an in-place layer) and `scratch` (temporaries carved from its workspace). Shapes and
geometry come from `tracker.model.shapes`, which restates Caffe's own rules, so the engine and
the caffemodel checks agree by construction.

Two execution modes exist for the layers whose algorithm differs:
- "caffe": Caffe's algorithm. Convolution runs per image: im2col of one image into one reused
  column buffer, then one GEMM per group, (O/g, C/g*kh*kw) @ (C/g*kh*kw, OH*OW). With a bias it
  is (O/g, C/g*kh*kw + 1) @ (C/g*kh*kw + 1, OH*OW): a row of ones below each group's columns and
  the bias as the last column of its weights, so that the one GEMM adds the bias too (Caffe runs
  a second GEMM for it; `Convolution._run_caffe`). 1x1 stride-1 unpadded convolutions skip
  im2col as Caffe does, reading the image itself as their columns, and add the bias after the
  GEMM.
- "dl": the same arithmetic per image in bands of output rows, each an im2col and a GEMM whose
  result IS that band of the output blob (handed on as an NCHW-shaped view of its memory, so no
  transpose is ever copied), with the bias and a following in-place ReLU applied in place on the
  GEMM output. The GEMM is oriented one of two ways (`Convolution.pixel_major`):
  - channel-major: (O, C*kh*kw) @ (C*kh*kw, rows*OW), the output in (C, N, H, W) memory. Each row
    of the column buffer is a run of OW input pixels, which suits few input channels (conv1 of
    the face CNN reads one);
  - pixel-major: (rows*OW, kh*kw*C) @ (kh*kw*C, O), the output in (N, H, W, C) memory, the input
    read through an NHWC copy when it is not NHWC already. Each column-buffer row is one patch,
    copied in runs of kw*C floats, and OpenBLAS runs this orientation faster when O is small: on
    the EPYC dev machine, single-threaded, the face CNN's conv2 GEMM (O 48, K 576) ran at 35-43
    GFLOP/s pixel-major against 24-32 channel-major (`scripts/engine_timing.py --gemms`). Unless
    dilated along H, the bands give way to copies that need no im2col: on one BLAS thread, one
    GEMM per output row over a row-unfolded copy (`Convolution._pixel_major_by_rows`); on several,
    at stride 1 along H, one GEMM per group of kernel rows over a copy unfolded along W
    (`Convolution._pixel_major_by_kernel_rows`).
  A channel-major convolution and the MAX pooling of its top can run as one `PooledConvolution`
  (the engine's schedule decides). An InnerProduct keeps its weights as (K, N) in "dl" mode,
  whatever Caffe's `transpose` (the same products, a faster GEMM for few images).

Each type of the one table of layer types (`shapes.LAYER_TYPES`) has its `Op` subclass here, named
after the type; `OPS` is built from the table, so a type without its operator fails at import.

The face CNN's paths here and in `tracker.model.layers` do their arithmetic on arrays as calls to
numpy's functions (`np.add(r, bias, out=r)`, not `r += bias`: the same ufunc), because calls are
what `scripts/engine_timing.py --layers` times to split each step into GEMMs, copies, element-wise
work and what runs outside numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from tracker.errors import ModelError
from tracker.model import cache_aligned
from tracker.model import layers as L
from tracker.model import shapes as S

Shape = tuple[int, ...]

PIXEL_MAJOR_MIN_RUN = 16  # floats: see Convolution.pixel_major
BAND_BYTES = 1 << 20  # columns per band of a "dl" convolution and BLAS thread: about one core's L2


class Op:
    """One layer. Subclasses implement `run`; `scratch_sizes` lists temporaries (element counts).

    in_place_safe: the op may write its top into the array of its first bottom (Caffe's in-place
    layers: top name == bottom name). Ops that cannot are given a fresh top and the blob name is
    rebound, which is indistinguishable from Caffe for every reader of the blob.
    keeps_layout: a 4-D top has the same memory order as the first bottom (element-wise ops), so
    "dl" mode keeps (C, N, H, W) memory flowing between convolutions without copies.
    """

    in_place_safe: ClassVar[bool] = False
    keeps_layout: ClassVar[bool] = False

    def __init__(self, layer, dtype: np.dtype, mode: str, shapes: S.LayerShapes):
        self.name: str = layer.name
        self.type: str = layer.type
        self.layer_names: tuple[str, ...] = (layer.name,)  # the layers it runs, in order (see PooledConvolution)
        self.bottoms: tuple[str, ...] = tuple(layer.bottoms)
        self.tops: tuple[str, ...] = tuple(layer.tops)
        self.dtype = np.dtype(dtype)
        self.mode = mode
        self.shapes = shapes
        self._layer = layer

    def error(self, what: str) -> ModelError:
        return ModelError(f"layer {self.name!r} ({self.type}): {what}")

    def blob(self, i: int) -> np.ndarray:
        """Parameter blob i, checked against the shape Caffe expects and cast to the engine dtype."""
        blobs = self._layer.blobs
        expected = self.shapes.params
        if len(blobs) != len(expected):
            raise self.error(f"has {len(blobs)} parameter blobs; expected {len(expected)} of shapes {list(expected)}")
        arr = np.asarray(blobs[i])
        if arr.size != math.prod(expected[i]):
            raise self.error(f"parameter blob {i} has shape {arr.shape}; expected {expected[i]}")
        return np.ascontiguousarray(arr.reshape(expected[i]), dtype=self.dtype)

    def scratch_sizes(self, in_shapes: Sequence[Shape]) -> list[int]:
        """Element counts of the temporaries one run on bottoms of `in_shapes` needs."""
        return []

    def run(self, ins: list[np.ndarray], outs: list[np.ndarray], scratch: list[np.ndarray], threads: int = 1) -> list[np.ndarray]:
        """The tops for bottoms `ins`, written into `outs`; `threads`: how many
        threads the BLAS splits this run's GEMMs between (the ops that cut work to fit caches
        cut it less for more threads)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Convolution
# --------------------------------------------------------------------------------------------


class Convolution(Op):
    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        p = layer.param.convolution_param
        bottom = shapes.bottoms[0]
        if len(bottom) != 4 or S.canonical_axis(layer, p.axis, len(bottom)) != 1:
            raise self.error(f"only 2-D convolution over axis 1 of an (N, C, H, W) input is supported; found input {bottom}, axis {p.axis}")
        g = S.conv_geometry(layer, 2)
        self.kernel, self.stride, self.pad, self.dilation = g.kernel, g.stride, g.pad, g.dilation
        self.group = p.group
        self.in_c, self.in_hw = bottom[1], bottom[2:]
        self.out_c, self.out_hw = shapes.tops[0][1], shapes.tops[0][2:]
        weight = self.blob(0)  # (O, C/g, kh, kw)
        o_g = self.out_c // self.group
        self.k_g = weight[0].size  # C/g * kh * kw: rows of the column buffer per group
        self.weight = weight.reshape(self.group, o_g, self.k_g)  # per-group GEMM left operands
        self.bias = self.blob(1).reshape(-1, 1) if p.bias_term else None
        self.is_1x1 = self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)
        # "caffe": the bias as one more column of each group's weights, for the row of ones the
        # column buffer has below each group's columns (see _run_caffe); None without a bias, and
        # for 1x1 convolutions, whose column buffer is the image itself
        self.weight_and_bias = None
        if mode == "caffe" and self.bias is not None and not self.is_1x1:
            self.weight_and_bias = cache_aligned.copy(np.concatenate([self.weight, self.bias.reshape(self.group, o_g, 1)], axis=2))
        # "dl": pixel-major when each patch row is copied in runs of at least a cache line
        # (16 floats); below that, numpy's per-run cost makes the im2col slower than the GEMM
        # gains (conv1 of the face CNN, one input channel: 0.48 against 0.08 ms per image).
        self.pixel_major = mode == "dl" and self.group == 1 and self.in_c * self.kernel[1] >= PIXEL_MAJOR_MIN_RUN
        if self.pixel_major:  # (kh*kw*C, O): the GEMM's right operand, rows in patch order
            self.weight_pm = cache_aligned.copy(weight.transpose(2, 3, 1, 0).reshape(self.k_g, self.out_c))
            # the bias of one output row of pixels, (OW*O,): added to a band seen as (rows, OW*O)
            self.bias_run = None if self.bias is None else np.tile(self.bias.reshape(-1), self.out_hw[1])
        # True only on the copy `engine.schedule.with_relu` makes ("dl": an in-place ReLU follows)
        self.fuse_relu = False

    def padded_hw(self) -> tuple[int, int]:
        return self.in_hw[0] + 2 * self.pad[0], self.in_hw[1] + 2 * self.pad[1]

    def scratch_sizes(self, in_shapes):
        """Both modes run one image at a time through the column buffer: its columns ("dl": at
        most one band's, but a band may be the whole image; "caffe": and a row of ones per group
        if the bias is folded in), its padded copy (pixel-major: its NHWC copy, padded or not), and
        ("caffe") the copy unfolded along W that `_im2col_of` fills the columns from."""
        if self.is_1x1 and not self.pixel_major:
            return [0, 0, 0]
        rows = self.in_c * self.kernel[0] * self.kernel[1] + (self.group if self.weight_and_bias is not None else 0)
        cols = rows * self.out_hw[0] * self.out_hw[1]
        if self.pixel_major:  # or its unfolded copies (see `_pixel_major_by_rows`, `_by_kernel_rows`)
            cols = max(cols, self.unfolded_size(), self.kernel_rows_size())
        padded = self.in_c * math.prod(self.padded_hw()) if any(self.pad) or self.pixel_major else 0
        along_w = self.in_c * self.kernel[1] * self._rows_read() * self.out_hw[1] if self.mode == "caffe" else 0
        return [cols, padded, along_w]

    def _rows_read(self) -> int:
        """Input rows (of the padded image) that the windows read, from the first."""
        return (self.out_hw[0] - 1) * self.stride[0] + (self.kernel[0] - 1) * self.dilation[0] + 1

    def _im2col_of(self, x: np.ndarray, cols: np.ndarray, padded: np.ndarray | None, along_w: np.ndarray) -> Callable[[int], None]:
        """A function of i that writes Caffe's im2col of image i of x (N, C, H, W) into the first
        C/g*kh*kw rows of each group's block of cols (g, rows, OH*OW) (the rows below them are
        left as they are). Two copies: first the image unfolded along W,
        along_w[c, kx, y, ox] = src[c, y, ox*sw + kx*dw], then each column-buffer row (c, ky, kx)
        from along_w[c, kx, ky*dh + oy*sh, :] (for stride 1 along H, one contiguous run of OH*OW
        values). The same columns as copying the windows directly, whose runs are only OW long:
        on the AMD EPYC dev machine, one image of the face CNN's conv2 took 0.12 against 0.20 ms,
        conv3 0.023 against 0.075, conv1 0.060 against 0.067 (a trial script). The strided views
        of both copies are made once per batch: numpy's as_strided costs about 3 us a call, a tenth
        of conv3's whole im2col (Intel Xeon)."""
        (kh, kw), (sh, sw), (dh, dw), (oh, ow) = self.kernel, self.stride, self.dilation, self.out_hw
        unfolded = along_w[: self.in_c * kw * self._rows_read() * ow].reshape(self.in_c, kw, self._rows_read(), ow)
        src = x if padded is None else padded[np.newaxis]  # (N or 1, C, H, W): the padded copy is one image's
        s_n, s_c, s_h, s_w = src.strides
        unfolding = np.lib.stride_tricks.as_strided(
            src, shape=(src.shape[0], *unfolded.shape), strides=(s_n, s_c, dw * s_w, s_h, sw * s_w), writeable=False)
        u_c, u_kx, u_y, u_x = unfolded.strides
        c_g = self.in_c // self.group
        rows = cols[:, : self.k_g].reshape(self.group, c_g, kh, kw, oh, ow)
        rows_source = np.lib.stride_tricks.as_strided(
            unfolded, shape=rows.shape, strides=(c_g * u_c, u_c, dh * u_y, u_kx, sh * u_y, u_x), writeable=False)

        def im2col(i: int) -> None:
            if padded is None:
                np.copyto(unfolded, unfolding[i])
            else:
                L.pad_into(x[i], self.pad, self.pad, 0.0, out=padded)
                np.copyto(unfolded, unfolding[0])
            np.copyto(rows, rows_source)

        return im2col

    def run(self, ins, outs, scratch, threads: int = 1):
        if self.mode == "caffe":
            return [self._run_caffe(ins[0], outs[0], scratch)]
        return [self._run_dl(ins[0], outs[0], scratch, threads)]

    def _run_caffe(self, x, out, scratch):
        """Caffe's forward: per image, its im2col and one GEMM per group, then the bias. Caffe
        adds the bias with a second GEMM, the bias times a row of ones accumulated onto the output
        on the BLAS's threads. numpy's matmul cannot accumulate, so the column buffer has that row
        of ones below each group's columns and the weights the bias as their last column: the one
        GEMM adds it, the same sum in another order (float32 rounding), each BLAS thread to the
        outputs it computed. Added in numpy after the GEMM, it read half of them from the other
        core's cache: the face CNN's conv1, conv2 and conv3 took 0.156, 0.557 and 0.120 ms per
        image against 0.138, 0.512 and 0.116 on two threads, 0.175, 0.686 and 0.123 against 0.163,
        0.669 and 0.121 on one (Intel Xeon, batch 64, a trial script). A 1x1 convolution reads the
        image itself as its columns (Caffe's shortcut, no copy), so its bias is added after."""
        n = x.shape[0]
        p = self.out_hw[0] * self.out_hw[1]
        out3 = out.reshape(n, self.out_c, p)
        o_g = self.out_c // self.group
        weight = self.weight if self.weight_and_bias is None else self.weight_and_bias
        if not self.is_1x1:
            cols = scratch[0][: self.group * weight.shape[2] * p].reshape(self.group, weight.shape[2], p)
            if self.weight_and_bias is not None:
                cols[:, -1] = 1  # im2col writes only the rows above it
            padded = scratch[1].reshape(self.in_c, *self.padded_hw()) if any(self.pad) else None
            im2col = self._im2col_of(x, cols, padded, scratch[2])
        for i in range(n):
            if self.is_1x1:
                cols = x[i].reshape(self.group, self.k_g, p)
            else:
                im2col(i)
            for g in range(self.group):
                np.matmul(weight[g], cols[g], out=out3[i, g * o_g : (g + 1) * o_g])
            if self.is_1x1 and self.bias is not None:
                np.add(out3[i], self.bias, out=out3[i])
        return out

    def _run_dl(self, x, out, scratch, threads):
        """Both "dl" orientations: per image, bands of output rows, each its own im2col, GEMM,
        bias and ReLU while the band's columns are in cache (on the dev machine a chunk of 9
        images ran its conv2 at 2.4-2.7 ms per image in one im2col and one GEMM, 2.0-2.3 in
        bands). Pixel-major ones not dilated along H run without an im2col instead: on one BLAS
        thread by output rows (`_pixel_major_by_rows`), on several, if also of stride 1 along H,
        by groups of kernel rows (`_pixel_major_by_kernel_rows`). `threads`: the BLAS threads
        each GEMM is split between."""
        n = x.shape[0]
        oh, ow = self.out_hw
        path = self.dl_path(threads)
        if path == "1x1":
            return self._run_1x1(x, out)
        if self.pixel_major:
            res = _nhwc_rows(out).reshape(n, oh * ow, self.out_c)  # a view: image i's (OH*OW, O)
            gather = any(self.pad) or _nhwc_rows(x, check=False) is None
            copy_shape, copy_axes = (1, *self.padded_hw(), self.in_c), (0, 3, 1, 2)
        else:
            res = out.transpose(1, 0, 2, 3).reshape(self.out_c, n, oh * ow)  # a view: image i's (O, OH*OW)
            gather = any(self.pad)
            copy_shape, copy_axes = (1, self.in_c, *self.padded_hw()), (0, 1, 2, 3)
        copy = scratch[1][: math.prod(copy_shape)].reshape(copy_shape).transpose(copy_axes) if gather else None
        cols = scratch[0]  # every band's columns in turn

        def source(i: int) -> np.ndarray:
            """Image i, (1, C, Hp, Wp): its (padded, NHWC) copy if it needs one."""
            return L.pad_into(x[i : i + 1], self.pad, self.pad, 0.0, out=copy) if gather else x[i : i + 1]

        def windows(i: int) -> np.ndarray:
            """Image i's windows (C, kh, kw, OH, OW)."""
            return L.windows(source(i), self.kernel, self.stride, self.dilation, self.out_hw)[0]

        def band(win: np.ndarray, i: int, r0: int, r1: int) -> None:
            """Output rows [r0, r1) of image i from its windows."""
            m, k_all = (r1 - r0) * ow, self.k_g * self.group
            region = cols[: m * k_all]
            if self.pixel_major:  # (rows, OW, kh, kw, C): one patch per GEMM row
                np.copyto(region.reshape(r1 - r0, ow, *self.kernel, self.in_c), win[..., r0:r1, :].transpose(3, 4, 1, 2, 0))
                r = res[i, r0 * ow : r1 * ow]
                np.matmul(region.reshape(m, self.k_g), self.weight_pm, out=r)
                self._bias_and_relu(r.reshape(r1 - r0, ow * self.out_c))
            else:  # (C, kh, kw, rows, OW): one pixel per GEMM column
                np.copyto(region.reshape(self.in_c, *self.kernel, r1 - r0, ow), win[..., r0:r1, :])
                self._channel_major_gemm(region.reshape(k_all, m), res[:, i, r0 * ow : r1 * ow])

        if path == "rows":
            for i in range(n):
                self._pixel_major_by_rows(source(i)[0].transpose(1, 2, 0), res[i].reshape(oh, ow, self.out_c), cols)
            return out
        if path == "kernel rows":
            for i in range(n):
                self._pixel_major_by_kernel_rows(source(i)[0].transpose(1, 2, 0), res[i], cols)
            return out
        rows = self.rows_per_band(threads)
        for i in range(n):
            win = windows(i)
            for r0 in range(0, oh, rows):
                band(win, i, r0, min(oh, r0 + rows))
        return out

    def dl_path(self, threads: int) -> str:
        """Which "dl" algorithm `_run_dl` runs with the BLAS on `threads` threads: "1x1" (the
        input is the column buffer, `_run_1x1`), "rows" (`_pixel_major_by_rows`), "kernel rows"
        (`_pixel_major_by_kernel_rows`) or "bands" (an im2col per band of output rows)."""
        if self.is_1x1 and not self.pixel_major:
            return "1x1"
        if self.pixel_major and self.dilation[0] == 1:
            if threads == 1:
                return "rows"
            if self.stride[0] == 1:
                return "kernel rows"
        return "bands"

    def _pixel_major_by_rows(self, src: np.ndarray, r: np.ndarray, scratch: np.ndarray) -> None:
        """One image of a pixel-major convolution on one BLAS thread, as one GEMM per output row
        over a row-unfolded copy instead of an im2col: src (Hp, Wp, C), the padded input in any
        strides; r (OH, OW, O), the output, C-contiguous; scratch: at least `unfolded_size()`
        elements. Needs dilation 1 along H.

        The copy holds, for each output column ox and each input row y, the kw*C values that
        its windows read in that row: unfolded[ox, y, kx, c] = src[y, ox*sw + kx*dw, c]. The
        patches of output row oy are then kh consecutive runs of it, [ox, oy*sh : oy*sh + kh],
        so they form a (OW, kh*kw*C) matrix with rows `rows_needed * kw * C` apart: a GEMM
        operand as it lies, in the weights' (ky, kx, c) order. All OH of them are one stacked
        numpy matmul (one BLAS GEMM per row). The copy is about kh/sh times smaller than the
        columns (the face CNN's conv2: 0.57 against 3 MB), and OpenBLAS ran the (36, 576) @ (576, 48)
        GEMMs faster than band-sized ones: conv2 of one image in 0.71 against 0.95 ms, conv3 in
        0.16 against 0.18 (AMD EPYC dev machine, a trial script). On several BLAS threads the
        engine keeps the bands: OpenBLAS does not split GEMMs this small.
        """
        (oh, ow), (kh, kw), (sh, sw) = self.out_hw, self.kernel, self.stride
        c, rows_needed, run = self.in_c, (oh - 1) * sh + kh, kw * self.in_c
        s_h, s_w, s_c = src.strides
        unfolded = scratch[: ow * rows_needed * run].reshape(ow, rows_needed, kw, c)
        np.copyto(unfolded, np.lib.stride_tricks.as_strided(
            src, shape=unfolded.shape, strides=(sw * s_w, s_h, self.dilation[1] * s_w, s_c), writeable=False))
        size = unfolded.itemsize
        patches = np.lib.stride_tricks.as_strided(
            unfolded, shape=(oh, ow, kh * run), strides=(sh * run * size, rows_needed * run * size, size), writeable=False)
        np.matmul(patches, self.weight_pm, out=r)
        self._bias_and_relu(r.reshape(oh, ow * self.out_c))

    def _pixel_major_by_kernel_rows(self, src: np.ndarray, r: np.ndarray, scratch: np.ndarray) -> None:
        """One image of a pixel-major convolution on several BLAS threads, its GEMM's depth split
        by kernel rows instead of an im2col: src (Hp, Wp, C), the padded input in any strides; r
        (OH*OW, O), the output, C-contiguous; scratch: at least `kernel_rows_size()` elements.
        Needs stride 1 and dilation 1 along H.

        With g = `kernel_rows_per_gemm()`, the copy holds each input row unfolded along W together
        with the g - 1 rows below it: unfolded[y, ox, dy, kx, c] = src[y + dy, ox*sw + kx*dw, c].
        For kernel rows [a, a + g), every output pixel's share of its patch, the rows
        oy + a .. oy + a + g - 1 of its window, is then unfolded[oy + a, ox], and these lie
        g*kw*C apart for all OH*OW pixels in order: one (OH*OW, g*kw*C) GEMM operand as it lies, in
        the weights' (ky, kx, c) row order. Each group of kernel rows is one GEMM on all the BLAS
        threads (a shorter group first, if kh is not a multiple of g, reading the first dy of the
        same copy), and the groups' products are summed.

        Against bands of an im2col (the engine's other path on several threads), each pixel is
        copied g*kw times instead of kh*kw, and the last sum, like the bias and ReLU after it,
        runs on the calling thread, which the next layer runs on too (the face CNN's pool2 after
        it: 0.061 against 0.068 ms in the pass, `engine_timing.py --threads 2 --layers`).
        The face CNN's conv2 (kh 6, 576-deep patches) at batch 1 on the two BLAS threads of the
        Intel Xeon Emerald Rapids VM of the README (a trial script, seven alternating rounds of
        200 calls): 0.37-0.40 ms with groups of 2 rows against 0.47-0.49 in bands; the whole pass
        0.85 ms against 0.98 (nine rounds), groups of 1 or 3 rows 0.87 and 0.88; conv3 (kh 5, a
        0.3 MB copy) in one group 0.109-0.112 against 0.114-0.116. On one BLAS thread the rows of
        `_pixel_major_by_rows` stay faster (conv2 0.50 against 0.50-0.56, conv3 0.087 against
        0.099-0.107).
        """
        (oh, ow), (kh, kw), c = self.out_hw, self.kernel, self.in_c
        g, run = self.kernel_rows_per_gemm(), kw * self.in_c
        s_h, s_w, s_c = src.strides
        unfolded_rows = oh + kh - g
        size = unfolded_rows * ow * g * run
        unfolded = scratch[:size].reshape(unfolded_rows, ow, g, kw, c)
        np.copyto(unfolded, np.lib.stride_tricks.as_strided(
            src, shape=unfolded.shape, strides=(s_h, self.stride[1] * s_w, s_h, self.dilation[1] * s_w, s_c), writeable=False))
        patches = unfolded.reshape(unfolded_rows * ow, g * run)
        partial = scratch[size : size + r.size].reshape(r.shape)
        for a, b in self.kernel_row_groups():
            product = r if a == 0 else partial
            np.matmul(patches[a * ow : (a + oh) * ow, : (b - a) * run], self.weight_pm[a * run : b * run], out=product)
            if a:
                np.add(r, partial, out=r)
        self._bias_and_relu(r.reshape(oh, ow * self.out_c))

    def _bias_and_relu(self, pixel_rows: np.ndarray) -> None:
        """Add the bias to pixel-major output rows (rows, OW*O) and the fused ReLU, in place. Long
        rows because numpy streams them faster: the bias of the face CNN's conv2 image took 22
        against 33 µs over rows of O floats (EPYC dev machine, `engine_timing.py --elementwise`;
        the ReLU: see L.relu)."""
        if self.bias_run is not None:
            np.add(pixel_rows, self.bias_run, out=pixel_rows)
        if self.fuse_relu:
            L.relu(pixel_rows, out=pixel_rows)

    def unfolded_size(self) -> int:
        """Elements of `_pixel_major_by_rows`'s row-unfolded copy of one image."""
        return self.out_hw[1] * ((self.out_hw[0] - 1) * self.stride[0] + self.kernel[0]) * self.kernel[1] * self.in_c

    def kernel_rows_per_gemm(self) -> int:
        """Kernel rows per GEMM of `_pixel_major_by_kernel_rows`: the most whose left operand (OH*OW
        patch shares of g*kw*C values) fits BAND_BYTES, at least 1, at most kh. The face CNN's
        conv2 gets 2 (1.0 MB), the fastest of 1-3 measured; conv3 all 5 (0.3 MB)."""
        share = math.prod(self.out_hw) * self.kernel[1] * self.in_c * self.dtype.itemsize
        return max(1, min(self.kernel[0], BAND_BYTES // share))

    def kernel_row_groups(self) -> list[tuple[int, int]]:
        """The [a, b) kernel rows of each GEMM of `_pixel_major_by_kernel_rows`, in order: groups of
        `kernel_rows_per_gemm()`, the shorter one first if kh is not a multiple of it."""
        kh, g = self.kernel[0], self.kernel_rows_per_gemm()
        first = kh % g or g
        return [(0, first)] + [(a, a + g) for a in range(first, kh, g)]

    def kernel_rows_size(self) -> int:
        """Elements of `_pixel_major_by_kernel_rows`'s scratch for one image: its copy (OH + kh - g
        unfolded rows) and a group's product; 0 where that path does not run."""
        if self.stride[0] != 1 or self.dilation[0] != 1:
            return 0
        g = self.kernel_rows_per_gemm()
        oh, ow = self.out_hw
        return (oh + self.kernel[0] - g) * ow * g * self.kernel[1] * self.in_c + oh * ow * self.out_c

    def rows_per_band(self, threads: int = 1) -> int:
        """Output rows per "dl" band (see `rows_per_band`)."""
        return rows_per_band(self.out_hw, self.k_g * self.group, self.dtype, threads)

    def _run_1x1(self, x, out):
        """Channel-major 1x1 stride-1 unpadded convolution of a chunk: the (C, n*H*W) input
        itself is the column buffer."""
        n = x.shape[0]
        p = self.out_hw[0] * self.out_hw[1]
        cols = np.ascontiguousarray(x.transpose(1, 0, 2, 3)).reshape(self.in_c, n * p)
        self._channel_major_gemm(cols, out.transpose(1, 0, 2, 3).reshape(self.out_c, n * p))
        return out

    def _channel_major_gemm(self, cols: np.ndarray, r: np.ndarray) -> None:
        """r (O, m) = the weights (O, C*kh*kw) @ cols (C*kh*kw, m), one GEMM per group, then the
        bias (and the fused ReLU), in place."""
        o_g = self.out_c // self.group
        for g in range(self.group):
            np.matmul(self.weight[g], cols[g * self.k_g : (g + 1) * self.k_g], out=r[g * o_g : (g + 1) * o_g])
        if self.bias is not None:
            np.add(r, self.bias, out=r)
        if self.fuse_relu:
            L.relu(r, out=r)


def rows_per_band(out_hw: tuple[int, int], column_rows: int, dtype: np.dtype, threads: int) -> int:
    """Output rows per "dl" band of a convolution with `column_rows` column-buffer rows per output
    pixel: at most BAND_BYTES of columns per BLAS thread, at least one row, at most all (a GEMM the
    BLAS splits between threads gains from being cut less: on the dev machine one image's forward
    pass took 3.38-3.41 ms with 2 MB bands on 2 threads, 3.87-3.98 with 1 MB)."""
    rows = max(1, threads * BAND_BYTES // (out_hw[1] * column_rows * dtype.itemsize))
    return min(rows, out_hw[0])


def _nhwc_rows(a: np.ndarray, check: bool = True) -> np.ndarray | None:
    """The (N*H*W, C) view of an NCHW-shaped array whose memory is (N, H, W, C) C-contiguous;
    None (or, with check, a ModelError: the schedule gave the op a top of another layout) if it
    is not."""
    n, c, h, w = a.shape
    nhwc = a.transpose(0, 2, 3, 1)
    if not nhwc.flags.c_contiguous:
        if check:
            raise ModelError(f"engine: a pixel-major convolution's top must be (N, H, W, C) in memory; found strides {a.strides}")
        return None
    return nhwc.reshape(n * h * w, c)


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------


class Pooling(Op):
    """Caffe Pooling. On the copy `engine.schedule.with_bias_relu_of` makes ("dl", MAX), the bias
    and ReLU of the convolution whose top it pools are applied to the pooled values instead
    (`then_bias`, `then_relu`), which is exact: x -> x + b and ReLU are monotonic, rounding
    included, so they commute with a max over a window's cells (a pooling with a window of no
    cells, `has_empty_windows`, is never given them)."""

    keeps_layout = True

    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        p = layer.param.pooling_param
        if p.pool not in (L.POOL_MAX, L.POOL_AVE):
            raise self.error("pool STOCHASTIC is not supported (only MAX and AVE)")
        self.method = p.pool
        g = S.pool_geometry(layer, shapes.bottoms[0])
        self.kernel, self.stride, self.pad, self.out_hw = g.kernel, g.stride, g.pad, g.out
        self.then_bias: np.ndarray | None = None  # (1, C, 1, 1): added to the pooled values
        self.then_relu = False
        # A window wholly past the input (ceil rounding, no padding, a stride over the kernel):
        # Caffe gives it -FLT_MAX, which a bias or ReLU applied after the pooling would change.
        self.has_empty_windows = any((o - 1) * s - p >= size for o, s, p, size
                                     in zip(self.out_hw, self.stride, self.pad, shapes.bottoms[0][2:]))

    def scratch_sizes(self, in_shapes):
        return [L.pool_scratch_len(in_shapes[0], self.dtype.itemsize, self.method, self.kernel, self.stride, self.pad, self.out_hw)]

    def run(self, ins, outs, scratch, threads: int = 1):
        out = L.pool2d(ins[0], self.method, self.kernel, self.stride, self.pad, self.out_hw, out=outs[0], scratch=scratch[0])
        if self.then_bias is not None:
            np.add(out, self.then_bias, out=out)
        if self.then_relu:
            L.relu(out, out=out)
        return [out]


# --------------------------------------------------------------------------------------------
# A convolution pooled as it is computed ("dl")
# --------------------------------------------------------------------------------------------

# The most GEMM work a PooledConvolution may add: the face CNN's conv1 + pool1 does 1.31x the
# multiply-adds of conv1 and took about half the time of the two layers (docs/ENGINE.md, "conv1
# and pool1 as one GEMM"); larger ratios were not measured, and 1x1 kernels (4x) would lose.
POOLED_CONV_MAX_WORK = 1.5


class PooledConvolution(Op):
    """"dl": a channel-major Convolution (with its fused ReLU, if any) and the MAX Pooling of its
    top as one op, for pooling windows that tile that top (kernel == stride, no pad, no partial
    window). The Convolution's own top is never written.

    The ph x pw outputs of one pooling window read one input patch of KH x KW = (kh + (ph-1)*sh)
    x (kw + (pw-1)*sw) pixels, so all of them are one GEMM over an im2col at the pooling's grid:
    (ph*pw*O, C*KH*KW) @ (C*KH*KW, OH*OW) for the pooled OH x OW, the left operand holding the
    kernel once per window position, at its offset in the patch, zeros elsewhere. The pooling is
    then a max over ph*pw contiguous blocks of O rows, and the bias and ReLU follow on the pooled
    rows: both commute with a max exactly (x -> x + b and ReLU are monotonic, rounding included).
    Against the two layers it copies KH*KW / (kh*kw*ph*pw) of the columns, pools contiguous rows
    instead of strided pixels, adds the bias and the ReLU to 1/(ph*pw) of the values, and gives
    the GEMM ph*pw times the rows; it does KH*KW / (kh*kw) times the multiply-adds
    (`fits`: at most POOLED_CONV_MAX_WORK). Top: (C, N, H, W) memory, like the Convolution's.
    """

    def __init__(self, conv: Convolution, pool: Pooling):
        # built from two ops, not from a layer: Op.__init__ does not apply
        self.name, self.type = f"{conv.name}+{pool.name}", "Convolution+Pooling"
        self.layer_names = (conv.name, pool.name)
        self.bottoms, self.tops = conv.bottoms, pool.tops
        self.dtype, self.mode = conv.dtype, conv.mode
        self.shapes = S.LayerShapes(conv.shapes.bottoms, pool.shapes.tops, conv.shapes.params)
        self.fuse_relu = conv.fuse_relu
        self.conv = conv
        (kh, kw), (sh, sw), (ph, pw) = conv.kernel, conv.stride, pool.kernel
        self.patch = (kh + (ph - 1) * sh, kw + (pw - 1) * sw)
        self.patch_stride = (ph * sh, pw * sw)
        self.out_hw = pool.out_hw
        c, o = conv.in_c, conv.out_c
        left = np.zeros((ph, pw, o, c, *self.patch), dtype=self.dtype)
        kernel = conv.weight.reshape(o, c, kh, kw)
        for dy in range(ph):
            for dx in range(pw):
                left[dy, dx, :, :, dy * sh : dy * sh + kh, dx * sw : dx * sw + kw] = kernel
        self.weight = cache_aligned.copy(left.reshape(ph * pw * o, c * self.patch[0] * self.patch[1]))
        self.windows = ph * pw
        # the bias of every pooled pixel, (O, OH*OW): a band's is a slice, added row to row rather
        # than broadcast from an (O, 1) column (numpy streams whole rows faster: see bias_run)
        self.bias_plane = None if conv.bias is None else np.repeat(conv.bias, math.prod(self.out_hw), axis=1)

    @staticmethod
    def fits(conv: Convolution, pool: Pooling) -> bool:
        """True if `pool` (reading conv's top) can be computed with conv as one PooledConvolution."""
        tiles = all(o * s == c for o, s, c in zip(pool.out_hw, pool.stride, conv.out_hw))
        (kh, kw), (sh, sw), (ph, pw) = conv.kernel, conv.stride, pool.kernel
        work = (kh + (ph - 1) * sh) * (kw + (pw - 1) * sw) / (kh * kw)
        return (conv.mode == "dl" and not conv.pixel_major and conv.group == 1 and conv.dilation == (1, 1)
                and pool.method == L.POOL_MAX and pool.kernel == pool.stride and pool.pad == (0, 0) and tiles
                and work <= POOLED_CONV_MAX_WORK)

    def scratch_sizes(self, in_shapes):
        """Per image (one band at most, but a band may be the whole image): its columns, the
        GEMM's output for them, and its padded copy if the convolution pads."""
        pixels = self.out_hw[0] * self.out_hw[1]
        padded = self.conv.in_c * math.prod(self.conv.padded_hw()) if any(self.conv.pad) else 0
        return [self.weight.shape[1] * pixels, self.weight.shape[0] * pixels, padded]

    def run(self, ins, outs, scratch, threads: int = 1):
        x, out = ins[0], outs[0]
        n, (oh, ow), o, k = x.shape[0], self.out_hw, self.conv.out_c, self.weight.shape[1]
        res = out.transpose(1, 0, 2, 3).reshape(o, n, oh * ow)  # a view: image i's (O, OH*OW)
        pad = self.conv.pad
        copy_shape = (self.conv.in_c, *self.conv.padded_hw())
        copy = scratch[2][: math.prod(copy_shape)].reshape(copy_shape) if any(pad) else None
        rows = self.rows_per_band(threads)
        for i in range(n):
            src = L.pad_into(x[i], pad, pad, 0.0, out=copy) if any(pad) else x[i]
            win = L.windows(src, self.patch, self.patch_stride, (1, 1), self.out_hw)  # (C, KH, KW, OH, OW)
            for r0 in range(0, oh, rows):
                r1 = min(oh, r0 + rows)
                m = (r1 - r0) * ow
                cols = scratch[0][: k * m].reshape(k, m)
                np.copyto(cols.reshape(*win.shape[:3], r1 - r0, ow), win[..., r0:r1, :])
                grid = scratch[1][: self.weight.shape[0] * m].reshape(self.windows, o, m)
                np.matmul(self.weight, cols, out=grid.reshape(self.windows * o, m))
                # pooled, biased and rectified in the GEMM's own contiguous output, the top written
                # once at the end: max, bias and ReLU straight into the top's strided rows took
                # 0.15 ms per image of the face CNN's conv1 + pool1 against 0.07 (Intel Xeon, one
                # core, batch 8, the steps timed inside the op)
                pooled = grid[0]
                for w in range(1, self.windows):
                    np.maximum(pooled, grid[w], out=pooled)
                if self.bias_plane is not None:
                    np.add(pooled, self.bias_plane[:, :m], out=pooled)
                top = res[:, i, r0 * ow : r1 * ow]
                if self.fuse_relu:
                    L.relu(pooled, out=top)
                else:
                    np.copyto(top, pooled)
        return [out]

    def rows_per_band(self, threads: int = 1) -> int:
        """Pooled output rows per band (see `rows_per_band`)."""
        return rows_per_band(self.out_hw, self.weight.shape[1], self.dtype, threads)


# --------------------------------------------------------------------------------------------
# Element-wise activations and identity
# --------------------------------------------------------------------------------------------


class ReLU(Op):
    in_place_safe = True
    keeps_layout = True

    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        self.negative_slope = float(layer.param.relu_param.negative_slope)

    def run(self, ins, outs, scratch, threads: int = 1):
        return [L.relu(ins[0], self.negative_slope, out=outs[0])]


class Sigmoid(Op):
    in_place_safe = True
    keeps_layout = True

    def run(self, ins, outs, scratch, threads: int = 1):
        return [L.sigmoid(ins[0], out=outs[0])]


class TanH(Op):
    in_place_safe = True
    keeps_layout = True

    def run(self, ins, outs, scratch, threads: int = 1):
        return [L.tanh(ins[0], out=outs[0])]


class Dropout(Op):
    """Identity at inference (Caffe scales at training time, so TEST is a plain copy)."""

    in_place_safe = True
    keeps_layout = True

    def run(self, ins, outs, scratch, threads: int = 1):
        x, out = ins[0], outs[0]
        if out is x:
            return [x]
        np.copyto(out, x)
        return [out]


# --------------------------------------------------------------------------------------------
# Dense
# --------------------------------------------------------------------------------------------


class InnerProduct(Op):
    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        p = layer.param.inner_product_param
        self.axis = S.canonical_axis(layer, p.axis, len(shapes.bottoms[0]))
        self.weight = self.blob(0)  # (N, K), or (K, N) with Caffe's transpose
        self.transpose = bool(p.transpose)  # True: self.weight is (K, N)
        # "dl": the weights also as (N, K) rows, for a single row of x (see run)
        self.weight_rows: np.ndarray | None = None
        if mode == "dl":
            # OpenBLAS's sgemm with a few rows runs faster on a contiguous (K, N) right operand
            # than on Caffe's (N, K) read transposed: on the AMD EPYC dev machine, one thread, the
            # face CNN's fc1 for 4 images took 0.16 against 0.52 ms (`scripts/engine_timing.py
            # --elementwise`); the whole pass, alternating in one process, took 0.86x the time at
            # batch 2 and 0.94x at 8, on one core or two. One row is a matrix-vector product, and
            # there the (N, K) rows win once the weights have left the cache, as they have in a
            # forward pass: fc1 of one image took 0.12 against 0.18 ms on one thread and 0.06
            # against 0.07 on two with 32 MB rewritten between calls (`scripts/engine_timing.py
            # --elementwise`; 0.04-0.05 either way in cache), and the whole batch-1 pass 0.97-1.00x
            # the time on one core and 0.96-0.98x on two (Zen 4 EPYC, a trial script alternating
            # two Nets in one process, four runs of 20-30 rounds). The rows cost the face CNN's
            # Net 2.9 MB of RSS: fc1's, permuted by `engine.schedule.reading_nhwc` (the others
            # are the caffemodel's own arrays).
            rows_first = not self.transpose
            self.weight_rows = self.weight if rows_first else cache_aligned.copy(self.weight.T)
            self.weight = cache_aligned.copy(self.weight.T) if rows_first else self.weight
            self.transpose = True
        self.bias = self.blob(1) if p.bias_term else None
        # True only on the copy `engine.schedule.with_relu` makes ("dl": an in-place ReLU follows)
        self.fuse_relu = False
        # True only on the copy `engine.schedule.reading_nhwc` makes ("dl": the 4-D bottom is in
        # (N, H, W, C) memory and the weights are permuted to match)
        self.bottom_nhwc = False

    def scratch_sizes(self, in_shapes):
        # "dl": a bottom in (C, N, H, W) memory is gathered into NCHW order for the (M, K) GEMM;
        # one read as it lies (bottom_nhwc) needs no room
        return [math.prod(in_shapes[0]) if self.mode == "dl" and not self.bottom_nhwc else 0]

    def run(self, ins, outs, scratch, threads: int = 1):
        x = ins[0].transpose(0, 2, 3, 1) if self.bottom_nhwc else ins[0]  # flattened in the weights' order
        if not x.flags.c_contiguous and scratch and scratch[0].size:
            gathered = scratch[0][: x.size].reshape(x.shape)
            np.copyto(gathered, x)
            x = gathered
        out = outs[0]
        if self.weight_rows is not None and math.prod(x.shape[: self.axis]) == 1:
            res = L.inner_product(x, self.weight_rows, self.bias, self.axis, False, out=out)
        else:
            res = L.inner_product(x, self.weight, self.bias, self.axis, self.transpose, out=out)
        if self.fuse_relu:
            L.relu(res, out=res)
        return [res]


class Softmax(Op):
    in_place_safe = True

    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        self.axis = S.canonical_axis(layer, layer.param.softmax_param.axis, len(shapes.bottoms[0]))

    def run(self, ins, outs, scratch, threads: int = 1):
        return [L.softmax(ins[0], self.axis, out=outs[0])]


# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------


class LRN(Op):
    in_place_safe = True
    keeps_layout = True

    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        p = layer.param.lrn_param
        self.size, self.alpha, self.beta, self.k = int(p.local_size), float(p.alpha), float(p.beta), float(p.k)
        self.region = p.norm_region

    def run(self, ins, outs, scratch, threads: int = 1):
        if self.region == L.LRN_ACROSS_CHANNELS:
            return [L.lrn_across_channels(ins[0], self.size, self.alpha, self.beta, self.k, out=outs[0])]
        return [L.lrn_within_channel(ins[0], self.size, self.alpha, self.beta, out=outs[0])]


class BatchNorm(Op):
    in_place_safe = True
    keeps_layout = True

    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        p = layer.param.batch_norm_param
        # Caffe: use_global_stats defaults to true in the TEST phase, which is inference.
        self.use_global_stats = p.use_global_stats if p.HasField("use_global_stats") else True
        self.eps = float(p.eps)
        self.mean, self.var = self.blob(0), self.blob(1)
        self.scale_factor = float(self.blob(2).reshape(-1)[0])

    def run(self, ins, outs, scratch, threads: int = 1):
        return [L.batch_norm(ins[0], self.mean, self.var, self.scale_factor, self.eps, self.use_global_stats, out=outs[0])]


class Scale(Op):
    in_place_safe = True
    keeps_layout = True

    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        p = layer.param.scale_param
        bottom = shapes.bottoms[0]
        if len(self.bottoms) == 2:
            factor_shape = shapes.bottoms[1]
            self.axis = 0 if not factor_shape else S.canonical_axis(layer, p.axis, len(bottom))
            self.factor = None
            self.bias = self.blob(0) if p.bias_term else None
        else:
            self.axis = S.canonical_axis(layer, p.axis, len(bottom)) if bottom else 0
            self.factor = self.blob(0)
            self.bias = self.blob(1) if p.bias_term else None

    def run(self, ins, outs, scratch, threads: int = 1):
        factor = ins[1] if self.factor is None else self.factor
        return [L.scale(ins[0], factor, self.axis, self.bias, out=outs[0])]


# --------------------------------------------------------------------------------------------
# Shape and combination
# --------------------------------------------------------------------------------------------


class Flatten(Op):
    def run(self, ins, outs, scratch, threads: int = 1):
        shape = self.shapes.tops[0]
        x = ins[0]
        shape = (x.shape[0], *shape[1:])
        np.copyto(outs[0], x.reshape(shape))  # Caffe shares the data: the engine gives the top its own
        return [outs[0]]


class Concat(Op):
    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        self.axis = S.concat_axis(layer, len(shapes.bottoms[0]))

    def run(self, ins, outs, scratch, threads: int = 1):
        return [np.concatenate(ins, axis=self.axis, out=outs[0])]


class Eltwise(Op):
    def __init__(self, layer, dtype, mode, shapes):
        super().__init__(layer, dtype, mode, shapes)
        p = layer.param.eltwise_param
        self.op = p.operation
        self.coeffs = [float(c) for c in p.coeff]

    def run(self, ins, outs, scratch, threads: int = 1):
        return [L.eltwise(ins, self.op, self.coeffs, out=outs[0])]


def _operator(layer_type: str) -> type[Op]:
    """The Op subclass of this module named `layer_type`; ImportError if there is none."""
    found = globals().get(layer_type)
    if not (isinstance(found, type) and issubclass(found, Op)):
        raise ImportError(f"tracker.model.ops has no operator for layer type {layer_type!r}, which shapes.LAYER_TYPES lists; "
                          f"add an Op subclass named {layer_type}")
    return found


# Layer type -> its operator, for every type of the one table (`shapes.LAYER_TYPES`).
OPS: dict[str, type[Op]] = {layer_type: _operator(layer_type) for layer_type in S.LAYER_TYPES}
