"""Read and write Caffe files, and load a prototxt + caffemodel pair into a checked `NetDef`.

Parsing and writing are protobuf's own (text format for .prototxt, binary for .caffemodel) with
the schema in `caffe_pb`. Both the current syntax (`layer { type: "Convolution" }`, BlobShape)
and the legacy V1 syntax (`layers { type: CONVOLUTION }`, blobs with num/channels/height/width)
are read; V1 is upgraded to the current form by Caffe's rules (UpgradeV1Net). Inputs may be given
as `input:` + `input_dim`/`input_shape` or as `Input` layers. Layers excluded in the TEST phase
by include/exclude rules (data layers, losses, accuracy of a train_val net) are dropped, as Caffe
does for a deploy net.

`load_net` is the one entry the engine, the backends and the converters use: it returns a
`NetDef` whose every weight blob has been matched to its prototxt layer by name and checked
against the shape the prototxt implies. Every failure is a one-line ModelError (exit 2) naming
the file, the layer, what was found and what was expected.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from google.protobuf import message as pb_message
from google.protobuf import text_format

from tracker.errors import ModelError
from tracker.files import atomic_write, read_regular_file
from tracker.model import caffe_pb
from tracker.model.netdef import LayerDef, NetDef
from tracker.model.shapes import LAYER_TYPES, infer_layer_shapes

# The layer types a prototxt may use: the table of the types the project runs, and "Input",
# whose layers become NetDef.inputs and never appear in NetDef.layers.
SUPPORTED_LAYER_TYPES = frozenset(LAYER_TYPES) | {"Input"}

# V1LayerParameter.LayerType name -> current type string (Caffe's UpgradeV1LayerType).
V1_TYPE_NAMES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution", "DATA": "Data", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence",
    "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice",
    "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}
_V1_ENUM = caffe_pb.V1LayerParameter.DESCRIPTOR.enum_types_by_name["LayerType"]
_TEST_PHASE = 1  # caffe.Phase.TEST: the phase a deploy net runs in


# ----------------------------------------------------------------------------- reading


# The largest model file read: a prototxt is text of a few kB; 256 MB of weights is a quarter of
# the Pi's memory, decoded twice over (protobuf, then numpy). /dev/zero named as weights grew to
# 23 GB before these bounds, and a FIFO hung the start.
MAX_FILE_BYTES = {"prototxt": 16 << 20, "caffemodel": 256 << 20}


def _read_bytes(path: Path, kind: str) -> bytes:
    """The bytes of a regular `kind` file (a key of MAX_FILE_BYTES), within its bound."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{kind} not found: {path}; expected an existing Caffe {kind} file")
    if path.is_dir():
        raise ModelError(f"{kind} {path} is a directory; expected a file")
    try:
        data = read_regular_file(path, MAX_FILE_BYTES[kind])
    except OSError as err:
        raise ModelError(f"cannot read {kind} {path}: {err.strerror or err}; expected a regular file of at most "
                         f"{MAX_FILE_BYTES[kind] >> 20} MB") from None
    if not data.strip():
        raise ModelError(f"{kind} {path} is empty ({len(data)} bytes); expected a Caffe "
                         f"NetParameter")
    return data


def read_prototxt(path: Path, *, upgrade: bool = True):
    """Parse a .prototxt (protobuf text format) into a caffe NetParameter.

    With `upgrade` (the default) a V1 `layers` net is returned in the current `layer` syntax.
    ModelError names the file and, for a syntax error, protobuf's line:column and reason.
    """
    data = _read_bytes(path, "prototxt")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ModelError(f"prototxt {path} is not text (byte {err.start} is not UTF-8); "
                         f"expected a Caffe net in protobuf text format (a binary .caffemodel?)"
                         ) from None
    net = caffe_pb.NetParameter()
    try:
        text_format.Parse(text, net)
    except text_format.ParseError as err:
        raise ModelError(f"prototxt {path} is not a valid Caffe net: {err}") from None
    if not len(net.layer) and not len(net.layers):
        raise ModelError(f"prototxt {path} defines no layers; expected `layer {{ ... }}` "
                         f"(or V1 `layers {{ ... }}`) entries")
    return upgrade_net(net, path) if upgrade else net


def read_caffemodel(path: Path, *, upgrade: bool = True):
    """Parse a .caffemodel (binary protobuf NetParameter); V1 upgraded unless `upgrade=False`.

    Fields this schema does not know are kept by protobuf as unknown fields, not errors.
    ModelError names the file, its size and protobuf's reason for a truncated/corrupt file.
    """
    data = _read_bytes(path, "caffemodel")
    net = caffe_pb.NetParameter()
    try:
        net.ParseFromString(data)
    except pb_message.DecodeError as err:
        raise ModelError(f"caffemodel {path} ({len(data)} bytes) is truncated or corrupt: "
                         f"{err}{_looks_like_text(data)}") from None
    if not len(net.layer) and not len(net.layers):
        raise ModelError(f"caffemodel {path} ({len(data)} bytes) holds no layers; expected a "
                         f"binary Caffe NetParameter{_looks_like_text(data)}")
    return upgrade_net(net, path) if upgrade else net


def _looks_like_text(data: bytes) -> str:
    """A hint for the commonest mix-up: a prototxt given where the caffemodel goes."""
    try:
        data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return " (the file is text: a prototxt given as the weights?)"


# ----------------------------------------------------------------------------- V1 upgrade


def upgrade_v1_layer(v1, source: Path | str = "<net>"):
    """A V1LayerParameter as a current LayerParameter (Caffe's UpgradeV1LayerParameter).

    The enum type becomes its type string; blobs_lr/weight_decay/param/blob_share_mode become
    ParamSpec entries; every *_param moves to the same-named field. Blobs are copied unchanged
    (legacy num/channels/height/width are resolved against the expected shape at load time, as
    Caffe's ShapeEquals does).
    """
    if not v1.HasField("type"):
        raise ModelError(f"{source}: V1 layer {v1.name!r} has no type (the V0 syntax of 2013, "
                         f"a `layer` inside `layers`, is not supported)")
    layer = caffe_pb.LayerParameter()
    for field, value in v1.ListFields():
        name = field.name
        if name == "name":
            layer.name = value
        elif name in ("bottom", "top", "loss_weight"):
            getattr(layer, name).extend(value)
        elif name in ("include", "exclude", "blobs"):
            for item in value:
                getattr(layer, name).add().CopyFrom(item)
        elif name == "type":
            enum_name = _V1_ENUM.values_by_number[value].name
            if enum_name not in V1_TYPE_NAMES:  # NONE
                raise ModelError(f"{source}: V1 layer {v1.name!r} has type NONE")
            layer.type = V1_TYPE_NAMES[enum_name]
        elif name.endswith("_param"):
            getattr(layer, name).CopyFrom(value)
    for i, param_name in enumerate(v1.param):
        _param_spec(layer, i).name = param_name
    for i, mode in enumerate(v1.blob_share_mode):
        _param_spec(layer, i).share_mode = mode
    for i, lr in enumerate(v1.blobs_lr):
        _param_spec(layer, i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        _param_spec(layer, i).decay_mult = decay
    return layer


def _param_spec(layer, index: int):
    while len(layer.param) <= index:
        layer.param.add()
    return layer.param[index]


def upgrade_net(net, source: Path | str = "<net>"):
    """`net` in the current syntax: V1 `layers` upgraded to `layer` (a new message if needed)."""
    if not len(net.layers):
        return net
    if len(net.layer):
        raise ModelError(f"{source}: mixes current `layer` and V1 `layers` entries; expected one "
                         f"syntax")
    # Every NetParameter field but the V1 layers, so their blobs are copied only once.
    upgraded = caffe_pb.NetParameter(input=net.input, input_dim=net.input_dim,
                                     input_shape=net.input_shape)
    for name in ("name", "force_backward", "debug_info"):
        if net.HasField(name):
            setattr(upgraded, name, getattr(net, name))
    if net.HasField("state"):
        upgraded.state.CopyFrom(net.state)
    for v1 in net.layers:
        upgraded.layer.add().CopyFrom(upgrade_v1_layer(v1, source))
    return upgraded


# ----------------------------------------------------------------------------- writing


def _v1_type_number(layer_type: str, layer_name: str) -> int:
    for enum_name, type_name in V1_TYPE_NAMES.items():
        if type_name == layer_type:
            return _V1_ENUM.values_by_name[enum_name].number
    raise ModelError(f"layer {layer_name!r} has type {layer_type!r}, which the V1 `layers` "
                     f"syntax cannot express")


def downgrade_to_v1(net):
    """A current-syntax NetParameter in the legacy V1 form (for old tools and round-trip tests).

    Input layers become net-level `input` with `input_dim` (4 per input, when every input is
    4-D, as V1-era nets wrote them) or else `input_shape` (V1 has no Input type); blobs are stored
    with num/channels/height/width (shapes of up to 4 axes, left-padded with 1s as Caffe's
    LegacyShape does); ParamSpecs become blobs_lr/weight_decay/param/blob_share_mode.
    """
    v1net = caffe_pb.NetParameter(name=net.name)
    if net.HasField("state"):
        v1net.state.CopyFrom(net.state)
    inputs = dict(_net_inputs(net, "<net>"))
    for layer in net.layer:
        if layer.type == "Input":
            inputs.update(_input_layer_shapes(layer, "<net>"))
    v1net.input.extend(inputs)
    if all(len(shape) == 4 for shape in inputs.values()):
        for shape in inputs.values():
            v1net.input_dim.extend(shape)
    else:
        for shape in inputs.values():
            v1net.input_shape.add(dim=shape)
    v1_fields = caffe_pb.V1LayerParameter.DESCRIPTOR.fields_by_name
    for layer in net.layer:
        if layer.type == "Input":
            continue
        v1 = v1net.layers.add(name=layer.name, type=_v1_type_number(layer.type, layer.name))
        v1.bottom.extend(layer.bottom)
        v1.top.extend(layer.top)
        v1.loss_weight.extend(layer.loss_weight)
        for rule in layer.include:
            v1.include.add().CopyFrom(rule)
        for rule in layer.exclude:
            v1.exclude.add().CopyFrom(rule)
        specs = list(layer.param)
        v1.blobs_lr.extend(spec.lr_mult for spec in specs)
        v1.weight_decay.extend(spec.decay_mult for spec in specs)
        # The V1 lists are matched by index, so write all names/modes or none.
        if any(spec.name for spec in specs):
            v1.param.extend(spec.name for spec in specs)
        if any(spec.HasField("share_mode") for spec in specs):
            v1.blob_share_mode.extend(spec.share_mode for spec in specs)
        for blob in layer.blobs:
            legacy = v1.blobs.add()
            dims = _legacy_dims(_blob_shape(blob), layer.name)
            legacy.num, legacy.channels, legacy.height, legacy.width = dims
            legacy.data.extend(blob.data)
            legacy.double_data.extend(blob.double_data)
        for field, value in layer.ListFields():
            if field.name.endswith("_param"):
                if field.name not in v1_fields:
                    raise ModelError(f"layer {layer.name!r}: {field.name} has no V1 form")
                getattr(v1, field.name).CopyFrom(value)
    return v1net


def _legacy_dims(shape: tuple[int, ...], where: str) -> tuple[int, int, int, int]:
    if len(shape) > 4:
        raise ModelError(f"{where}: shape {shape} has more than 4 axes; V1 cannot store it")
    n, c, h, w = (1,) * (4 - len(shape)) + tuple(int(d) for d in shape)
    return n, c, h, w


def array_to_blob(array: np.ndarray, blob=None):
    """A BlobProto holding `array` as float32 `data` with its shape in `shape.dim`."""
    blob = caffe_pb.BlobProto() if blob is None else blob
    array = np.asarray(array, dtype=np.float32)
    blob.shape.dim.extend(int(d) for d in array.shape)
    blob.data.extend(array.ravel().tolist())  # a list is ~4x faster than a numpy array here
    return blob


def to_net_parameter(netdef: NetDef, *, with_blobs: bool = True):
    """A current-syntax NetParameter for `netdef`: one Input layer per input (named after its
    blob), then every layer's param with its blobs (if `with_blobs`)."""
    net = caffe_pb.NetParameter(name=netdef.name)
    for blob_name, shape in netdef.inputs.items():
        layer = net.layer.add(name=blob_name, type="Input", top=[blob_name])
        layer.input_param.shape.add(dim=[int(d) for d in shape])
    for layer_def in netdef.layers:
        layer = net.layer.add()
        layer.CopyFrom(layer_def.param)
        layer.name, layer.type = layer_def.name, layer_def.type
        del layer.bottom[:], layer.top[:], layer.blobs[:]
        layer.bottom.extend(layer_def.bottoms)
        layer.top.extend(layer_def.tops)
        if with_blobs:
            for array in layer_def.blobs:
                array_to_blob(array, layer.blobs.add())
    return net


def _as_message(net, with_blobs: bool):
    """A current-syntax NetParameter for a NetDef or a (possibly V1) NetParameter."""
    if isinstance(net, NetDef):
        return to_net_parameter(net, with_blobs=with_blobs)
    return upgrade_net(net)


def write_caffemodel(path: Path, net, *, v1: bool = False) -> None:
    """Write `net` (a NetDef or a NetParameter) as a binary caffemodel.

    Current syntax by default; `v1=True` writes the legacy V1 `layers` form. Serialization is
    deterministic: the same net gives the same bytes.
    """
    message = _as_message(net, with_blobs=True)
    if v1:
        message = downgrade_to_v1(message)
    atomic_write(path, message.SerializeToString(deterministic=True))  # a model is shared: 0644


def write_prototxt(path: Path, net, *, v1: bool = False) -> None:
    """Write `net` (a NetDef or a NetParameter) as a prototxt, without weight blobs."""
    message = caffe_pb.NetParameter()
    message.CopyFrom(_as_message(net, with_blobs=False))
    for layer in message.layer:
        del layer.blobs[:]
    if v1:
        message = downgrade_to_v1(message)
    atomic_write(path, text_format.MessageToString(message).encode("utf-8"))


# ----------------------------------------------------------------------------- load_net


def _blob_shape(blob) -> tuple[int, ...]:
    """The blob's own shape: `shape.dim`, or legacy (num, channels, height, width)."""
    if _is_legacy(blob):
        return (blob.num, blob.channels, blob.height, blob.width)
    return tuple(int(d) for d in blob.shape.dim)


def _is_legacy(blob) -> bool:
    return any(blob.HasField(f) for f in ("num", "channels", "height", "width"))


def blob_to_array(blob, expected: tuple[int, ...] | None = None, where: str = "blob"
                  ) -> np.ndarray:
    """A BlobProto as a float32 array, in `expected` shape when given and compatible.

    A legacy 4-D blob matches `expected` when `expected` left-padded with 1s to 4 axes equals
    (num, channels, height, width) -- Caffe's ShapeEquals -- and is then reshaped to `expected`.
    float `data` is preferred; `double_data` is converted. ModelError names `where`.
    """
    shape = _blob_shape(blob)
    if any(d < 0 for d in shape):  # two negative sizes made a positive count, and numpy's reshape a traceback
        raise ModelError(f"{where} has shape {shape}; expected sizes >= 0")
    values = blob.data if len(blob.data) or not len(blob.double_data) else blob.double_data
    count = math.prod(shape)  # Python's integers: numpy's int64 product wrapped 2**32 x 2**32 round to 0
    if len(values) != count:
        raise ModelError(f"{where} has {len(values)} values but its shape {shape} needs {count}")
    array = np.array(values, dtype=np.float32).reshape(shape)
    if expected is None:
        return array
    expected = tuple(int(d) for d in expected)
    if _is_legacy(blob):
        ok = len(expected) <= 4 and (1,) * (4 - len(expected)) + expected == shape
    else:
        ok = shape == expected
    if not ok:
        raise ModelError(f"{where} has shape {shape}; the prototxt implies {expected}")
    return array.reshape(expected)


def _state_meets_rule(rule, level: int, stages: set[str]) -> bool:
    """Caffe's Net::StateMeetsRule for a TEST-phase state with `level` and `stages`."""
    if rule.HasField("phase") and rule.phase != _TEST_PHASE:
        return False
    if rule.HasField("min_level") and level < rule.min_level:
        return False
    if rule.HasField("max_level") and level > rule.max_level:
        return False
    if any(s not in stages for s in rule.stage):
        return False
    return not any(s in stages for s in rule.not_stage)


def _in_test_phase(layer, net, source: Path) -> bool:
    """Whether Caffe's FilterNet keeps `layer` in the TEST phase (with the net's level/stages)."""
    if len(layer.include) and len(layer.exclude):
        raise ModelError(f"prototxt {source}: layer {layer.name!r} has both include and exclude "
                         f"rules; Caffe allows one or the other")
    level, stages = net.state.level, set(net.state.stage)
    if len(layer.include):
        return any(_state_meets_rule(r, level, stages) for r in layer.include)
    return not any(_state_meets_rule(r, level, stages) for r in layer.exclude)


def _net_inputs(net, source: Path | str) -> dict[str, tuple[int, ...]]:
    """Inputs given at net level: `input` with `input_shape` or 4 `input_dim` each."""
    names = list(net.input)
    if not names:
        if len(net.input_shape) or len(net.input_dim):
            raise ModelError(f"prototxt {source}: input_shape/input_dim given without `input`")
        return {}
    _refuse_repeated_inputs(names, source)
    if len(net.input_shape):
        if len(net.input_shape) != len(names):
            raise ModelError(f"prototxt {source}: {len(names)} inputs but {len(net.input_shape)} "
                             f"input_shape entries; expected one per input")
        return {n: tuple(int(d) for d in s.dim) for n, s in zip(names, net.input_shape)}
    if len(net.input_dim) != 4 * len(names):
        raise ModelError(f"prototxt {source}: {len(names)} inputs need {4 * len(names)} input_dim "
                         f"values; found {len(net.input_dim)}")
    dims = [int(d) for d in net.input_dim]
    return {n: tuple(dims[4 * i:4 * i + 4]) for i, n in enumerate(names)}


def _refuse_repeated_inputs(names: list[str], source: Path | str) -> None:
    """One blob per input name, as Caffe has it (a repeated name was kept once, with one of the
    shapes given for it)."""
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ModelError(f"prototxt {source}: input {name!r} is declared twice")


def _input_layer_shapes(layer, source: Path | str) -> dict[str, tuple[int, ...]]:
    shapes = list(layer.input_param.shape)
    if len(shapes) not in (1, len(layer.top)) or not len(layer.top):
        raise ModelError(f"prototxt {source}: Input layer {layer.name!r} has {len(layer.top)} "
                         f"tops and {len(shapes)} shapes; expected one shape, or one per top")
    _refuse_repeated_inputs(list(layer.top), source)
    return {top: tuple(int(d) for d in (shapes[i] if len(shapes) > 1 else shapes[0]).dim)
            for i, top in enumerate(layer.top)}


def _structure(net, source: Path) -> NetDef:
    """The TEST-phase NetDef of a prototxt NetParameter, without weights."""
    inputs = _net_inputs(net, source)
    layers: list[LayerDef] = []
    seen: set[str] = set()
    for layer in net.layer:
        if not _in_test_phase(layer, net, source):
            continue
        if layer.type not in SUPPORTED_LAYER_TYPES:
            raise ModelError(f"prototxt {source}: layer {layer.name!r} has type {layer.type!r}, "
                             f"which the engine does not support (supported: "
                             f"{', '.join(sorted(SUPPORTED_LAYER_TYPES))})")
        if layer.name in seen:
            raise ModelError(f"prototxt {source}: two layers are named {layer.name!r}; weights "
                             f"are matched by name, so names must be unique")
        seen.add(layer.name)
        if layer.type == "Input":
            for top, shape in _input_layer_shapes(layer, source).items():
                if top in inputs:
                    raise ModelError(f"prototxt {source}: input {top!r} is declared twice")
                inputs[top] = shape
            continue
        param = caffe_pb.LayerParameter()
        param.CopyFrom(layer)
        del param.blobs[:]
        layers.append(LayerDef(layer.name, layer.type, tuple(layer.bottom), tuple(layer.top),
                               param, ()))
    if not inputs:
        raise ModelError(f"prototxt {source}: the net declares no input; expected an Input layer "
                         f"or `input:` with `input_shape`/`input_dim`")
    for name, shape in inputs.items():
        if not shape or min(shape) <= 0:
            raise ModelError(f"prototxt {source}: input {name!r} has shape {shape}; expected "
                             f"positive dimensions (N, C, H, W)")
    if not layers:
        raise ModelError(f"prototxt {source}: no layers are left for the TEST phase")
    produced = set(inputs)
    for layer in layers:  # as Caffe: a blob has one source, unless a layer works on it in place
        for top in layer.tops:
            if top in produced and top not in layer.bottoms:
                raise ModelError(f"prototxt {source}: layer {layer.name!r} writes blob {top!r}, which an input or an "
                                 "earlier layer already produces; expected a new name, or the layer's own bottom "
                                 "(in place)")
            produced.add(top)
    return NetDef(net.name, inputs, layers)


def load_net(prototxt: Path, weights: Path | None) -> NetDef:
    """Load `prototxt` (+ `weights`, a caffemodel) into a NetDef for the TEST phase.

    Weights are matched to layers by name (layers only in the caffemodel are ignored, as Caffe
    does); every layer that has parameters must find exactly the blobs its prototxt implies, in
    the implied shapes. `weights=None` gives a NetDef with empty `blobs` (for shape inference and
    for generating weights). Raises ModelError (one line, exit 2) for a missing/corrupt file, an
    unsupported layer type, a layer without weights, or a blob of the wrong count or shape.
    """
    prototxt = Path(prototxt)
    structure = _structure(read_prototxt(prototxt), prototxt)
    try:
        shapes = infer_layer_shapes(structure)
    except ModelError as err:
        raise ModelError(f"prototxt {prototxt}: {err}") from None
    if weights is None:
        return structure
    weights = Path(weights)
    stored = {layer.name: layer for layer in read_caffemodel(weights).layer}
    layers = []
    for layer, layer_shapes in zip(structure.layers, shapes):
        expected = layer_shapes.params
        found = stored.get(layer.name)
        count = len(found.blobs) if found is not None else 0
        if expected and found is None:
            raise ModelError(f"caffemodel {weights} has no weights for layer {layer.name!r} "
                             f"({layer.type} in {prototxt.name}); expected {len(expected)} "
                             f"blobs of shapes {', '.join(map(str, expected))}")
        if count != len(expected):
            raise ModelError(f"caffemodel {weights}: layer {layer.name!r} ({layer.type}) has "
                             f"{count} blobs; {prototxt.name} implies {len(expected)}"
                             + (f" of shapes {', '.join(map(str, expected))}" if expected else ""))
        blobs = tuple(
            blob_to_array(blob, shape, f"caffemodel {weights}: layer {layer.name!r} blob {i}")
            for i, (blob, shape) in enumerate(zip(found.blobs, expected))) if expected and found is not None else ()
        layers.append(LayerDef(layer.name, layer.type, layer.bottoms, layer.tops, layer.param,
                               blobs))
    return NetDef(structure.name, structure.inputs, layers)

