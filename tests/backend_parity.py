"""Helpers shared by the converter and backend tests (not a test module).

The reference is the project's Caffe engine in float64 (`Net(netdef, np.float64, "caffe")`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from tracker.model.spec import ModelSpec, default_model

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-4  # docs/ARCHITECTURE.md section 2: every backend within 1e-4 of the float64 engine

# Caffe prototxt of a small net whose every quirk matters: a non-square 2-channel input; a conv
# with pad, stride 2 and group 2; a leaky ReLU; MAX pooling whose windows do not divide the input
# (ceil mode reads a padded tail row); a conv with rectangular kernel and dilation; AVE pooling
# with pad and a ceil tail (Caffe's divisor changes at the edge); InnerProduct on an image blob
# (the C,H,W flatten order) with in-place ReLU; Dropout; softmax.
QUIRKY_PROTOTXT = """
name: "quirky"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 23 dim: 17 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1 stride: 2 group: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_h: 3 kernel_w: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 5 kernel_h: 2 kernel_w: 1 dilation: 2 } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
        pooling_param { pool: AVE kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad: 1 } }
layer { name: "fc1" type: "InnerProduct" bottom: "pool2" top: "fc1" inner_product_param { num_output: 10 } }
layer { name: "relu2" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "drop" type: "Dropout" bottom: "fc1" top: "fc1" }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2" inner_product_param { num_output: 7 } }
layer { name: "prob" type: "Softmax" bottom: "fc2" top: "prob" }
"""


def write_net(folder: Path, name: str, text: str, probs: str, embedding: str, seed: int = 0) -> ModelSpec:
    """A prototxt and a caffemodel of random weights (N(0, 0.5^2)), written by caffe_io."""
    from tracker.model.caffe_io import load_net, write_caffemodel
    from tracker.model.netdef import LayerDef, NetDef
    from tracker.model.shapes import infer_layer_shapes

    folder.mkdir(parents=True, exist_ok=True)
    prototxt, weights = folder / f"{name}.prototxt", folder / f"{name}.caffemodel"
    prototxt.write_text(text)
    structure = load_net(prototxt, None)
    rng = np.random.default_rng(seed)
    layers = [LayerDef(layer.name, layer.type, layer.bottoms, layer.tops, layer.param,
                       tuple(rng.standard_normal(s).astype(np.float32) * 0.5 for s in shapes.params))
              for layer, shapes in zip(structure.layers, infer_layer_shapes(structure))]
    write_caffemodel(weights, NetDef(structure.name, structure.inputs, layers))
    return ModelSpec(prototxt, weights, probs, embedding)


def write_quirky(folder: Path, seed: int = 0) -> ModelSpec:
    """QUIRKY_PROTOTXT plus a caffemodel of random weights (written with caffe_io's writer)."""
    return write_net(folder, "quirky", QUIRKY_PROTOTXT, "prob", "fc1", seed)


def lenet(testdata: Path) -> ModelSpec:
    folder = testdata / "caffe" / "lenet"
    return ModelSpec(folder / "lenet.prototxt", folder / "lenet_iter_10000.caffemodel", "prob", "ip1")


def mnist(testdata: Path) -> np.ndarray:
    """64 real MNIST test digits, (64, 1, 28, 28) float32 scaled by 1/256."""
    return np.load(testdata / "caffe" / "lenet" / "ref_input_mnist_t10k_first64.npy")


@lru_cache(maxsize=8)
def _reference(model: ModelSpec, key: bytes, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    from tracker.model.caffe_io import load_net
    from tracker.model.engine import Net

    x = np.frombuffer(key, np.float32).reshape(shape).astype(np.float64)
    out = Net(load_net(model.prototxt, model.weights), dtype=np.float64, mode="caffe").forward(x, [model.probs, model.embedding])
    return out[model.probs].reshape(len(x), -1), out[model.embedding].reshape(len(x), -1)


def reference(model: ModelSpec, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(probs, embedding) of the float64 Caffe engine."""
    x = np.ascontiguousarray(x, np.float32)
    return _reference(model, x.tobytes(), x.shape)


def face_inputs(n: int = 12) -> np.ndarray:
    """Face-CNN inputs: n real face views (the quality set) plus 2 uniform-noise images."""
    from tracker.model.convert.calibration import QUALITY_COUNT, QUALITY_SEED, sample_set

    faces = sample_set(None, QUALITY_COUNT, QUALITY_SEED).make((1, 88, 88))[:n]
    noise = np.random.default_rng(7).random((2, 1, 88, 88), dtype=np.float32)
    return np.concatenate([faces, noise])


def input_for(model: ModelSpec, testdata: Path | None) -> np.ndarray:
    if model == default_model():
        return face_inputs()
    if testdata is not None and model == lenet(testdata):
        return mnist(testdata)
    from tracker.model.convert import load_graph

    return np.random.default_rng(3).standard_normal((5, *load_graph(model).input_shape)).astype(np.float32)


def assert_parity(backend, model: ModelSpec, x: np.ndarray, tol: float = TOL) -> None:
    """`backend` agrees with the float64 engine within `tol` on probs and embedding."""
    probs, embedding = reference(model, x)
    out = backend.infer(x)
    assert out.probs.dtype == np.float32 and out.embedding.dtype == np.float32
    assert out.probs.shape == probs.shape and out.embedding.shape == embedding.shape
    np.testing.assert_allclose(out.probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.abs(out.probs - probs).max() <= tol, f"probs differ by {np.abs(out.probs - probs).max():.2e}"
    assert np.abs(out.embedding - embedding).max() <= tol, f"embedding differs by {np.abs(out.embedding - embedding).max():.2e}"


def run_without(module: str, code: str) -> subprocess.CompletedProcess:
    """Run `code` in a child python in which `import <module>` fails (sys.modules shim)."""
    shim = f"import sys; sys.modules[{module!r}] = None\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.run([sys.executable, "-c", shim + code], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)


CREATE_AND_EXIT = """
from tracker.backends import create_backend
from tracker.errors import TrackerError
try:
    create_backend({name!r})
except TrackerError as err:
    print(err, file=sys.stderr)
    raise SystemExit(err.exit_code)
"""


def real_face_crops(testdata: Path) -> np.ndarray:
    """Real faces none of the calibration used: the 55 dlib chips of 5 people (one of them not in
    the shipped chips at all) and the 100 LFW faces of skimage's lfw_subset, as 88x88 inputs."""
    import cv2

    faces = testdata / "faces"
    chips = [cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) for p in sorted((faces / "dlib" / "johns").rglob("*.jpg"))]
    x = [cv2.resize(c, (88, 88), interpolation=cv2.INTER_AREA).astype(np.float32) / 255 for c in chips]
    lfw = np.load(faces / "skimage" / "lfw_subset.npy")[:100].astype(np.float32)
    x += [cv2.resize(f, (88, 88), interpolation=cv2.INTER_LINEAR) for f in lfw]
    return np.stack(x)[:, None]


def int8_quality(backend_name: str, model=None, *, crops: np.ndarray | None = None,
                 threads: int | None = None, **options) -> dict:
    """tracker.bench.quality.compare() of `backend_name` in int8 against itself in fp32 on `crops`
    (default: the benchmark's fixed quality set for the model's input shape), plus "set_id" naming
    the crops. `options` go to both backends (e.g. cache_dir, calibration)."""
    from tracker.backends import create_backend
    from tracker.bench.quality import compare, quality_crops
    from tracker.model.convert import load_graph
    from tracker.model.convert.calibration import sample_set
    from tracker.model.spec import default_model

    model = model or default_model()
    if crops is None:
        crops, set_id = quality_crops(load_graph(model).input_shape)
    else:
        set_id = sample_set(crops).set_id
    reference = create_backend(backend_name, model, precision="fp32", threads=threads, **options)
    candidate = create_backend(backend_name, model, precision="int8", threads=threads, **options)
    try:
        return {"set_id": set_id, **compare(reference, candidate, crops)}
    finally:
        reference.close()
        candidate.close()


def assert_int8_quality(quality: dict, all_crops: bool = False) -> None:
    """int8 bar: top-1 agreement >= 99% (on the crops fp32 decides, see tracker.bench.quality,
    or on all crops for a real classifier) and mean embedding cosine >= 0.99."""
    if all_crops:
        assert quality["top1_agreement"] >= 0.99, quality
    else:
        assert quality["decided_crops"] >= 0.6 * quality["crops"], quality  # the check must count
        assert quality["top1_agreement_decided"] >= 0.99, quality
    assert quality["embedding_cosine_mean"] >= 0.99, quality
