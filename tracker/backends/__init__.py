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


def create_backend(name: str, model=None, *, precision: str = "fp32", threads: int | None = None,
                   worker: bool = False, worker_options: dict | None = None, **options):
    """Create backend `name` for `model` (a ModelSpec; default: the face CNN).

    worker=True runs it in a child process (tracker.backends.worker.WorkerBackend, keyword
    arguments from `worker_options`); backends that always run in a worker (`runs_in_worker`,
    e.g. MXNet) ignore `worker` and receive `worker_options` as an option. Raises InputError for
    an unknown name or a precision the backend lacks (listing the backends that have it),
    BackendUnavailable (exit 3) when its runtime is missing.
    """
    from tracker.backends.base import default_model

    cls = backend_class(name)
    if precision not in cls.precisions:
        having = [n for n in REGISTRY if precision in backend_class(n).precisions]
        raise InputError(
            f"precision: backend {name!r} has no {precision!r} model; "
            f"backends with {precision!r}: {', '.join(having) or 'none'}"
        )
    if getattr(cls, "runs_in_worker", False):
        if worker_options:
            options["worker_options"] = worker_options
    elif worker:
        from tracker.backends.worker import WorkerBackend

        # the child checks the runtime: importing it here would defeat the isolation
        return WorkerBackend(name, model or default_model(), precision, threads, options=options, **(worker_options or {}))
    cls.check_runtime()
    return cls(model or default_model(), precision=precision, threads=threads, **options)


def missing_runtime(name: str, module: str, err: Exception) -> BackendUnavailable:
    """The error for a backend whose runtime module cannot be imported."""
    return BackendUnavailable(
        f"backend {name!r}: runtime {module!r} is not importable ({err.__class__.__name__}: {err}); "
        f"install it with: {REGISTRY[name].install_hint()}"
    )
