"""The backend registry: one literal dict from backend name to implementation and pip extra.

Nothing here imports a runtime: a backend's module is imported only when that backend is created
or checked, and a missing runtime raises `BackendUnavailable` naming the extra that installs it.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from tracker.errors import BackendUnavailable, InputError


class Entry(NamedTuple):
    target: str  # "module:Class"
    extra: str | None  # pip extra that installs the runtime (None: in the base install)
    setup: str | None = None  # project command that installs a runtime pip cannot put in the venv

    def install_hint(self) -> str:
        """What a user runs to get this backend's runtime."""
        if self.setup:
            return self.setup
        return f"pip install -e '.[{self.extra}]'" if self.extra else "(base install)"


REGISTRY: dict[str, Entry] = {
    "caffe-openblas": Entry("tracker.backends.caffe:CaffeOpenBLAS", None),
    "caffe-openblas-dl": Entry("tracker.backends.caffe:CaffeOpenBLASDL", None),
    "tf-vanilla": Entry("tracker.backends.tensorflow:TFVanilla", "tf"),
    "tf-neon-vfpv4": Entry("tracker.backends.litert:LiteRTXNNPACK", "litert"),
    "mxnet-openblas": Entry("tracker.backends.mxnet:MXNetOpenBLAS", None, "scripts/setup-mxnet"),
    "mxnet-openblas-dl": Entry("tracker.backends.mxnet:MXNetOpenBLASDL", None, "scripts/setup-mxnet"),
    "nnpack": Entry("tracker.backends.nnpack:TorchNNPACK", "torch"),
    "onnxruntime": Entry("tracker.backends.onnxrt:OnnxRuntime", "onnx"),
    "opencv-dnn": Entry("tracker.backends.opencv_dnn:OpenCVDNN", None),
    "auto": Entry("tracker.backends.auto:Auto", None),
}


def backend_class(name: str):
    """The class registered under `name`; InputError listing valid names if it is unknown."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise InputError(f"backend: unknown name {name!r}; expected one of {', '.join(REGISTRY)}")
    module_name, class_name = entry.target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def availability(name: str) -> str | None:
    """None if backend `name` can run here, else the one-line reason it cannot."""
    try:
        backend_class(name).check_runtime()
    except BackendUnavailable as err:
        return str(err)
    return None


def missing_runtime(name: str, module: str, err: Exception) -> BackendUnavailable:
    """The error for a backend whose runtime module cannot be imported."""
    return BackendUnavailable(
        f"backend {name!r}: runtime {module!r} is not importable ({err.__class__.__name__}: {err}); "
        f"install it with: {REGISTRY[name].install_hint()}"
    )
