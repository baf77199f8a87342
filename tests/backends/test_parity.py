"""Every registered backend against the float64 Caffe engine (tests/backend_parity.py): the face
CNN, the BVLC LeNet on real MNIST digits and the quirky net within 1e-4 (fp32); int8 quality for
every backend that runs int8; a missing runtime is one line naming what installs it, exit 3.

Parametrised over tracker.backends.REGISTRY, so that registering a backend tests it here; what a
test needs to know that the registry does not say is in RUNTIMES, and a registered backend missing
there fails test_every_registered_backend_is_described. A backend whose runtime is not installed
fails, as anywhere in the suite (on aarch64, tests/conftest.py skips the tests of a backend the
Pi install leaves out, with its reason; the missing-runtime tests still run). What is particular
to one backend's engine is tested in its own file (tests/backends/test_backend_<name>.py and the
like).
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_parity import (
    CREATE_AND_EXIT,
    assert_int8_quality,
    assert_parity,
    face_inputs,
    int8_quality,
    lenet,
    mnist,
    real_face_crops,
    run_without,
    write_quirky,
)

from tracker.backends import REGISTRY, backend_class, create_backend
from tracker.model.spec import default_model

# For each registered backend, the module whose absence makes it unavailable and what its error
# must say to install it; None where no module of this interpreter can be hidden for that.
RUNTIMES: dict[str, tuple[str, str] | None] = {
    "caffe-openblas": None,  # the project's own engine on numpy: always installed
    "caffe-openblas-dl": None,
    "tf-vanilla": ("tensorflow", "pip install -e '.[tf]'"),
    "tf-neon-vfpv4": ("ai_edge_litert", "pip install -e '.[litert]'"),
    # MXNet runs in its own venv: test_mxnet.py::test_missing_environment_names_the_setup_command
    "mxnet-openblas": None,
    "mxnet-openblas-dl": None,
    "nnpack": ("torch", "pip install -e '.[torch]'"),
    "onnxruntime": ("onnxruntime", "pip install -e '.[onnx]'"),
    "opencv-dnn": ("cv2", "opencv-python-headless"),  # a base dependency: the package to reinstall
    "auto": None,  # runs other backends
}
# Backends that run other backends: their parity is that of the backend they pick
# (test_auto.py runs the picks through assert_parity).
DISPATCHERS = ("auto",)

ENGINES = [name for name in REGISTRY if name not in DISPATCHERS]
INT8 = [name for name in ENGINES if "int8" in backend_class(name).precisions]
MISSING = [name for name in REGISTRY if RUNTIMES.get(name)]


def test_every_registered_backend_is_described():
    assert sorted(RUNTIMES) == sorted(REGISTRY)
    assert set(DISPATCHERS) <= set(REGISTRY)


@pytest.fixture
def cache(backend_caches, backend):
    return backend_caches(backend)


@pytest.mark.parametrize("backend", ENGINES)
def test_fp32_face_cnn(backend, cache):
    with create_backend(backend, default_model(), cache_dir=cache) as engine:
        assert_parity(engine, default_model(), face_inputs())
        assert_parity(engine, default_model(), face_inputs()[:1])  # batch 1 after a larger batch


@pytest.mark.parametrize("backend", ENGINES)
def test_fp32_lenet(backend, testdata, cache):
    with create_backend(backend, lenet(testdata), cache_dir=cache) as engine:
        assert_parity(engine, lenet(testdata), mnist(testdata))


@pytest.mark.parametrize("backend", ENGINES)
def test_fp32_quirky_net(backend, tmp_path, cache):
    model = write_quirky(tmp_path)
    x = np.random.default_rng(2).standard_normal((3, 2, 23, 17)).astype(np.float32)
    with create_backend(backend, model, cache_dir=cache) as engine:
        assert_parity(engine, model, x)


@pytest.mark.parametrize("backend", INT8)
def test_int8_face_cnn_quality(backend, cache):
    assert_int8_quality(int8_quality(backend, cache_dir=cache))


@pytest.mark.parametrize("backend", INT8)
def test_int8_on_real_faces(backend, testdata, cache):
    assert_int8_quality(int8_quality(backend, crops=real_face_crops(testdata), cache_dir=cache))


@pytest.mark.parametrize("backend", INT8)
def test_int8_lenet_on_mnist(backend, testdata, cache):
    """Calibrated on 32 digits; every one of the 64 keeps its fp32 class."""
    x = mnist(testdata)
    assert_int8_quality(int8_quality(backend, lenet(testdata), crops=x, cache_dir=cache, calibration=x[:32]), all_crops=True)


@pytest.mark.parametrize("backend", MISSING)
def test_missing_runtime_exits_3(backend):
    module, install = RUNTIMES[backend]
    done = run_without(module, CREATE_AND_EXIT.format(name=backend))
    assert done.returncode == 3, done.stderr
    assert install in done.stderr and "Traceback" not in done.stderr
