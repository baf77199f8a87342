"""`opencv-dnn`: OpenCV 4.x's DNN module reading the Caffe files directly (its own Caffe importer;
nothing converted), on its own CPU implementation (DNN_BACKEND_OPENCV, DNN_TARGET_CPU).

OpenCV names a layer's output after the layer, and fuses in-place layers: asking for "fc1" can give
fc1 *before* its in-place ReLU. The backend therefore asks for the output of the last layer that
writes each wanted blob (e.g. "relu4" for "fc1"), which is the blob as Caffe leaves it. `threads`
is cv2.setNumThreads (process-wide; default: every core this process may use).
"""

from __future__ import annotations

import numpy as np

from tracker.backends.base import BackendBase, check_batch, check_options
from tracker.errors import BackendUnavailable, ModelError
from tracker.machine import cores
from tracker.model.spec import ModelSpec
from tracker.types import Inference


def last_writers(netdef, blobs: tuple[str, ...]) -> tuple[str, ...]:
    """For each blob name, the name of the last layer with it as a top (ModelError if none)."""
    writers = {}
    for layer in netdef.layers:
        for top in layer.tops:
            writers[top] = layer.name
    missing = [b for b in blobs if b not in writers]
    if missing:
        raise ModelError(f"model: blob {missing[0]!r} is not produced by any layer of net {netdef.name!r}")
    return tuple(writers[b] for b in blobs)


class OpenCVDNN(BackendBase):
    """Options: cache_dir is accepted and unused (nothing is converted), so callers can pass
    it to every backend alike."""

    name = "opencv-dnn"
    precisions = ("fp32",)

    @classmethod
    def check_runtime(cls) -> None:
        # OpenCV is a base dependency (no extra to name): say which package to reinstall.
        try:
            import cv2
        except ImportError as err:
            raise BackendUnavailable(f"backend {cls.name!r}: runtime 'cv2' is not importable ({err.__class__.__name__}: "
                                     f"{err}); it is a base dependency: pip install 'opencv-python-headless>=4.8,<5'") from None
        if not hasattr(getattr(cv2, "dnn", None), "readNetFromCaffe"):
            raise BackendUnavailable(f"backend {cls.name!r}: OpenCV {cv2.__version__} has no Caffe importer "
                                     f"(OpenCV 5 removed it); install 'opencv-python-headless>=4.8,<5'")

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, **options):
        import cv2

        from tracker.model.caffe_io import load_net

        check_options(self.name, options, ("cache_dir",))
        self.precision = precision
        netdef = load_net(model.prototxt, model.weights)  # validates the files with our messages
        (c, h, w) = next(iter(netdef.inputs.values()))[1:]
        self._shape = (c, h, w)
        self._outputs = list(last_writers(netdef, (model.probs, model.embedding)))
        self.threads = threads or cores()
        cv2.setNumThreads(self.threads)
        try:
            self._net = cv2.dnn.readNetFromCaffe(str(model.prototxt), str(model.weights))
        except cv2.error as err:
            raise ModelError(f"model {model.prototxt}: OpenCV's Caffe importer rejects it "
                             f"({str(err).strip().splitlines()[-1]})") from None
        self._net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        self._net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)

    def infer(self, x) -> Inference:
        x = check_batch(self.name, x, self._shape)
        self._net.setInput(x)
        prob, embedding = self._net.forward(self._outputs)
        n = x.shape[0]
        return Inference(np.array(prob.reshape(n, -1)), np.array(embedding.reshape(n, -1)))

    def close(self) -> None:
        self.__dict__.pop("_net", None)  # drop the runtime's net: a closed backend is not used again
