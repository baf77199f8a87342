"""Caffe files: reading real files written by BVLC Caffe, writing files OpenCV 4.x loads back
identically, the V1 syntax, shape inference against OpenCV's Caffe importer, and every bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from google.protobuf import text_format

from tracker.errors import EXIT_BAD_INPUT, ModelError
from tracker.model import caffe_io, caffe_pb, ops, shapes
from tracker.model.caffe_io import (
    SUPPORTED_LAYER_TYPES,
    NetDef,
    load_net,
    read_caffemodel,
    read_prototxt,
    write_caffemodel,
    write_prototxt,
)
from tracker.model.convert import graph

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lenet(testdata):
    d = testdata / "caffe" / "lenet"
    return d / "lenet.prototxt", d / "lenet_iter_10000.caffemodel", d


def _cv2_forward(prototxt: Path, weights: Path, x: np.ndarray, output: str = "prob") -> np.ndarray:
    net = cv2.dnn.readNetFromCaffe(str(prototxt), str(weights))
    net.setInput(x)
    return net.forward(output).copy()


def _arrays(netdef: NetDef) -> dict[str, tuple[np.ndarray, ...]]:
    return {layer.name: layer.blobs for layer in netdef.layers if layer.blobs}


def _assert_same_arrays(a: NetDef, b: NetDef) -> None:
    arrays_a, arrays_b = _arrays(a), _arrays(b)
    assert arrays_a.keys() == arrays_b.keys()
    for name in arrays_a:
        assert len(arrays_a[name]) == len(arrays_b[name])
        for x, y in zip(arrays_a[name], arrays_b[name]):
            assert x.dtype == y.dtype == np.float32
            assert x.shape == y.shape
            np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------ real files from BVLC Caffe


def test_lenet_loads_with_the_blobs_opencv_reads(lenet):
    prototxt, weights, _ = lenet
    net = load_net(prototxt, weights)
    assert net.name == "LeNet"
    assert net.inputs == {"data": (64, 1, 28, 28)}
    assert [(layer.name, layer.type) for layer in net.layers] == [
        ("conv1", "Convolution"), ("pool1", "Pooling"), ("conv2", "Convolution"),
        ("pool2", "Pooling"), ("ip1", "InnerProduct"), ("relu1", "ReLU"),
        ("ip2", "InnerProduct"), ("prob", "Softmax")]
    assert net.layers[5].bottoms == net.layers[5].tops == ("ip1",)  # in place
    # The weights we decode are bit-identical to what OpenCV's own Caffe importer decodes.
    cv_net = cv2.dnn.readNetFromCaffe(str(prototxt), str(weights))
    for layer in net.layers:
        for i, blob in enumerate(layer.blobs):
            theirs = cv_net.getParam(cv_net.getLayerId(layer.name), i)
            np.testing.assert_array_equal(blob.reshape(theirs.shape), theirs)
    shapes_ = {layer.name: [b.shape for b in layer.blobs] for layer in net.layers if layer.blobs}
    assert shapes_ == {"conv1": [(20, 1, 5, 5), (20,)], "conv2": [(50, 20, 5, 5), (50,)],
                       "ip1": [(500, 800), (500,)], "ip2": [(10, 500), (10,)]}


def test_lenet_caffemodel_keeps_train_layers_but_load_net_ignores_them(lenet):
    _, weights, _ = lenet
    raw = read_caffemodel(weights)
    types = {layer.name: layer.type for layer in raw.layer}
    assert types["mnist"] == "Data" and types["loss"] == "SoftmaxWithLoss"
    assert raw.layer[0].include[0].phase == 0  # TRAIN


def test_rewritten_lenet_gives_opencv_the_same_outputs(lenet, tmp_path):
    prototxt, weights, d = lenet
    net = load_net(prototxt, weights)
    ours_model, ours_proto = tmp_path / "lenet.caffemodel", tmp_path / "lenet.prototxt"
    write_caffemodel(ours_model, net)
    write_prototxt(ours_proto, net)
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")
    original = _cv2_forward(prototxt, weights, x)
    np.testing.assert_allclose(original, np.load(d / "ref_opencv_prob_first64.npy"), atol=1e-5)
    np.testing.assert_array_equal(_cv2_forward(prototxt, ours_model, x), original)
    np.testing.assert_array_equal(_cv2_forward(ours_proto, ours_model, x), original)
    # And our reader gets back exactly what it wrote.
    _assert_same_arrays(load_net(ours_proto, ours_model), net)


def test_v2_round_trip_preserves_every_array_and_layer(lenet, tmp_path):
    prototxt, weights, _ = lenet
    net = load_net(prototxt, weights)
    path = tmp_path / "v2.caffemodel"
    write_caffemodel(path, net)
    raw = read_caffemodel(path, upgrade=False)
    assert len(raw.layers) == 0 and [layer.name for layer in raw.layer][0] == "data"
    assert raw.layer[1].blobs[0].shape.dim == [20, 1, 5, 5]
    back = load_net(prototxt, path)
    _assert_same_arrays(back, net)
    assert [str(layer.param) for layer in back.layers] == [str(layer.param) for layer in net.layers]


def test_v1_round_trip_and_opencv_reads_our_v1_files(lenet, tmp_path):
    prototxt, weights, d = lenet
    net = load_net(prototxt, weights)
    v1_model, v1_proto = tmp_path / "v1.caffemodel", tmp_path / "v1.prototxt"
    write_caffemodel(v1_model, net, v1=True)
    write_prototxt(v1_proto, net, v1=True)

    raw = read_caffemodel(v1_model, upgrade=False)
    assert len(raw.layer) == 0 and len(raw.layers) == 8
    conv1 = raw.layers[0]
    enum = caffe_pb.V1LayerParameter.DESCRIPTOR.enum_types_by_name["LayerType"]
    assert enum.values_by_number[conv1.type].name == "CONVOLUTION"
    assert (conv1.blobs[0].num, conv1.blobs[0].channels, conv1.blobs[0].height,
            conv1.blobs[0].width) == (20, 1, 5, 5)
    assert (conv1.blobs[1].num, conv1.blobs[1].width) == (1, 20)  # bias (20,) as 1x1x1x20
    assert not conv1.blobs[0].HasField("shape")
    assert list(conv1.blobs_lr) == [1.0, 2.0]

    text = v1_proto.read_text()
    assert "layers {" in text and "type: CONVOLUTION" in text and "input_dim: 64" in text
    proto_raw = read_prototxt(v1_proto, upgrade=False)
    assert list(proto_raw.input) == ["data"] and list(proto_raw.input_dim) == [64, 1, 28, 28]

    upgraded = read_caffemodel(v1_model)
    assert [layer.type for layer in upgraded.layer][:2] == ["Convolution", "Pooling"]
    assert upgraded.layer[0].param[1].lr_mult == 2.0

    back = load_net(v1_proto, v1_model)
    assert back.inputs == net.inputs
    assert [(layer.name, layer.type, layer.bottoms, layer.tops) for layer in back.layers] == \
           [(layer.name, layer.type, layer.bottoms, layer.tops) for layer in net.layers]
    _assert_same_arrays(back, net)
    # A V1 caffemodel with the current prototxt, too (legacy 4-D blobs resolved by shape).
    _assert_same_arrays(load_net(prototxt, v1_model), net)
    # OpenCV's own V1 upgrade reads our V1 files and computes the same outputs.
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")[:8]
    np.testing.assert_array_equal(_cv2_forward(v1_proto, v1_model, x),
                                  _cv2_forward(prototxt, weights, x))


def test_hand_written_v1_prototxt_with_legacy_params(tmp_path):
    """An old-style prototxt: V1 enum types, blobs_lr/weight_decay, include rules."""
    path = tmp_path / "old.prototxt"
    path.write_text("""
        name: "old"
        input: "data" input_dim: 1 input_dim: 3 input_dim: 10 input_dim: 10
        layers { name: "train_data" type: DATA top: "data" top: "label"
                 data_param { source: "x_lmdb" batch_size: 64 backend: LMDB }
                 include { phase: TRAIN } }
        layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
                 blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
                 convolution_param { num_output: 4 kernel_size: 3 pad: 1
                                     weight_filler { type: "gaussian" std: 0.01 } } }
        layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
        layers { name: "pool" type: POOLING bottom: "conv" top: "pool"
                 pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
        layers { name: "ip" type: INNER_PRODUCT bottom: "pool" top: "ip"
                 inner_product_param { num_output: 5 } }
        layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" top: "loss"
                 include { phase: TRAIN } }
        layers { name: "prob" type: SOFTMAX bottom: "ip" top: "prob"
                 include { phase: TEST } }
    """)
    net = load_net(path, None)
    assert net.name == "old" and net.inputs == {"data": (1, 3, 10, 10)}
    assert [(layer.name, layer.type) for layer in net.layers] == [
        ("conv", "Convolution"), ("relu", "ReLU"), ("pool", "Pooling"),
        ("ip", "InnerProduct"), ("prob", "Softmax")]
    conv = net.layers[0].param
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1.0, 1.0), (2.0, 0.0)]
    assert conv.convolution_param.weight_filler.std == pytest.approx(0.01)
    assert shapes.infer_shapes(net, 2) == {
        "data": (2, 3, 10, 10), "conv": (2, 4, 10, 10), "pool": (2, 4, 5, 5),
        "ip": (2, 5), "prob": (2, 5)}


def test_opencv_layer_prototxts_parse(testdata):
    layer_dir = testdata / "caffe" / "layers"
    files = sorted(layer_dir.glob("*.prototxt"))
    assert len(files) == 6
    for path in files:
        net = load_net(path, None)
        assert net.inputs == {"input": (2, 6, 75, 113)}
        assert [layer.tops for layer in net.layers] == [("output",)]
        ref = np.load(path.with_name(path.stem + ".ref_opencv.npy"))
        assert shapes.infer_shapes(net)["output"] == ref.shape, path.name
    lrn = load_net(layer_dir / "layer_lrn_spatial.prototxt", None).layers[0].param.lrn_param
    assert (lrn.norm_region, lrn.local_size, lrn.beta) == (1, 5, 0.75)  # WITHIN_CHANNEL
    assert lrn.alpha == pytest.approx(0.9)
    pool = load_net(layer_dir / "layer_pooling_ave.prototxt", None).layers[0].param.pooling_param
    assert (pool.pool, pool.kernel_h, pool.kernel_w, pool.stride_h, pool.pad_h, pool.pad_w) == \
           (1, 3, 5, 2, 2, 1)


def test_defaults_are_caffes():
    assert caffe_pb.ConvolutionParameter().bias_term is True
    assert caffe_pb.ConvolutionParameter().group == 1
    assert caffe_pb.PoolingParameter().stride == 1
    assert caffe_pb.LRNParameter().local_size == 5
    assert caffe_pb.LRNParameter().k == 1.0
    assert caffe_pb.BatchNormParameter().eps == pytest.approx(1e-5)
    assert caffe_pb.FlattenParameter().end_axis == -1
    assert caffe_pb.EltwiseParameter().operation == 1  # SUM
    assert caffe_pb.NetState().phase == 1  # TEST
    assert caffe_pb.FillerParameter().type == "constant"


def test_unknown_fields_in_a_caffemodel_are_kept_not_fatal(lenet, tmp_path):
    prototxt, weights, _ = lenet
    raw = read_caffemodel(weights)
    # A field number no Caffe version uses (9999, varint 7), inside a layer and at net level.
    unknown = bytes([0xF8, 0xE1, 0x04, 0x07])
    conv1 = next(layer for layer in raw.layer if layer.name == "conv1")
    patched = caffe_pb.LayerParameter()
    patched.ParseFromString(conv1.SerializeToString() + unknown)
    conv1.CopyFrom(patched)
    path = tmp_path / "future.caffemodel"
    path.write_bytes(raw.SerializeToString() + unknown)
    net = load_net(prototxt, path)
    _assert_same_arrays(net, load_net(prototxt, weights))
    reread = read_caffemodel(path)
    assert reread.SerializeToString().endswith(unknown)  # protobuf kept it


def test_double_data_blobs_are_read(tmp_path):
    proto = tmp_path / "ip.prototxt"
    proto.write_text('input: "x" input_shape { dim: 1 dim: 3 }\n'
                     'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
                     'inner_product_param { num_output: 2 bias_term: false } }\n')
    model = caffe_pb.NetParameter()
    blob = model.layer.add(name="ip", type="InnerProduct").blobs.add()
    blob.shape.dim.extend([2, 3])
    blob.double_data.extend([0.5, 1.5, 2.5, 3.5, 4.5, 5.5])
    (tmp_path / "ip.caffemodel").write_bytes(model.SerializeToString())
    (weight,) = load_net(proto, tmp_path / "ip.caffemodel").layers[0].blobs
    assert weight.dtype == np.float32
    np.testing.assert_array_equal(weight, np.arange(6).reshape(2, 3) + 0.5)


def test_test_phase_rules_drop_train_layers(tmp_path):
    path = tmp_path / "tv.prototxt"
    body = """
        layer { name: "data" type: "Input" top: "data"
                input_param { shape { dim: 1 dim: 2 dim: 4 dim: 4 } } }
        layer { name: "mnist" type: "Data" top: "data" top: "label"
                include { phase: TRAIN } data_param { source: "lmdb" batch_size: 1 } }
        layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
                inner_product_param { num_output: 3 } }
        layer { name: "drop" type: "Dropout" bottom: "ip" top: "ip" exclude { phase: TEST } }
        layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
                include { phase: TEST stage: "validate" } }
        layer { name: "deploy_prob" type: "Softmax" bottom: "ip" top: "prob"
                include { phase: TEST not_stage: "validate" } }
        layer { name: "deep" type: "Sigmoid" bottom: "ip" top: "sig"
                include { min_level: 1 } }
    """
    path.write_text(body)
    assert [layer.name for layer in load_net(path, None).layers] == ["ip", "deploy_prob"]
    path.write_text('state { level: 2 }\n' + body)
    assert [layer.name for layer in load_net(path, None).layers] == ["ip", "deploy_prob", "deep"]
    # With stage "validate" the Accuracy layer is in, and the engine does not run it.
    path.write_text('state { stage: "validate" }\n' + body)
    with pytest.raises(ModelError, match=r"layer 'acc' has type 'Accuracy'"):
        load_net(path, None)


@pytest.mark.parametrize("window_data, softmax", [
    ('layer { name: "data" type: "WindowData"', 'layer { name: "prob" type: "Softmax"'),
    ('layers { name: "data" type: WINDOW_DATA', 'layers { name: "prob" type: SOFTMAX'),
], ids=["current", "V1"])
def test_an_rcnn_train_val_prototxt_loads_without_its_train_window_data(tmp_path, window_data, softmax):
    """R-CNN's fine-tuning net: its TRAIN-only WindowData layer would be dropped, but the prototxt
    did not parse (no window_data_param in the schema)."""
    path = tmp_path / "rcnn.prototxt"
    path.write_text(f"""
        name: "rcnn_finetune"
        input: "data" input_shape {{ dim: 1 dim: 3 dim: 8 dim: 8 }}
        {window_data} top: "data" top: "label" include {{ phase: TRAIN }}
          window_data_param {{ source: "window_file_train.txt" batch_size: 128 fg_threshold: 0.5
                              bg_threshold: 0.5 fg_fraction: 0.25 context_pad: 16 crop_mode: "warp" }} }}
        {softmax} bottom: "data" top: "prob" }}
    """)
    net = load_net(path, None)
    assert net.inputs == {"data": (1, 3, 8, 8)} and [layer.name for layer in net.layers] == ["prob"]
    window = read_prototxt(path).layer[0].window_data_param  # upgraded from V1 alike
    assert (window.batch_size, window.context_pad, window.crop_mode, window.root_folder) == (128, 16, "warp", "")


def test_the_fields_of_window_data_and_recurrent_layers_are_caffes():
    """Field numbers, types and defaults as in BVLC's caffe.proto: a caffemodel's layers carry them."""
    fields = caffe_pb.LayerParameter.DESCRIPTOR.fields_by_name
    assert (fields["window_data_param"].number, fields["recurrent_param"].number) == (129, 146)
    assert caffe_pb.V1LayerParameter.DESCRIPTOR.fields_by_name["window_data_param"].number == 20
    window = caffe_pb.WindowDataParameter()
    assert (window.scale, window.fg_threshold, window.bg_threshold, window.fg_fraction) == (1.0, 0.5, 0.5, 0.25)
    assert (window.crop_size, window.mirror, window.context_pad, window.cache_images) == (0, False, 0, False)
    assert {f.name: f.number for f in window.DESCRIPTOR.fields} == {
        "source": 1, "scale": 2, "mean_file": 3, "batch_size": 4, "crop_size": 5, "mirror": 6,
        "fg_threshold": 7, "bg_threshold": 8, "fg_fraction": 9, "context_pad": 10, "crop_mode": 11,
        "cache_images": 12, "root_folder": 13}
    recurrent = text_format.Parse("num_output: 8 weight_filler { type: 'uniform' } expose_hidden: true",
                                  caffe_pb.RecurrentParameter())
    assert (recurrent.num_output, recurrent.weight_filler.type, recurrent.bias_filler.type) == (8, "uniform", "constant")
    assert (recurrent.debug_info, recurrent.expose_hidden) == (False, True)
    assert {f.name: f.number for f in recurrent.DESCRIPTOR.fields} == {
        "num_output": 1, "weight_filler": 2, "bias_filler": 3, "debug_info": 4, "expose_hidden": 5}


# ------------------------------------------------------------------ shapes vs OpenCV's importer

_SHAPE_NET = """
name: "shapes"
input: "data" input_shape { dim: 2 dim: 4 dim: 23 dim: 19 }
layer { name: "c_pad" type: "Convolution" bottom: "data" top: "c_pad"
        convolution_param { num_output: 6 kernel_size: 3 pad: 2 stride: 2 } }
layer { name: "c_hw" type: "Convolution" bottom: "data" top: "c_hw"
        convolution_param { num_output: 4 kernel_h: 5 kernel_w: 2 stride_h: 3 stride_w: 1
                            pad_h: 1 pad_w: 0 group: 2 } }
layer { name: "c_dil" type: "Convolution" bottom: "data" top: "c_dil"
        convolution_param { num_output: 3 kernel_size: 3 dilation: 2 bias_term: false } }
layer { name: "p_clip" type: "Pooling" bottom: "c_pad" top: "p_clip"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "p_ceil" type: "Pooling" bottom: "data" top: "p_ceil"
        pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "p_hw" type: "Pooling" bottom: "data" top: "p_hw"
        pooling_param { pool: MAX kernel_h: 3 kernel_w: 5 stride_h: 2 stride_w: 1
                        pad_h: 2 pad_w: 1 } }
layer { name: "p_glob" type: "Pooling" bottom: "c_hw" top: "p_glob"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "bn" type: "BatchNorm" bottom: "c_pad" top: "bn" }
layer { name: "sc" type: "Scale" bottom: "bn" top: "sc" scale_param { bias_term: true } }
layer { name: "lrn" type: "LRN" bottom: "sc" top: "lrn" lrn_param { local_size: 3 } }
layer { name: "sig" type: "Sigmoid" bottom: "lrn" top: "sig" }
layer { name: "th" type: "TanH" bottom: "sig" top: "th" }
layer { name: "drop" type: "Dropout" bottom: "th" top: "drop" }
layer { name: "elt" type: "Eltwise" bottom: "drop" bottom: "bn" top: "elt"
        eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "relu" type: "ReLU" bottom: "elt" top: "relu" relu_param { negative_slope: 0.1 } }
layer { name: "cat" type: "Concat" bottom: "relu" bottom: "c_pad" top: "cat" }
layer { name: "flat" type: "Flatten" bottom: "cat" top: "flat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip"
        inner_product_param { num_output: 7 } }
layer { name: "ip2" type: "InnerProduct" bottom: "p_clip" top: "ip2"
        inner_product_param { num_output: 5 axis: 2 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def test_infer_shapes_matches_opencv_on_every_supported_layer(tmp_path):
    proto = tmp_path / "shapes.prototxt"
    proto.write_text(_SHAPE_NET)
    structure = load_net(proto, None)
    assert {layer.type for layer in structure.layers} | {"Input"} == SUPPORTED_LAYER_TYPES
    # One table of layer types (shapes.LAYER_TYPES): load_net reads exactly those and Input, the
    # engine has an operator for each and none besides (but the one fusion of two layers, which the
    # "dl" schedule makes), the converters lower some of them.
    assert set(shapes.LAYER_TYPES) | {"Input"} == SUPPORTED_LAYER_TYPES
    assert set(ops.OPS) == set(shapes.LAYER_TYPES)
    assert set(ops.OPS.values()) == set(ops.Op.__subclasses__()) - {ops.PooledConvolution}
    assert set(graph.SUPPORTED) < set(shapes.LAYER_TYPES)
    # Random weights in exactly the shapes we infer; OpenCV must accept them and agree.
    rng = np.random.default_rng(1)
    layers = []
    for layer, ls in zip(structure.layers, shapes.infer_layer_shapes(structure)):
        blobs = tuple(rng.standard_normal(s).astype(np.float32) for s in ls.params)
        if layer.type == "BatchNorm":  # positive variance and a non-zero scale factor
            blobs = (blobs[0], np.abs(blobs[1]) + 0.5, np.ones(1, np.float32))
        layers.append(caffe_io.LayerDef(layer.name, layer.type, layer.bottoms, layer.tops,
                                        layer.param, blobs))
    model = tmp_path / "shapes.caffemodel"
    write_caffemodel(model, NetDef(structure.name, structure.inputs, layers))
    ours = shapes.infer_shapes(load_net(proto, model), batch=2)
    assert ours["p_clip"] == (2, 6, 7, 6)  # Caffe's clip: ceil gives 8x7, last window in pad
    assert ours["p_hw"] == (2, 4, 13, 17)  # ceil((23+4-3)/2)+1, (19+2-5)+1; no clip
    net = cv2.dnn.readNetFromCaffe(str(proto), str(model))
    net.setInput(rng.standard_normal((2, 4, 23, 19)).astype(np.float32))
    names = [layer.name for layer in layers]
    outs = net.forward(names)
    for name, out in zip(names, outs):
        assert ours[name] == out.shape, name


def test_infer_shapes_batch_and_errors():
    proto = caffe_pb.NetParameter()
    text_format.Parse('input: "x" input_dim: 1 input_dim: 3 input_dim: 4 input_dim: 4 '
                      'layer { name: "c" type: "Convolution" bottom: "x" top: "c" '
                      'convolution_param { num_output: 2 kernel_size: 5 } }', proto)
    net = caffe_io._structure(proto, Path("mem.prototxt"))
    with pytest.raises(ModelError, match=r"layer 'c' \(Convolution\): kernel \(5, 5\).*does not "
                                         r"fit"):
        shapes.infer_shapes(net)


# ------------------------------------------------------------------ bad input


def _edit(src: Path, dst: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text
    dst.write_text(text.replace(old, new, 1))
    return dst


def test_missing_files(lenet, tmp_path):
    prototxt, weights, _ = lenet
    with pytest.raises(ModelError, match=r"prototxt not found: .*nope\.prototxt") as info:
        load_net(tmp_path / "nope.prototxt", weights)
    assert info.value.exit_code == EXIT_BAD_INPUT
    with pytest.raises(ModelError, match=r"caffemodel not found: .*nope\.caffemodel"):
        load_net(prototxt, tmp_path / "nope.caffemodel")
    with pytest.raises(ModelError, match=r"is a directory"):
        load_net(tmp_path, weights)


def test_empty_files(lenet, tmp_path):
    prototxt, weights, _ = lenet
    (tmp_path / "e.prototxt").write_text("  \n")
    (tmp_path / "e.caffemodel").write_bytes(b"")
    with pytest.raises(ModelError, match=r"prototxt .*e\.prototxt is empty"):
        load_net(tmp_path / "e.prototxt", weights)
    with pytest.raises(ModelError, match=r"caffemodel .*e\.caffemodel is empty \(0 bytes\)"):
        load_net(prototxt, tmp_path / "e.caffemodel")
    (tmp_path / "c.prototxt").write_text("# only a comment\n")
    with pytest.raises(ModelError, match=r"c\.prototxt defines no layers"):
        load_net(tmp_path / "c.prototxt", weights)


def test_a_model_file_that_is_no_regular_file_or_too_large_is_refused_unread(lenet, tmp_path):
    """/dev/zero named as the weights grew to 23 GB; a FIFO named as the prototxt hung the start."""
    prototxt, weights, _ = lenet
    with pytest.raises(ModelError, match=r"cannot read caffemodel /dev/zero: not a regular file; expected a "
                                         r"regular file of at most 256 MB"):
        load_net(prototxt, Path("/dev/zero"))
    os.mkfifo(tmp_path / "f.prototxt")
    with pytest.raises(ModelError, match=r"cannot read prototxt .*f\.prototxt: not a regular file"):
        load_net(tmp_path / "f.prototxt", weights)
    with open(tmp_path / "big.caffemodel", "wb") as sparse:  # no disk used
        sparse.truncate((256 << 20) + 1)
    with pytest.raises(ModelError, match=r"big\.caffemodel: larger than 268435456 bytes"):
        load_net(prototxt, tmp_path / "big.caffemodel")


def test_truncated_caffemodel(lenet, tmp_path):
    prototxt, weights, _ = lenet
    data = weights.read_bytes()
    half = tmp_path / "half.caffemodel"
    half.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=rf"caffemodel .*half\.caffemodel \({len(data) // 2} "
                                         rf"bytes\) is truncated or corrupt"):
        load_net(prototxt, half)


def test_garbage_caffemodel(lenet, tmp_path):
    prototxt, _, _ = lenet
    for seed in range(5):
        path = tmp_path / f"garbage{seed}.caffemodel"
        path.write_bytes(np.random.default_rng(seed).bytes(4096))
        with pytest.raises(ModelError, match=rf"caffemodel .*garbage{seed}\.caffemodel"):
            load_net(prototxt, path)
    text = tmp_path / "text.caffemodel"
    text.write_bytes(prototxt.read_bytes())  # a prototxt passed as weights
    with pytest.raises(ModelError, match=r"text\.caffemodel .*a prototxt given as the weights"):
        load_net(prototxt, text)


def test_corrupt_prototxt_names_line_and_column(lenet, tmp_path):
    prototxt, weights, _ = lenet
    bad = _edit(prototxt, tmp_path / "bad.prototxt", 'type: "Pooling"', 'type: "Pooling" }}')
    with pytest.raises(ModelError, match=r"prototxt .*bad\.prototxt is not a valid Caffe net: "
                                         r"\d+:\d+ :"):
        load_net(bad, weights)
    unknown_field = _edit(prototxt, tmp_path / "field.prototxt", "stride: 2", "strid: 2")
    with pytest.raises(ModelError, match=r"field\.prototxt .*no field named \"strid\""):
        load_net(unknown_field, weights)
    binary = tmp_path / "binary.prototxt"
    binary.write_bytes(weights.read_bytes())  # a caffemodel passed as the prototxt
    with pytest.raises(ModelError, match=r"binary\.prototxt is not (text|a valid Caffe net)"):
        load_net(binary, weights)
    truncated = tmp_path / "cut.prototxt"
    truncated.write_text(prototxt.read_text()[:700])
    with pytest.raises(ModelError, match=r"cut\.prototxt is not a valid Caffe net"):
        load_net(truncated, weights)


def test_blob_shape_mismatch_names_file_layer_and_shapes(lenet, tmp_path):
    prototxt, weights, _ = lenet
    bad = _edit(prototxt, tmp_path / "wide.prototxt", "num_output: 20", "num_output: 21")
    with pytest.raises(ModelError, match=r"caffemodel .*lenet_iter_10000\.caffemodel: layer "
                                         r"'conv1' blob 0 has shape \(20, 1, 5, 5\); the prototxt "
                                         r"implies \(21, 1, 5, 5\)"):
        load_net(bad, weights)
    bad = _edit(prototxt, tmp_path / "ip.prototxt", "num_output: 500", "num_output: 400")
    with pytest.raises(ModelError, match=r"layer 'ip1' blob 0 has shape \(500, 800\); the "
                                         r"prototxt implies \(400, 800\)"):
        load_net(bad, weights)
    # A V1 (legacy 4-D) blob that does not match either.
    v1 = tmp_path / "v1.caffemodel"
    write_caffemodel(v1, load_net(prototxt, weights), v1=True)
    with pytest.raises(ModelError, match=r"layer 'conv1' blob 0 has shape \(20, 1, 5, 5\); the "
                                         r"prototxt implies \(21, 1, 5, 5\)"):
        load_net(tmp_path / "wide.prototxt", v1)


def test_blob_count_and_size_mismatch(lenet, tmp_path):
    prototxt, weights, _ = lenet
    no_bias = _edit(prototxt, tmp_path / "nobias.prototxt", "num_output: 20",
                    "num_output: 20 bias_term: false")
    with pytest.raises(ModelError, match=r"layer 'conv1' \(Convolution\) has 2 blobs; "
                                         r"nobias\.prototxt implies 1 of shapes \(20, 1, 5, 5\)"):
        load_net(no_bias, weights)
    raw = read_caffemodel(weights)
    del next(layer for layer in raw.layer if layer.name == "ip2").blobs[1].data[3:]
    short = tmp_path / "short.caffemodel"
    short.write_bytes(raw.SerializeToString())
    with pytest.raises(ModelError, match=r"short\.caffemodel: layer 'ip2' blob 1 has 3 values "
                                         r"but its shape \(10,\) needs 10"):
        load_net(prototxt, short)
    # Sizes a numpy product got wrong: two negatives make a positive count, 2**32 x 2**32 wraps to
    # 0 in int64 (a ValueError traceback from reshape, both)
    for dims, values, message in (([-10, -500], 5000, r"blob 0 has shape \(-10, -500\); expected sizes >= 0"),
                                  ([2**32, 2**32], 0, r"blob 0 has 0 values but its shape \(4294967296, 4294967296\) "
                                                      r"needs 18446744073709551616")):
        raw = read_caffemodel(weights)
        blob = next(layer for layer in raw.layer if layer.name == "ip2").blobs[0]
        del blob.shape.dim[:]
        blob.shape.dim.extend(dims)
        del blob.data[values:]
        blob.data.extend([0.0] * (values - len(blob.data)))
        odd = tmp_path / "odd.caffemodel"
        odd.write_bytes(raw.SerializeToString())
        with pytest.raises(ModelError, match=rf"odd\.caffemodel: layer 'ip2' {message}"):
            load_net(prototxt, odd)


def test_layer_without_weights(lenet, tmp_path):
    prototxt, weights, _ = lenet
    renamed = _edit(prototxt, tmp_path / "renamed.prototxt", 'name: "ip2"', 'name: "ip_new"')
    with pytest.raises(ModelError, match=r"caffemodel .*lenet_iter_10000\.caffemodel has no "
                                         r"weights for layer 'ip_new' \(InnerProduct in "
                                         r"renamed\.prototxt\); expected 2 blobs of shapes "
                                         r"\(10, 500\), \(10,\)"):
        load_net(renamed, weights)


def test_unknown_layer_type_names_layer_and_type(lenet, tmp_path):
    prototxt, weights, _ = lenet
    bad = _edit(prototxt, tmp_path / "swish.prototxt", 'type: "ReLU"', 'type: "Swish"')
    with pytest.raises(ModelError, match=r"prototxt .*swish\.prototxt: layer 'relu1' has type "
                                         r"'Swish', which the engine does not support "
                                         r"\(supported: BatchNorm, Concat,"):
        load_net(bad, weights)


def test_structural_errors(tmp_path):
    cases = {
        "noinput": ('layer { name: "r" type: "ReLU" bottom: "x" top: "x" }',
                    r"declares no input"),
        "dims": ('input: "x" input_dim: 1 input_dim: 2 layer { name: "r" type: "ReLU" '
                 'bottom: "x" top: "x" }', r"1 inputs need 4 input_dim values; found 2"),
        "dangling": ('input: "x" input_shape { dim: 1 dim: 2 } layer { name: "r" type: "ReLU" '
                     'bottom: "y" top: "y" }',
                     r"layer 'r' \(ReLU\): bottom 'y' is not produced by any earlier layer"),
        "both": ('input: "x" input_shape { dim: 1 dim: 2 } layer { name: "r" type: "ReLU" '
                 'bottom: "x" top: "x" include { phase: TEST } exclude { phase: TRAIN } }',
                 r"layer 'r' has both include and exclude rules"),
        "dup": ('input: "x" input_shape { dim: 1 dim: 2 } '
                'layer { name: "r" type: "ReLU" bottom: "x" top: "x" } '
                'layer { name: "r" type: "ReLU" bottom: "x" top: "x" }',
                r"two layers are named 'r'"),
        "mixed": ('input: "x" input_shape { dim: 1 dim: 2 } '
                  'layer { name: "r" type: "ReLU" bottom: "x" top: "x" } '
                  'layers { name: "s" type: RELU bottom: "x" top: "x" }',
                  r"mixes current `layer` and V1 `layers`"),
        "zero": ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 0 } } } '
                 'layer { name: "r" type: "ReLU" bottom: "x" top: "x" }',
                 r"input 'x' has shape \(0,\); expected positive"),
        "group": ('input: "x" input_shape { dim: 1 dim: 3 dim: 8 dim: 8 } layer { name: "c" '
                  'type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 4 '
                  'kernel_size: 3 group: 2 } }',
                  r"layer 'c' \(Convolution\): group 2 must divide both the 3 input channels"),
        # Caffe refuses a blob of two sources; the later layer's output replaced the other in silence
        "twice": ('input: "x" input_shape { dim: 1 dim: 2 } '
                  'layer { name: "a" type: "ReLU" bottom: "x" top: "y" } '
                  'layer { name: "b" type: "Sigmoid" bottom: "x" top: "y" }',
                  r"layer 'b' writes blob 'y', which an input or an earlier layer already produces"),
        "input": ('input: "x" input_shape { dim: 1 dim: 2 } '
                  'layer { name: "a" type: "ReLU" bottom: "x" top: "y" } '
                  'layer { name: "b" type: "Sigmoid" bottom: "y" top: "x" }',
                  r"layer 'b' writes blob 'x', which an input"),
        # Caffe keeps one blob per name; a repeated input was kept once, with one of its shapes
        "repeated": ('input: "x" input_shape { dim: 1 dim: 2 } input: "x" input_shape { dim: 1 dim: 3 } '
                     'layer { name: "r" type: "ReLU" bottom: "x" top: "r" }',
                     r"input 'x' is declared twice"),
        "repeatedtop": ('layer { name: "in" type: "Input" top: "x" top: "x" '
                        'input_param { shape { dim: 1 dim: 2 } shape { dim: 1 dim: 3 } } } '
                        'layer { name: "r" type: "ReLU" bottom: "x" top: "r" }',
                        r"input 'x' is declared twice"),
        # Caffe's ConcatLayer refuses both fields; the engine took concat_dim and left axis unread
        "concatboth": ('input: "x" input_shape { dim: 1 dim: 2 dim: 3 } '
                       'layer { name: "c" type: "Concat" bottom: "x" bottom: "x" top: "c" '
                       'concat_param { axis: 2 concat_dim: 1 } }',
                       r"layer 'c' \(Concat\): sets both axis \(2\) and concat_dim \(1\); "
                       r"expected one of them"),
        "concatdim": ('input: "x" input_shape { dim: 1 dim: 2 dim: 3 } '
                      'layer { name: "c" type: "Concat" bottom: "x" bottom: "x" top: "c" '
                      'concat_param { concat_dim: 3 } }',
                      r"layer 'c' \(Concat\): concat_dim 3 is out of range for a 3-D input "
                      r"\(expected 0..2\)"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / f"{name}.prototxt"
        path.write_text(text)
        with pytest.raises(ModelError, match=rf"{name}\.prototxt.*{message}"):
            load_net(path, None)


def test_bad_input_is_one_line_and_exit_2_from_the_command_line(tmp_path):
    out = tmp_path / "w.caffemodel"
    result = subprocess.run(
        [sys.executable, "-m", "tracker.model.face_cnn", "--prototxt",
         str(tmp_path / "missing.prototxt"), "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip().count("\n") == 0
    assert "prototxt not found" in result.stderr and "missing.prototxt" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_v1_writes_non_4d_inputs_as_input_shape(tmp_path):
    proto = tmp_path / "vec.prototxt"
    proto.write_text('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 '
                     'dim: 3 } } }\n'
                     'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
                     'param { name: "shared_w" lr_mult: 1 } param { lr_mult: 2 } '
                     'inner_product_param { num_output: 4 } }\n')
    net = load_net(proto, None)
    v1 = tmp_path / "vec_v1.prototxt"
    write_prototxt(v1, net, v1=True)
    raw = read_prototxt(v1, upgrade=False)
    assert list(raw.input) == ["x"] and len(raw.input_dim) == 0
    assert list(raw.input_shape[0].dim) == [2, 3]
    assert list(raw.layers[0].param) == ["shared_w", ""]  # names stay aligned with the blobs
    back = load_net(v1, None)
    assert back.inputs == {"x": (2, 3)}
    assert [p.name for p in back.layers[0].param.param] == ["shared_w", ""]
    assert shapes.infer_shapes(back) == {"x": (2, 3), "y": (2, 4)}
