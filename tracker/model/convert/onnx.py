"""The lowered graph (`graph.Graph`) as an ONNX model (opset 17), NCHW like Caffe.

Input "data" (N, C, H, W) float32 with a symbolic batch; outputs "prob" (N, P) and "embedding"
(N, D). Convolutions keep OIHW weights; pooling follows graph.Pool with explicit Slice (crop),
Pad (mode "edge" for MAX, zeros for AVE), a valid MaxPool/AveragePool and a Mul by the constant
divisor map for AVE; Flatten of NCHW is Caffe's order already; InnerProduct is Gemm(transB=1).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tracker.model.convert.graph import Activation, Conv, Dense, Flatten, Graph, Pool, Softmax, unique_namer

OPSET = 17
POOL_STEPS = ("crop", "pad", "scale")  # the nodes a Pool op may have besides its pooling node


def _node_names(graph: Graph) -> dict[tuple[str, str], str]:
    """The names of the nodes besides those of the graph's ops (named as the op): (pool op name,
    step of POOL_STEPS) -> "<op>_<step>", (role, "output") -> "<role>_output" for an output's
    Identity node; each unique (graph.unique_namer), as ONNX Runtime refuses a model with two
    nodes of one name. quantize_int8 finds a float op's nodes here."""
    unique = unique_namer(op.name for op in graph.ops)
    names = {(op.name, step): unique(f"{op.name}_{step}")
             for op in graph.ops if isinstance(op, Pool) for step in POOL_STEPS}
    names.update({(role, "output"): unique(f"{role}_output") for role in graph.outputs})
    return names


def build_onnx(graph: Graph) -> onnx.ModelProto:
    """An ONNX ModelProto for `graph` (checked with onnx.checker)."""
    nodes: list = []
    inits: list = []
    node_name = _node_names(graph)

    def const(name: str, array: np.ndarray) -> str:
        name = "const/" + name
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    env = {graph.input: "data"}
    # An output tensor is named after its role where it is made: an Identity node to rename it
    # would copy it on every run. Only a tensor serving two roles needs one.
    role_of: dict[str, str] = {}
    for role, tensor in graph.outputs.items():
        role_of.setdefault(tensor, role)
    for op in graph.ops:
        # Internal tensors are prefixed, so never data/prob/logits/embedding: "caffe/" + the graph's
        # tensor, and the steps this emitter adds inside an op "cropped/", "padded/" or "pooled/" +
        # the op's output tensor (a prefix per step, not a suffix: a layer's name can end in "_cropped").
        x, y = env[op.src], role_of.get(op.dst, "caffe/" + op.dst)
        if isinstance(op, Conv):
            inputs = [x, const(op.name + "_W", op.weight.astype(np.float32))]
            if op.bias is not None:
                inputs.append(const(op.name + "_B", op.bias.astype(np.float32)))
            ph, pw = op.pad
            nodes.append(helper.make_node("Conv", inputs, [y], name=op.name,
                                          kernel_shape=list(op.weight.shape[2:]),
                                          strides=list(op.stride), pads=[ph, pw, ph, pw],
                                          dilations=list(op.dilation), group=op.group))
        elif isinstance(op, Pool):
            cb, cr = op.crop
            if cb or cr:
                h, w = graph.shapes[op.src][1:]
                nodes.append(helper.make_node(
                    "Slice", [x, const(op.name + "_crop_start", np.array([0, 0], np.int64)),
                              const(op.name + "_crop_end", np.array([h - cb, w - cr], np.int64)),
                              const(op.name + "_crop_axes", np.array([2, 3], np.int64))],
                    ["cropped/" + op.dst], name=node_name[op.name, "crop"]))
                x = "cropped/" + op.dst
            top, left, bottom, right = op.pad
            if any(op.pad):
                pads = const(op.name + "_pads", np.array([0, 0, top, left, 0, 0, bottom, right], np.int64))
                nodes.append(helper.make_node("Pad", [x, pads], ["padded/" + op.dst], name=node_name[op.name, "pad"],
                                              mode="edge" if op.method == "max" else "constant"))
                x = "padded/" + op.dst
            kind = "MaxPool" if op.method == "max" else "AveragePool"
            pooled = y if op.scale is None else "pooled/" + op.dst
            nodes.append(helper.make_node(kind, [x], [pooled], name=op.name,
                                          kernel_shape=list(op.kernel), strides=list(op.stride)))
            if op.scale is not None:
                nodes.append(helper.make_node(
                    "Mul", [pooled, const(op.name + "_scale", op.scale[None, None])], [y],
                    name=node_name[op.name, "scale"]))
        elif isinstance(op, Activation):
            if op.fn == "relu" and op.slope:
                nodes.append(helper.make_node("LeakyRelu", [x], [y], name=op.name, alpha=op.slope))
            else:
                kind = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}[op.fn]
                nodes.append(helper.make_node(kind, [x], [y], name=op.name))
        elif isinstance(op, Flatten):
            nodes.append(helper.make_node("Flatten", [x], [y], name=op.name, axis=1))
        elif isinstance(op, Dense):
            inputs = [x, const(op.name + "_W", op.weight.astype(np.float32))]
            if op.bias is not None:
                inputs.append(const(op.name + "_B", op.bias.astype(np.float32)))
            nodes.append(helper.make_node("Gemm", inputs, [y], name=op.name, transB=1))
        else:
            assert isinstance(op, Softmax)
            nodes.append(helper.make_node("Softmax", [x], [y], name=op.name, axis=1))
        env[op.dst] = y
    outputs = []
    for role, tensor in graph.outputs.items():
        if env[tensor] != role:
            nodes.append(helper.make_node("Identity", [env[tensor]], [role], name=node_name[role, "output"]))
        outputs.append(helper.make_tensor_value_info(role, TensorProto.FLOAT, ["N", graph.shapes[tensor][0]]))
    c, h, w = graph.input_shape
    onnx_graph = helper.make_graph(
        nodes, graph.name or "net",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", c, h, w])], outputs, inits)
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tracker.convert")
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


def quantize_int8(graph: Graph, path, samples: np.ndarray, float_ops: tuple[str, ...] = ()) -> None:
    """Write to `path` the static int8 quantisation of build_onnx(graph) (QDQ, per-channel int8 weights,
    uint8 activations), calibrated on `samples` (N, C, H, W) float32 (min/max of each activation
    over the set). Ops named in `float_ops` (graph op names; see graph.int8_float_ops) stay
    float32 -- sessions must then be created without ONNX Runtime's QDQPropagationTransformer,
    which would otherwise move the first QuantizeLinear above a float MaxPool and leave that
    pooling to a slow uint8 NCHW kernel."""
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._items = iter(samples[i:i + 1] for i in range(len(samples)))

        def get_next(self):
            x = next(self._items, None)
            return None if x is None else {"data": x}

    model = build_onnx(graph)
    _out_of_the_quantisers_way(model)
    step_names = _node_names(graph)
    keep = set(float_ops) | {step_names[name, step] for name in float_ops for step in POOL_STEPS if (name, step) in step_names}
    exclude = [n.name for n in model.graph.node if n.name in keep]
    advice = _PreProcessingAdvice()
    logging.getLogger().addFilter(advice)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = Path(tmp) / "fp32.onnx"
            onnx.save(model, fp32)
            quantize_static(str(fp32), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=exclude)
    finally:
        logging.getLogger().removeFilter(advice)


class _PreProcessingAdvice(logging.Filter):
    """Drops ONNX Runtime's "Please consider (to run) pre-processing before quantization" warnings,
    which quantize_static logs twice on the root logger for every model not run through its
    pre-processing script: advice to the code that calls it, which the user of `tracker convert` or
    of the guard (whose int8 ONNX backend converts on its first start) cannot act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _out_of_the_quantisers_way(model: onnx.ModelProto) -> None:
    """Rename, in place, every tensor but the graph's input and outputs to its name + "#". ONNX
    Runtime's quantiser names what it adds for a tensor after it (its name + "_scale",
    "_zero_point", "_quantized", ...): a net with layers "q" and "q_scale" had two tensors
    "caffe/q_scale", and the quantiser failed with a KeyError traceback. A name it adds never ends
    in "#", so it is never one of these."""
    keep = {info.name for info in (*model.graph.input, *model.graph.output)}

    def renamed(name: str) -> str:
        return name if not name or name in keep else name + "#"  # "": an optional input left out

    for node in model.graph.node:
        node.input[:] = [renamed(name) for name in node.input]
        node.output[:] = [renamed(name) for name in node.output]
    for tensor in (*model.graph.initializer, *model.graph.value_info):
        tensor.name = renamed(tensor.name)
