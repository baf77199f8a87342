"""Caffe's shape rules: blob shapes through a net, parameter-blob shapes, and per-layer cost.

Each rule restates what Caffe's layer `LayerSetUp`/`Reshape` computes, so that a caffemodel can be
checked against the shapes its prototxt implies before anything runs, and so that the engine,
the converters and the benchmark share one answer:

- Convolution: out = (in + 2*pad - (dilation*(kernel-1) + 1)) // stride + 1 per spatial axis;
  weights (num_output, C/group, *kernel), bias (num_output,).
- Pooling (4-D): out = ceil((in + 2*pad - kernel) / stride) + 1 (floor with round_mode FLOOR);
  then, if any pad is non-zero and (out-1)*stride >= in + pad, out -= 1 (Caffe's clip, so the
  last window starts inside the image); global_pooling uses kernel = (H, W).
- InnerProduct: shape[:axis] + (num_output,); weights (num_output, K) or (K, num_output) with
  transpose, K = prod(shape[axis:]).
- Flatten, Concat, Eltwise, Softmax, LRN, BatchNorm (blobs (C,), (C,), (1,)), Scale, and the
  element-wise layers (ReLU, Sigmoid, TanH, Dropout) as Caffe does them.

`LAYER_TYPES` maps every layer type the project runs to its rule: it is the one list of supported
layer types; the Caffe reader and the engine take theirs from it, the converters a subset.

Shapes are tuples of ints in Caffe's axis order (N, C, H, W for images). A rule that cannot hold
(kernel larger than the padded input, channels not divisible by group, ...) raises ModelError
naming the layer, what was found and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tracker.errors import ModelError
from tracker.model.netdef import LayerDef, NetDef

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ConvGeometry:
    """Kernel, stride, pad and dilation per spatial axis (Caffe's defaults filled in)."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[int, ...]
    dilation: tuple[int, ...]


@dataclass(frozen=True)
class PoolGeometry:
    """A 2-D pooling window: (h, w) pairs for kernel, stride and pad, and the output size."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    out: tuple[int, int]


@dataclass(frozen=True)
class LayerShapes:
    """One layer's bottom shapes, top shapes and the parameter-blob shapes Caffe would create."""

    bottoms: tuple[Shape, ...]
    tops: tuple[Shape, ...]
    params: tuple[Shape, ...]


@dataclass(frozen=True)
class LayerCost:
    """Parameters (learned numbers) and multiply-adds of one layer for the given batch.

    Only Convolution and InnerProduct count multiply-adds (the GEMMs, as the study counts
    FLOPs = 2 * MACs); pooling, activations and normalisation count 0.
    """

    name: str
    type: str
    params: int
    macs: int


def _err(layer: LayerDef, what: str) -> ModelError:
    return ModelError(f"layer {layer.name!r} ({layer.type}): {what}")


def canonical_axis(layer: LayerDef, axis: int, ndim: int, what: str = "axis") -> int:
    """Caffe's CanonicalAxisIndex: negative axes count from the end; out of range is an error."""
    if not -ndim <= axis < ndim:
        raise _err(layer, f"{what} {axis} is out of range for a {ndim}-D input "
                          f"(expected {-ndim}..{ndim - 1})")
    return axis % ndim


def _per_axis(layer: LayerDef, values: Sequence[int], n: int, default: int, what: str
              ) -> tuple[int, ...]:
    """A repeated conv field: empty -> default, one value -> every axis, else one per axis."""
    if len(values) == 0:
        return (default,) * n
    if len(values) == 1:
        return (int(values[0]),) * n
    if len(values) == n:
        return tuple(int(v) for v in values)
    raise _err(layer, f"{what} has {len(values)} values; expected 1 or {n} (one per spatial axis)")


def conv_geometry(layer: LayerDef, num_spatial: int) -> ConvGeometry:
    """Kernel/stride/pad/dilation of a Convolution layer with `num_spatial` spatial axes.

    The *_h/*_w fields (2-D only) override the repeated fields, as in Caffe's
    BaseConvolutionLayer::LayerSetUp; missing stride and dilation are 1, missing pad is 0.
    """
    p = layer.param.convolution_param
    if p.HasField("kernel_h") or p.HasField("kernel_w"):
        if num_spatial != 2 or not (p.HasField("kernel_h") and p.HasField("kernel_w")):
            raise _err(layer, "kernel_h and kernel_w must be given together, for 2-D only")
        if len(p.kernel_size):
            raise _err(layer, "give either kernel_size or kernel_h/kernel_w, not both")
        kernel: tuple[int, ...] = (p.kernel_h, p.kernel_w)
    else:
        if not len(p.kernel_size):
            raise _err(layer, "convolution_param has no kernel_size (nor kernel_h/kernel_w)")
        kernel = _per_axis(layer, p.kernel_size, num_spatial, 1, "kernel_size")
    if p.HasField("stride_h") or p.HasField("stride_w"):
        if num_spatial != 2 or len(p.stride) or not (p.HasField("stride_h")
                                                      and p.HasField("stride_w")):
            raise _err(layer, "stride_h and stride_w must be given together, for 2-D only, "
                              "and exclude stride")
        stride: tuple[int, ...] = (p.stride_h, p.stride_w)
    else:
        stride = _per_axis(layer, p.stride, num_spatial, 1, "stride")
    if p.HasField("pad_h") or p.HasField("pad_w"):
        if num_spatial != 2 or len(p.pad):
            raise _err(layer, "pad_h/pad_w are for 2-D only and exclude pad")
        pad: tuple[int, ...] = (p.pad_h, p.pad_w)
    else:
        pad = _per_axis(layer, p.pad, num_spatial, 0, "pad")
    dilation = _per_axis(layer, p.dilation, num_spatial, 1, "dilation")
    for name, values in (("kernel", kernel), ("stride", stride), ("dilation", dilation)):
        if min(values) <= 0:
            raise _err(layer, f"{name} {values} must be positive")
    return ConvGeometry(tuple(kernel), tuple(stride), tuple(pad), tuple(dilation))


def pool_geometry(layer: LayerDef, bottom: Shape) -> PoolGeometry:
    """Window and output size of a Pooling layer on a 4-D (N, C, H, W) bottom, as Caffe does."""
    p = layer.param.pooling_param
    if len(bottom) != 4:
        raise _err(layer, f"pooling needs a 4-D (N, C, H, W) input; found shape {bottom}")
    h, w = bottom[2], bottom[3]
    has_k = p.HasField("kernel_size")
    has_khw = p.HasField("kernel_h") or p.HasField("kernel_w")
    if p.global_pooling:
        if has_k or has_khw:
            raise _err(layer, "global_pooling takes no kernel_size/kernel_h/kernel_w")
        kernel = (h, w)
    elif has_k and has_khw:
        raise _err(layer, "give either kernel_size or kernel_h and kernel_w, not both")
    elif has_k:
        kernel = (p.kernel_size, p.kernel_size)
    elif p.HasField("kernel_h") and p.HasField("kernel_w"):
        kernel = (p.kernel_h, p.kernel_w)
    else:
        raise _err(layer, "pooling_param needs kernel_size, or kernel_h and kernel_w")
    pad = (p.pad_h, p.pad_w) if (p.HasField("pad_h") or p.HasField("pad_w")) else (p.pad, p.pad)
    stride = ((p.stride_h, p.stride_w) if (p.HasField("stride_h") or p.HasField("stride_w"))
              else (p.stride, p.stride))
    if min(kernel) <= 0 or min(stride) <= 0:
        raise _err(layer, f"kernel {kernel} and stride {stride} must be positive")
    if p.global_pooling and (pad != (0, 0) or stride != (1, 1)):
        raise _err(layer, f"global_pooling needs pad 0 and stride 1; found pad {pad}, "
                          f"stride {stride}")
    if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
        raise _err(layer, f"pad {pad} must be smaller than the kernel {kernel}")
    rounding = math.floor if p.round_mode == 1 else math.ceil  # RoundMode FLOOR = 1
    out = []
    for size, k, s, pd in zip((h, w), kernel, stride, pad):
        o = int(rounding((size + 2 * pd - k) / s)) + 1
        # Caffe's clip: the last window must start inside the image (not only in the padding).
        if (pad[0] or pad[1]) and (o - 1) * s >= size + pd:
            o -= 1
        if o <= 0:
            raise _err(layer, f"kernel {kernel} with pad {pad} does not fit the {h}x{w} input")
        out.append(o)
    return PoolGeometry((kernel[0], kernel[1]), (stride[0], stride[1]), (pad[0], pad[1]), (out[0], out[1]))


def _prod(values: Sequence[int]) -> int:
    return math.prod(int(v) for v in values)


def _one_bottom(layer: LayerDef, bottoms: tuple[Shape, ...]) -> Shape:
    if len(bottoms) != 1:
        raise _err(layer, f"takes exactly 1 bottom; found {len(bottoms)}")
    return bottoms[0]


def _same(layer: LayerDef, bottoms: tuple[Shape, ...]) -> tuple[tuple[Shape, ...], tuple]:
    return (_one_bottom(layer, bottoms),), ()


def _convolution(layer, bottoms):
    b = _one_bottom(layer, bottoms)
    p = layer.param.convolution_param
    axis = canonical_axis(layer, p.axis, len(b))
    spatial = b[axis + 1:]
    if not spatial:
        raise _err(layer, f"convolution needs spatial axes after axis {axis}; found shape {b}")
    g = conv_geometry(layer, len(spatial))
    channels, group, num_output = b[axis], p.group, p.num_output
    if num_output <= 0:
        raise _err(layer, "convolution_param.num_output must be positive")
    if group <= 0 or channels % group or num_output % group:
        raise _err(layer, f"group {group} must divide both the {channels} input channels and "
                          f"num_output {num_output}")
    out = []
    for size, k, s, pd, d in zip(spatial, g.kernel, g.stride, g.pad, g.dilation):
        o = (size + 2 * pd - (d * (k - 1) + 1)) // s + 1
        if o <= 0:
            raise _err(layer, f"kernel {g.kernel} (dilation {g.dilation}, pad {g.pad}) does not "
                              f"fit the input of shape {b}")
        out.append(o)
    params = [(num_output, channels // group, *g.kernel)]
    if p.bias_term:
        params.append((num_output,))
    return (b[:axis] + (num_output, *out),), tuple(params)


def _pooling(layer, bottoms):
    b = _one_bottom(layer, bottoms)
    g = pool_geometry(layer, b)
    return (b[:2] + g.out,), ()


def _inner_product(layer, bottoms):
    b = _one_bottom(layer, bottoms)
    p = layer.param.inner_product_param
    axis = canonical_axis(layer, p.axis, len(b))
    if p.num_output <= 0:
        raise _err(layer, "inner_product_param.num_output must be positive")
    k = _prod(b[axis:])
    params = [(k, p.num_output) if p.transpose else (p.num_output, k)]
    if p.bias_term:
        params.append((p.num_output,))
    return (b[:axis] + (p.num_output,),), tuple(params)


def _softmax(layer, bottoms):
    b = _one_bottom(layer, bottoms)
    canonical_axis(layer, layer.param.softmax_param.axis, len(b))
    return (b,), ()


def _lrn(layer, bottoms):
    b = _one_bottom(layer, bottoms)
    if len(b) != 4:
        raise _err(layer, f"LRN needs a 4-D (N, C, H, W) input; found shape {b}")
    if layer.param.lrn_param.local_size % 2 == 0:
        raise _err(layer, f"local_size {layer.param.lrn_param.local_size} must be odd")
    return (b,), ()


def _flatten(layer, bottoms):
    b = _one_bottom(layer, bottoms)
    p = layer.param.flatten_param
    start = canonical_axis(layer, p.axis, len(b))
    end = canonical_axis(layer, p.end_axis, len(b), "end_axis")
    if end < start:
        raise _err(layer, f"end_axis {p.end_axis} comes before axis {p.axis} for shape {b}")
    return (b[:start] + (_prod(b[start:end + 1]),) + b[end + 1:],), ()


def concat_axis(layer: LayerDef, ndim: int) -> int:
    """The axis a Concat joins its bottoms of `ndim` axes along: `axis` (Caffe's canonical index)
    or the legacy `concat_dim`, not both (Caffe's ConcatLayer refuses both)."""
    p = layer.param.concat_param
    if not p.HasField("concat_dim"):
        return canonical_axis(layer, p.axis, ndim)
    if p.HasField("axis"):
        raise _err(layer, f"sets both axis ({p.axis}) and concat_dim ({p.concat_dim}); "
                          f"expected one of them")
    if p.concat_dim >= ndim:
        raise _err(layer, f"concat_dim {p.concat_dim} is out of range for a {ndim}-D input "
                          f"(expected 0..{ndim - 1})")
    return p.concat_dim


def _concat(layer, bottoms):
    if not bottoms:
        raise _err(layer, "takes at least 1 bottom; found 0")
    first = bottoms[0]
    axis = concat_axis(layer, len(first))
    for other in bottoms[1:]:
        if len(other) != len(first) or any(
                a != c for i, (a, c) in enumerate(zip(first, other)) if i != axis):
            raise _err(layer, f"bottom shapes {first} and {other} differ outside axis {axis}")
    total = sum(s[axis] for s in bottoms)
    return (first[:axis] + (total,) + first[axis + 1:],), ()


def _eltwise(layer, bottoms):
    if len(bottoms) < 2:
        raise _err(layer, f"takes at least 2 bottoms; found {len(bottoms)}")
    p = layer.param.eltwise_param
    if len(p.coeff) and (p.operation != 1 or len(p.coeff) != len(bottoms)):  # 1 = SUM
        raise _err(layer, f"coeff needs operation SUM and one value per bottom "
                          f"({len(bottoms)}); found {len(p.coeff)}")
    for other in bottoms[1:]:
        if other != bottoms[0]:
            raise _err(layer, f"bottom shapes differ: {bottoms[0]} and {other}")
    return (bottoms[0],), ()


def _batch_norm(layer, bottoms):
    b = _one_bottom(layer, bottoms)
    channels = 1 if len(b) == 1 else b[1]
    return (b,), ((channels,), (channels,), (1,))


def _scale(layer, bottoms):
    if len(bottoms) not in (1, 2):
        raise _err(layer, f"takes 1 or 2 bottoms; found {len(bottoms)}")
    b = bottoms[0]
    p = layer.param.scale_param
    if len(bottoms) == 2:
        factor = bottoms[1]
        # A scalar factor ignores axis; otherwise it must match bottom[0] from axis on.
        axis = 0 if not factor else canonical_axis(layer, p.axis, len(b))
        if tuple(b[axis:axis + len(factor)]) != factor:
            raise _err(layer, f"scale factor shape {factor} does not match {b} at axis {axis}")
        return (b,), ((factor,) if p.bias_term else ())
    axis = canonical_axis(layer, p.axis, len(b)) if b else 0
    if p.num_axes < -1:
        raise _err(layer, f"num_axes {p.num_axes} must be -1 or more")
    end = len(b) if p.num_axes == -1 else axis + p.num_axes
    if end > len(b):
        raise _err(layer, f"axis {p.axis} + num_axes {p.num_axes} exceeds the input axes {b}")
    factor = tuple(b[axis:end])
    return (b,), ((factor, factor) if p.bias_term else (factor,))


ShapeRule = Callable[[LayerDef, tuple[Shape, ...]], tuple[tuple[Shape, ...], tuple[Shape, ...]]]

# The one table of the layer types the project runs, each with its shape rule: (layer, bottom
# shapes) -> (top shapes, parameter-blob shapes). "Input" is not a layer here: load_net turns it
# into NetDef.inputs. Everything else derives from this table: `caffe_io.load_net` accepts these
# types (and Input); the engine runs each with the `ops.Op` subclass of the same name (`ops.OPS`,
# built from this table); the converters lower a subset (`convert.graph.SUPPORTED`).
LAYER_TYPES: dict[str, ShapeRule] = {
    "Convolution": _convolution,
    "Pooling": _pooling,
    "ReLU": _same,
    "Sigmoid": _same,
    "TanH": _same,
    "InnerProduct": _inner_product,
    "Softmax": _softmax,
    "LRN": _lrn,
    "Dropout": _same,
    "Flatten": _flatten,
    "Concat": _concat,
    "Eltwise": _eltwise,
    "BatchNorm": _batch_norm,
    "Scale": _scale,
}


def layer_shapes(layer: LayerDef, bottoms: Sequence[Shape]) -> LayerShapes:
    """Top shapes and parameter-blob shapes of `layer` given its bottom shapes."""
    rule = LAYER_TYPES.get(layer.type)
    if rule is None:
        raise _err(layer, f"no shape rule for layer type {layer.type!r} "
                          f"(known: {', '.join(sorted(LAYER_TYPES))})")
    bottoms = tuple(tuple(int(d) for d in s) for s in bottoms)
    tops, params = rule(layer, bottoms)
    if len(layer.tops) != 1:
        raise _err(layer, f"takes exactly 1 top; found {len(layer.tops)}")
    return LayerShapes(bottoms, tuple(tops), tuple(params))


def infer_layer_shapes(netdef: NetDef, batch: int | None = None) -> list[LayerShapes]:
    """`LayerShapes` for every layer of `netdef`, in order, with the batch axis set to `batch`.

    `batch=None` keeps the batch size the prototxt declares. A bottom that no earlier layer or
    input produced is a ModelError naming the layer and the blob.
    """
    blobs: dict[str, Shape] = {}
    for name, shape in netdef.inputs.items():
        shape = tuple(int(d) for d in shape)
        blobs[name] = (batch, *shape[1:]) if batch is not None and shape else shape
    result = []
    for layer in netdef.layers:
        missing = [b for b in layer.bottoms if b not in blobs]
        if missing:
            raise _err(layer, f"bottom {missing[0]!r} is not produced by any earlier layer or "
                              f"input (known blobs: {', '.join(blobs)})")
        shapes = layer_shapes(layer, [blobs[b] for b in layer.bottoms])
        for top, shape in zip(layer.tops, shapes.tops):
            if top in layer.bottoms and blobs[top] != shape:
                raise _err(layer, f"computes in place on {top!r} but changes its shape "
                                  f"{blobs[top]} -> {shape}")
            blobs[top] = shape
        result.append(shapes)
    return result


def infer_shapes(netdef: NetDef, batch: int | None = None) -> dict[str, Shape]:
    """Shape of every blob of `netdef` (inputs and tops) for a batch of `batch` images.

    In-place blobs (a ReLU writing back to its bottom) keep one entry with their final shape.
    `batch=None` keeps the prototxt's declared batch size.
    """
    blobs: dict[str, Shape] = {}
    for name, shape in netdef.inputs.items():
        shape = tuple(int(d) for d in shape)
        blobs[name] = (batch, *shape[1:]) if batch is not None and shape else shape
    for layer, shapes in zip(netdef.layers, infer_layer_shapes(netdef, batch)):
        blobs.update(zip(layer.tops, shapes.tops))
    return blobs


def layer_costs(netdef: NetDef, batch: int = 1) -> list[LayerCost]:
    """Parameters and multiply-adds of every layer for `batch` images (see LayerCost)."""
    costs = []
    for layer, shapes in zip(netdef.layers, infer_layer_shapes(netdef, batch)):
        params = sum(_prod(s) for s in shapes.params)
        macs = 0
        if layer.type == "Convolution":
            weight = shapes.params[0]  # (num_output, C/group, *kernel)
            macs = _prod(shapes.tops[0]) * _prod(weight[1:])
        elif layer.type == "InnerProduct":
            # M*K*N where M*K is the whole bottom, whatever the axis.
            macs = _prod(shapes.bottoms[0]) * layer.param.inner_product_param.num_output
        costs.append(LayerCost(layer.name, layer.type, params, macs))
    return costs


def count_params(netdef: NetDef) -> int:
    """Learned numbers in the net, from the shapes its prototxt implies (not from the weights)."""
    return sum(c.params for c in layer_costs(netdef, 1))


def count_macs(netdef: NetDef, batch: int = 1) -> int:
    """Multiply-adds of one forward pass of `batch` images (Convolution and InnerProduct)."""
    return sum(c.macs for c in layer_costs(netdef, batch))
