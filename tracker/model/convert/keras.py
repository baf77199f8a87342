"""The lowered graph (`graph.Graph`) as a Keras model (TensorFlow backend), NHWC.

TensorFlow's CPU convolutions are NHWC, so the model takes (N, H, W, C) input and the weights are
permuted once here: conv OIHW -> HWIO; the Dense after a Flatten of an image gets its (O, C*H*W)
weight re-ordered to (O, H*W*C), so flattening NHWC needs no runtime transpose (a Flatten whose
result is itself an output, or feeds anything but Dense, transposes to NCHW first instead).
Outputs are a dict {"prob": (N, P), "embedding": (N, D)} -- both in Caffe's order.

Pooling follows graph.Pool: crop (Cropping2D), pad (EdgePad2D for MAX, ZeroPadding2D for AVE),
valid pooling, then ConstantScale for AVE windows Caffe divides by less than kh*kw. The two custom
layers are registered with Keras under the package "tracker", so a saved `.keras` file loads
after this module is imported.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import keras
import numpy as np

from tracker.errors import ModelError
from tracker.model.convert.graph import Activation, Conv, Dense, Flatten, Graph, Pool, Softmax, unique_namer


@keras.saving.register_keras_serializable(package="tracker")
class EdgePad2D(keras.layers.Layer):
    """Pad an NHWC tensor by repeating its edge rows/columns: pad = (top, left, bottom, right)."""

    def __init__(self, pad, **kwargs):
        super().__init__(**kwargs)
        self.pad = tuple(int(p) for p in pad)

    def call(self, x):
        top, left, bottom, right = self.pad
        x = keras.ops.concatenate([x[:, :1]] * top + [x] + [x[:, -1:]] * bottom, axis=1)
        return keras.ops.concatenate([x[:, :, :1]] * left + [x] + [x[:, :, -1:]] * right, axis=2)

    def compute_output_shape(self, shape):
        top, left, bottom, right = self.pad
        return (shape[0], shape[1] + top + bottom, shape[2] + left + right, shape[3])

    def get_config(self):
        return {**super().get_config(), "pad": list(self.pad)}


@keras.saving.register_keras_serializable(package="tracker")
class ConstantScale(keras.layers.Layer):
    """Multiply an NHWC tensor by a fixed (H, W) map (broadcast over batch and channels)."""

    def __init__(self, shape, **kwargs):
        super().__init__(**kwargs)
        self.map_shape = tuple(int(s) for s in shape)
        self.factor = self.add_weight(shape=self.map_shape + (1,), initializer="ones",
                                      trainable=False, name="factor")

    def call(self, x):
        return x * self.factor

    def compute_output_shape(self, shape):
        return shape

    def get_config(self):
        return {**super().get_config(), "shape": list(self.map_shape)}


_INPUT = "data"  # the Keras Input layer's name


def _namer(reserved: tuple[str, ...]) -> Callable[..., str]:
    """A function naming a Keras layer after its Caffe layer (and a suffix): that name with each
    character outside [A-Za-z0-9_.-] made "_", unique in the model and never one of `reserved`
    (graph.unique_namer), as Keras refuses a model with two layers of one name."""
    unique = unique_namer(reserved)

    def name(caffe_name: str, suffix: str = "") -> str:
        return unique(re.sub(r"[^A-Za-z0-9_.-]", "_", caffe_name + suffix) or "layer")
    return name


def build_keras(graph: Graph) -> keras.Model:
    """A Keras model for `graph`: input "data" (N, H, W, C) float32, outputs {"prob", "embedding"}."""
    L = keras.layers
    name = _namer(reserved=(_INPUT,))  # Keras names the Input layer too: a layer "data" is "data_2"
    c, h, w = graph.input_shape
    inp = keras.Input((h, w, c), name=_INPUT)
    env = {graph.input: inp}
    hwc_order: set[str] = set()  # flattened tensors holding H, W, C order (folded into Dense)
    outputs = set(graph.outputs.values())
    layers = []  # (keras layer, weights) to set once the model is built
    for op in graph.ops:
        x = env[op.src]
        if isinstance(op, Conv):
            if max(op.stride) > 1 and max(op.dilation) > 1:
                raise ModelError(f"layer {op.name!r}: stride {op.stride} with dilation {op.dilation}, which Keras's "
                                 "Conv2D (the TensorFlow and LiteRT conversions) cannot run; the ONNX one can")
            if op.pad != (0, 0):  # ((top, bottom), (left, right)): Caffe pads each side of an axis alike
                (ph, pw) = op.pad
                x = L.ZeroPadding2D(((ph, ph), (pw, pw)), name=name(op.name, "_pad"))(x)
            layer = L.Conv2D(op.weight.shape[0], op.weight.shape[2:], strides=op.stride,
                             dilation_rate=op.dilation, groups=op.group, padding="valid",
                             use_bias=op.bias is not None, name=name(op.name))
            x = layer(x)
            layers.append((layer, [op.weight.transpose(2, 3, 1, 0)] + _bias(op.bias)))
        elif isinstance(op, Pool):
            cb, cr = op.crop
            if cb or cr:
                x = L.Cropping2D(((0, cb), (0, cr)), name=name(op.name, "_crop"))(x)
            top, left, bottom, right = op.pad
            if any(op.pad):
                x = (EdgePad2D(op.pad, name=name(op.name, "_pad"))(x) if op.method == "max"
                     else L.ZeroPadding2D(((top, bottom), (left, right)), name=name(op.name, "_pad"))(x))
            pool = L.MaxPooling2D if op.method == "max" else L.AveragePooling2D
            x = pool(op.kernel, op.stride, padding="valid", name=name(op.name))(x)
            if op.scale is not None:
                layer = ConstantScale(op.scale.shape, name=name(op.name, "_scale"))
                x = layer(x)
                layers.append((layer, [op.scale[:, :, None]]))
        elif isinstance(op, Activation):
            if op.fn == "relu":
                x = L.ReLU(negative_slope=op.slope, name=name(op.name))(x)
            else:
                x = L.Activation(op.fn, name=name(op.name))(x)
        elif isinstance(op, Flatten):
            readers = graph.consumers.get(op.dst, ())
            if op.dst not in outputs and readers and all(isinstance(r, Dense) for r in readers):
                hwc_order.add(op.dst)
            else:
                x = L.Permute((3, 1, 2), name=name(op.name, "_nchw"))(x)
            x = L.Flatten(name=name(op.name))(x)
        elif isinstance(op, Dense):
            weight = op.weight
            if op.src in hwc_order:
                sc, sh, sw = graph.shapes[_flatten_source(graph, op.src)]
                weight = weight.reshape(-1, sc, sh, sw).transpose(0, 2, 3, 1).reshape(weight.shape)
            layer = L.Dense(weight.shape[0], use_bias=op.bias is not None, name=name(op.name))
            x = layer(x)
            layers.append((layer, [weight.T] + _bias(op.bias)))
        else:
            assert isinstance(op, Softmax)
            x = L.Softmax(axis=-1, name=name(op.name))(x)
        env[op.dst] = x
    model = keras.Model(inp, {role: env[t] for role, t in graph.outputs.items()}, name=name(graph.name or "net"))
    for layer, weights in layers:
        layer.set_weights([np.ascontiguousarray(a, np.float32) for a in weights])
    return model


def _bias(bias: np.ndarray | None) -> list[np.ndarray]:
    return [] if bias is None else [bias]


def _flatten_source(graph: Graph, flat: str) -> str:
    return next(op.src for op in graph.ops if op.dst == flat)
