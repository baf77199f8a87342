"""The Caffe engine, layer by layer, against three independent answers:

1. a float64 reference written here from Caffe's layer definitions with plain loops and einsum
   (no engine code: no im2col, no strided windows, no shared helpers);
2. OpenCV 4.x's Caffe importer (`cv2.dnn.readNetFromCaffe`) reading the same prototxt and a
   caffemodel written by the project's caffe-io writer;
3. the shared test data: OpenCV's layer-test prototxts with their reference outputs, and a LeNet
   trained with BVLC Caffe with reference probabilities and per-layer blobs.

Every case runs in both engine modes ("caffe" and "dl"), float32 and float64, and the shapes are
chosen so that sloppy code fails: non-square inputs, windows that do not tile the input (Caffe's
ceil rounding, AVE windows clipped by the padded border), batch 1 and batches larger than one
"dl" workspace chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

from tracker.errors import InputError, ModelError
from tracker.machine import cores
from tracker.model import layers as L
from tracker.model import ops as O
from tracker.model.caffe_io import load_net, write_caffemodel
from tracker.model.engine import Net
from tracker.model.netdef import LayerDef, NetDef
from tracker.model.shapes import infer_layer_shapes

MODES = ("caffe", "dl")


# ------------------------------------------------------------------------------------------
# Building small nets as real files
# ------------------------------------------------------------------------------------------


def build_net(tmp_path: Path, name: str, body: str, input_shape: tuple[int, ...], seed: int = 0):
    """Write `<name>.prototxt` (input "data" of `input_shape` + `body`) and a caffemodel with
    random weights written by the caffe-io writer; return (prototxt, caffemodel, NetDef loaded
    back from both files)."""
    dims = " ".join(f"dim: {d}" for d in input_shape)
    proto = tmp_path / f"{name}.prototxt"
    proto.write_text(f'name: "{name}"\ninput: "data"\ninput_shape {{ {dims} }}\n{body}\n')
    structure = load_net(proto, None)
    rng = np.random.default_rng(seed)
    layers = []
    for layer, ls in zip(structure.layers, infer_layer_shapes(structure)):
        if layer.type == "BatchNorm":
            c = ls.params[0][0]
            factor = 2.5
            blobs = (rng.normal(0, 1, c) * factor, rng.uniform(0.2, 2.0, c) * factor, np.array([factor]))
        else:
            blobs = tuple(rng.normal(0, 0.5, shape) for shape in ls.params)
        blobs = tuple(np.asarray(b, np.float32) for b in blobs)
        layers.append(LayerDef(layer.name, layer.type, layer.bottoms, layer.tops, layer.param, blobs))
    model = tmp_path / f"{name}.caffemodel"
    write_caffemodel(model, NetDef(structure.name, structure.inputs, layers))
    return proto, model, load_net(proto, model)


def weights(netdef: NetDef, layer: str) -> list[np.ndarray]:
    """A layer's parameter blobs as float64 (what the reference computes with)."""
    (ld,) = [ld for ld in netdef.layers if ld.name == layer]
    return [np.asarray(b, np.float64) for b in ld.blobs]


def opencv_forward(proto: Path, model: Path, x: np.ndarray, layer: str) -> np.ndarray:
    net = cv2.dnn.readNetFromCaffe(str(proto), str(model))
    net.enableWinograd(False)  # plain convolution arithmetic, no Winograd rounding
    net.setInput(x.astype(np.float32), "data")
    return net.forward(layer)


# ------------------------------------------------------------------------------------------
# Float64 reference layers, written from Caffe's definitions
# ------------------------------------------------------------------------------------------


def ref_conv(x, w, b, stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    xp[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + wd] = x
    oh = (h + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    og = o // group
    out = np.zeros((n, o, oh, ow))
    for g in range(group):
        for y in range(oh):
            for xx in range(ow):
                ys = [y * stride[0] + i * dilation[0] for i in range(kh)]
                xs = [xx * stride[1] + j * dilation[1] for j in range(kw)]
                patch = xp[:, g * cg : (g + 1) * cg][:, :, ys][:, :, :, xs]  # (n, cg, kh, kw)
                out[:, g * og : (g + 1) * og, y, xx] = np.einsum("nckl,ockl->no", patch, w[g * og : (g + 1) * og])
    if b is not None:
        out += b.reshape(1, o, 1, 1)
    return out


def ref_pool(x, method, kernel, stride, pad=(0, 0), ceil=True):
    """Caffe's PoolingLayer::Forward_cpu, cell by cell."""
    n, c, h, w = x.shape
    sizes = []
    for size, k, s, p in zip((h, w), kernel, stride, pad):
        o = (math.ceil if ceil else math.floor)((size + 2 * p - k) / s) + 1
        if (pad[0] or pad[1]) and (o - 1) * s >= size + p:
            o -= 1
        sizes.append(o)
    out = np.zeros((n, c, *sizes))
    for py in range(sizes[0]):
        for px in range(sizes[1]):
            hs, ws = py * stride[0] - pad[0], px * stride[1] - pad[1]
            he, we = min(hs + kernel[0], h + pad[0]), min(ws + kernel[1], w + pad[1])
            area = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            window = x[:, :, hs:he, ws:we]
            if method == "MAX":
                out[:, :, py, px] = window.max(axis=(2, 3))
            else:
                out[:, :, py, px] = window.sum(axis=(2, 3)) / area
    return out


def ref_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_lrn_across(x, size, alpha, beta, k):
    n, c = x.shape[:2]
    out = np.empty_like(x)
    half = (size - 1) // 2
    for ch in range(c):
        lo, hi = max(0, ch - half), min(c, ch + half + 1)
        s = (x[:, lo:hi] ** 2).sum(axis=1)
        out[:, ch] = x[:, ch] / (k + alpha / size * s) ** beta
    return out


def ref_lrn_within(x, size, alpha, beta):
    """Caffe: x * (1 + alpha/size^2 * sum of x^2 over the size x size window) ** -beta."""
    h, w = x.shape[2:]
    half = (size - 1) // 2
    out = np.empty_like(x)
    for y in range(h):
        for xx in range(w):
            win = x[:, :, max(0, y - half) : y + half + 1, max(0, xx - half) : xx + half + 1]
            s = (win**2).sum(axis=(2, 3))
            out[:, :, y, xx] = x[:, :, y, xx] * (1 + alpha / size**2 * s) ** -beta
    return out


def ref_ip(x, w, b, axis=1, transpose=False):
    lead = x.shape[:axis]
    x2 = x.reshape(int(np.prod(lead)), -1)
    wt = w if transpose else w.T
    out = np.einsum("mk,kn->mn", x2, wt)
    if b is not None:
        out = out + b
    return out.reshape(*lead, -1)


def ref_batchnorm(x, mean, var, factor, eps):
    f = 0.0 if factor[0] == 0 else 1.0 / factor[0]
    out = np.empty_like(x)
    for ch in range(x.shape[1]):
        out[:, ch] = (x[:, ch] - mean[ch] * f) / np.sqrt(var[ch] * f + eps)
    return out


def f32(v: float) -> float:
    """A prototxt float as Caffe holds it (the proto fields are float32)."""
    return float(np.float32(v))


def relu(x, slope=0.0):
    return np.where(x > 0, x, x * slope)


# ------------------------------------------------------------------------------------------
# The cases: prototxt body, input shape, reference, and whether OpenCV implements it as Caffe
# ------------------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    body: str
    shape: tuple[int, ...]
    ref: Callable[[np.ndarray, NetDef], np.ndarray]
    out: str = "out"
    opencv: bool = True  # False where OpenCV's importer knowingly departs from Caffe (see note)
    note: str = ""


def conv_case(id, param, shape, **kw):
    body = f'layer {{ name: "out" type: "Convolution" bottom: "data" top: "out" convolution_param {{ {param} }} }}'
    def ref(x, nd):
        ws = weights(nd, "out")
        return ref_conv(x, ws[0], ws[1] if len(ws) > 1 else None, **kw)
    return Case(id, body, shape, ref)


def pool_case(id, param, shape, method, kernel, stride, pad=(0, 0)):
    body = f'layer {{ name: "out" type: "Pooling" bottom: "data" top: "out" pooling_param {{ pool: {method} {param} }} }}'
    return Case(id, body, shape, lambda x, nd: ref_pool(x, method, kernel, stride, pad))


def floor_pool_case(id, method, shape):
    """3 x 3 windows 2 apart, with Caffe's FLOOR rounding (no partial window)."""
    body = single("Pooling", f"pooling_param {{ pool: {method} kernel_size: 3 stride: 2 round_mode: FLOOR }}")
    return Case(id, body, shape, lambda x, nd: ref_pool(x, method, (3, 3), (2, 2), ceil=False),
                opencv=False, note="OpenCV 4.x's importer fails on BVLC's round_mode field")


def conv_pool_case(id, conv_param, pool_param, window, shape, relu_between, **conv_kw):
    """A Convolution "c" (then an in-place ReLU if relu_between) pooled by MAX `window` windows,
    as many apart, into "out"."""
    relu_layer = 'layer { name: "r" type: "ReLU" bottom: "c" top: "c" }\n' if relu_between else ""
    body = (f'layer {{ name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param {{ {conv_param} }} }}\n'
            f'{relu_layer}layer {{ name: "out" type: "Pooling" bottom: "c" top: "out" pooling_param {{ pool: MAX {pool_param} }} }}')

    def ref(x, nd):
        conv = ref_conv(x, *weights(nd, "c"), **conv_kw)
        return ref_pool(relu(conv) if relu_between else conv, "MAX", window, window)
    return Case(id, body, shape, ref)


def single(type_, param=""):
    return f'layer {{ name: "out" type: "{type_}" bottom: "data" top: "out" {param} }}'


POOL_BLOCKS_SHAPE = (7, 16, 60, 70)
KERNEL_ROWS_SHAPE = (2, 16, 48, 95)

CASES = [
    conv_case("conv-3x3-pad", "num_output: 5 kernel_size: 3 pad: 1", (2, 3, 9, 7), pad=(1, 1)),
    conv_case(
        "conv-kernel-hw-stride-pad-nobias",
        "num_output: 4 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 2 bias_term: false",
        (2, 3, 11, 13),
        stride=(2, 3),
        pad=(1, 2),
    ),
    conv_case(
        "conv-group-dilation",
        "num_output: 6 kernel_size: 3 group: 3 dilation: 2 pad: 2 stride: 2",
        (1, 6, 10, 9),
        stride=(2, 2),
        pad=(2, 2),
        dilation=(2, 2),
        group=3,
    ),
    conv_case("conv-1x1", "num_output: 3 kernel_size: 1", (3, 4, 5, 6)),
    conv_case(
        "conv-repeated-per-axis",
        "num_output: 2 kernel_size: 3 kernel_size: 2 stride: 1 stride: 2 pad: 0 pad: 1 dilation: 1 dilation: 2",
        (2, 2, 8, 9),
        stride=(1, 2),
        pad=(0, 1),
        dilation=(1, 2),
    ),
    # At least 16 floats per patch run (C * kw): "dl" runs these pixel-major (NHWC, one GEMM
    # row per patch); the cases above run channel-major. On one BLAS thread (several images),
    # one GEMM per output row over a row-unfolded copy, unless dilated along H; on several (one
    # image), at stride 1 along H and not dilated along it, one GEMM per group of kernel rows;
    # otherwise in bands of output rows over an im2col.
    conv_case(
        "conv-pixel-major-rows-stride-pad-wdilation",
        "num_output: 4 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 2 dilation: 1 dilation: 2",
        (3, 8, 11, 13),
        stride=(2, 3),
        pad=(1, 2),
        dilation=(1, 2),
    ),
    # strides over the kernel: the row-unfolded copy is larger than the columns
    conv_case("conv-pixel-major-rows-stride-over-kernel", "num_output: 3 kernel_size: 2 stride: 3", (2, 16, 10, 11), stride=(3, 3)),
    # large enough that one image's 3 kernel rows take 2 GEMMs in float32 (1 row, then 2) and 3
    # in float64 (see test_kernel_row_groups)
    conv_case(
        "conv-pixel-major-kernel-rows-pad-wstride-wdilation",
        "num_output: 5 kernel_size: 3 pad: 1 stride: 1 stride: 2 dilation: 1 dilation: 2",
        KERNEL_ROWS_SHAPE,
        pad=(1, 1),
        stride=(1, 2),
        dilation=(1, 2),
    ),
    conv_case(
        "conv-pixel-major-stride-pad-dilation",
        "num_output: 5 kernel_size: 3 stride: 2 pad: 2 dilation: 2",
        (2, 8, 11, 9),
        stride=(2, 2),
        pad=(2, 2),
        dilation=(2, 2),
    ),
    conv_case("conv-pixel-major-1x1", "num_output: 7 kernel_size: 1", (3, 16, 5, 6)),
    Case(
        # channel-major 1x1: a chunk's images in one GEMM, its ReLU fused
        "conv-1x1-relu",
        'layer { name: "out" type: "Convolution" bottom: "data" top: "out" convolution_param { num_output: 3 kernel_size: 1 } }\n'
        'layer { name: "r" type: "ReLU" bottom: "out" top: "out" }',
        (3, 4, 5, 6),
        lambda x, nd: relu(ref_conv(x, *weights(nd, "out"))),
        out="r",
    ),
    Case(
        # pixel-major -> ReLU -> MAX pooling in (N, H, W, C) memory -> a pixel-major convolution
        # reading that memory without a copy -> AVE pooling -> InnerProduct of NHWC memory
        "pixel-major-chain",
        'layer { name: "a" type: "Convolution" bottom: "data" top: "a" convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }\n'
        'layer { name: "ra" type: "ReLU" bottom: "a" top: "a" }\n'
        'layer { name: "pa" type: "Pooling" bottom: "a" top: "pa" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
        'layer { name: "b" type: "Convolution" bottom: "pa" top: "b" convolution_param { num_output: 6 kernel_size: 2 } }\n'
        'layer { name: "pb" type: "Pooling" bottom: "b" top: "pb" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }\n'
        'layer { name: "out" type: "InnerProduct" bottom: "pb" top: "out" inner_product_param { num_output: 5 } }',
        (3, 8, 13, 10),
        lambda x, nd: ref_ip(
            ref_pool(ref_conv(ref_pool(relu(ref_conv(x, *weights(nd, "a"), pad=(1, 1))), "MAX", (2, 2), (2, 2)), *weights(nd, "b")),
                     "AVE", (3, 3), (2, 2), (1, 1)),
            *weights(nd, "out"),
        ),
    ),
    Case(
        # a pixel-major convolution read by a transposed InnerProduct ((K, N) weights, permuted to
        # the convolution's (H, W, C) memory order)
        "pixel-major-ip-transposed",
        'layer { name: "a" type: "Convolution" bottom: "data" top: "a" convolution_param { num_output: 5 kernel_size: 2 } }\n'
        'layer { name: "out" type: "InnerProduct" bottom: "a" top: "out" inner_product_param { num_output: 4 transpose: true } }',
        (2, 8, 5, 6),
        lambda x, nd: ref_ip(ref_conv(x, *weights(nd, "a")), *weights(nd, "out"), transpose=True),
        opencv=False,
        note="OpenCV's importer ignores transpose (see innerproduct-transpose)",
    ),
    pool_case("pool-max-ceil", "kernel_size: 3 stride: 2", (2, 3, 10, 9), "MAX", (3, 3), (2, 2)),
    pool_case("pool-ave-ceil-pad", "kernel_size: 3 stride: 2 pad: 1", (2, 3, 10, 7), "AVE", (3, 3), (2, 2), (1, 1)),
    pool_case("pool-max-ceil-pad", "kernel_size: 3 stride: 2 pad: 1", (2, 3, 10, 7), "MAX", (3, 3), (2, 2), (1, 1)),
    pool_case(
        "pool-ave-hw",
        "kernel_h: 2 kernel_w: 3 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0",
        (1, 2, 7, 8),
        "AVE",
        (2, 3),
        (2, 1),
        (1, 0),
    ),
    pool_case("pool-max-2x2-tiles", "kernel_size: 2 stride: 2", (2, 3, 8, 6), "MAX", (2, 2), (2, 2)),
    # MAX pools rows, then columns: overlapping windows along H, one-row and one-column windows
    pool_case("pool-max-hw-overlap", "kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0", (2, 3, 7, 9),
              "MAX", (3, 2), (1, 2), (1, 0)),
    pool_case("pool-max-1-row", "kernel_h: 1 kernel_w: 3 stride: 2", (2, 3, 7, 10), "MAX", (1, 3), (2, 2)),
    pool_case("pool-max-1-column", "kernel_h: 2 kernel_w: 1 stride_h: 2 stride_w: 1", (2, 3, 7, 5), "MAX", (2, 1), (2, 1)),
    # the windows never read the last row and columns: MAX's row pass covers only what they read
    floor_pool_case("pool-max-floor", "MAX", (2, 2, 10, 12)),
    # Large enough that pooling runs in blocks of images, the last one shorter (float32: 3, 3, 1;
    # float64: one image each): test_pooling_blocks_split_these_cases.
    pool_case("pool-max-ceil-pad-blocks", "kernel_size: 3 stride: 2 pad: 1", POOL_BLOCKS_SHAPE, "MAX", (3, 3), (2, 2), (1, 1)),
    pool_case("pool-ave-ceil-pad-blocks", "kernel_size: 3 stride: 2 pad: 1", POOL_BLOCKS_SHAPE, "AVE", (3, 3), (2, 2), (1, 1)),
    floor_pool_case("pool-ave-floor", "AVE", (1, 2, 10, 9)),
    pool_case("pool-global-ave", "global_pooling: true", (2, 3, 5, 7), "AVE", (5, 7), (1, 1)),
    pool_case("pool-global-max", "global_pooling: true", (2, 3, 5, 7), "MAX", (5, 7), (1, 1)),
    Case("relu", single("ReLU"), (2, 3, 4, 5), lambda x, nd: relu(x)),
    Case("relu-leaky", single("ReLU", "relu_param { negative_slope: 0.1 }"), (2, 3, 4, 5), lambda x, nd: relu(x, f32(0.1))),
    Case("sigmoid", single("Sigmoid"), (2, 3, 4, 5), lambda x, nd: 1 / (1 + np.exp(-x))),
    Case("tanh", single("TanH"), (2, 3, 4, 5), lambda x, nd: np.tanh(x)),
    Case("dropout", single("Dropout", "dropout_param { dropout_ratio: 0.3 }"), (2, 3, 4, 5), lambda x, nd: x),
    Case(
        "innerproduct",
        single("InnerProduct", "inner_product_param { num_output: 7 }"),
        (3, 2, 3, 4),
        lambda x, nd: ref_ip(x, *weights(nd, "out")),
    ),
    Case(
        "innerproduct-axis2-nobias",
        single("InnerProduct", "inner_product_param { num_output: 4 axis: 2 bias_term: false }"),
        (2, 3, 4, 5),
        lambda x, nd: ref_ip(x, weights(nd, "out")[0], None, axis=2),
    ),
    Case(
        "innerproduct-transpose",
        single("InnerProduct", "inner_product_param { num_output: 6 transpose: true }"),
        (2, 3, 2, 2),
        lambda x, nd: ref_ip(x, *weights(nd, "out"), transpose=True),
        opencv=False,
        note="OpenCV's importer ignores transpose and reads the (K, N) weights as (N, K)",
    ),
    Case("softmax", single("Softmax"), (2, 5, 3, 4), lambda x, nd: ref_softmax(x, 1)),
    Case("softmax-axis-last", single("Softmax", "softmax_param { axis: -1 }"), (2, 3, 4, 6), lambda x, nd: ref_softmax(x, 3)),
    Case(
        "lrn-across",
        single("LRN", "lrn_param { local_size: 5 alpha: 1.1 beta: 0.75 k: 2 }"),
        (2, 7, 4, 5),
        lambda x, nd: ref_lrn_across(x, 5, f32(1.1), 0.75, 2.0),
        opencv=False,
        note="OpenCV's importer ignores lrn_param.k (it reads a 'bias' parameter, default 1)",
    ),
    Case(
        "lrn-across-3",
        single("LRN", "lrn_param { local_size: 3 alpha: 0.5 beta: 0.6 }"),
        (1, 4, 3, 5),
        lambda x, nd: ref_lrn_across(x, 3, 0.5, f32(0.6), 1.0),
    ),
    Case(
        "lrn-within",
        single("LRN", "lrn_param { norm_region: WITHIN_CHANNEL local_size: 3 alpha: 0.9 beta: 0.6 }"),
        (2, 3, 6, 7),
        lambda x, nd: ref_lrn_within(x, 3, f32(0.9), f32(0.6)),
    ),
    Case(
        "lrn-within-k-ignored",
        single("LRN", "lrn_param { norm_region: WITHIN_CHANNEL local_size: 5 alpha: 2.0 beta: 0.75 k: 3 }"),
        (1, 2, 6, 8),
        lambda x, nd: ref_lrn_within(x, 5, 2.0, 0.75),  # Caffe's Power layer uses shift 1, not k
    ),
    Case(
        "lrn-within-window-past-the-image",
        single("LRN", "lrn_param { norm_region: WITHIN_CHANNEL local_size: 15 alpha: 0.9 beta: 0.6 }"),
        (1, 2, 6, 8),
        lambda x, nd: ref_lrn_within(x, 15, f32(0.9), f32(0.6)),
    ),
    Case(
        "flatten",
        single("Flatten"),
        (2, 3, 4, 5),
        lambda x, nd: x.reshape(x.shape[0], -1),
    ),
    Case(
        "flatten-axis-range",
        single("Flatten", "flatten_param { axis: 1 end_axis: 2 }"),
        (2, 3, 4, 5),
        lambda x, nd: x.reshape(x.shape[0], 12, 5),
    ),
    Case(
        "concat-channels",
        'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
        'layer { name: "t" type: "TanH" bottom: "data" top: "t" }\n'
        'layer { name: "out" type: "Concat" bottom: "data" bottom: "r" bottom: "t" top: "out" }',
        (2, 3, 4, 5),
        lambda x, nd: np.concatenate([x, relu(x), np.tanh(x)], axis=1),
    ),
    Case(
        "concat-axis2",
        'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
        'layer { name: "out" type: "Concat" bottom: "data" bottom: "r" top: "out" concat_param { axis: 2 } }',
        (2, 3, 4, 5),
        lambda x, nd: np.concatenate([x, relu(x)], axis=2),
    ),
    Case(
        "eltwise-sum-coeff",
        'layer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
        'layer { name: "out" type: "Eltwise" bottom: "data" bottom: "r" top: "out" eltwise_param { operation: SUM coeff: 2 coeff: -0.5 } }',
        (2, 3, 4, 5),
        lambda x, nd: 2 * x - 0.5 * relu(x),
    ),
    Case(
        "eltwise-prod",
        'layer { name: "s" type: "Sigmoid" bottom: "data" top: "s" }\n'
        'layer { name: "t" type: "TanH" bottom: "data" top: "t" }\n'
        'layer { name: "out" type: "Eltwise" bottom: "data" bottom: "s" bottom: "t" top: "out" eltwise_param { operation: PROD } }',
        (2, 3, 4, 5),
        lambda x, nd: x * (1 / (1 + np.exp(-x))) * np.tanh(x),
    ),
    Case(
        "eltwise-max",
        'layer { name: "s" type: "Sigmoid" bottom: "data" top: "s" }\n'
        'layer { name: "t" type: "TanH" bottom: "data" top: "t" }\n'
        'layer { name: "out" type: "Eltwise" bottom: "data" bottom: "s" bottom: "t" top: "out" eltwise_param { operation: MAX } }',
        (2, 3, 4, 5),
        lambda x, nd: np.maximum(np.maximum(x, 1 / (1 + np.exp(-x))), np.tanh(x)),
    ),
    Case(
        "batchnorm",
        single("BatchNorm", "batch_norm_param { eps: 0.001 }"),
        (2, 4, 3, 5),
        lambda x, nd: ref_batchnorm(x, *weights(nd, "out"), f32(1e-3)),
    ),
    Case(
        "batchnorm-batch-stats",
        single("BatchNorm", "batch_norm_param { use_global_stats: false }"),
        (1, 4, 3, 5),
        lambda x, nd: (x - x.mean(axis=(0, 2, 3), keepdims=True)) / np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + f32(1e-5)),
    ),
    Case(
        "batchnorm-batch-stats-n3",
        single("BatchNorm", "batch_norm_param { use_global_stats: false }"),
        (3, 4, 3, 5),
        lambda x, nd: (x - x.mean(axis=(0, 2, 3), keepdims=True)) / np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + f32(1e-5)),
        opencv=False,
        note="OpenCV computes batch statistics only for a batch of 1",
    ),
    Case(
        "scale-bias",
        single("Scale", "scale_param { bias_term: true }"),
        (2, 4, 3, 5),
        lambda x, nd: x * weights(nd, "out")[0].reshape(1, 4, 1, 1) + weights(nd, "out")[1].reshape(1, 4, 1, 1),
    ),
    Case(
        "scale-two-axes",
        single("Scale", "scale_param { axis: 1 num_axes: 2 }"),
        (2, 4, 3, 5),
        lambda x, nd: x * weights(nd, "out")[0].reshape(1, 4, 3, 1),
    ),
    Case(
        "scale-second-bottom",
        'layer { name: "s" type: "Sigmoid" bottom: "data" top: "s" }\n'
        'layer { name: "out" type: "Scale" bottom: "data" bottom: "s" top: "out" scale_param { axis: 0 } }',
        (2, 3, 4, 5),
        lambda x, nd: x / (1 + np.exp(-x)),
    ),
    Case(
        # Convolution tops kept in (C, N, H, W) memory ("dl") feeding every other kind of layer.
        "conv-outputs-into-everything",
        'layer { name: "a" type: "Convolution" bottom: "data" top: "a" convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }\n'
        'layer { name: "ra" type: "ReLU" bottom: "a" top: "a" }\n'
        'layer { name: "b" type: "Convolution" bottom: "data" top: "b" convolution_param { num_output: 4 kernel_size: 3 pad: 1 group: 2 } }\n'
        'layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }\n'
        'layer { name: "lrn" type: "LRN" bottom: "cat" top: "cat" lrn_param { local_size: 3 alpha: 0.3 } }\n'
        'layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "sum" eltwise_param { coeff: 0.5 coeff: 2 } }\n'
        'layer { name: "pool" type: "Pooling" bottom: "cat" top: "pool" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }\n'
        'layer { name: "psum" type: "Pooling" bottom: "sum" top: "psum" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
        'layer { name: "cat2" type: "Concat" bottom: "pool" bottom: "psum" top: "cat2" }\n'
        'layer { name: "out" type: "Softmax" bottom: "cat2" top: "out" }',
        (3, 2, 9, 7),
        lambda x, nd: ref_softmax(
            np.concatenate(
                [
                    ref_pool(
                        ref_lrn_across(np.concatenate([relu(ref_conv(x, *weights(nd, "a"), pad=(1, 1))),
                                                       ref_conv(x, *weights(nd, "b"), pad=(1, 1), group=2)], 1),
                                       3, f32(0.3), 0.75, 1.0),
                        "AVE", (3, 3), (2, 2), (1, 1),
                    ),
                    ref_pool(0.5 * relu(ref_conv(x, *weights(nd, "a"), pad=(1, 1)))
                             + 2 * ref_conv(x, *weights(nd, "b"), pad=(1, 1), group=2), "MAX", (2, 2), (2, 2)),
                ],
                1,
            ),
            1,
        ),
    ),
    # A convolution pooled as it is computed ("dl": ops.PooledConvolution): padded, ReLU fused...
    conv_pool_case("conv-relu-pool-tiled", "num_output: 5 kernel_size: 5 pad: 2", "kernel_size: 2 stride: 2", (2, 2),
                   (3, 2, 8, 10), relu_between=True, pad=(2, 2)),
    # ...no ReLU, a pooling window of 2 x 1...
    conv_pool_case("conv-pool-tiled-2x1", "num_output: 4 kernel_size: 5", "kernel_h: 2 kernel_w: 1 stride_h: 2 stride_w: 1",
                   (2, 1), (2, 1, 14, 9), relu_between=False),
    # ...a strided convolution (patches of 11 x 11 pixels, 4 apart; 121/81 the multiply-adds)...
    conv_pool_case("conv-stride2-pool-tiled", "num_output: 3 kernel_size: 9 stride: 2", "kernel_size: 2 stride: 2", (2, 2),
                   (2, 1, 27, 23), relu_between=True, stride=(2, 2)),
    # ...and one that must not be: the convolution's top is read by a second pooling too.
    Case(
        "conv-pool-top-read-twice",
        'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 3 kernel_size: 3 } }\n'
        'layer { name: "p" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
        'layer { name: "q" type: "Pooling" bottom: "c" top: "q" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }\n'
        'layer { name: "out" type: "Concat" bottom: "p" bottom: "q" top: "out" }',
        (2, 2, 8, 6),
        lambda x, nd: np.concatenate([ref_pool(ref_conv(x, *weights(nd, "c")), "MAX", (2, 2), (2, 2)),
                                      ref_pool(ref_conv(x, *weights(nd, "c")), "AVE", (2, 2), (2, 2))], 1),
    ),
    Case(
        "inplace-chain",
        'layer { name: "out" type: "Convolution" bottom: "data" top: "out" convolution_param { num_output: 3 kernel_size: 2 } }\n'
        'layer { name: "bn" type: "BatchNorm" bottom: "out" top: "out" }\n'
        'layer { name: "sc" type: "Scale" bottom: "out" top: "out" scale_param { bias_term: true } }\n'
        'layer { name: "relu" type: "ReLU" bottom: "out" top: "out" }',
        (2, 2, 5, 4),
        lambda x, nd: relu(
            ref_batchnorm(ref_conv(x, *weights(nd, "out")), *weights(nd, "bn"), f32(1e-5)) * weights(nd, "sc")[0].reshape(1, 3, 1, 1)
            + weights(nd, "sc")[1].reshape(1, 3, 1, 1)
        ),
        out="relu",  # OpenCV names outputs by layer: the last in-place layer's output is the blob
    ),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every case's files and NetDef, built once."""
    tmp = tmp_path_factory.mktemp("layers")
    return {c.id: build_net(tmp, c.id.replace("-", "_"), c.body, c.shape, seed=i) for i, c in enumerate(CASES)}


def case_input(case: Case) -> np.ndarray:
    return np.random.default_rng(len(case.id)).normal(0, 1.5, case.shape)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layer_against_float64_reference(case, built):
    proto, model, netdef = built[case.id]
    x = case_input(case)
    ref = case.ref(x, netdef)
    exact = Net(netdef, np.float64, "caffe").forward(x, ["out"])["out"]
    assert exact.shape == ref.shape
    np.testing.assert_allclose(exact, ref, rtol=1e-10, atol=1e-12)
    scale = max(1.0, float(np.abs(ref).max()))
    for mode in MODES:
        for dtype, tol in ((np.float64, 1e-10), (np.float32, 2e-6)):
            net = Net(netdef, dtype, mode, threads=2)
            got = net.forward(x.astype(dtype), ["out"])["out"]
            assert got.dtype == dtype and got.shape == ref.shape
            np.testing.assert_allclose(got, ref, rtol=0, atol=tol * scale, err_msg=f"{mode} {dtype.__name__}")
            # One image alone takes other paths in "dl" (its GEMMs split by 2 BLAS threads, larger bands).
            one = net.forward(x[:1].astype(dtype), ["out"])["out"]
            np.testing.assert_allclose(one, case.ref(x[:1], netdef), rtol=0, atol=tol * scale, err_msg=f"{mode} {dtype.__name__} one image")


def test_pooling_blocks_split_these_cases():
    """The "-blocks" cases above pool in several blocks, the last one shorter."""
    for itemsize in (4, 8):
        step = L.pool_block_len(POOL_BLOCKS_SHAPE, itemsize)
        assert step < POOL_BLOCKS_SHAPE[0]
        assert POOL_BLOCKS_SHAPE[0] % step or step == 1


PIXEL_MAJOR_CASES = ["conv-pixel-major-rows-stride-pad-wdilation", "conv-pixel-major-rows-stride-over-kernel",
                     "conv-pixel-major-kernel-rows-pad-wstride-wdilation", "conv-pixel-major-stride-pad-dilation",
                     "pixel-major-chain"]


@pytest.mark.parametrize("case_id", PIXEL_MAJOR_CASES)
def test_pixel_major_convolutions_take_the_path_their_threads_and_geometry_call_for(case_id, built, monkeypatch):
    """Which of the three pixel-major algorithms each case above exercises: by rows for several
    images (one BLAS thread per worker) unless dilated along H; for one image (two BLAS threads)
    by groups of kernel rows at stride 1 along H, not dilated along it; by bands otherwise. The
    values are checked by test_layer_against_float64_reference."""
    netdef = built[case_id][2]
    calls: dict[str, list[str]] = {"_pixel_major_by_rows": [], "_pixel_major_by_kernel_rows": []}

    def spy_on(method: str):
        unspied, names = getattr(O.Convolution, method), calls[method]

        def spy(self, src, r, scratch):
            names.append(self.name)
            return unspied(self, src, r, scratch)
        return spy

    for method in calls:
        monkeypatch.setattr(O.Convolution, method, spy_on(method))
    net = Net(netdef, np.float32, "dl", threads=2)
    pixel_major = [s.op for s in net._plan.steps if isinstance(s.op, O.Convolution) and s.op.pixel_major]
    assert pixel_major
    case = next(c for c in CASES if c.id == case_id)
    x = case_input(case).astype(np.float32)
    assert x.shape[0] > 1
    net.forward(x, ["out"])
    by_rows = sorted(op.name for op in pixel_major if op.dilation[0] == 1 for _ in range(x.shape[0]))
    assert sorted(calls["_pixel_major_by_rows"]) == by_rows and (by_rows or case_id == "conv-pixel-major-stride-pad-dilation")
    assert calls["_pixel_major_by_kernel_rows"] == []
    calls["_pixel_major_by_rows"].clear()
    net.forward(x[:1], ["out"])
    by_kernel_rows = [op.name for op in pixel_major if op.stride[0] == 1 and op.dilation[0] == 1]
    assert calls == {"_pixel_major_by_rows": [], "_pixel_major_by_kernel_rows": by_kernel_rows}
    assert by_kernel_rows or case_id in ("conv-pixel-major-rows-stride-pad-wdilation", "conv-pixel-major-rows-stride-over-kernel",
                                         "conv-pixel-major-stride-pad-dilation")


def test_kernel_row_groups(built):
    """The large kernel-rows case above runs its 3 kernel rows as a shorter group and a full one
    in float32 and one row per GEMM in float64, so the float64 reference checks both; the face
    CNN's conv2 takes its 6 rows 2 at a time (docs/ENGINE.md's figures), conv3 its 5 at once."""
    from tracker.model.spec import default_model

    def kernel_rows(netdef, dtype) -> dict[str, int]:
        net = Net(netdef, dtype, "dl")
        return {s.op.name: s.op.kernel_rows_per_gemm() for s in net._plan.steps if isinstance(s.op, O.Convolution) and s.op.pixel_major}

    netdef = built["conv-pixel-major-kernel-rows-pad-wstride-wdilation"][2]
    assert kernel_rows(netdef, np.float32) == {"out": 2} and kernel_rows(netdef, np.float64) == {"out": 1}
    spec = default_model()
    assert kernel_rows(load_net(spec.prototxt, spec.weights), np.float32) == {"conv2": 2, "conv3": 5}


OPENCV_CASES = [c for c in CASES if c.opencv]


@pytest.mark.parametrize("case", OPENCV_CASES, ids=[c.id for c in OPENCV_CASES])
def test_layer_against_opencv(case, built):
    proto, model, netdef = built[case.id]
    x = case_input(case).astype(np.float32)
    cv = opencv_forward(proto, model, x, case.out)
    for mode in MODES:
        got = Net(netdef, np.float32, mode).forward(x, ["out"])["out"]
        assert got.shape == cv.shape, mode
        scale = max(1.0, float(np.abs(cv).max()))
        err = np.abs(got - cv)
        assert err.max() <= 1e-4 * scale and err.mean() <= 1e-5 * scale, (mode, err.max(), err.mean())


DEPARTURES = [c for c in CASES if not c.opencv]


@pytest.mark.parametrize("case", DEPARTURES, ids=[c.id for c in DEPARTURES])
def test_opencv_departures_are_real(case, built):
    """Each case left out of the OpenCV comparison is left out because OpenCV's importer departs
    from Caffe there (`case.note`); the engine follows Caffe (checked against the reference)."""
    proto, model, netdef = built[case.id]
    x = case_input(case).astype(np.float32)
    ours = Net(netdef, np.float32, "caffe").forward(x, ["out"])["out"]
    try:
        cv = opencv_forward(proto, model, x, case.out)
    except cv2.error:
        return  # OpenCV cannot run it at all
    assert cv.shape != ours.shape or np.abs(cv - ours).max() > 1e-3, case.note


# ------------------------------------------------------------------------------------------
# The shared test data
# ------------------------------------------------------------------------------------------

LAYER_FILES = ["relu", "softmax", "lrn_channels", "lrn_spatial", "pooling_max", "pooling_ave"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", LAYER_FILES)
def test_opencv_layer_testdata(testdata, name, mode):
    d = testdata / "caffe" / "layers"
    netdef = load_net(d / f"layer_{name}.prototxt", None)
    x = np.load(d / "blob.npy")
    ref = np.load(d / f"layer_{name}.ref_opencv.npy")
    net = Net(netdef, np.float32, mode)
    (top,) = netdef.layers[-1].tops
    out = net.forward(x, [top])[top]
    assert out.shape == ref.shape
    err = np.abs(out - ref)
    assert err.mean() <= 1e-5 and err.max() <= 1e-4, (err.mean(), err.max())


@pytest.fixture(scope="module")
def lenet(testdata):
    d = testdata / "caffe" / "lenet"
    return d, load_net(d / "lenet.prototxt", d / "lenet_iter_10000.caffemodel")


@pytest.mark.parametrize("mode", MODES)
def test_lenet_reference_probabilities(lenet, mode):
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")
    ref = np.load(d / "ref_opencv_prob_first64.npy")
    prob = Net(netdef, np.float32, mode).forward(x, ["prob"])["prob"]
    assert np.abs(prob - ref).max() <= 1e-4
    assert (prob.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("mode", MODES)
def test_lenet_every_blob_of_image_1024(lenet, mode):
    d, netdef = lenet
    ref = np.load(d / "ref_opencv_blobs_mnist_idx1024.npz")
    names = ["conv1", "pool1", "conv2", "pool2", "ip1", "ip2", "prob"]
    got = Net(netdef, np.float32, mode).forward(ref["input"], ["data", *names])
    np.testing.assert_array_equal(got["data"], ref["input"])
    for name in names:
        # Caffe's in-place ReLU overwrites ip1; OpenCV's dump has ip1 before it and relu1 after.
        want = ref["relu1"] if name == "ip1" else ref[name]
        assert got[name].shape == want.shape, name
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got[name] - want).max() <= 1e-4 * scale, name
    assert (ref["ip1"] < 0).any()  # so the in-place check above is not vacuous
    assert got["prob"].argmax() == 4


# ------------------------------------------------------------------------------------------
# The "dl" mode's chunks, workers and workspace
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
def test_dl_chunks_match_caffe_mode(lenet, threads):
    """A workspace too small for the batch: many chunks of several images, a ragged last chunk
    per worker, and every blob still equal to Caffe's per-image algorithm."""
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")[:23]
    names = ["conv1", "pool1", "conv2", "pool2", "ip1", "prob"]
    want = Net(netdef, np.float32, "caffe", threads=threads).forward(x, names)
    cap = 1_000_000
    net = Net(netdef, np.float32, "dl", workspace_bytes=cap, threads=threads)
    got = net.forward(x, names)
    # dl's sums run in other orders than Caffe's (bands, rows), so the tolerance is float32
    # rounding at each blob's scale, as in test_layer_against_float64_reference
    tol = {name: 2e-6 * max(1.0, float(np.abs(want[name]).max())) for name in names}
    chunk = net.chunk_size(23)
    assert 1 < chunk < 23 // threads  # several images per chunk, several chunks per worker
    assert 0 < net.workspace_nbytes <= cap
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=tol[name], err_msg=name)
    one = net.forward(x[5:6], names)
    for name in names:
        np.testing.assert_allclose(one[name], want[name][5:6], rtol=0, atol=tol[name], err_msg=name)
    # Without conv1 asked for, the schedule that pools conv1 as it computes it runs, in the same cap.
    assert "conv1" in net._plan.hidden
    pooled = net.forward(x, ["pool1", "ip1", "prob"])
    assert 0 < net.workspace_nbytes <= cap
    for name in ("pool1", "ip1", "prob"):
        np.testing.assert_allclose(pooled[name], want[name], rtol=0, atol=tol[name], err_msg=f"{name}, pooled conv1")


def test_dl_workspace_arrays_start_on_cache_lines(lenet):
    """Every top, temporary and input copy of every worker's share starts on a 64-byte line
    (numpy's own allocations are 16-byte aligned only: the arena is placed, not just planned)."""
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")[:23]
    net = Net(netdef, np.float32, "dl", workspace_bytes=1_000_000, threads=2)
    net.forward(x, ["prob"])
    chunk = net.chunk_size(23)
    workspace = net._plan.workspace
    arrays = [workspace.arrays(worker, chunk, m) for worker in (0, 1) for m in (chunk, 23 % chunk)]
    views = [a for c in arrays for a in (*c.tops, *(t for step in c.scratch for t in step), c.input)
             if a is not None and a.size]
    assert len(views) > 10
    assert [a.ctypes.data % 64 for a in views] == [0] * len(views)


@pytest.mark.parametrize("mode", MODES)
def test_every_weight_copy_the_engine_makes_starts_on_a_cache_line(mode):
    """Every weight array of the face CNN's Net that is the engine's own copy in another layout
    (fused steps' permuted ones included; the caffemodel's arrays it reads where they are) starts
    on a 64-byte line, in float32 and float64: OpenBLAS's small GEMMs ran 20-30% slower on weights
    that did not (see tracker.model.cache_aligned)."""
    from tracker.model.spec import default_model

    spec = default_model()
    netdef = load_net(spec.prototxt, spec.weights)
    copies = {"conv1+pool1.weight", "conv2.weight_pm", "conv3.weight_pm", "fc1.weight", "fc1.weight_rows", "fc2.weight"}
    if mode == "caffe":
        copies = {"conv1.weight_and_bias", "conv2.weight_and_bias", "conv3.weight_and_bias"}
    for dtype in (np.float32, np.float64):
        net = Net(netdef, dtype, mode)
        weights = {f"{s.op.name}.{attr}": a for s in net._plan.steps for attr, a in vars(s.op).items()
                   if attr.startswith("weight") and isinstance(a, np.ndarray)}
        blobs = [b for layer in netdef.layers for b in layer.blobs]
        if dtype == np.float32:  # the rest are the caffemodel's arrays
            assert {n for n, a in weights.items() if not any(np.shares_memory(a, b) for b in blobs)} == copies
        assert {name: weights[name].ctypes.data % 64 for name in copies} == dict.fromkeys(copies, 0)


def test_caffe_mode_keeps_its_workspace_for_the_batch_and_frees_a_larger_batchs(lenet):
    """"caffe" runs the whole batch in one planned arena (the cap does not cut it into chunks),
    reuses a dead blob's memory within the pass and the arena across passes, and frees an arena
    over twice what a smaller batch needs."""
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")
    ref = np.load(d / "ref_opencv_prob_first64.npy")
    net = Net(netdef, np.float32, "caffe", workspace_bytes=1000)
    assert np.abs(net.forward(x, ["prob"])["prob"] - ref).max() <= 1e-4
    arena = net.workspace_nbytes
    shapes = net.blob_shapes(64)
    every_top = 4 * sum(math.prod(shapes[op.tops[0]]) for op in net.ops if op.tops[0] != op.bottoms[0])
    assert 1000 < arena < every_top
    first = net._plan.workspace.arrays(0, 64, 64).tops
    assert np.abs(net.forward(x, ["prob"])["prob"] - ref).max() <= 1e-4
    assert net.workspace_nbytes == arena
    assert all(a is b for a, b in zip(net._plan.workspace.arrays(0, 64, 64).tops, first))
    assert np.abs(net.forward(x[:1], ["prob"])["prob"] - ref[:1]).max() <= 1e-4
    assert 0 < net.workspace_nbytes < arena / 2


def test_dl_chunks_are_two_per_worker_but_not_below_eight_images(lenet):
    """Every chunk runs the fully connected layers once, so several workers cut a batch into
    about two chunks each only while a chunk keeps MIN_SHARED_CHUNK (8) images."""
    _, netdef = lenet
    net = Net(netdef, np.float32, "dl", threads=2)
    assert [net.chunk_size(n) for n in (3, 8, 16, 17, 32, 64)] == [2, 4, 8, 8, 8, 16]
    assert net.chunk_size(8, cores=1) == 8


def test_batch_statistics_are_never_split_into_chunks(built):
    """A layer that mixes images (BatchNorm on the batch's own statistics) must see the whole
    batch even when the workspace would otherwise cut it into per-image chunks and workers."""
    case = next(c for c in CASES if c.id == "batchnorm-batch-stats-n3")
    _, _, netdef = built[case.id]
    x = case_input(case)
    net = Net(netdef, np.float32, "dl", workspace_bytes=64, threads=2)
    got = net.forward(x.astype(np.float32), ["out"])["out"]
    np.testing.assert_allclose(got, case.ref(x, netdef), atol=2e-6)


@pytest.mark.parametrize("mode", MODES)
def test_a_blob_whose_first_axis_is_not_the_batch_is_returned_whole(tmp_path, mode):
    """A Concat along axis 0 makes 2N rows of N images: the copy out took rows [0, N) of the
    result array and failed to broadcast 2N rows into them (a traceback in the guard)."""
    body = 'layer { name: "c" type: "Concat" bottom: "data" bottom: "data" top: "out" concat_param { axis: 0 } }'
    _, _, netdef = build_net(tmp_path, "concat_batch", body, (1, 2, 3, 3))
    x = np.random.default_rng(2).normal(size=(3, 2, 3, 3)).astype(np.float32)
    got = Net(netdef, np.float32, mode, threads=2).forward(x, ["out"])["out"]
    np.testing.assert_array_equal(got, np.concatenate([x, x]))


@pytest.mark.parametrize("body, refusal", [
    ('layer { name: "flat" type: "Flatten" bottom: "data" top: "out" flatten_param { axis: 0 } }',
     r"layer 'flat' \(Flatten\): flattens from axis 0, the batch"),
    ('layer { name: "fc" type: "InnerProduct" bottom: "data" top: "out" inner_product_param { num_output: 4 axis: 0 } }',
     r"layer 'fc' \(InnerProduct\): its weights' shape depends on the batch size \(\(\(4, 48\), \(4,\)\) for one "
     r"image, \(\(4, 96\), \(4,\)\) for two\)"),
])
def test_a_layer_over_the_batch_axis_is_refused_before_it_runs(tmp_path, body, refusal):
    """Both passed `check_net` and the guard's checks, then failed at the first forward (a
    reshape of every image into one row, weights of one image's size for two)."""
    from tracker.model.engine import check_net

    proto = tmp_path / "batch_axis.prototxt"
    proto.write_text('name: "b"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 4 dim: 4 }\n' + body + "\n")
    structure = load_net(proto, None)
    with pytest.raises(ModelError, match=refusal):
        check_net(structure)
    with pytest.raises(ModelError, match=refusal):
        Net(structure, np.float32, "caffe")


@pytest.mark.parametrize("body, refusal", [
    # blobs of 0.15 MB; one image's im2col columns 921 MB ("caffe")
    (single("Convolution", "convolution_param { num_output: 1 kernel_size: 88 pad: 87 }"),
     r"its 'caffe' forward needs 921 MB of blobs and temporaries \(im2col columns, padded copies\) for one image"),
    # a 2 x 2 top; the padded copy reaching the second window of each axis, 3.6 TB
    (single("Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 1000000 }"),
     r"its 'caffe' forward needs 3,814,720 MB of blobs and temporaries \(im2col columns, padded copies\) for one image"),
])
def test_a_net_whose_temporaries_outgrow_the_bound_is_refused_before_it_runs(tmp_path, body, refusal):
    """check_net bounded the blobs only: both passed it and the guard's checks, then took 1 GB, or
    failed with numpy's traceback, at the first forward."""
    from tracker.model.engine import check_net

    _, _, netdef = build_net(tmp_path, "temporaries", body, (1, 1, 88, 88))
    with pytest.raises(ModelError, match=r"^net 'temporaries': " + refusal + "; expected at most 256 MB$"):
        check_net(netdef)


def test_a_net_whose_blobs_outgrow_the_bound_is_refused_before_its_operators_are_built(tmp_path, monkeypatch):
    """A pixel-major convolution's constructor allocates a row of its output: a wide padding made
    check_net allocate 800 MB before the blob check refused the net."""
    from tracker.model.engine import check_net

    built = []
    monkeypatch.setattr(O.Convolution, "__init__", lambda self, *args: built.append(self) or None)
    body = single("Convolution", "convolution_param { num_output: 100 kernel_h: 1 kernel_w: 16 pad_w: 1000000 }")
    proto = tmp_path / "wide.prototxt"
    proto.write_text('name: "wide"\ninput: "data"\ninput_shape { dim: 1 dim: 1 dim: 88 dim: 88 }\n' + body + "\n")
    with pytest.raises(ModelError, match=r"its blobs need 67,141 MB for one image \(blob 'out' is \(1, 100, 88, 2000073\)\)"):
        check_net(load_net(proto, None))
    assert built == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_max_window_wholly_past_the_input_is_caffes_lowest_float(tmp_path, mode, dtype):
    """Kernel 1, stride 5 on 12: ceil mode's fourth window starts at 15. Caffe gives it -FLT_MAX;
    it was -inf (which a later layer that adds opposite infinities turns into NaN)."""
    body = single("Pooling", "pooling_param { pool: MAX kernel_size: 1 stride: 5 }")
    _, _, netdef = build_net(tmp_path, "pool_past", body, (1, 1, 12, 12))
    x = np.random.default_rng(4).normal(size=(2, 1, 12, 12)).astype(dtype)
    out = Net(netdef, dtype, mode).forward(x, ["out"])["out"]
    assert out.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(out[:, :, :3, :3], x[:, :, 0:12:5, 0:12:5])
    lowest = np.finfo(np.float32).min
    assert (out[:, :, 3, :] == lowest).all() and (out[:, :, :, 3] == lowest).all()


@pytest.mark.parametrize("mode", MODES)
def test_a_window_wholly_past_the_input_keeps_caffes_lowest_float_after_a_convolution_and_relu(tmp_path, mode):
    """"dl" moved the convolution's bias and ReLU after the pooling, where the empty window's
    -FLT_MAX became ReLU(-FLT_MAX + b) = 0; in Caffe the ReLU runs first and the window stays -FLT_MAX."""
    body = ('layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 1 } }\n'
            'layer { name: "r" type: "ReLU" bottom: "c" top: "c" }\n'
            'layer { name: "out" type: "Pooling" bottom: "c" top: "out" pooling_param { pool: MAX kernel_size: 1 stride: 5 } }')
    _, _, netdef = build_net(tmp_path, "conv_pool_past", body, (1, 1, 12, 12))
    x = np.random.default_rng(5).normal(size=(2, 1, 12, 12))
    expected = Net(netdef, np.float64, "caffe").forward(x, ["out"])["out"]
    got = Net(netdef, np.float32, mode).forward(x.astype(np.float32), ["out"])["out"]
    assert (got[:, :, 3, :] == np.finfo(np.float32).min).all()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_lrn_within_a_channel_costs_the_same_for_any_window(tmp_path, mode):
    """Its window sums came from AVE pooling over a copy padded by (local_size-1)/2: 400,001 on a
    5 x 4 input asked for hundreds of GB."""
    body = single("LRN", "lrn_param { norm_region: WITHIN_CHANNEL local_size: 400001 alpha: 0.9 beta: 0.6 }")
    _, _, netdef = build_net(tmp_path, "lrn_huge", body, (1, 1, 5, 4))
    x = np.random.default_rng(3).normal(size=(2, 1, 5, 4))
    got = Net(netdef, np.float32, mode).forward(x.astype(np.float32), ["out"])["out"]
    np.testing.assert_allclose(got, ref_lrn_within(x, 400001, f32(0.9), f32(0.6)), rtol=1e-5)


def test_dl_workspace_smaller_than_one_image_still_runs(lenet):
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")[:3]
    net = Net(netdef, np.float32, "dl", workspace_bytes=1000)
    assert net.chunk_size(3) == 1
    ref = np.load(d / "ref_opencv_prob_first64.npy")[:3]
    assert np.abs(net.forward(x, ["prob"])["prob"] - ref).max() <= 1e-4


@pytest.mark.parametrize("mode", MODES)
def test_in_place_layer_on_the_input_leaves_the_callers_array_alone(tmp_path, mode):
    body = 'layer { name: "r" type: "ReLU" bottom: "data" top: "data" }\n' + single("Sigmoid")
    _, _, netdef = build_net(tmp_path, "inplace_input", body, (2, 3, 4, 5))
    x = np.random.default_rng(1).normal(size=(3, 3, 4, 5)).astype(np.float32)
    before = x.copy()
    out = Net(netdef, np.float32, mode, workspace_bytes=2000).forward(x, ["data", "out"])
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(out["data"], np.maximum(before, 0))  # the blob after its in-place layer
    np.testing.assert_allclose(out["out"], 1 / (1 + np.exp(-np.maximum(before, 0))), atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_forward_returns_copies(lenet, mode):
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")[:2]
    net = Net(netdef, np.float32, mode)
    first = net.forward(x, ["pool2", "prob"])
    kept = {k: v.copy() for k, v in first.items()}
    net.forward(x[::-1].copy(), ["pool2", "prob"])
    for k in kept:
        np.testing.assert_array_equal(first[k], kept[k])
        assert first[k].flags.c_contiguous


@pytest.mark.parametrize("mode", MODES)
def test_strided_input(lenet, mode):
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")
    net = Net(netdef, np.float32, mode)
    np.testing.assert_allclose(net.forward(x[::3], ["prob"])["prob"], net.forward(np.ascontiguousarray(x[::3]), ["prob"])["prob"], atol=1e-6)


def test_blob_shapes(lenet):
    _, netdef = lenet
    shapes = Net(netdef, np.float32, "dl").blob_shapes(5)
    assert shapes["data"] == (5, 1, 28, 28)
    assert shapes["conv2"] == (5, 50, 8, 8) and shapes["pool2"] == (5, 50, 4, 4)
    assert shapes["ip1"] == (5, 500) and shapes["prob"] == (5, 10)


def test_dl_fuses_relu_and_keeps_each_convolutions_memory_order():
    from tracker.model.spec import default_model

    spec = default_model()
    net = Net(load_net(spec.prototxt, spec.weights), np.float32, "dl")
    plan = "\n".join(net.describe())
    # one input channel: channel-major, and pooled as it is computed (conv1's top is never written)
    assert "conv1+pool1  Convolution+Pooling +ReLU -> pool1 (cnhw)" in plan
    # 16 channels x 6 columns: pixel-major; its bias and ReLU applied by pool2, to a ninth of the values
    assert "conv2        Convolution -> conv2 (nhwc)" in plan
    assert "pool2        Pooling +bias +ReLU -> pool2 (nhwc)" in plan
    # conv3's (N, H, W, C) top read as it lies: fc1's weights permuted to (H, W, C) order once
    assert "fc1          InnerProduct +ReLU (weights in HWC order) -> fc1 (nchw)" in plan
    assert "relu" not in plan  # the separate ReLU layers are gone


def test_dl_pools_a_convolution_only_where_it_can(built):
    """Which convolutions the "dl" schedule pools as they are computed (ops.PooledConvolution),
    in the cases above and in nets made to miss one condition each."""
    def plan(netdef):
        return "\n".join(Net(netdef, np.float32, "dl").describe())

    assert "c+out        Convolution+Pooling +ReLU -> out (cnhw)" in plan(built["conv-relu-pool-tiled"][2])
    assert "c+out        Convolution+Pooling -> out (cnhw)" in plan(built["conv-pool-tiled-2x1"][2])
    assert "c+out        Convolution+Pooling +ReLU -> out (cnhw)" in plan(built["conv-stride2-pool-tiled"][2])
    assert "+" not in plan(built["conv-pool-top-read-twice"][2])  # q reads c too
    assert "out          InnerProduct (weights in HWC order) -> out" in plan(built["pixel-major-ip-transposed"][2])
    assert "HWC" not in "\n".join(Net(built["pixel-major-ip-transposed"][2], np.float32, "caffe").describe())
    assert "Convolution+Pooling" not in "\n".join(Net(built["conv-relu-pool-tiled"][2], np.float32, "caffe").describe())


@pytest.mark.parametrize("conv, pool, after, why", [
    ("kernel_size: 5", "pool: MAX kernel_size: 3 stride: 2", " +bias +ReLU", "overlapping windows"),
    ("kernel_size: 5", "pool: MAX kernel_size: 3 stride: 3", " +bias +ReLU", "a partial last window (10 rows)"),
    ("kernel_size: 5", "pool: AVE kernel_size: 2 stride: 2", "", "not MAX"),
    ("kernel_size: 5", "pool: MAX kernel_size: 2 stride: 2 pad: 1", " +bias +ReLU", "padded pooling"),
    ("kernel_size: 1", "pool: MAX kernel_size: 2 stride: 2", " +bias +ReLU", "4x the multiply-adds"),
    ("kernel_size: 3 stride: 2", "pool: MAX kernel_size: 2 stride: 2", " +bias +ReLU", "25/9 the multiply-adds"),
    ("kernel_size: 5 group: 2", "pool: MAX kernel_size: 2 stride: 2", " +bias +ReLU", "groups"),
    ("kernel_size: 5 bias_term: false", "pool: MAX kernel_size: 3 stride: 2", " +ReLU", "no bias"),
    ("kernel_size: 5 pad: 1", "pool: MAX kernel_size: 3 stride: 2 pad: 1", " +bias +ReLU", "both padded"),
])
def test_dl_leaves_convolution_and_pooling_apart(tmp_path, conv, pool, after, why):
    """Convolutions that PooledConvolution does not take; the ones read by a MAX pooling leave
    their bias and ReLU to it (exact: both commute with a max). Inputs shifted so that some
    windows hold negative values only, which the ReLU zeroes after the max as before it."""
    body = (f'layer {{ name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param {{ num_output: 4 {conv} }} }}\n'
            'layer { name: "r" type: "ReLU" bottom: "c" top: "c" }\n'
            f'layer {{ name: "out" type: "Pooling" bottom: "c" top: "out" pooling_param {{ {pool} }} }}')
    _, _, netdef = build_net(tmp_path, "apart", body, (2, 2, 14, 14))
    net = Net(netdef, np.float32, "dl")
    plan = "\n".join(net.describe())
    assert "Convolution+Pooling" not in plan, why
    assert f"c            Convolution{'' if after else ' +ReLU'} -> c" in plan, why
    assert f"out          Pooling{after} -> out" in plan, why
    x = np.random.default_rng(0).normal(0, 1, (2, 2, 14, 14))
    x[1] -= 4  # conv outputs of either sign
    reference = Net(netdef, np.float64, "caffe")
    want = reference.forward(x, ["out"])["out"]
    assert (want == 0).any() and (want > 0).any()
    np.testing.assert_allclose(net.forward(x.astype(np.float32), ["out"])["out"], want, rtol=0, atol=1e-4)
    # asked for, the convolution's top is Caffe's (bias and ReLU in): the unfused schedule runs
    both = net.forward(x.astype(np.float32), ["c", "out"])
    want_c = reference.forward(x, ["c"])["c"]
    np.testing.assert_allclose(both["c"], want_c, rtol=0, atol=1e-4)
    np.testing.assert_allclose(both["out"], want, rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------


def test_unknown_layer_type_names_layer_and_type(lenet, tmp_path):
    _, netdef = lenet
    bogus = LayerDef("mystery", "Bogus", ("pool2",), ("m",), netdef.layers[0].param, ())
    bad = NetDef(netdef.name, netdef.inputs, [*netdef.layers[:4], bogus])
    with pytest.raises(ModelError, match=r"layer 'mystery'.*'Bogus'"):
        Net(bad)
    proto = tmp_path / "bogus.prototxt"
    proto.write_text('input: "data" input_shape { dim: 1 dim: 1 dim: 4 dim: 4 }\n'
                     'layer { name: "odd" type: "Swish" bottom: "data" top: "odd" }\n')
    with pytest.raises(ModelError, match=r"'odd'.*'Swish'"):
        Net(load_net(proto, None))


def test_parameter_blob_of_wrong_shape(lenet):
    _, netdef = lenet
    conv1 = netdef.layers[0]
    broken = LayerDef(conv1.name, conv1.type, conv1.bottoms, conv1.tops, conv1.param, (conv1.blobs[0][:, :, :4, :4], conv1.blobs[1]))
    with pytest.raises(ModelError, match=r"layer 'conv1' \(Convolution\): parameter blob 0 has shape \(20, 1, 4, 4\); expected \(20, 1, 5, 5\)"):
        Net(NetDef(netdef.name, netdef.inputs, [broken, *netdef.layers[1:]]))


@pytest.mark.parametrize("mode", MODES)
def test_bad_forward_arguments(lenet, mode):
    _, netdef = lenet
    net = Net(netdef, np.float32, mode)
    good = np.zeros((2, 1, 28, 28), np.float32)
    with pytest.raises(InputError, match=r"input 'data': expected shape \('N', 1, 28, 28\).*found \(2, 1, 28, 27\)"):
        net.forward(np.zeros((2, 1, 28, 27), np.float32), ["prob"])
    with pytest.raises(InputError, match=r"found \(0, 1, 28, 28\)"):
        net.forward(good[:0], ["prob"])
    with pytest.raises(InputError, match=r"expected dtype float32 or float64 \(this net computes in float32\); found int32"):
        net.forward(good.astype(np.int32), ["prob"])
    with pytest.raises(InputError, match=r"expected dtype float32 or float64 \(this net computes in float64\); found float16"):
        Net(netdef, np.float64, mode).forward(good.astype(np.float16), ["prob"])
    with pytest.raises(InputError, match=r"found list"):
        net.forward(good.tolist(), ["prob"])
    with pytest.raises(InputError, match=r"no blob named 'relu1'; blobs are data, conv1, pool1"):
        net.forward(good, ["prob", "relu1"])


def test_bad_engine_settings(lenet):
    _, netdef = lenet
    with pytest.raises(InputError, match="engine mode: unknown 'fast'"):
        Net(netdef, np.float32, "fast")
    with pytest.raises(InputError, match="float16"):
        Net(netdef, np.float16)
    with pytest.raises(InputError, match="threads: 0"):
        Net(netdef, threads=0)


# ------------------------------------------------------------------------------------------
# Choosing the thread count by timing (threads=None)
# ------------------------------------------------------------------------------------------


def drive(tuner, key, cost, passes):
    """Run `passes` simulated forwards, arm -> seconds per image from `cost(arm, pass)`."""
    used = []
    for i in range(passes):
        arm = tuner.choose(key)
        tuner.record(key, arm, cost(arm, i))
        used.append(arm)
    return used


def test_tuner_settles_on_the_faster_arm():
    from tracker.model.tuning import ThreadTuner

    tuner = ThreadTuner((1, 2))
    used = drive(tuner, 1, lambda arm, i: {1: 2.0, 2: 1.0}[arm], 40)
    assert used[:10] == [1] * 5 + [2] * 5  # each arm sampled, in order of preference
    assert set(used[10:]) == {2} and tuner.best(1) == 2


def test_tuner_drops_a_much_slower_arm_after_one_pass_and_retries_it_later():
    from tracker.model.tuning import ThreadTuner

    tuner = ThreadTuner((1, 2))
    busy = lambda arm, i: {1: 3.0, 2: 30.0}[arm]  # noqa: E731 - the other arm starved of CPU
    used = drive(tuner, 8, busy, 10 * ThreadTuner.RETRY_FIRST)  # 10x slower: retried after 10x
    assert used.count(2) == 1 and used[5] == 2
    # Later the machine is idle and the second arm is the fast one: the retry notices.
    quiet = lambda arm, i: {1: 3.0, 2: 1.5}[arm]  # noqa: E731
    used = drive(tuner, 8, quiet, 20)
    assert 2 in used[:8] and set(used[-10:]) == {2} and tuner.best(8) == 2


def test_tuner_keys_are_independent_and_one_arm_is_fixed():
    from tracker.model.tuning import ThreadTuner, batch_class

    tuner = ThreadTuner((1, 2))
    drive(tuner, batch_class(1), lambda arm, i: {1: 1.0, 2: 2.0}[arm], 10)
    drive(tuner, batch_class(64), lambda arm, i: {1: 2.0, 2: 1.0}[arm], 10)
    assert tuner.best(batch_class(1)) == 1 and tuner.best(batch_class(64)) == 2
    assert batch_class(2) == batch_class(3) != batch_class(4)
    fixed = ThreadTuner((2,))
    assert drive(fixed, 1, lambda arm, i: 1.0, 5) == [2] * 5


@pytest.mark.parametrize("mode", MODES)
def test_untuned_net_gives_the_same_answer_on_every_arm(lenet, mode):
    d, netdef = lenet
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")[:5]
    net = Net(netdef, np.float32, mode, workspace_bytes=1_000_000)
    assert net._tuner.arms == tuple(dict.fromkeys((1, cores())))
    choose, used = net._tuner.choose, []
    net._tuner.choose = lambda key: used.append(choose(key)) or used[-1]
    first = net.forward(x, ["prob", "pool2"])
    for _ in range(11):  # the sampling passes visit every arm
        out = net.forward(x, ["prob", "pool2"])
        for k in out:  # equal up to float32 summation order (GEMM shapes differ per arm)
            np.testing.assert_allclose(out[k], first[k], rtol=1e-5, atol=1e-6)
    assert set(used) == set(net._tuner.arms)
    # one arena, whichever arm ran ("caffe": its whole batch, which the cap does not cut)
    assert net.workspace_nbytes <= (1_000_000 if mode == "dl" else net._plan.workspace.plan(5)[1])


@pytest.mark.timeout(60)  # the old loop: over two minutes for the largest size (a hang, not a speed figure)
def test_lrn_across_channels_with_a_window_wider_than_the_channels_loops_only_over_channels():
    """A local_size of 400 million looped over offsets that reach no channel, for minutes a call;
    the result is the reference's, and a window wider than any channel count costs what C does."""
    x = np.random.default_rng(0).standard_normal((2, 6, 3, 3))
    for size in (5, 13, 400_000_001):
        got = L.lrn_across_channels(x, size, 0.5, 0.75, 2.0)
        np.testing.assert_allclose(got, ref_lrn_across(x, size, 0.5, 0.75, 2.0), rtol=1e-12)
