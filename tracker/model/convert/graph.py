"""A Caffe `NetDef` lowered to a small graph whose every op means one thing in every engine.

Caffe's quirks are resolved here, once, so that each emitter (Keras, ONNX, torch) translates op
by op without knowing Caffe:

- Convolution keeps Caffe's OIHW weights, symmetric pad, stride, dilation and group.
- Pooling becomes: crop (rows/columns no window reaches), explicit pad, *valid* pooling, and for
  AVE an optional per-position scale. Caffe rounds the output size up (ceil mode) and clips the
  last window when it would start inside the padding; the explicit pad below reproduces that
  exactly: `pad_before = pad`, `pad_after = (out - 1) * stride + kernel - size - pad` (negative
  means the tail is never read and is cropped). MAX pads by repeating the edge row/column -- every
  window that reaches into the pad also holds that edge value, so the max is Caffe's (which
  ignores padding) -- and that stays exact after int8 quantisation, unlike a -inf pad. AVE pads
  with zeros and divides, like Caffe, by the window's size clipped to `size + pad` (so the
  symmetric pad counts, the ceil-mode tail does not): the valid average over the zero-padded
  input is multiplied by `kh*kw / divisor`, a constant (out_h, out_w) map, omitted when all 1.
- InnerProduct on an image blob becomes Flatten (in Caffe's C, H, W order) + Dense; the NHWC
  emitters fold the order into the weights (see `Flatten`).
- In-place layers (ReLU on "fc1") produce a new tensor version; the model's outputs are the last
  versions of the ModelSpec's blobs, i.e. read after in-place layers ran, as Caffe reads them.
  An output blob that is an image is flattened in Caffe order, so outputs are always (N, D).
- Dropout (TEST phase) is the identity; ops that no output needs are dropped.

Shapes exclude the batch axis: (C, H, W) for images, (D,) for vectors. Weights are float32.
A layer type outside `SUPPORTED` raises ModelError naming the layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tracker.errors import ModelError
from tracker.model.layers import ave_pool_divisors
from tracker.model.shapes import canonical_axis, conv_geometry, infer_layer_shapes, pool_geometry

# The layer types the converters lower: a subset of the one table (`shapes.LAYER_TYPES`), those
# `lower` below has an op for; LRN, Concat, Eltwise, BatchNorm and Scale run on the Caffe engine
# only (the face CNN has none of them).
SUPPORTED = ("Convolution", "Pooling", "ReLU", "Sigmoid", "TanH", "InnerProduct", "Softmax",
             "Dropout", "Flatten")


@dataclass(frozen=True, eq=False)
class Conv:
    """2-D convolution, NCHW semantics. weight (O, I/group, kh, kw), bias (O,) or None."""

    name: str
    src: str
    dst: str
    weight: np.ndarray
    bias: np.ndarray | None
    stride: tuple[int, int]
    pad: tuple[int, int]  # symmetric (h, w), as Caffe
    dilation: tuple[int, int]
    group: int


@dataclass(frozen=True, eq=False)
class Pool:
    """crop -> pad -> valid pooling [-> scale]; see the module docstring for why this is Caffe.

    crop: (bottom, right) rows/columns dropped first; pad: (top, left, bottom, right) added next,
    by edge replication for "max" and zeros for "ave"; scale: (out_h, out_w) float32 or None.
    """

    name: str
    src: str
    dst: str
    method: str  # "max" | "ave"
    kernel: tuple[int, int]
    stride: tuple[int, int]
    crop: tuple[int, int]
    pad: tuple[int, int, int, int]
    scale: np.ndarray | None


@dataclass(frozen=True, eq=False)
class Activation:
    """Element-wise: "relu" (leaky when slope != 0), "sigmoid" or "tanh"."""

    name: str
    src: str
    dst: str
    fn: str
    slope: float = 0.0


@dataclass(frozen=True, eq=False)
class Flatten:
    """(C, H, W) -> (C*H*W,) in Caffe's order (channel slowest). NHWC engines either transpose
    first or, when only Dense ops read the result, permute those Dense weights instead."""

    name: str
    src: str
    dst: str


@dataclass(frozen=True, eq=False)
class Dense:
    """y = x @ weight.T + bias on a (K,) vector. weight (O, K), bias (O,) or None."""

    name: str
    src: str
    dst: str
    weight: np.ndarray
    bias: np.ndarray | None


@dataclass(frozen=True, eq=False)
class Softmax:
    """Softmax over the channel axis (axis 1 of (N, C) or (N, C, H, W))."""

    name: str
    src: str
    dst: str


Op = Conv | Pool | Activation | Flatten | Dense | Softmax


@dataclass(frozen=True, eq=False)
class Graph:
    """The lowered net: one image input, ops in execution order, two named outputs.

    input: tensor name; shapes: tensor -> shape without batch; outputs: {"prob": tensor,
    "embedding": tensor} (or "logits" instead of "prob", see float_softmax), all (D,)-shaped;
    consumers: tensor -> ops reading it.
    """

    name: str
    input: str
    ops: tuple[Op, ...]
    shapes: dict[str, tuple[int, ...]]
    outputs: dict[str, str]
    consumers: dict[str, tuple[Op, ...]] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shapes[self.input]


def _pool_axis(size: int, k: int, s: int, p: int, out: int, layer: str) -> tuple[int, int, np.ndarray]:
    """(crop_after, pad_after, divisor per output position: layers.ave_pool_divisors) along one
    axis, as Caffe pools."""
    last_start = (out - 1) * s - p
    if last_start >= size:  # only when stride > kernel: Caffe would emit -FLT_MAX / 0 there
        raise ModelError(f"layer {layer!r} (Pooling): its last window starts past the input "
                         f"(size {size}, kernel {k}, stride {s}, pad {p}); the converters do not "
                         f"reproduce Caffe's output for empty windows")
    after = (out - 1) * s + k - size - p
    return max(0, -after), max(0, after), ave_pool_divisors(size, k, p, s, out)


def _axis(layer, axis: int, bottom: tuple[int, ...]) -> int:
    """A layer's `axis` on its input of one image's shape `bottom` with the batch before it, as
    Caffe counts it (negative from the end): 1 is the channels, len(bottom) the last."""
    return canonical_axis(layer, axis, len(bottom) + 1)


def _lower_pool(layer, src: str, dst: str, bottom: tuple[int, ...]) -> Pool:
    g = pool_geometry(layer, (1,) + bottom)
    method = {0: "max", 1: "ave"}.get(layer.param.pooling_param.pool)
    if method is None:
        raise ModelError(f"layer {layer.name!r} (Pooling): pool method STOCHASTIC is not "
                         f"supported by the converters; expected MAX or AVE")
    crop_b, pad_b, div_h = _pool_axis(bottom[1], g.kernel[0], g.stride[0], g.pad[0], g.out[0], layer.name)
    crop_r, pad_r, div_w = _pool_axis(bottom[2], g.kernel[1], g.stride[1], g.pad[1], g.out[1], layer.name)
    scale = None
    if method == "ave":
        ratio = (g.kernel[0] * g.kernel[1]) / np.outer(div_h, div_w).astype(np.float64)
        if not np.all(ratio == 1.0):
            scale = ratio.astype(np.float32)
    return Pool(layer.name, src, dst, method, g.kernel, g.stride, (crop_b, crop_r),
                (g.pad[0], g.pad[1], pad_b, pad_r), scale)


def lower(netdef, probs: str, embedding: str) -> Graph:
    """Lower `netdef` (caffe_io.NetDef with weights) to a Graph with outputs `probs` and
    `embedding` (blob names). ModelError for an unsupported layer, a missing output blob, or a
    net that is not one image input."""
    if len(netdef.inputs) != 1:
        raise ModelError(f"net {netdef.name!r} has inputs {list(netdef.inputs)}; the converters "
                         f"need exactly one image input (N, C, H, W)")
    (input_name, input_shape), = netdef.inputs.items()
    if len(input_shape) != 4:
        raise ModelError(f"net {netdef.name!r}: input {input_name!r} has shape {input_shape}; "
                         f"expected (N, C, H, W)")
    shapes: dict[str, tuple[int, ...]] = {input_name: tuple(input_shape[1:])}
    current = {input_name: input_name}  # blob -> its latest tensor version
    ops: list[Op] = []
    layer_shapes = infer_layer_shapes(netdef, 1)

    def fresh(layer_name: str) -> str:
        if layer_name in shapes:
            raise ModelError(f"net {netdef.name!r}: layer {layer_name!r} has the name of a "
                             f"blob; the converters name tensors after layers")
        return layer_name

    for layer, ls in zip(netdef.layers, layer_shapes):
        if layer.type not in SUPPORTED:
            raise ModelError(f"layer {layer.name!r} has type {layer.type!r}, which the "
                             f"converters do not support (supported: {', '.join(SUPPORTED)})")
        if len(layer.bottoms) != 1 or len(layer.tops) != 1:
            raise ModelError(f"layer {layer.name!r} ({layer.type}) has {len(layer.bottoms)} "
                             f"bottoms and {len(layer.tops)} tops; the converters need 1 and 1")
        src = current[layer.bottoms[0]]
        bottom = shapes[src]
        top_shape = tuple(ls.tops[0][1:])
        if layer.type == "Dropout":
            current[layer.tops[0]] = src
            continue
        dst = fresh(layer.name)
        if layer.type == "Convolution":
            p = layer.param.convolution_param
            if len(bottom) != 3 or p.axis not in (1, -3):
                raise ModelError(f"layer {layer.name!r} (Convolution): the converters support "
                                 f"2-D convolution on (N, C, H, W); found input {bottom}, axis {p.axis}")
            g = conv_geometry(layer, 2)
            ops.append(Conv(layer.name, src, dst, layer.blobs[0],
                            layer.blobs[1] if p.bias_term else None, (g.stride[0], g.stride[1]),
                            (g.pad[0], g.pad[1]), (g.dilation[0], g.dilation[1]), int(p.group)))
        elif layer.type == "Pooling":
            ops.append(_lower_pool(layer, src, dst, bottom))
        elif layer.type == "ReLU":
            ops.append(Activation(layer.name, src, dst, "relu",
                                  float(layer.param.relu_param.negative_slope)))
        elif layer.type in ("Sigmoid", "TanH"):
            ops.append(Activation(layer.name, src, dst, layer.type.lower()))
        elif layer.type == "Flatten":
            p = layer.param.flatten_param
            if _axis(layer, p.axis, bottom) != 1 or _axis(layer, p.end_axis, bottom) != len(bottom):
                raise ModelError(f"layer {layer.name!r} (Flatten): the converters support "
                                 f"axis 1 to end_axis -1 only; found {p.axis}..{p.end_axis}")
            if len(bottom) == 1:
                current[layer.tops[0]] = src
                continue
            ops.append(Flatten(layer.name, src, dst))
        elif layer.type == "InnerProduct":
            p = layer.param.inner_product_param
            if _axis(layer, p.axis, bottom) != 1:
                raise ModelError(f"layer {layer.name!r} (InnerProduct): the converters support "
                                 f"axis 1 only; found {p.axis}")
            if len(bottom) != 1:
                flat = fresh(layer.name + "_flatten")
                ops.append(Flatten(layer.name + "_flatten", src, flat))
                shapes[flat] = (int(np.prod(bottom)),)
                src = flat
            weight = layer.blobs[0].T if p.transpose else layer.blobs[0]
            ops.append(Dense(layer.name, src, dst, np.ascontiguousarray(weight, np.float32),
                             layer.blobs[1] if p.bias_term else None))
        elif layer.type == "Softmax":
            axis = layer.param.softmax_param.axis
            if _axis(layer, axis, bottom) != 1:
                raise ModelError(f"layer {layer.name!r} (Softmax): the converters support "
                                 f"axis 1 (channels) only; found {axis}")
            ops.append(Softmax(layer.name, src, dst))
        shapes[dst] = top_shape
        current[layer.tops[0]] = dst

    outputs = {}
    for role, blob in (("prob", probs), ("embedding", embedding)):
        if blob not in current:
            raise ModelError(f"model: {role} blob {blob!r} is not a blob of net {netdef.name!r}; "
                             f"its blobs are {', '.join(current)}")
        tensor = current[blob]
        if len(shapes[tensor]) != 1:  # an image blob as output: (N, C*H*W) in Caffe order
            flat = fresh(f"{blob}_{role}_flat")
            ops.append(Flatten(flat, tensor, flat))
            shapes[flat] = (int(np.prod(shapes[tensor])),)
            tensor = flat
        outputs[role] = tensor
    ops = _needed(ops, set(outputs.values()))
    return Graph(netdef.name, input_name, tuple(ops), shapes, outputs, _consumers(ops))


def final_softmax(graph: Graph) -> Softmax | None:
    """The Softmax op producing "prob" when it is the softmax of a vector (a classifier's last
    op), else None."""
    last = next((op for op in graph.ops if op.dst == graph.outputs["prob"]), None)
    return last if isinstance(last, Softmax) and len(graph.shapes[last.src]) == 1 else None


def float_softmax(graph: Graph) -> Graph:
    """`graph` ending at the logits, for training (its loss reads the logits): the final Softmax
    (final_softmax) is removed and its input becomes the output "logits". A graph without one is
    returned unchanged."""
    last = final_softmax(graph)
    if last is None:
        return graph
    outputs = {"logits": last.src, "embedding": graph.outputs["embedding"]}
    ops = _needed([op for op in graph.ops if op is not last], set(outputs.values()))
    return Graph(graph.name, graph.input, tuple(ops), graph.shapes, outputs, _consumers(ops))


INT8_MIN_CHANNELS = 4


def int8_float_prefix(graph: Graph) -> tuple[str, ...]:
    """Names of the ops an int8 model keeps in float32: when the first convolution reads fewer
    than INT8_MIN_CHANNELS channels (conv1 on a grey image) and a pooling follows it, everything
    up to and including that pooling (the int8 part then starts on 4x fewer values); otherwise
    none.

    Why: int8 convolution kernels (XNNPACK, ONNX Runtime's MLAS) vectorise over input channels,
    so a 7x7 kernel on one channel wastes most of each vector: measured here, conv1 alone ran
    3-8x slower in int8 than in float32, more than the whole rest of the int8 net.
    """
    first = next((i for i, op in enumerate(graph.ops) if isinstance(op, Conv)), None)
    if first is None or graph.shapes[graph.ops[first].src][0] >= INT8_MIN_CHANNELS:
        return ()
    end = next((i for i in range(first, len(graph.ops)) if isinstance(graph.ops[i], Pool)), None)
    return () if end is None else tuple(op.name for op in graph.ops[:end + 1])


def int8_float_ops(graph: Graph) -> tuple[str, ...]:
    """Names of the ops an int8 model keeps in float32: int8_float_prefix(graph), and the final
    softmax (final_softmax), which then reads the dequantised logits.

    Why the softmax: an int8 softmax has a resolution of 1/256, which cannot rank the ~1e-3
    probabilities of a wide, unsure classifier (848 identities). Why in the graph rather than in
    the backends: with numpy's softmax in the backend, LiteRT's int8 backend ran at 1.11-1.13x
    its own file at batch 1 (a wrapper cost of 30-47 us a call on a 0.24 ms pass); with the
    softmax in the file, at 1.00x (2 us), `scripts/backend_overhead.py` on a 2-core EPYC VM
    (docs/BENCHMARKS.md, the AMD EPYC set)."""
    last = final_softmax(graph)
    return int8_float_prefix(graph) + ((last.name,) if last is not None else ())


def unique_namer(taken: Iterable[str]) -> Callable[[str], str]:
    """A function naming what an emitter adds beside the graph's ops: it returns `base`, or `base`
    with "_2", "_3", ... appended, the first that is neither in `taken` (the names the emitter
    gives the graph's ops, which can be any Caffe layer's, such as "pool1_crop") nor returned
    before."""
    used = set(taken)

    def unique(base: str) -> str:
        name, i = base, 1
        while name in used:
            i += 1
            name = f"{base}_{i}"
        used.add(name)
        return name
    return unique


def _consumers(ops: list[Op]) -> dict[str, tuple[Op, ...]]:
    readers: dict[str, list[Op]] = {}
    for op in ops:
        readers.setdefault(op.src, []).append(op)
    return {k: tuple(v) for k, v in readers.items()}


def _needed(ops: list[Op], wanted: set[str]) -> list[Op]:
    """The ops the `wanted` tensors depend on, in their original order."""
    keep = []
    for op in reversed(ops):
        if op.dst in wanted:
            keep.append(op)
            wanted.add(op.src)
    return keep[::-1]
