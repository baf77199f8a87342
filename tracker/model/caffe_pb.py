"""Caffe's protobuf messages, built at import time from a schema written in Python.

The schema below restates the parts of BVLC Caffe's `src/caffe/proto/caffe.proto` (package
`caffe`, proto2) that prototxt and caffemodel files use: the same message and field names, the
same field numbers, types, labels, packing and defaults. It is turned into a
`FileDescriptorProto`, loaded into a private `DescriptorPool` (so it never clashes with another
`caffe` package a user may have imported) and the message classes come from protobuf's
`message_factory`. Parsing and writing are therefore done by protobuf itself: text format for
`.prototxt` and the binary wire format for `.caffemodel`; fields this schema does not name are kept
as unknown fields when a binary file is parsed, so newer or forked caffemodels still load.

Covered: NetParameter (current `layer` and legacy V1 `layers`), BlobShape, BlobProto,
BlobProtoVector, NetState, NetStateRule, ParamSpec, FillerParameter, LayerParameter with the
parameters of every layer the engine runs plus those that real train/deploy nets carry (data,
loss, accuracy, ...), and V1LayerParameter with its `LayerType` enum. The V0 (`layer` inside
`layers`) syntax of 2013 is not covered.

Exports the message classes as module attributes: `NetParameter`, `LayerParameter`,
`V1LayerParameter`, `BlobProto`, `BlobShape`, `ConvolutionParameter`, ... (every message below).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FDP = descriptor_pb2.FieldDescriptorProto

_SCALARS = {
    "double": _FDP.TYPE_DOUBLE,
    "float": _FDP.TYPE_FLOAT,
    "int32": _FDP.TYPE_INT32,
    "int64": _FDP.TYPE_INT64,
    "uint32": _FDP.TYPE_UINT32,
    "uint64": _FDP.TYPE_UINT64,
    "bool": _FDP.TYPE_BOOL,
    "string": _FDP.TYPE_STRING,
    "bytes": _FDP.TYPE_BYTES,
}

# A field is (label, type, name, number, default-or-None, packed); `o`/`r` keep the table readable.


def o(type_: str, name: str, number: int, default: object = None) -> tuple:
    """An `optional` field; `default` as in caffe.proto (enum defaults by value name)."""
    return ("optional", type_, name, number, default, False)


def r(type_: str, name: str, number: int, packed: bool = False) -> tuple:
    """A `repeated` field; `packed=True` where caffe.proto says `[packed = true]`."""
    return ("repeated", type_, name, number, None, packed)


_ENGINE = {"Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2))}
_POOL_METHOD = (("MAX", 0), ("AVE", 1), ("STOCHASTIC", 2))

# (message name, fields, nested enums {name: ((value name, number), ...)}), in caffe.proto's order.
_MESSAGES: tuple[tuple[str, tuple[tuple, ...], dict], ...] = (
    ("BlobShape", (r("int64", "dim", 1, packed=True),), {}),
    ("BlobProto", (
        o("BlobShape", "shape", 7),
        r("float", "data", 5, packed=True),
        r("float", "diff", 6, packed=True),
        r("double", "double_data", 8, packed=True),
        r("double", "double_diff", 9, packed=True),
        o("int32", "num", 1, 0),
        o("int32", "channels", 2, 0),
        o("int32", "height", 3, 0),
        o("int32", "width", 4, 0),
    ), {}),
    ("BlobProtoVector", (r("BlobProto", "blobs", 1),), {}),
    ("FillerParameter", (
        o("string", "type", 1, "constant"),
        o("float", "value", 2, 0.0),
        o("float", "min", 3, 0.0),
        o("float", "max", 4, 1.0),
        o("float", "mean", 5, 0.0),
        o("float", "std", 6, 1.0),
        o("int32", "sparse", 7, -1),
        o("VarianceNorm", "variance_norm", 8, "FAN_IN"),
    ), {"VarianceNorm": (("FAN_IN", 0), ("FAN_OUT", 1), ("AVERAGE", 2))}),
    ("NetParameter", (
        o("string", "name", 1),
        r("string", "input", 3),
        r("BlobShape", "input_shape", 8),
        r("int32", "input_dim", 4),
        o("bool", "force_backward", 5, False),
        o("NetState", "state", 6),
        o("bool", "debug_info", 7, False),
        r("LayerParameter", "layer", 100),
        r("V1LayerParameter", "layers", 2),
    ), {}),
    ("NetState", (
        o("Phase", "phase", 1, "TEST"),
        o("int32", "level", 2, 0),
        r("string", "stage", 3),
    ), {}),
    ("NetStateRule", (
        o("Phase", "phase", 1),
        o("int32", "min_level", 2),
        o("int32", "max_level", 3),
        r("string", "stage", 4),
        r("string", "not_stage", 5),
    ), {}),
    ("ParamSpec", (
        o("string", "name", 1),
        o("DimCheckMode", "share_mode", 2),
        o("float", "lr_mult", 3, 1.0),
        o("float", "decay_mult", 4, 1.0),
    ), {"DimCheckMode": (("STRICT", 0), ("PERMISSIVE", 1))}),
    ("LayerParameter", (
        o("string", "name", 1),
        o("string", "type", 2),
        r("string", "bottom", 3),
        r("string", "top", 4),
        o("Phase", "phase", 10),
        r("float", "loss_weight", 5),
        r("ParamSpec", "param", 6),
        r("BlobProto", "blobs", 7),
        r("bool", "propagate_down", 11),
        r("NetStateRule", "include", 8),
        r("NetStateRule", "exclude", 9),
        o("TransformationParameter", "transform_param", 100),
        o("LossParameter", "loss_param", 101),
        o("AccuracyParameter", "accuracy_param", 102),
        o("ArgMaxParameter", "argmax_param", 103),
        o("BatchNormParameter", "batch_norm_param", 139),
        o("BiasParameter", "bias_param", 141),
        o("ClipParameter", "clip_param", 148),
        o("ConcatParameter", "concat_param", 104),
        o("ContrastiveLossParameter", "contrastive_loss_param", 105),
        o("ConvolutionParameter", "convolution_param", 106),
        o("CropParameter", "crop_param", 144),
        o("DataParameter", "data_param", 107),
        o("DropoutParameter", "dropout_param", 108),
        o("DummyDataParameter", "dummy_data_param", 109),
        o("EltwiseParameter", "eltwise_param", 110),
        o("ELUParameter", "elu_param", 140),
        o("EmbedParameter", "embed_param", 137),
        o("ExpParameter", "exp_param", 111),
        o("FlattenParameter", "flatten_param", 135),
        o("HDF5DataParameter", "hdf5_data_param", 112),
        o("HDF5OutputParameter", "hdf5_output_param", 113),
        o("HingeLossParameter", "hinge_loss_param", 114),
        o("ImageDataParameter", "image_data_param", 115),
        o("InfogainLossParameter", "infogain_loss_param", 116),
        o("InnerProductParameter", "inner_product_param", 117),
        o("InputParameter", "input_param", 143),
        o("LogParameter", "log_param", 134),
        o("LRNParameter", "lrn_param", 118),
        o("MemoryDataParameter", "memory_data_param", 119),
        o("MVNParameter", "mvn_param", 120),
        o("ParameterParameter", "parameter_param", 145),
        o("PoolingParameter", "pooling_param", 121),
        o("PowerParameter", "power_param", 122),
        o("PReLUParameter", "prelu_param", 131),
        o("PythonParameter", "python_param", 130),
        o("ReductionParameter", "reduction_param", 136),
        o("ReLUParameter", "relu_param", 123),
        o("ReshapeParameter", "reshape_param", 133),
        o("ScaleParameter", "scale_param", 142),
        o("SigmoidParameter", "sigmoid_param", 124),
        o("SoftmaxParameter", "softmax_param", 125),
        o("SPPParameter", "spp_param", 132),
        o("SliceParameter", "slice_param", 126),
        o("SwishParameter", "swish_param", 147),
        o("TanHParameter", "tanh_param", 127),
        o("ThresholdParameter", "threshold_param", 128),
        o("TileParameter", "tile_param", 138),
    ), {}),
    ("TransformationParameter", (
        o("float", "scale", 1, 1.0),
        o("bool", "mirror", 2, False),
        o("uint32", "crop_size", 3, 0),
        o("string", "mean_file", 4),
        r("float", "mean_value", 5),
        o("bool", "force_color", 6, False),
        o("bool", "force_gray", 7, False),
    ), {}),
    ("LossParameter", (
        o("int32", "ignore_label", 1),
        o("NormalizationMode", "normalization", 3, "VALID"),
        o("bool", "normalize", 2),
    ), {"NormalizationMode": (("FULL", 0), ("VALID", 1), ("BATCH_SIZE", 2), ("NONE", 3))}),
    ("AccuracyParameter", (
        o("uint32", "top_k", 1, 1),
        o("int32", "axis", 2, 1),
        o("int32", "ignore_label", 3),
    ), {}),
    ("ArgMaxParameter", (
        o("bool", "out_max_val", 1, False),
        o("uint32", "top_k", 2, 1),
        o("int32", "axis", 3),
    ), {}),
    ("BatchNormParameter", (
        o("bool", "use_global_stats", 1),
        o("float", "moving_average_fraction", 2, 0.999),
        o("float", "eps", 3, 1e-5),
    ), {}),
    ("BiasParameter", (
        o("int32", "axis", 1, 1),
        o("int32", "num_axes", 2, 1),
        o("FillerParameter", "filler", 3),
    ), {}),
    ("ClipParameter", (o("float", "min", 1), o("float", "max", 2)), {}),
    ("ConcatParameter", (
        o("int32", "axis", 2, 1),
        o("uint32", "concat_dim", 1, 1),
    ), {}),
    ("ContrastiveLossParameter", (
        o("float", "margin", 1, 1.0),
        o("bool", "legacy_version", 2, False),
    ), {}),
    ("ConvolutionParameter", (
        o("uint32", "num_output", 1),
        o("bool", "bias_term", 2, True),
        r("uint32", "pad", 3),
        r("uint32", "kernel_size", 4),
        r("uint32", "stride", 6),
        r("uint32", "dilation", 18),
        o("uint32", "pad_h", 9, 0),
        o("uint32", "pad_w", 10, 0),
        o("uint32", "kernel_h", 11),
        o("uint32", "kernel_w", 12),
        o("uint32", "stride_h", 13),
        o("uint32", "stride_w", 14),
        o("uint32", "group", 5, 1),
        o("FillerParameter", "weight_filler", 7),
        o("FillerParameter", "bias_filler", 8),
        o("Engine", "engine", 15, "DEFAULT"),
        o("int32", "axis", 16, 1),
        o("bool", "force_nd_im2col", 17, False),
    ), _ENGINE),
    ("CropParameter", (o("int32", "axis", 1, 2), r("uint32", "offset", 2)), {}),
    ("DataParameter", (
        o("string", "source", 1),
        o("uint32", "batch_size", 4),
        o("uint32", "rand_skip", 7, 0),
        o("DB", "backend", 8, "LEVELDB"),
        o("float", "scale", 2, 1.0),
        o("string", "mean_file", 3),
        o("uint32", "crop_size", 5, 0),
        o("bool", "mirror", 6, False),
        o("bool", "force_encoded_color", 9, False),
        o("uint32", "prefetch", 10, 4),
    ), {"DB": (("LEVELDB", 0), ("LMDB", 1))}),
    ("DropoutParameter", (o("float", "dropout_ratio", 1, 0.5),), {}),
    ("DummyDataParameter", (
        r("FillerParameter", "data_filler", 1),
        r("BlobShape", "shape", 6),
        r("uint32", "num", 2),
        r("uint32", "channels", 3),
        r("uint32", "height", 4),
        r("uint32", "width", 5),
    ), {}),
    ("EltwiseParameter", (
        o("EltwiseOp", "operation", 1, "SUM"),
        r("float", "coeff", 2),
        o("bool", "stable_prod_grad", 3, True),
    ), {"EltwiseOp": (("PROD", 0), ("SUM", 1), ("MAX", 2))}),
    ("ELUParameter", (o("float", "alpha", 1, 1.0),), {}),
    ("EmbedParameter", (
        o("uint32", "num_output", 1),
        o("uint32", "input_dim", 2),
        o("bool", "bias_term", 3, True),
        o("FillerParameter", "weight_filler", 4),
        o("FillerParameter", "bias_filler", 5),
    ), {}),
    ("ExpParameter", (
        o("float", "base", 1, -1.0),
        o("float", "scale", 2, 1.0),
        o("float", "shift", 3, 0.0),
    ), {}),
    ("FlattenParameter", (o("int32", "axis", 1, 1), o("int32", "end_axis", 2, -1)), {}),
    ("HDF5DataParameter", (
        o("string", "source", 1),
        o("uint32", "batch_size", 2),
        o("bool", "shuffle", 3, False),
    ), {}),
    ("HDF5OutputParameter", (o("string", "file_name", 1),), {}),
    ("HingeLossParameter", (o("Norm", "norm", 1, "L1"),), {"Norm": (("L1", 1), ("L2", 2))}),
    ("ImageDataParameter", (
        o("string", "source", 1),
        o("uint32", "batch_size", 4, 1),
        o("uint32", "rand_skip", 7, 0),
        o("bool", "shuffle", 8, False),
        o("uint32", "new_height", 9, 0),
        o("uint32", "new_width", 10, 0),
        o("bool", "is_color", 11, True),
        o("float", "scale", 2, 1.0),
        o("string", "mean_file", 3),
        o("uint32", "crop_size", 5, 0),
        o("bool", "mirror", 6, False),
        o("string", "root_folder", 12, ""),
    ), {}),
    ("InfogainLossParameter", (o("string", "source", 1), o("int32", "axis", 2, 1)), {}),
    ("InnerProductParameter", (
        o("uint32", "num_output", 1),
        o("bool", "bias_term", 2, True),
        o("FillerParameter", "weight_filler", 3),
        o("FillerParameter", "bias_filler", 4),
        o("int32", "axis", 5, 1),
        o("bool", "transpose", 6, False),
    ), {}),
    ("InputParameter", (r("BlobShape", "shape", 1),), {}),
    ("LogParameter", (
        o("float", "base", 1, -1.0),
        o("float", "scale", 2, 1.0),
        o("float", "shift", 3, 0.0),
    ), {}),
    ("LRNParameter", (
        o("uint32", "local_size", 1, 5),
        o("float", "alpha", 2, 1.0),
        o("float", "beta", 3, 0.75),
        o("NormRegion", "norm_region", 4, "ACROSS_CHANNELS"),
        o("float", "k", 5, 1.0),
        o("Engine", "engine", 6, "DEFAULT"),
    ), {"NormRegion": (("ACROSS_CHANNELS", 0), ("WITHIN_CHANNEL", 1)), **_ENGINE}),
    ("MemoryDataParameter", (
        o("uint32", "batch_size", 1),
        o("uint32", "channels", 2),
        o("uint32", "height", 3),
        o("uint32", "width", 4),
    ), {}),
    ("MVNParameter", (
        o("bool", "normalize_variance", 1, True),
        o("bool", "across_channels", 2, False),
        o("float", "eps", 3, 1e-9),
    ), {}),
    ("ParameterParameter", (o("BlobShape", "shape", 1),), {}),
    ("PoolingParameter", (
        o("PoolMethod", "pool", 1, "MAX"),
        o("uint32", "pad", 4, 0),
        o("uint32", "pad_h", 9, 0),
        o("uint32", "pad_w", 10, 0),
        o("uint32", "kernel_size", 2),
        o("uint32", "kernel_h", 5),
        o("uint32", "kernel_w", 6),
        o("uint32", "stride", 3, 1),
        o("uint32", "stride_h", 7),
        o("uint32", "stride_w", 8),
        o("Engine", "engine", 11, "DEFAULT"),
        o("bool", "global_pooling", 12, False),
        o("RoundMode", "round_mode", 13, "CEIL"),
    ), {"PoolMethod": _POOL_METHOD, "RoundMode": (("CEIL", 0), ("FLOOR", 1)), **_ENGINE}),
    ("PowerParameter", (
        o("float", "power", 1, 1.0),
        o("float", "scale", 2, 1.0),
        o("float", "shift", 3, 0.0),
    ), {}),
    ("PReLUParameter", (
        o("FillerParameter", "filler", 1),
        o("bool", "channel_shared", 2, False),
    ), {}),
    ("PythonParameter", (
        o("string", "module", 1),
        o("string", "layer", 2),
        o("string", "param_str", 3, ""),
        o("bool", "share_in_parallel", 4, False),
    ), {}),
    ("ReductionParameter", (
        o("ReductionOp", "operation", 1, "SUM"),
        o("int32", "axis", 2, 0),
        o("float", "coeff", 3, 1.0),
    ), {"ReductionOp": (("SUM", 1), ("ASUM", 2), ("SUMSQ", 3), ("MEAN", 4))}),
    ("ReLUParameter", (
        o("float", "negative_slope", 1, 0.0),
        o("Engine", "engine", 2, "DEFAULT"),
    ), _ENGINE),
    ("ReshapeParameter", (
        o("BlobShape", "shape", 1),
        o("int32", "axis", 2, 0),
        o("int32", "num_axes", 3, -1),
    ), {}),
    ("ScaleParameter", (
        o("int32", "axis", 1, 1),
        o("int32", "num_axes", 2, 1),
        o("FillerParameter", "filler", 3),
        o("bool", "bias_term", 4, False),
        o("FillerParameter", "bias_filler", 5),
    ), {}),
    ("SigmoidParameter", (o("Engine", "engine", 1, "DEFAULT"),), _ENGINE),
    ("SliceParameter", (
        o("int32", "axis", 3, 1),
        r("uint32", "slice_point", 2),
        o("uint32", "slice_dim", 1, 1),
    ), {}),
    ("SoftmaxParameter", (
        o("Engine", "engine", 1, "DEFAULT"),
        o("int32", "axis", 2, 1),
    ), _ENGINE),
    ("SwishParameter", (o("float", "beta", 1, 1.0),), {}),
    ("TanHParameter", (o("Engine", "engine", 1, "DEFAULT"),), _ENGINE),
    ("TileParameter", (o("int32", "axis", 1, 1), o("int32", "tiles", 2)), {}),
    ("ThresholdParameter", (o("float", "threshold", 1, 0.0),), {}),
    ("SPPParameter", (
        o("uint32", "pyramid_height", 1),
        o("PoolMethod", "pool", 2, "MAX"),
        o("Engine", "engine", 6, "DEFAULT"),
    ), {"PoolMethod": _POOL_METHOD, **_ENGINE}),
    ("V1LayerParameter", (
        r("string", "bottom", 2),
        r("string", "top", 3),
        o("string", "name", 4),
        r("NetStateRule", "include", 32),
        r("NetStateRule", "exclude", 33),
        o("LayerType", "type", 5),
        r("BlobProto", "blobs", 6),
        r("string", "param", 1001),
        r("DimCheckMode", "blob_share_mode", 1002),
        r("float", "blobs_lr", 7),
        r("float", "weight_decay", 8),
        r("float", "loss_weight", 35),
        o("AccuracyParameter", "accuracy_param", 27),
        o("ArgMaxParameter", "argmax_param", 23),
        o("ConcatParameter", "concat_param", 9),
        o("ContrastiveLossParameter", "contrastive_loss_param", 40),
        o("ConvolutionParameter", "convolution_param", 10),
        o("DataParameter", "data_param", 11),
        o("DropoutParameter", "dropout_param", 12),
        o("DummyDataParameter", "dummy_data_param", 26),
        o("EltwiseParameter", "eltwise_param", 24),
        o("ExpParameter", "exp_param", 41),
        o("HDF5DataParameter", "hdf5_data_param", 13),
        o("HDF5OutputParameter", "hdf5_output_param", 14),
        o("HingeLossParameter", "hinge_loss_param", 29),
        o("ImageDataParameter", "image_data_param", 15),
        o("InfogainLossParameter", "infogain_loss_param", 16),
        o("InnerProductParameter", "inner_product_param", 17),
        o("LRNParameter", "lrn_param", 18),
        o("MemoryDataParameter", "memory_data_param", 22),
        o("MVNParameter", "mvn_param", 34),
        o("PoolingParameter", "pooling_param", 19),
        o("PowerParameter", "power_param", 21),
        o("ReLUParameter", "relu_param", 30),
        o("SigmoidParameter", "sigmoid_param", 38),
        o("SoftmaxParameter", "softmax_param", 39),
        o("SliceParameter", "slice_param", 31),
        o("TanHParameter", "tanh_param", 37),
        o("ThresholdParameter", "threshold_param", 25),
        o("TransformationParameter", "transform_param", 36),
        o("LossParameter", "loss_param", 42),
    ), {
        "LayerType": (
            ("NONE", 0), ("ABSVAL", 35), ("ACCURACY", 1), ("ARGMAX", 30), ("BNLL", 2),
            ("CONCAT", 3), ("CONTRASTIVE_LOSS", 37), ("CONVOLUTION", 4), ("DATA", 5),
            ("DECONVOLUTION", 39), ("DROPOUT", 6), ("DUMMY_DATA", 32), ("EUCLIDEAN_LOSS", 7),
            ("ELTWISE", 25), ("EXP", 38), ("FLATTEN", 8), ("HDF5_DATA", 9), ("HDF5_OUTPUT", 10),
            ("HINGE_LOSS", 28), ("IM2COL", 11), ("IMAGE_DATA", 12), ("INFOGAIN_LOSS", 13),
            ("INNER_PRODUCT", 14), ("LRN", 15), ("MEMORY_DATA", 29),
            ("MULTINOMIAL_LOGISTIC_LOSS", 16), ("MVN", 34), ("POOLING", 17), ("POWER", 26),
            ("RELU", 18), ("SIGMOID", 19), ("SIGMOID_CROSS_ENTROPY_LOSS", 27), ("SILENCE", 36),
            ("SOFTMAX", 20), ("SOFTMAX_LOSS", 21), ("SPLIT", 22), ("SLICE", 33), ("TANH", 23),
            ("WINDOW_DATA", 24), ("THRESHOLD", 31),
        ),
        "DimCheckMode": (("STRICT", 0), ("PERMISSIVE", 1)),
    }),
)

_TOP_LEVEL_ENUMS = {"Phase": (("TRAIN", 0), ("TEST", 1))}


def _default_text(value: object) -> str:
    """A default as FieldDescriptorProto.default_value wants it (text, bools lower-case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _add_enum(container, name: str, values: tuple[tuple[str, int], ...]) -> None:
    enum = container.enum_type.add(name=name)
    for value_name, number in values:
        enum.value.add(name=value_name, number=number)


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    """The schema as a FileDescriptorProto (proto2, package `caffe`)."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="tracker/model/caffe_schema.proto", package="caffe", syntax="proto2")
    message_names = {name for name, _, _ in _MESSAGES}
    for enum_name, values in _TOP_LEVEL_ENUMS.items():
        _add_enum(fdp, enum_name, values)
    for msg_name, fields, enums in _MESSAGES:
        msg = fdp.message_type.add(name=msg_name)
        for enum_name, values in enums.items():
            _add_enum(msg, enum_name, values)
        for label, type_, name, number, default, packed in fields:
            field = msg.field.add(name=name, number=number)
            field.label = _FDP.LABEL_OPTIONAL if label == "optional" else _FDP.LABEL_REPEATED
            if type_ in _SCALARS:
                field.type = _SCALARS[type_]
            elif type_ in enums:
                field.type, field.type_name = _FDP.TYPE_ENUM, f".caffe.{msg_name}.{type_}"
            elif type_ in _TOP_LEVEL_ENUMS:
                field.type, field.type_name = _FDP.TYPE_ENUM, f".caffe.{type_}"
            elif type_ in message_names:
                field.type, field.type_name = _FDP.TYPE_MESSAGE, f".caffe.{type_}"
            else:  # a typo in the table above: fail at import, loudly
                raise TypeError(f"caffe schema: {msg_name}.{name} has unknown type {type_!r}")
            if default is not None:
                field.default_value = _default_text(default)
            if packed:
                field.options.packed = True
    return fdp


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_file())

NetParameter = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("caffe.NetParameter"))
LayerParameter = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("caffe.LayerParameter"))
V1LayerParameter = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("caffe.V1LayerParameter"))
BlobProto = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("caffe.BlobProto"))
BlobShape = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("caffe.BlobShape"))


def message_class(name: str):
    """The generated class of message `name` (e.g. "ConvolutionParameter") in package caffe."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"caffe.{name}"))


def __getattr__(name: str):
    """Every other message of the schema as a module attribute (`caffe_pb.PoolingParameter`)."""
    if any(name == msg_name for msg_name, _, _ in _MESSAGES):
        return message_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
