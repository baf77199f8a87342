"""mxnet-openblas and mxnet-openblas-dl: the Caffe -> MXNet converter, parity with the float64
Caffe engine (face CNN, the real LeNet, a net of edge cases), MKLDNN really off / on, the missing
environment, and a killed MXNet worker recovered by RestartingBackend.

The MXNet tests run the real MXNet 1.9.1 in .venv-mxnet (scripts/setup-mxnet, which scripts/setup
runs); they are native_only because MXNet exists only for x86-64 (the aarch64 suite checks instead
that the backends say why they are unavailable there). The converter tests run everywhere.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
from pathlib import Path

import backend_parity as bp
import numpy as np
import pytest

from tracker.backends import availability, create_backend
from tracker.backends.mxnet import caffe_to_mxnet, convert
from tracker.backends.worker import InputsLost, RestartingBackend
from tracker.errors import BackendUnavailable, ModelError
from tracker.model.caffe_io import load_net
from tracker.model.spec import ModelSpec, default_model

CONFIGS = ["mxnet-openblas", "mxnet-openblas-dl"]
X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.timeout(300)
native = pytest.mark.native_only  # MXNet 1.9.1 is x86-64 only

# What the face CNN and the LeNet do not exercise: a convolution without bias; MAX pooling whose
# last window would start in the padding on both axes (Caffe drops it: 9x11 -> 5x6, where MXNet's
# "full" convention alone gives 6x7); AVE pooling with the same clip on H (5 -> 3, not 4) and the
# Caffe divisor at the padded edges; Sigmoid, TanH, Flatten; InnerProduct with transpose and
# one without bias.
EDGES_PROTOTXT = """
name: "edges"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 9 dim: 11 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "sig" type: "Sigmoid" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "pool2" type: "Pooling" bottom: "pool1" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "tanh" type: "TanH" bottom: "pool2" top: "pool2" }
layer { name: "flat" type: "Flatten" bottom: "pool2" top: "flat" }
layer { name: "fc1" type: "InnerProduct" bottom: "flat" top: "fc1" inner_product_param { num_output: 6 transpose: true } }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2" inner_product_param { num_output: 5 bias_term: false } }
layer { name: "prob" type: "Softmax" bottom: "fc2" top: "prob" }
"""


@pytest.fixture(scope="module")
def edges(tmp_path_factory) -> ModelSpec:
    return bp.write_net(tmp_path_factory.mktemp("edges"), "edges", EDGES_PROTOTXT, "prob", "fc1")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mxnet-cache")


# ---- the converter (no MXNet needed) ---------------------------------------------------------


def test_converter_keeps_caffe_semantics_in_the_symbol(edges):
    symbol, params = caffe_to_mxnet(load_net(edges.prototxt, edges.weights), "prob", "fc1")
    graph = json.loads(symbol)
    ops = [(n["op"], n["name"], n.get("attrs", {})) for n in graph["nodes"] if n["op"] != "null"]
    by_name = {name: (op, attrs) for op, name, attrs in ops}
    assert by_name["conv1"] == ("Convolution", {"kernel": "(3, 3)", "stride": "(1, 1)", "pad": "(1, 1)", "dilate": "(1, 1)",
                                                "num_filter": "4", "num_group": "1", "no_bias": "True"})
    assert by_name["pool1"][1]["pooling_convention"] == "full" and by_name["pool2"][1]["pool_type"] == "avg"
    # Caffe's clip of a last window starting in the padding: pool1 on both axes, pool2 on H
    assert by_name["pool1_clip2"] == ("slice_axis", {"axis": "2", "begin": "0", "end": "5"})
    assert by_name["pool1_clip3"] == ("slice_axis", {"axis": "3", "begin": "0", "end": "6"})
    assert by_name["pool2_clip2"] == ("slice_axis", {"axis": "2", "begin": "0", "end": "3"})
    assert "pool2_clip3" not in by_name
    assert [op for op, _, _ in ops] == ["Convolution", "Activation", "Pooling", "slice_axis", "slice_axis", "Pooling",
                                        "slice_axis", "Activation", "Flatten", "FullyConnected", "FullyConnected", "softmax"]
    netdef = load_net(edges.prototxt, edges.weights)
    fc1 = next(layer for layer in netdef.layers if layer.name == "fc1")
    assert fc1.blobs[0].shape == (48, 6)  # transpose: (K, num_output) in Caffe
    np.testing.assert_array_equal(params["fc1_weight"], fc1.blobs[0].T)
    assert sorted(params) == ["conv1_weight", "fc1_bias", "fc1_weight", "fc2_weight"]
    heads = [graph["nodes"][h[0]]["name"] for h in graph["heads"]]
    assert heads == ["prob", "fc1"]


def test_converter_reads_outputs_after_in_place_layers():
    model = default_model()
    graph = json.loads(caffe_to_mxnet(load_net(model.prototxt, model.weights), "prob", "fc1")[0])
    heads = [graph["nodes"][h[0]]["name"] for h in graph["heads"]]
    assert heads == ["prob", "relu4"]  # fc1 as Caffe reads it: after its in-place ReLU


def test_converter_rejects_what_it_cannot_express(testdata, edges):
    lrn = testdata / "caffe" / "layers" / "layer_lrn_channels.prototxt"
    with pytest.raises(ModelError, match=r"layer '.*': type 'LRN' is not supported by the MXNet converter; supported: Convolution"):
        caffe_to_mxnet(load_net(lrn, None), "output", "output")
    with pytest.raises(ModelError, match="embedding blob 'nope' is not in the net; blobs are data, conv1"):
        caffe_to_mxnet(load_net(edges.prototxt, edges.weights), "prob", "nope")


def test_conversion_is_cached_by_caffemodel_sha256(edges, tmp_path):
    first = convert(edges, tmp_path)
    symbol, params, input_name, chw = first
    assert (input_name, chw) == ("data", (3, 9, 11))
    sha = __import__("hashlib").sha256(edges.weights.read_bytes()).hexdigest()
    assert symbol == tmp_path / sha / "mxnet-symbol-fp32.json" and params == tmp_path / sha / "mxnet-params-fp32.npz"
    stamps = (symbol.stat().st_mtime_ns, params.stat().st_mtime_ns)
    assert convert(edges, tmp_path) == first
    assert (symbol.stat().st_mtime_ns, params.stat().st_mtime_ns) == stamps  # reused, not rebuilt
    with np.load(params) as stored:
        assert sorted(stored.files) == ["conv1_weight", "fc1_bias", "fc1_weight", "fc2_weight"]


# ---- availability -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_missing_environment_names_the_setup_command(name, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACKER_MXNET_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(BackendUnavailable) as err:
        create_backend(name)
    assert err.value.exit_code == 3
    if X86:
        assert f"backend {name!r}: the MXNet environment is missing" in str(err.value)
        assert str(err.value).endswith("create it with: scripts/setup-mxnet")
        # an interpreter without MXNet (this one) is no MXNet environment either
        monkeypatch.setenv("TRACKER_MXNET_PYTHON", sys.executable)
        assert "MXNet is not installed in the environment" in availability(name)
    else:
        assert "runs only on x86-64 here" in str(err.value) and "Arm Performance Libraries" in str(err.value)


@native
def test_unknown_option_is_an_input_error():
    from tracker.errors import InputError

    with pytest.raises(InputError,
                       match="backend 'mxnet-openblas': unknown option 'workspace_mb'; expected options: cache_dir, python, worker_options"):
        create_backend("mxnet-openblas", workspace_mb=64)


@pytest.mark.parametrize("name", CONFIGS)
def test_available_exactly_on_x86_64(name):
    reason = availability(name)
    if X86:
        assert reason is None, f"{reason} (CI runs scripts/setup-mxnet through scripts/setup)"
    else:
        assert "runs only on x86-64 here" in reason


# ---- MXNet for real ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def face_backends(cache_dir):
    """Both configurations on the face CNN, with oneDNN's verbose log on (to see which kernels run)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DNNL_VERBOSE", "1")
        backends = {name: create_backend(name, cache_dir=cache_dir) for name in CONFIGS}
    yield backends
    for backend in backends.values():
        backend.close()


@native
@pytest.mark.parametrize("name", CONFIGS)
def test_face_cnn_parity(face_backends, name):
    backend = face_backends[name]
    x = bp.face_inputs()
    bp.assert_parity(backend, default_model(), x)
    bp.assert_parity(backend, default_model(), x[:1])  # another batch size: another executor
    bp.assert_parity(backend, default_model(), x[3:6])


@native
def test_mkldnn_is_off_in_openblas_and_on_in_dl(face_backends):
    for name, backend in face_backends.items():
        versions = backend.runtime_versions
        assert (versions["mxnet"], versions["numpy"], versions["python"][:4]) == ("1.9.1", "1.23.5", "3.11")
        assert versions["mxnet_mkldnn"] == ("on" if name.endswith("-dl") else "off")
        backend.infer(bp.face_inputs()[:2])
    # oneDNN logs every primitive it executes (DNNL_VERBOSE=1): none without MKLDNN
    off = face_backends["mxnet-openblas"].worker.output_text()
    on = face_backends["mxnet-openblas-dl"].worker.output_text()
    assert "MXNET_SUBGRAPH_BACKEND=NONE" in off and "dnnl_verbose,exec" not in off
    assert "dnnl_verbose,exec,cpu,convolution" in on and "Subgraph backend MKLDNN is activated" in on
    assert "attr-post-ops:eltwise_relu" in on  # the graph pass fused each ReLU into its convolution


@native
@pytest.mark.parametrize("name", CONFIGS)
def test_lenet_parity_on_real_digits(testdata, cache_dir, name):
    model = bp.lenet(testdata)
    x = bp.mnist(testdata)
    with create_backend(name, model, cache_dir=cache_dir) as backend:
        bp.assert_parity(backend, model, x)
        predicted = backend.infer(x).probs.argmax(axis=1)
    opencv = np.load(testdata / "caffe" / "lenet" / "ref_opencv_mnist_t10k_pred.npy")[:64]
    np.testing.assert_array_equal(predicted, opencv)


@native
@pytest.mark.parametrize("name", CONFIGS)
def test_edge_case_net_parity(edges, cache_dir, name):
    x = np.random.default_rng(4).standard_normal((5, 3, 9, 11)).astype(np.float32)
    with create_backend(name, edges, cache_dir=cache_dir) as backend:
        bp.assert_parity(backend, edges, x)


@native
def test_killed_mxnet_worker_is_restarted_and_its_inputs_counted(testdata, cache_dir):
    model = bp.lenet(testdata)
    x = bp.mnist(testdata)[:8]
    backend = RestartingBackend(lambda: create_backend("mxnet-openblas", model, cache_dir=cache_dir), backoff_initial_s=0)
    try:
        first = backend.backend.worker.pid
        bp.assert_parity(backend, model, x)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(InputsLost, match="killed by signal 9") as err:
            backend.infer(x)
        assert err.value.lost_inputs == 8
        bp.assert_parity(backend, model, x)  # restarted on this call
        assert backend.backend.worker.pid != first
        assert backend.restarts == 1
    finally:
        backend.close()


@native
def test_benchmark_reports_mxnet_out_of_memory_cells_with_their_cause(tmp_path, capsys):
    """Under a memory cgroup of 250 MB for each cell (tracker.bench.memory_cap: memory the cell
    itself charges; shared libraries already in the page cache are not charged again),
    mxnet-openblas-dl runs batch 1 and is OOM-killed at batch 256 (its workspace grows by ~190 MB).
    Measured here: batch 1 runs at 230 MB, batch 256 needs more than 300 MB and fits in 320 MB, so
    under a real 1 GB cap MXNet runs batch 256 (the former RLIMIT_AS cap refused it, and even
    batch 1 on some CPUs: address space is not memory)."""
    from tracker.bench.memory_cap import cap_method
    from tracker.cli import main

    if cap_method(250) == "rlimit-as":
        pytest.skip("no memory cgroup can be made on this machine (needs write access to this process's cgroup)")
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    out = tmp_path / "out"
    code = main(["--config", str(config), "--benchmark", "--backend", "mxnet-openblas-dl", "--batches", "1,256",
                 "--passes", "1", "--memory-limit", "250", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["memory_limit_method"].startswith("cgroup")
    rows = {r["batch"]: r for r in results["rows"]}
    assert rows[1]["status"] == "ok" and rows[1]["ms_per_image"] > 0
    failed = rows[256]
    assert failed["status"] == "failed" and failed["reason"] == "WorkerFailure"
    assert "killed by signal 9" in failed["error_detail"]
    assert "out of memory: the OOM killer ended a process of this cell" in failed["error_detail"]
    assert "256 inputs lost" in failed["error_detail"]
