"""The face CNN as a trainable torch module, and its export back to a caffemodel.

The module is built from the lowered graph of the prototxt (`tracker.model.convert.graph.lower`),
so it is exactly the net the guard runs (same layers, Caffe's pooling and flatten order), plus one
training-only change: every Convolution and InnerProduct whose output feeds a ReLU is followed by
BatchNorm. Without it both losses collapsed in a first trial on this data (fc1 all zeros, or every
embedding the same; see ../shared/datasets/README.md). In eval mode a BatchNorm is an affine map
per channel, so `export_netdef` folds it exactly into the preceding layer's weights and bias:

    scale = gamma / sqrt(running_var + eps);  W' = W * scale (per output);  b' = (b - mean) * scale + beta

so such a layer must have a bias (a prototxt's `bias_term: false` there is a ModelError when the
module is built: its export dropped b' and failed the parity check only after the training).

The exported net has the prototxt's layers only and runs on every backend as before.

`forward(x)`: x (N, 1, 88, 88) float32 in [0, 1] -> (logits (N, P) before the softmax, embedding
(N, D) after its ReLU), the graph's "prob" input and "embedding" outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F

from tracker.errors import ModelError
from tracker.model.convert.graph import Activation, Conv, Dense, Flatten, Graph, Pool, Softmax, float_softmax
from tracker.model.netdef import LayerDef, NetDef

BN_EPS = 1e-5


class TrainableNet(torch.nn.Module):
    """See the module docstring. Built from a Graph with weights (the starting point)."""

    def __init__(self, graph: Graph):
        super().__init__()
        graph = float_softmax(graph)  # train on logits; the Softmax is the caffemodel's, unchanged
        self.outputs = (graph.outputs["logits"], graph.outputs["embedding"])
        self.input_name = graph.input
        self.layers = torch.nn.ModuleDict()
        self.norms = torch.nn.ModuleDict()
        self._steps: list[tuple[str, str, Callable[[torch.Tensor], torch.Tensor]]] = []
        for op in graph.ops:
            self._steps.append((op.src, op.dst, self._step(op, graph)))

    def _step(self, op, graph: Graph) -> Callable[[torch.Tensor], torch.Tensor]:
        feeds_relu = any(isinstance(c, Activation) and c.fn == "relu" for c in graph.consumers.get(op.dst, ()))
        layer: torch.nn.Conv2d | torch.nn.Linear
        norm: torch.nn.BatchNorm2d | torch.nn.BatchNorm1d | None
        if isinstance(op, (Conv, Dense)) and feeds_relu and op.bias is None:
            # the BatchNorm's shift (beta - mean * scale) is folded into the bias at export
            raise ModelError(f"train: layer {op.name!r} has no bias (bias_term: false) and feeds a ReLU; training "
                             "folds a BatchNorm into such a layer, whose shift needs a bias: expected bias_term true")
        if isinstance(op, Conv):
            o, i, kh, kw = op.weight.shape
            if op.group != 1:
                raise ModelError(f"train: layer {op.name!r} has group {op.group}; training supports group 1")
            layer = torch.nn.Conv2d(i, o, (kh, kw), op.stride, op.pad, op.dilation, bias=op.bias is not None)
            norm = torch.nn.BatchNorm2d(o, eps=BN_EPS) if feeds_relu else None
        elif isinstance(op, Dense):
            o, k = op.weight.shape
            layer = torch.nn.Linear(k, o, bias=op.bias is not None)
            norm = torch.nn.BatchNorm1d(o, eps=BN_EPS) if feeds_relu else None
        elif isinstance(op, Pool):
            if op.method != "max" or op.scale is not None:
                raise ModelError(f"train: layer {op.name!r} is {op.method} pooling; training supports max pooling")
            crop_b, crop_r = op.crop
            top, left, bottom, right = op.pad

            def pool(x, op=op):
                if crop_b or crop_r:
                    x = x[:, :, :x.shape[2] - crop_b, :x.shape[3] - crop_r]
                if top or left or bottom or right:
                    x = F.pad(x, (left, right, top, bottom), mode="replicate")
                return F.max_pool2d(x, op.kernel, op.stride)
            return pool
        elif isinstance(op, Activation):
            if op.fn != "relu" or op.slope:
                raise ModelError(f"train: layer {op.name!r} is {op.fn}; training supports ReLU")
            return F.relu
        elif isinstance(op, Flatten):
            return lambda x: x.flatten(1)  # NCHW flattened is Caffe's C, H, W order
        elif isinstance(op, Softmax):
            raise ModelError(f"train: softmax {op.name!r} inside the net; training supports one final softmax")
        else:
            raise ModelError(f"train: layer {op.name!r} ({type(op).__name__}) is not supported for training")
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.asarray(op.weight, np.float32)))
            if op.bias is not None and layer.bias is not None:
                layer.bias.copy_(torch.from_numpy(np.asarray(op.bias, np.float32)))
        self.layers[op.name] = layer
        if norm is None:
            return layer
        self.norms[op.name] = norm
        return lambda x: norm(layer(x))  # type: ignore[misc]  # mypy loses the narrowing of norm in the lambda

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tensors = {self.input_name: x}
        for src, dst, step in self._steps:
            tensors[dst] = step(tensors[src])
        return tensors[self.outputs[0]], tensors[self.outputs[1]]


def folded_weights(net: TrainableNet) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Layer name -> (weight, bias) float32 in Caffe's layouts with every BatchNorm folded in
    (see the module docstring); uses the running statistics, as eval mode does."""
    result = {}
    for name, module in net.layers.items():
        layer = cast("torch.nn.Conv2d | torch.nn.Linear", module)  # what _step puts there
        weight = layer.weight.detach().double()
        bias = layer.bias.detach().double() if layer.bias is not None else torch.zeros(weight.shape[0], dtype=torch.float64)
        if name in net.norms:
            norm = cast("torch.nn.BatchNorm2d | torch.nn.BatchNorm1d", net.norms[name])
            mean, var = cast(torch.Tensor, norm.running_mean), cast(torch.Tensor, norm.running_var)  # tracked: BN's default
            scale = norm.weight.detach().double() / torch.sqrt(var.double() + norm.eps)
            weight = weight * scale.reshape(-1, *([1] * (weight.dim() - 1)))
            bias = (bias - mean.double()) * scale + norm.bias.detach().double()
        result[name] = (weight.float().numpy(), bias.float().numpy())
    return result


def export_netdef(net: TrainableNet, structure: NetDef) -> NetDef:
    """`structure` (the prototxt's NetDef) with the trained, folded weights as its blobs; raises
    ModelError when a layer with parameters has no trained counterpart or another shape."""
    weights = folded_weights(net)
    layers = []
    for layer in structure.layers:
        blobs: tuple[np.ndarray, ...] = ()
        if layer.type in ("Convolution", "InnerProduct"):
            if layer.name not in weights:
                raise ModelError(f"train: layer {layer.name!r} of the prototxt was not trained")
            weight, bias = weights[layer.name]
            if layer.type == "InnerProduct" and layer.param.inner_product_param.transpose:
                weight = weight.T
            blobs = (np.ascontiguousarray(weight),)
            has_bias = (layer.param.convolution_param.bias_term if layer.type == "Convolution"
                        else layer.param.inner_product_param.bias_term)
            if has_bias:
                blobs += (np.ascontiguousarray(bias),)
        elif layer.blobs:
            raise ModelError(f"train: layer {layer.name!r} ({layer.type}) has parameters training does not set")
        layers.append(LayerDef(layer.name, layer.type, layer.bottoms, layer.tops, layer.param, blobs))
    return NetDef(structure.name, dict(structure.inputs), layers)
