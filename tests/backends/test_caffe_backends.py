"""The caffe-openblas and caffe-openblas-dl backends: parity with each other, with the float64
reference of the engine and with OpenCV's Caffe importer on the face CNN and the BVLC LeNet;
threads honoured; bad input refused with one clear line; batch 256 within the memory budget."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import cv2
import numpy as np
import pytest

from tracker.backends import REGISTRY, availability, backend_class, create_backend
from tracker.backends.caffe import CaffeOpenBLAS, CaffeOpenBLASDL
from tracker.errors import InputError, ModelError
from tracker.model.caffe_io import load_net
from tracker.model.engine import Net
from tracker.model.spec import ModelSpec, default_model
from tracker.types import Inference

NAMES = ("caffe-openblas", "caffe-openblas-dl")
REPO = default_model().prototxt.parents[1]


def test_registered_and_available():
    assert backend_class("caffe-openblas") is CaffeOpenBLAS and CaffeOpenBLAS.name == "caffe-openblas"
    assert backend_class("caffe-openblas-dl") is CaffeOpenBLASDL and CaffeOpenBLASDL.name == "caffe-openblas-dl"
    for name in NAMES:
        assert REGISTRY[name].extra is None
        assert availability(name) is None


def face_input(n: int) -> np.ndarray:
    return np.random.default_rng(n).uniform(0, 1, (n, 1, 88, 88)).astype(np.float32)


@pytest.fixture(scope="module")
def face_reference():
    """float64 engine reference and OpenCV outputs for batches of 1 and 7."""
    spec = default_model()
    ref_net = Net(load_net(spec.prototxt, spec.weights), np.float64, "caffe")
    cv_net = cv2.dnn.readNetFromCaffe(str(spec.prototxt), str(spec.weights))
    cv_net.enableWinograd(False)
    out = {}
    for n in (1, 7):
        x = face_input(n)
        ref = ref_net.forward(x.astype(np.float64), ["prob", "fc1"])
        cv_net.setInput(x)
        cv_prob, cv_emb = cv_net.forward(["prob", "relu4"])  # OpenCV names fc1-after-ReLU by its layer
        out[n] = (x, ref, cv_prob, cv_emb)
    return out


@pytest.mark.parametrize("n", [1, 7])
def test_face_cnn_parity(face_reference, n):
    x, ref, cv_prob, cv_emb = face_reference[n]
    results = {}
    for name in NAMES:
        with create_backend(name, default_model(), workspace_mb=4) if name.endswith("dl") else create_backend(name) as backend:
            inf = backend.infer(x)
        assert isinstance(inf, Inference)
        assert inf.probs.shape == (n, 848) and inf.probs.dtype == np.float32
        assert inf.embedding.shape == (n, 128) and inf.embedding.dtype == np.float32
        np.testing.assert_allclose(inf.probs.sum(1), 1, atol=1e-5)
        assert np.abs(inf.probs - ref["prob"]).max() <= 1e-4, name
        assert np.abs(inf.probs - cv_prob).max() <= 1e-4, name
        emb_scale = float(np.abs(ref["fc1"]).max())
        assert np.abs(inf.embedding - ref["fc1"]).max() <= 1e-4 * emb_scale, name
        assert np.abs(inf.embedding - cv_emb).max() <= 1e-4 * emb_scale, name
        assert (inf.embedding >= 0).all() and (inf.embedding == 0).any()  # fc1 after its ReLU
        results[name] = inf
    a, b = (results[name] for name in NAMES)
    assert np.abs(a.probs - b.probs).max() <= 1e-4
    assert np.abs(a.embedding - b.embedding).max() <= 1e-4 * float(np.abs(ref["fc1"]).max())
    # The probabilities are not degenerate, so 1e-4 is a real bound.
    assert ref["prob"].max() > 0.05 and np.argsort(ref["prob"], 1)[:, -1].tolist() == np.argsort(a.probs, 1)[:, -1].tolist()


@pytest.mark.parametrize("name", NAMES)
def test_lenet_reference_probabilities(testdata, name):
    d = testdata / "caffe" / "lenet"
    spec = ModelSpec(d / "lenet.prototxt", d / "lenet_iter_10000.caffemodel", probs="prob", embedding="ip1")
    x = np.load(d / "ref_input_mnist_t10k_first64.npy")
    with create_backend(name, spec) as backend:
        inf = backend.infer(x)
    assert np.abs(inf.probs - np.load(d / "ref_opencv_prob_first64.npy")).max() <= 1e-4
    assert inf.embedding.shape == (64, 500) and (inf.embedding >= 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_results_are_owned_by_the_caller(name):
    with create_backend(name) as backend:
        first = backend.infer(face_input(3))
        kept = first.probs.copy(), first.embedding.copy()
        backend.infer(face_input(3)[::-1].copy())
    np.testing.assert_array_equal(first.probs, kept[0])
    np.testing.assert_array_equal(first.embedding, kept[1])


def _threads_seen(monkeypatch, backend, x, stall_caller: bool = False) -> tuple[set[int], set[int]]:
    """Run infer and record, at every run of a Convolution op (both modes run the face CNN's
    conv2 and conv3 as one), the BLAS thread limit in force and the Python thread doing it.
    `stall_caller` holds the calling thread for 0.3 s at its first, so that helpers, which only
    take work nobody has claimed yet, surely get some even on a busy machine."""
    from threadpoolctl import threadpool_info

    from tracker.model.ops import Convolution

    seen_blas, seen_threads = set(), set()
    run = Convolution.run
    caller = threading.get_ident()
    stalled = []

    def spy(*args, **kwargs):
        seen_blas.update(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
        seen_threads.add(threading.get_ident())
        if stall_caller and not stalled and threading.get_ident() == caller:
            stalled.append(True)
            time.sleep(0.3)
        return run(*args, **kwargs)

    monkeypatch.setattr(Convolution, "run", spy)
    backend.infer(x)
    monkeypatch.setattr(Convolution, "run", run)
    return seen_blas, seen_threads


@pytest.mark.parametrize("name", NAMES)
def test_threads_option_is_honoured(monkeypatch, name):
    for n in (1, 4):
        with create_backend(name, threads=1) as backend:
            blas, threads = _threads_seen(monkeypatch, backend, face_input(n))
        assert blas == {1} and threads == {threading.get_ident()}


def test_caffe_mode_gives_blas_every_core(monkeypatch):
    with create_backend("caffe-openblas", threads=2) as backend:
        blas, threads = _threads_seen(monkeypatch, backend, face_input(3))
    assert blas == {2} and len(threads) == 1  # Caffe: one thread, OpenBLAS's own threads


def test_dl_shares_images_between_workers_and_one_image_between_blas_threads(monkeypatch):
    with create_backend("caffe-openblas-dl", threads=2) as backend:
        # several images: chunks claimed by one worker per core, each with single-threaded BLAS
        blas, threads = _threads_seen(monkeypatch, backend, face_input(4), stall_caller=True)
        assert blas == {1} and len(threads) == 2
        # one image: the calling thread alone, its GEMMs split by OpenBLAS's own threads
        blas, threads = _threads_seen(monkeypatch, backend, face_input(1))
        assert blas == {2} and threads == {threading.get_ident()}


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_is_one_clear_line(name):
    with create_backend(name) as backend:
        cases = [
            (np.zeros((1, 1, 88, 87), np.float32), r"expected shape \('N', 1, 88, 88\) with N >= 1; found \(1, 1, 88, 87\)"),
            (np.zeros((1, 88, 88), np.float32), r"found \(1, 88, 88\)"),
            (np.zeros((0, 1, 88, 88), np.float32), r"found \(0, 1, 88, 88\)"),
            (np.zeros((1, 1, 88, 88), np.float64), r"expected dtype float32; found float64"),
            ([[0.0]], r"expected a numpy float32 array .* found list"),
        ]
        for x, message in cases:
            with pytest.raises(InputError, match=message) as err:
                backend.infer(x)
            assert name in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(InputError, match=f"^{name}: the backend was closed$"):  # (was an AttributeError)
        backend.infer(np.zeros((1, 1, 88, 88), np.float32))


def test_bad_construction():
    spec = default_model()
    with pytest.raises(InputError, match=r"precision: backend 'caffe-openblas' runs fp32; found 'int8'"):
        CaffeOpenBLAS(spec, precision="int8")
    with pytest.raises(InputError, match=r"unknown option 'workspace_mb'; expected options: cache_dir"):
        CaffeOpenBLAS(spec, workspace_mb=8)
    with pytest.raises(InputError, match=r"workspace_mb: expected a positive number of MiB; found -1"):
        CaffeOpenBLASDL(spec, workspace_mb=-1)
    with pytest.raises(InputError, match=r"threads: expected a positive integer or None; found 0"):
        CaffeOpenBLASDL(spec, threads=0)
    with pytest.raises(ModelError, match=r"embedding blob 'fc9' is not in the net; blobs are data, conv1"):
        CaffeOpenBLAS(ModelSpec(spec.prototxt, spec.weights, "prob", "fc9"))
    with pytest.raises(ModelError, match=r"nowhere\.caffemodel"):
        CaffeOpenBLAS(ModelSpec(spec.prototxt, spec.prototxt.parent / "nowhere.caffemodel"))


_RSS_SCRIPT = """
import json, re, sys
# ru_maxrss survives fork + exec, so a child of a big pytest process would report the parent's
# size: reset the high-water mark first (Linux: 5 > clear_refs), then read VmHWM at the end.
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
import numpy as np
from tracker.backends import create_backend
backend = create_backend(sys.argv[1])
inf = backend.infer(np.random.default_rng(0).uniform(0, 1, (256, 1, 88, 88)).astype(np.float32))
assert inf.probs.shape == (256, 848) and np.isfinite(inf.probs).all()
status = open("/proc/self/status").read()
print(json.dumps({"peak_rss_mb": int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1)) / 1024}))
"""


@pytest.mark.parametrize("name", NAMES)
def test_batch_256_fits_the_memory_budget(name):
    """The Pi has 1 GB: a batch of 256 must complete with a peak RSS under 400 MB (whole process,
    interpreter and libraries included)."""
    proc = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, name], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_mb"]
    assert peak < 400, peak
