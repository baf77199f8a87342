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

# A field is (label, type, name, number, default-or-None, packed); `_o`/`_r` keep the table short.


def _o(type_: str, name: str, number: int, default: object = None) -> tuple:
    """An `optional` field; `default` as in caffe.proto (enum defaults by value name)."""
    return ("optional", type_, name, number, default, False)


def _r(type_: str, name: str, number: int, packed: bool = False) -> tuple:
    """A `repeated` field; `packed=True` where caffe.proto says `[packed = true]`."""
    return ("repeated", type_, name, number, None, packed)


_ENGINE = {"Engine": (("DEFAULT", 0), ("CAFFE", 1), ("CUDNN", 2))}
_POOL_METHOD = (("MAX", 0), ("AVE", 1), ("STOCHASTIC", 2))

# (message name, fields, nested enums {name: ((value name, number), ...)}), in caffe.proto's order.
_MESSAGES: tuple[tuple[str, tuple[tuple, ...], dict], ...] = (
    ("BlobShape", (_r("int64", "dim", 1, packed=True),), {}),
    ("BlobProto", (
        _o("BlobShape", "shape", 7),
        _r("float", "data", 5, packed=True),
        _r("float", "diff", 6, packed=True),
        _r("double", "double_data", 8, packed=True),
        _r("double", "double_diff", 9, packed=True),
        _o("int32", "num", 1, 0),
        _o("int32", "channels", 2, 0),
        _o("int32", "height", 3, 0),
        _o("int32", "width", 4, 0),
    ), {}),
    ("BlobProtoVector", (_r("BlobProto", "blobs", 1),), {}),
    ("FillerParameter", (
        _o("string", "type", 1, "constant"),
        _o("float", "value", 2, 0.0),
        _o("float", "min", 3, 0.0),
        _o("float", "max", 4, 1.0),
        _o("float", "mean", 5, 0.0),
        _o("float", "std", 6, 1.0),
        _o("int32", "sparse", 7, -1),
        _o("VarianceNorm", "variance_norm", 8, "FAN_IN"),
    ), {"VarianceNorm": (("FAN_IN", 0), ("FAN_OUT", 1), ("AVERAGE", 2))}),
    ("NetParameter", (
        _o("string", "name", 1),
        _r("string", "input", 3),
        _r("BlobShape", "input_shape", 8),
        _r("int32", "input_dim", 4),
        _o("bool", "force_backward", 5, False),
        _o("NetState", "state", 6),
        _o("bool", "debug_info", 7, False),
        _r("LayerParameter", "layer", 100),
        _r("V1LayerParameter", "layers", 2),
    ), {}),
    ("NetState", (
        _o("Phase", "phase", 1, "TEST"),
        _o("int32", "level", 2, 0),
        _r("string", "stage", 3),
    ), {}),
    ("NetStateRule", (
        _o("Phase", "phase", 1),
        _o("int32", "min_level", 2),
        _o("int32", "max_level", 3),
        _r("string", "stage", 4),
        _r("string", "not_stage", 5),
    ), {}),
    ("ParamSpec", (
        _o("string", "name", 1),
        _o("DimCheckMode", "share_mode", 2),
        _o("float", "lr_mult", 3, 1.0),
        _o("float", "decay_mult", 4, 1.0),
    ), {"DimCheckMode": (("STRICT", 0), ("PERMISSIVE", 1))}),
    ("LayerParameter", (
        _o("string", "name", 1),
        _o("string", "type", 2),
        _r("string", "bottom", 3),
        _r("string", "top", 4),
        _o("Phase", "phase", 10),
        _r("float", "loss_weight", 5),
        _r("ParamSpec", "param", 6),
        _r("BlobProto", "blobs", 7),
        _r("bool", "propagate_down", 11),
        _r("NetStateRule", "include", 8),
        _r("NetStateRule", "exclude", 9),
        _o("TransformationParameter", "transform_param", 100),
        _o("LossParameter", "loss_param", 101),
        _o("AccuracyParameter", "accuracy_param", 102),
        _o("ArgMaxParameter", "argmax_param", 103),
        _o("BatchNormParameter", "batch_norm_param", 139),
        _o("BiasParameter", "bias_param", 141),
        _o("ClipParameter", "clip_param", 148),
        _o("ConcatParameter", "concat_param", 104),
        _o("ContrastiveLossParameter", "contrastive_loss_param", 105),
        _o("ConvolutionParameter", "convolution_param", 106),
        _o("CropParameter", "crop_param", 144),
        _o("DataParameter", "data_param", 107),
        _o("DropoutParameter", "dropout_param", 108),
        _o("DummyDataParameter", "dummy_data_param", 109),
        _o("EltwiseParameter", "eltwise_param", 110),
        _o("ELUParameter", "elu_param", 140),
        _o("EmbedParameter", "embed_param", 137),
        _o("ExpParameter", "exp_param", 111),
        _o("FlattenParameter", "flatten_param", 135),
        _o("HDF5DataParameter", "hdf5_data_param", 112),
        _o("HDF5OutputParameter", "hdf5_output_param", 113),
        _o("HingeLossParameter", "hinge_loss_param", 114),
        _o("ImageDataParameter", "image_data_param", 115),
        _o("InfogainLossParameter", "infogain_loss_param", 116),
        _o("InnerProductParameter", "inner_product_param", 117),
        _o("InputParameter", "input_param", 143),
        _o("LogParameter", "log_param", 134),
        _o("LRNParameter", "lrn_param", 118),
        _o("MemoryDataParameter", "memory_data_param", 119),
        _o("MVNParameter", "mvn_param", 120),
        _o("ParameterParameter", "parameter_param", 145),
        _o("PoolingParameter", "pooling_param", 121),
        _o("PowerParameter", "power_param", 122),
        _o("PReLUParameter", "prelu_param", 131),
        _o("PythonParameter", "python_param", 130),
        _o("RecurrentParameter", "recurrent_param", 146),
        _o("ReductionParameter", "reduction_param", 136),
        _o("ReLUParameter", "relu_param", 123),
        _o("ReshapeParameter", "reshape_param", 133),
        _o("ScaleParameter", "scale_param", 142),
        _o("SigmoidParameter", "sigmoid_param", 124),
        _o("SoftmaxParameter", "softmax_param", 125),
        _o("SPPParameter", "spp_param", 132),
        _o("SliceParameter", "slice_param", 126),
        _o("SwishParameter", "swish_param", 147),
        _o("TanHParameter", "tanh_param", 127),
        _o("ThresholdParameter", "threshold_param", 128),
        _o("TileParameter", "tile_param", 138),
        _o("WindowDataParameter", "window_data_param", 129),
    ), {}),
    ("TransformationParameter", (
        _o("float", "scale", 1, 1.0),
        _o("bool", "mirror", 2, False),
        _o("uint32", "crop_size", 3, 0),
        _o("string", "mean_file", 4),
        _r("float", "mean_value", 5),
        _o("bool", "force_color", 6, False),
        _o("bool", "force_gray", 7, False),
    ), {}),
    ("LossParameter", (
        _o("int32", "ignore_label", 1),
        _o("NormalizationMode", "normalization", 3, "VALID"),
        _o("bool", "normalize", 2),
    ), {"NormalizationMode": (("FULL", 0), ("VALID", 1), ("BATCH_SIZE", 2), ("NONE", 3))}),
    ("AccuracyParameter", (
        _o("uint32", "top_k", 1, 1),
        _o("int32", "axis", 2, 1),
        _o("int32", "ignore_label", 3),
    ), {}),
    ("ArgMaxParameter", (
        _o("bool", "out_max_val", 1, False),
        _o("uint32", "top_k", 2, 1),
        _o("int32", "axis", 3),
    ), {}),
    ("BatchNormParameter", (
        _o("bool", "use_global_stats", 1),
        _o("float", "moving_average_fraction", 2, 0.999),
        _o("float", "eps", 3, 1e-5),
    ), {}),
    ("BiasParameter", (
        _o("int32", "axis", 1, 1),
        _o("int32", "num_axes", 2, 1),
        _o("FillerParameter", "filler", 3),
    ), {}),
    ("ClipParameter", (_o("float", "min", 1), _o("float", "max", 2)), {}),
    ("ConcatParameter", (
        _o("int32", "axis", 2, 1),
        _o("uint32", "concat_dim", 1, 1),
    ), {}),
    ("ContrastiveLossParameter", (
        _o("float", "margin", 1, 1.0),
        _o("bool", "legacy_version", 2, False),
    ), {}),
    ("ConvolutionParameter", (
        _o("uint32", "num_output", 1),
        _o("bool", "bias_term", 2, True),
        _r("uint32", "pad", 3),
        _r("uint32", "kernel_size", 4),
        _r("uint32", "stride", 6),
        _r("uint32", "dilation", 18),
        _o("uint32", "pad_h", 9, 0),
        _o("uint32", "pad_w", 10, 0),
        _o("uint32", "kernel_h", 11),
        _o("uint32", "kernel_w", 12),
        _o("uint32", "stride_h", 13),
        _o("uint32", "stride_w", 14),
        _o("uint32", "group", 5, 1),
        _o("FillerParameter", "weight_filler", 7),
        _o("FillerParameter", "bias_filler", 8),
        _o("Engine", "engine", 15, "DEFAULT"),
        _o("int32", "axis", 16, 1),
        _o("bool", "force_nd_im2col", 17, False),
    ), _ENGINE),
    ("CropParameter", (_o("int32", "axis", 1, 2), _r("uint32", "offset", 2)), {}),
    ("DataParameter", (
        _o("string", "source", 1),
        _o("uint32", "batch_size", 4),
        _o("uint32", "rand_skip", 7, 0),
        _o("DB", "backend", 8, "LEVELDB"),
        _o("float", "scale", 2, 1.0),
        _o("string", "mean_file", 3),
        _o("uint32", "crop_size", 5, 0),
        _o("bool", "mirror", 6, False),
        _o("bool", "force_encoded_color", 9, False),
        _o("uint32", "prefetch", 10, 4),
    ), {"DB": (("LEVELDB", 0), ("LMDB", 1))}),
    ("DropoutParameter", (_o("float", "dropout_ratio", 1, 0.5),), {}),
    ("DummyDataParameter", (
        _r("FillerParameter", "data_filler", 1),
        _r("BlobShape", "shape", 6),
        _r("uint32", "num", 2),
        _r("uint32", "channels", 3),
        _r("uint32", "height", 4),
        _r("uint32", "width", 5),
    ), {}),
    ("EltwiseParameter", (
        _o("EltwiseOp", "operation", 1, "SUM"),
        _r("float", "coeff", 2),
        _o("bool", "stable_prod_grad", 3, True),
    ), {"EltwiseOp": (("PROD", 0), ("SUM", 1), ("MAX", 2))}),
    ("ELUParameter", (_o("float", "alpha", 1, 1.0),), {}),
    ("EmbedParameter", (
        _o("uint32", "num_output", 1),
        _o("uint32", "input_dim", 2),
        _o("bool", "bias_term", 3, True),
        _o("FillerParameter", "weight_filler", 4),
        _o("FillerParameter", "bias_filler", 5),
    ), {}),
    ("ExpParameter", (
        _o("float", "base", 1, -1.0),
        _o("float", "scale", 2, 1.0),
        _o("float", "shift", 3, 0.0),
    ), {}),
    ("FlattenParameter", (_o("int32", "axis", 1, 1), _o("int32", "end_axis", 2, -1)), {}),
    ("HDF5DataParameter", (
        _o("string", "source", 1),
        _o("uint32", "batch_size", 2),
        _o("bool", "shuffle", 3, False),
    ), {}),
    ("HDF5OutputParameter", (_o("string", "file_name", 1),), {}),
    ("HingeLossParameter", (_o("Norm", "norm", 1, "L1"),), {"Norm": (("L1", 1), ("L2", 2))}),
    ("ImageDataParameter", (
        _o("string", "source", 1),
        _o("uint32", "batch_size", 4, 1),
        _o("uint32", "rand_skip", 7, 0),
        _o("bool", "shuffle", 8, False),
        _o("uint32", "new_height", 9, 0),
        _o("uint32", "new_width", 10, 0),
        _o("bool", "is_color", 11, True),
        _o("float", "scale", 2, 1.0),
        _o("string", "mean_file", 3),
        _o("uint32", "crop_size", 5, 0),
        _o("bool", "mirror", 6, False),
        _o("string", "root_folder", 12, ""),
    ), {}),
    ("InfogainLossParameter", (_o("string", "source", 1), _o("int32", "axis", 2, 1)), {}),
    ("InnerProductParameter", (
        _o("uint32", "num_output", 1),
        _o("bool", "bias_term", 2, True),
        _o("FillerParameter", "weight_filler", 3),
        _o("FillerParameter", "bias_filler", 4),
        _o("int32", "axis", 5, 1),
        _o("bool", "transpose", 6, False),
    ), {}),
    ("InputParameter", (_r("BlobShape", "shape", 1),), {}),
    ("LogParameter", (
        _o("float", "base", 1, -1.0),
        _o("float", "scale", 2, 1.0),
        _o("float", "shift", 3, 0.0),
    ), {}),
    ("LRNParameter", (
        _o("uint32", "local_size", 1, 5),
        _o("float", "alpha", 2, 1.0),
        _o("float", "beta", 3, 0.75),
        _o("NormRegion", "norm_region", 4, "ACROSS_CHANNELS"),
        _o("float", "k", 5, 1.0),
        _o("Engine", "engine", 6, "DEFAULT"),
    ), {"NormRegion": (("ACROSS_CHANNELS", 0), ("WITHIN_CHANNEL", 1)), **_ENGINE}),
    ("MemoryDataParameter", (
        _o("uint32", "batch_size", 1),
        _o("uint32", "channels", 2),
        _o("uint32", "height", 3),
        _o("uint32", "width", 4),
    ), {}),
    ("MVNParameter", (
        _o("bool", "normalize_variance", 1, True),
        _o("bool", "across_channels", 2, False),
        _o("float", "eps", 3, 1e-9),
    ), {}),
    ("ParameterParameter", (_o("BlobShape", "shape", 1),), {}),
    ("PoolingParameter", (
        _o("PoolMethod", "pool", 1, "MAX"),
        _o("uint32", "pad", 4, 0),
        _o("uint32", "pad_h", 9, 0),
        _o("uint32", "pad_w", 10, 0),
        _o("uint32", "kernel_size", 2),
        _o("uint32", "kernel_h", 5),
        _o("uint32", "kernel_w", 6),
        _o("uint32", "stride", 3, 1),
        _o("uint32", "stride_h", 7),
        _o("uint32", "stride_w", 8),
        _o("Engine", "engine", 11, "DEFAULT"),
        _o("bool", "global_pooling", 12, False),
        _o("RoundMode", "round_mode", 13, "CEIL"),
    ), {"PoolMethod": _POOL_METHOD, "RoundMode": (("CEIL", 0), ("FLOOR", 1)), **_ENGINE}),
    ("PowerParameter", (
        _o("float", "power", 1, 1.0),
        _o("float", "scale", 2, 1.0),
        _o("float", "shift", 3, 0.0),
    ), {}),
    ("PReLUParameter", (
        _o("FillerParameter", "filler", 1),
        _o("bool", "channel_shared", 2, False),
    ), {}),
    ("PythonParameter", (
        _o("string", "module", 1),
        _o("string", "layer", 2),
        _o("string", "param_str", 3, ""),
        _o("bool", "share_in_parallel", 4, False),
    ), {}),
    ("RecurrentParameter", (
        _o("uint32", "num_output", 1, 0),
        _o("FillerParameter", "weight_filler", 2),
        _o("FillerParameter", "bias_filler", 3),
        _o("bool", "debug_info", 4, False),
        _o("bool", "expose_hidden", 5, False),
    ), {}),
    ("ReductionParameter", (
        _o("ReductionOp", "operation", 1, "SUM"),
        _o("int32", "axis", 2, 0),
        _o("float", "coeff", 3, 1.0),
    ), {"ReductionOp": (("SUM", 1), ("ASUM", 2), ("SUMSQ", 3), ("MEAN", 4))}),
    ("ReLUParameter", (
        _o("float", "negative_slope", 1, 0.0),
        _o("Engine", "engine", 2, "DEFAULT"),
    ), _ENGINE),
    ("ReshapeParameter", (
        _o("BlobShape", "shape", 1),
        _o("int32", "axis", 2, 0),
        _o("int32", "num_axes", 3, -1),
    ), {}),
    ("ScaleParameter", (
        _o("int32", "axis", 1, 1),
        _o("int32", "num_axes", 2, 1),
        _o("FillerParameter", "filler", 3),
        _o("bool", "bias_term", 4, False),
        _o("FillerParameter", "bias_filler", 5),
    ), {}),
    ("SigmoidParameter", (_o("Engine", "engine", 1, "DEFAULT"),), _ENGINE),
    ("SliceParameter", (
        _o("int32", "axis", 3, 1),
        _r("uint32", "slice_point", 2),
        _o("uint32", "slice_dim", 1, 1),
    ), {}),
    ("SoftmaxParameter", (
        _o("Engine", "engine", 1, "DEFAULT"),
        _o("int32", "axis", 2, 1),
    ), _ENGINE),
    ("SwishParameter", (_o("float", "beta", 1, 1.0),), {}),
    ("TanHParameter", (_o("Engine", "engine", 1, "DEFAULT"),), _ENGINE),
    ("TileParameter", (_o("int32", "axis", 1, 1), _o("int32", "tiles", 2)), {}),
    ("ThresholdParameter", (_o("float", "threshold", 1, 0.0),), {}),
    ("WindowDataParameter", (
        _o("string", "source", 1),
        _o("float", "scale", 2, 1.0),
        _o("string", "mean_file", 3),
        _o("uint32", "batch_size", 4),
        _o("uint32", "crop_size", 5, 0),
        _o("bool", "mirror", 6, False),
        _o("float", "fg_threshold", 7, 0.5),
        _o("float", "bg_threshold", 8, 0.5),
        _o("float", "fg_fraction", 9, 0.25),
        _o("uint32", "context_pad", 10, 0),
        _o("string", "crop_mode", 11, "warp"),
        _o("bool", "cache_images", 12, False),
        _o("string", "root_folder", 13, ""),
    ), {}),
    ("SPPParameter", (
        _o("uint32", "pyramid_height", 1),
        _o("PoolMethod", "pool", 2, "MAX"),
        _o("Engine", "engine", 6, "DEFAULT"),
    ), {"PoolMethod": _POOL_METHOD, **_ENGINE}),
    ("V1LayerParameter", (
        _r("string", "bottom", 2),
        _r("string", "top", 3),
        _o("string", "name", 4),
        _r("NetStateRule", "include", 32),
        _r("NetStateRule", "exclude", 33),
        _o("LayerType", "type", 5),
        _r("BlobProto", "blobs", 6),
        _r("string", "param", 1001),
        _r("DimCheckMode", "blob_share_mode", 1002),
        _r("float", "blobs_lr", 7),
        _r("float", "weight_decay", 8),
        _r("float", "loss_weight", 35),
        _o("AccuracyParameter", "accuracy_param", 27),
        _o("ArgMaxParameter", "argmax_param", 23),
        _o("ConcatParameter", "concat_param", 9),
        _o("ContrastiveLossParameter", "contrastive_loss_param", 40),
        _o("ConvolutionParameter", "convolution_param", 10),
        _o("DataParameter", "data_param", 11),
        _o("DropoutParameter", "dropout_param", 12),
        _o("DummyDataParameter", "dummy_data_param", 26),
        _o("EltwiseParameter", "eltwise_param", 24),
        _o("ExpParameter", "exp_param", 41),
        _o("HDF5DataParameter", "hdf5_data_param", 13),
        _o("HDF5OutputParameter", "hdf5_output_param", 14),
        _o("HingeLossParameter", "hinge_loss_param", 29),
        _o("ImageDataParameter", "image_data_param", 15),
        _o("InfogainLossParameter", "infogain_loss_param", 16),
        _o("InnerProductParameter", "inner_product_param", 17),
        _o("LRNParameter", "lrn_param", 18),
        _o("MemoryDataParameter", "memory_data_param", 22),
        _o("MVNParameter", "mvn_param", 34),
        _o("PoolingParameter", "pooling_param", 19),
        _o("PowerParameter", "power_param", 21),
        _o("ReLUParameter", "relu_param", 30),
        _o("SigmoidParameter", "sigmoid_param", 38),
        _o("SoftmaxParameter", "softmax_param", 39),
        _o("SliceParameter", "slice_param", 31),
        _o("TanHParameter", "tanh_param", 37),
        _o("ThresholdParameter", "threshold_param", 25),
        _o("WindowDataParameter", "window_data_param", 20),
        _o("TransformationParameter", "transform_param", 36),
        _o("LossParameter", "loss_param", 42),
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



def message_class(name: str):
    """The generated class of message `name` (e.g. "ConvolutionParameter") in package caffe."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"caffe.{name}"))


NetParameter = message_class("NetParameter")
LayerParameter = message_class("LayerParameter")
V1LayerParameter = message_class("V1LayerParameter")
BlobProto = message_class("BlobProto")
BlobShape = message_class("BlobShape")


def __getattr__(name: str):
    """Every other message of the schema as a module attribute (`caffe_pb.PoolingParameter`)."""
    if any(name == msg_name for msg_name, _, _ in _MESSAGES):
        return message_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
