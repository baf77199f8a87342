"""Converters: Caffe semantics through graph.lower and the Keras, ONNX and torch emitters, against
the float64 Caffe engine (and OpenCV's outputs for the pooling layer tests); `tracker convert`."""

from __future__ import annotations

import re

import numpy as np
import pytest
from backend_parity import TOL, reference, run_without, write_quirky

from tracker.cli import main
from tracker.errors import ModelError
from tracker.model.caffe_io import load_net
from tracker.model.convert import load_graph
from tracker.model.convert.graph import Dense, Flatten, Pool, float_softmax, lower
from tracker.model.spec import ModelSpec

POOL_PROTOTXT = """
name: "pool"
layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: 1 dim: 3 dim: {h} dim: {w} }} }} }}
layer {{ name: "pool" type: "Pooling" bottom: "data" top: "pool"
        pooling_param {{ pool: {method} kernel_h: {kh} kernel_w: {kw} stride_h: {sh} stride_w: {sw} pad_h: {ph} pad_w: {pw} }} }}
"""

# (h, w, kh, kw, sh, sw, ph, pw): ceil tails, pads, Caffe's clip of a window starting in the pad
POOL_CASES = [
    (10, 7, 3, 2, 2, 2, 0, 0),  # ceil tail on both axes
    (9, 11, 3, 3, 2, 3, 1, 1),  # pad + tail
    (4, 5, 2, 2, 3, 3, 1, 1),  # last window would start in the pad: Caffe drops it (a crop)
    (6, 6, 2, 2, 2, 2, 0, 0),  # divides evenly: no pad at all
]


def _emitters(graph, x):
    """{emitter: (prob, embedding)} for the Keras, ONNX and torch forms of `graph` on x (NCHW)."""
    import onnxruntime as ort
    import torch

    from tracker.model.convert.keras import build_keras
    from tracker.model.convert.onnx import build_onnx
    from tracker.model.convert.torch import build_torch

    keras_out = build_keras(graph)(x.transpose(0, 2, 3, 1))
    session = ort.InferenceSession(build_onnx(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    with torch.inference_mode():
        torch_out = build_torch(graph)(torch.from_numpy(x))
    return {
        "keras": (keras_out["prob"].numpy(), keras_out["embedding"].numpy()),
        "onnx": tuple(session.run(["prob", "embedding"], {"data": x})),
        "torch": tuple(t.numpy() for t in torch_out),
    }


@pytest.fixture(scope="module")
def quirky(tmp_path_factory) -> ModelSpec:
    return write_quirky(tmp_path_factory.mktemp("quirky"))


def test_quirky_net_exercises_the_quirks(quirky):
    graph = load_graph(quirky)
    pools = [op for op in graph.ops if isinstance(op, Pool)]
    assert pools[0].pad[2:] == (1, 1), "MAX pooling must read a ceil-mode tail on both axes"
    assert pools[1].scale is not None, "AVE pooling must divide edge windows by less than kh*kw"
    assert graph.shapes["data"] == (2, 23, 17)
    flat = next(op for op in graph.ops if isinstance(op, Flatten))
    c, h, w = graph.shapes[flat.src]
    assert h != w and c > 1


def test_quirky_net_matches_the_engine_in_every_emitter(quirky):
    x = np.random.default_rng(0).standard_normal((4, 2, 23, 17)).astype(np.float32)
    probs, embedding = reference(quirky, x)
    for name, (p, e) in _emitters(load_graph(quirky), x).items():
        assert p.shape == probs.shape and e.shape == embedding.shape, name
        assert np.abs(p - probs).max() <= TOL, name
        assert np.abs(e - embedding).max() <= TOL, name


def test_a_wrong_flatten_order_would_be_caught(quirky):
    """The same weights read in H, W, C order (the NHWC mistake) change the outputs far beyond
    the tolerance on this input, so the parity test above would fail on that mistake."""
    graph = load_graph(quirky)
    x = np.random.default_rng(0).standard_normal((4, 2, 23, 17)).astype(np.float32)
    fc1 = next(op for op in graph.ops if isinstance(op, Dense))
    c, h, w = graph.shapes[next(op for op in graph.ops if op.dst == fc1.src).src]
    wrong = fc1.weight.reshape(-1, h, w, c).transpose(0, 3, 1, 2).reshape(fc1.weight.shape)
    mutated = type(graph)(graph.name, graph.input, tuple(
        Dense(op.name, op.src, op.dst, wrong, op.bias) if op is fc1 else op for op in graph.ops),
        graph.shapes, graph.outputs, graph.consumers)
    probs, embedding = reference(quirky, x)
    _, e = _emitters(mutated, x)["onnx"]
    assert np.abs(e - embedding).max() > 100 * TOL


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_pooling_matches_caffe(tmp_path, method, case):
    h, w, kh, kw, sh, sw, ph, pw = case
    prototxt = tmp_path / "pool.prototxt"
    prototxt.write_text(POOL_PROTOTXT.format(method=method, h=h, w=w, kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw))
    netdef = load_net(prototxt, None)
    graph = lower(netdef, "pool", "pool")
    x = np.random.default_rng(1).standard_normal((2, 3, h, w)).astype(np.float32)
    from tracker.model.engine import Net

    want = Net(netdef, dtype=np.float64, mode="caffe").forward(x.astype(np.float64), ["pool"])["pool"].reshape(2, -1)
    for name, (p, _) in _emitters(graph, x).items():
        assert p.shape == want.shape, name
        assert np.abs(p - want).max() <= TOL, (name, np.abs(p - want).max())


@pytest.mark.parametrize("method", ["max", "ave"])
def test_pooling_matches_opencv_reference(testdata, method):
    """OpenCV 4.10's outputs for its own Caffe pooling tests (kernel 3x5, stride 2x1, pad 2x1)."""
    folder = testdata / "caffe" / "layers"
    netdef = load_net(folder / f"layer_pooling_{method}.prototxt", None)
    x = np.load(folder / "blob.npy")
    want = np.load(folder / f"layer_pooling_{method}.ref_opencv.npy").reshape(len(x), -1)
    for name, (p, _) in _emitters(lower(netdef, "output", "output"), x).items():
        assert np.abs(p - want).max() <= 1e-4, name


def test_lenet_matches_the_engine_in_every_emitter(testdata):
    from backend_parity import lenet, mnist

    model, x = lenet(testdata), mnist(testdata)[:16]
    probs, embedding = reference(model, x)
    for name, (p, e) in _emitters(load_graph(model), x).items():
        assert np.abs(p - probs).max() <= TOL and np.abs(e - embedding).max() <= TOL, name


ODD_AXES_PROTOTXT = """
name: "odd"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 9 dim: 7 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 stride: 1 } }
layer { name: "flat" type: "Flatten" bottom: "conv" top: "flat" flatten_param { axis: -3 end_axis: 3 } }
layer { name: "fc1" type: "InnerProduct" bottom: "flat" top: "fc1" inner_product_param { num_output: 5 axis: -1 } }
layer { name: "prob" type: "Softmax" bottom: "fc1" top: "prob" softmax_param { axis: -1 } }
"""


def test_negative_axes_and_unequal_pads_match_the_engine_in_every_emitter(tmp_path):
    """axis -1 on (N, D) is axis 1: it was refused; a pad of 1 row and 0 columns padded Keras's
    rows and columns by 1 on one side each (a traceback, or outputs of the wrong size)."""
    from backend_parity import write_net

    model = write_net(tmp_path, "odd", ODD_AXES_PROTOTXT, "prob", "fc1")
    x = np.random.default_rng(2).standard_normal((3, 2, 9, 7)).astype(np.float32)
    probs, embedding = reference(model, x)
    for name, (p, e) in _emitters(load_graph(model), x).items():
        assert p.shape == probs.shape and np.abs(p - probs).max() <= TOL, name
        assert np.abs(e - embedding).max() <= TOL, name


# Nets with layers named like the names an emitter makes up. Keras: its Input is "data" (here the
# input blob is "img"). ONNX: pooling "p", cropped for FLOOR rounding, made a tensor
# "caffe/p_cropped" and a node "p_crop", as did the layers "p_cropped" and "p_crop"; pooling "q"
# pads and scales: "_padded", "_pooled" and "_pad", "_scale" alike.
NAME_CLASH_PROTOTXTS = {
    "keras-input": """
name: "keras_input"
input: "img"
input_shape { dim: 1 dim: 3 dim: 4 dim: 5 }
layer { name: "data" type: "InnerProduct" bottom: "img" top: "emb" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "emb" top: "prob" }
""",
    "onnx-steps": """
name: "onnx_steps"
input: "data"
input_shape { dim: 1 dim: 3 dim: 9 dim: 9 }
layer { name: "p" type: "Pooling" bottom: "data" top: "x" pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: FLOOR } }
layer { name: "p_cropped" type: "ReLU" bottom: "x" top: "x" relu_param { negative_slope: 0.5 } }
layer { name: "p_crop" type: "ReLU" bottom: "x" top: "x" relu_param { negative_slope: 0.5 } }
layer { name: "q" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "q_padded" type: "TanH" bottom: "y" top: "y" }
layer { name: "q_pad" type: "TanH" bottom: "y" top: "y" }
layer { name: "q_pooled" type: "Sigmoid" bottom: "y" top: "y" }
layer { name: "q_scale" type: "Sigmoid" bottom: "y" top: "y" }
layer { name: "emb" type: "InnerProduct" bottom: "y" top: "emb" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "emb" top: "prob" }
""",
}


@pytest.mark.parametrize("net", sorted(NAME_CLASH_PROTOTXTS))
def test_a_layer_named_like_an_emitters_own_name_matches_the_engine(tmp_path, net):
    """Keras refused a second "data" (ValueError), ONNX's checker a tensor made twice
    (ValidationError): both tracebacks of `tracker convert`; ONNX Runtime a model with two nodes
    of one name."""
    from backend_parity import write_net

    model = write_net(tmp_path, net, NAME_CLASH_PROTOTXTS[net], "prob", "emb")
    graph = load_graph(model)
    if net == "onnx-steps":  # each step ONNX names itself is made: the crop, the pad, the scale
        p, q = (op for op in graph.ops if isinstance(op, Pool))
        assert p.crop != (0, 0) and any(q.pad) and q.scale is not None
    x = np.random.default_rng(4).standard_normal((2, *graph.input_shape)).astype(np.float32)
    probs, embedding = reference(model, x)
    for name, (p, e) in _emitters(graph, x).items():
        assert p.shape == probs.shape and np.abs(p - probs).max() <= TOL, name
        assert np.abs(e - embedding).max() <= TOL, name


def test_int8_keeps_a_float_pools_own_nodes_in_float_not_a_layer_named_like_one(tmp_path):
    """Pooling "p" crops; a convolution is named "p_crop", as p's Slice node was (ONNX Runtime
    refused the model): that Slice is renamed, stays float with p, and the convolution is int8."""
    from backend_parity import write_net

    from tracker.model.convert.onnx import quantize_int8

    graph = load_graph(write_net(tmp_path, "float_steps", """
name: "float_steps"
input: "data"
input_shape { dim: 1 dim: 3 dim: 9 dim: 9 }
layer { name: "p" type: "Pooling" bottom: "data" top: "x" pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: FLOOR } }
layer { name: "p_crop" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "emb" type: "InnerProduct" bottom: "c" top: "emb" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "emb" top: "prob" }
""", "prob", "emb"))
    x = np.random.default_rng(5).standard_normal((4, *graph.input_shape)).astype(np.float32)
    quantize_int8(graph, tmp_path / "int8.onnx", x, ("p",))
    import onnx

    nodes = onnx.load(tmp_path / "int8.onnx").graph.node
    made_by = {out: n.op_type for n in nodes for out in n.output}
    reads_int8 = {n.name: any(made_by.get(i) == "DequantizeLinear" for i in n.input) for n in nodes}
    assert {n.name: n.op_type for n in nodes if n.op_type in ("Slice", "MaxPool", "Conv")} == {
        "p_crop_2": "Slice", "p": "MaxPool", "p_crop": "Conv"}
    assert not reads_int8["p_crop_2"] and not reads_int8["p"] and reads_int8["p_crop"]


def test_int8_takes_a_layer_named_like_a_name_the_quantiser_makes_up(tmp_path):
    """ONNX Runtime's quantiser names a tensor's scale "<tensor>_scale": the tops "q" and "q_scale"
    gave it two tensors "caffe/q_scale", and `tracker convert --precision int8` a KeyError traceback."""
    import onnxruntime as ort
    from backend_parity import write_net

    from tracker.model.convert.onnx import quantize_int8

    model = write_net(tmp_path, "quantiser_names", """
name: "quantiser_names"
input: "data"
input_shape { dim: 1 dim: 3 dim: 9 dim: 9 }
layer { name: "q" type: "Convolution" bottom: "data" top: "q" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "q_scale" type: "Sigmoid" bottom: "q" top: "q_scale" }
layer { name: "q_zero_point" type: "Convolution" bottom: "q_scale" top: "q_zero_point" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "emb" type: "InnerProduct" bottom: "q_zero_point" top: "emb" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "emb" top: "prob" }
""", "prob", "emb")
    graph = load_graph(model)
    x = np.random.default_rng(6).standard_normal((8, *graph.input_shape)).astype(np.float32)
    quantize_int8(graph, tmp_path / "int8.onnx", x)
    session = ort.InferenceSession(str(tmp_path / "int8.onnx"), providers=["CPUExecutionProvider"])
    probs, embedding = reference(model, x)
    got = dict(zip(["prob", "embedding"], session.run(["prob", "embedding"], {"data": x})))
    assert got["prob"].shape == probs.shape and np.abs(got["embedding"] - embedding).max() < 0.1 * np.abs(embedding).max()


@pytest.mark.parametrize("change, refusal, said", [  # (the engine's check refuses the Flatten first)
    ('softmax_param { axis: -1 }', "softmax_param { axis: -2 }", "'prob' (Softmax): the converters support axis 1"),
    ('flatten_param { axis: -3 end_axis: 3 }', "flatten_param { axis: -4 }", "'flat' (Flatten): flattens from axis 0"),
])
def test_an_axis_that_counts_back_to_the_batch_is_refused(tmp_path, change, refusal, said):
    """-len(shape) - 1 was taken for axis 1, and a softmax over the batch became one over the
    channels: a model unlike the engine's, without a word."""
    from backend_parity import write_net

    model = write_net(tmp_path, "batch_axis", ODD_AXES_PROTOTXT.replace(change, refusal), "prob", "fc1")
    with pytest.raises(ModelError, match=f"layer {re.escape(said)}"):
        load_graph(model)


def test_a_strided_dilated_convolution_is_refused_by_the_keras_conversion(tmp_path):
    """Keras's Conv2D cannot run it: a ValueError's traceback in `tracker convert --to tf`."""
    pytest.importorskip("keras")
    from backend_parity import write_net

    from tracker.model.convert.keras import build_keras

    text = ODD_AXES_PROTOTXT.replace("kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 stride: 1", "kernel_size: 3 stride: 2 dilation: 2")
    graph = load_graph(write_net(tmp_path, "dil", text, "prob", "fc1"))
    with pytest.raises(ModelError, match=r"layer 'conv': stride \(2, 2\) with dilation \(2, 2\), which Keras's Conv2D"):
        build_keras(graph)


def test_a_net_the_engine_refuses_is_not_lowered(tmp_path):
    """check_net's memory bound: a 300-megapixel input's pooling asked numpy for gigabytes (the
    OOM killer on a Pi) before any error."""
    from backend_parity import write_net

    model = write_net(tmp_path, "huge", """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 300000000 dim: 30 } } }
layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
""", "pool", "pool")
    with pytest.raises(ModelError, match=r"its blobs need .* MB for one image .*; expected at most 256 MB"):
        load_graph(model)


def test_unsupported_layer_is_named(tmp_path):
    prototxt = tmp_path / "lrn.prototxt"
    prototxt.write_text("""
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "norm1" type: "LRN" bottom: "data" top: "norm1" }
""")
    with pytest.raises(ModelError, match=r"layer 'norm1' has type 'LRN', which the converters do not support"):
        lower(load_net(prototxt, None), "norm1", "norm1")


def test_missing_output_blob_is_named(quirky):
    with pytest.raises(ModelError, match=r"embedding blob 'fc9' is not a blob of net 'quirky'"):
        lower(load_net(quirky.prototxt, quirky.weights), "prob", "fc9")


def test_float_softmax_ends_at_the_logits(quirky):
    graph = float_softmax(load_graph(quirky))
    assert set(graph.outputs) == {"logits", "embedding"} and graph.outputs["logits"] == "fc2"
    assert graph.ops[-1].dst == "fc2"


def test_convert_command_writes_each_target(tmp_path, quirky, capsys):
    for target, suffix in (("onnx", ".onnx"), ("tflite", ".tflite"), ("tf", ".keras")):
        out = tmp_path / f"model{suffix}"
        code = main(["convert", "--to", target, "--prototxt", str(quirky.prototxt), "--weights", str(quirky.weights),
                     "--cache-dir", str(tmp_path / "cache"), "--out", str(out)])
        assert code == 0 and out.stat().st_size > 1000
        assert capsys.readouterr().out.strip() == str(out)
    import onnx

    model = onnx.load(tmp_path / "model.onnx")
    assert [o.name for o in model.graph.output] == ["prob", "embedding"]


def test_convert_command_int8_onnx_keeps_the_softmax_in_float(tmp_path, testdata, capsys):
    from backend_parity import lenet

    model = lenet(testdata)
    code = main(["convert", "--to", "onnx", "--precision", "int8", "--prototxt", str(model.prototxt),
                 "--weights", str(model.weights), "--embedding", "ip1", "--cache-dir", str(tmp_path)])
    assert code == 0
    import onnx

    model = onnx.load(capsys.readouterr().out.strip())
    assert [o.name for o in model.graph.output] == ["prob", "embedding"]
    assert any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    assert [n.op_type for n in model.graph.node[-2:]] == ["DequantizeLinear", "Softmax"]


def test_convert_int8_onnx_says_what_it_converts_and_nothing_of_onnx_runtimes_advice(tmp_path):
    """ONNX Runtime's quantiser logged "Please consider to run pre-processing before quantization"
    (and again after it) on the root logger: two WARNING lines a conversion the user cannot act on."""
    import subprocess

    from test_pipeline_e2e import isolated_env, tracker_command

    proc = subprocess.run([*tracker_command(), "convert", "--to", "onnx", "--precision", "int8", "--cache-dir",
                           str(tmp_path / "cache")], capture_output=True, text=True, env=isolated_env(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "INFO tracker.model.convert.cache: converting onnx -> " in lines[0], proc.stderr


def test_convert_tflite_shows_no_tensorflow_info_lines(tmp_path):
    """`tracker convert` logs from INFO; TensorFlow's Python logger passed its INFO "Assets written
    to: /tmp/..." through, one line for each SavedModel the LiteRT converter writes on its way. Its
    C++ start-up lines (absl's, and "failed call to cuInit" on a machine without a GPU) came too,
    seven of them on this project's x86-64 machines (tracker.native_stderr)."""
    import subprocess

    from test_pipeline_e2e import isolated_env, tracker_command

    proc = subprocess.run([*tracker_command(), "convert", "--to", "tflite", "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, env=isolated_env(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "converting tflite -> " in proc.stderr and " INFO tensorflow" not in proc.stderr, proc.stderr
    assert "absl::InitializeLog" not in proc.stderr and "cuInit" not in proc.stderr, proc.stderr


def test_convert_command_bad_input(tmp_path, capsys):
    assert main(["convert", "--to", "tf", "--precision", "int8", "--cache-dir", str(tmp_path)]) == 2
    assert "target 'tf' has no 'int8' form; targets with 'int8': tflite, onnx" in capsys.readouterr().err
    assert main(["convert", "--to", "caffe2"]) == 2
    assert "--to" in capsys.readouterr().err
    assert main(["convert", "--to", "onnx", "--weights", str(tmp_path / "none.caffemodel"), "--cache-dir", str(tmp_path)]) == 2
    assert "none.caffemodel" in capsys.readouterr().err


def test_convert_command_never_writes_over_a_fifo_or_device(tmp_path, quirky, capsys):
    """The rename put a regular file in place of what --out named: as root, /dev/null itself."""
    import os
    import stat

    fifo = tmp_path / "out.onnx"
    os.mkfifo(fifo)
    assert main(["convert", "--to", "onnx", "--prototxt", str(quirky.prototxt), "--weights", str(quirky.weights),
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(fifo)]) == 2
    assert f"--out {str(fifo)!r}: cannot write ({fifo} exists and is not a regular file)" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    link = tmp_path / "link.onnx"  # as /dev/stdout is a link to a device
    link.symlink_to(fifo)
    assert main(["convert", "--to", "onnx", "--prototxt", str(quirky.prototxt), "--weights", str(quirky.weights),
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(link)]) == 2
    assert "exists and is not a regular file" in capsys.readouterr().err and link.is_symlink()


def test_convert_command_missing_runtime_exits_3(tmp_path):
    done = run_without("onnx", f"from tracker.cli import main; raise SystemExit(main(['convert', '--to', 'onnx', '--cache-dir', {str(tmp_path)!r}]))")
    assert done.returncode == 3, done.stderr
    assert "pip install -e '.[onnx]'" in done.stderr and "Traceback" not in done.stderr


def test_int8_keeps_the_one_channel_first_layer_in_float(testdata, quirky):
    from backend_parity import lenet

    from tracker.model.convert.graph import int8_float_prefix
    from tracker.model.spec import default_model

    assert int8_float_prefix(load_graph(default_model())) == ("conv1", "relu1", "pool1")
    assert int8_float_prefix(load_graph(lenet(testdata))) == ("conv1", "pool1")
    assert int8_float_prefix(load_graph(quirky)) == ("conv1", "relu1", "pool1")  # 2 channels
    three = load_graph(default_model())
    wide = type(three)(three.name, three.input, three.ops[3:], {**three.shapes}, three.outputs, three.consumers)
    assert int8_float_prefix(wide) == ()  # conv2 reads 16 channels: all int8


def test_int8_keeps_the_final_softmax_in_float(testdata, quirky):
    from backend_parity import lenet

    from tracker.model.convert.graph import int8_float_ops
    from tracker.model.spec import default_model

    assert int8_float_ops(load_graph(default_model())) == ("conv1", "relu1", "pool1", "prob")
    assert int8_float_ops(load_graph(lenet(testdata))) == ("conv1", "pool1", "prob")
    face = load_graph(default_model())
    no_softmax = type(face)(face.name, face.input, face.ops[3:-1], {**face.shapes},
                            {"prob": "fc2", "embedding": "relu4"}, face.consumers)
    assert int8_float_ops(no_softmax) == ()  # ends at a Dense, and conv2 reads 16 channels


def test_convert_command_never_writes_over_the_files_it_converts(tmp_path, quirky, capsys):
    """`--weights w.caffemodel --out w.caffemodel` replaced the weights (a training's only result,
    or the shipped ones) with the converted model."""
    import shutil

    model = ModelSpec(tmp_path / "net.prototxt", tmp_path / "net.caffemodel")
    shutil.copy(quirky.prototxt, model.prototxt)
    shutil.copy(quirky.weights, model.weights)
    for out, what in ((model.weights, "caffemodel"), (model.prototxt, "prototxt")):
        before = out.read_bytes()
        assert main(["convert", "--to", "onnx", "--prototxt", str(model.prototxt), "--weights", str(model.weights),
                     "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"tracker: error: output file {str(out)!r} is the {what} file; expected "
                                           f"another path (writing it would destroy the {what})\n")
        assert out.read_bytes() == before
