"""`tf-vanilla`: TensorFlow running the Keras model built from the Caffe weights, as a compiled
(graph-mode) tf.function with a fixed input signature, so it is traced once for every batch size.

The Keras model comes from the converter cache (tracker.model.convert, target "tf"); it is NHWC,
TensorFlow's CPU layout, so each batch is transposed at the boundary (a free reshape for
1-channel input). `threads` sets TensorFlow's intra-op thread pool (default: every core this
process may use) and the inter-op pool to 1 (the net is a chain); TensorFlow fixes both when its
runtime starts, so a second backend in the same process with another count keeps the first one's
(logged).
"""

from __future__ import annotations

import logging
import os

from tracker.backends.base import BackendBase, check_batch, check_options
from tracker.backends.registry import missing_runtime
from tracker.machine import cores
from tracker.model.convert import convert
from tracker.model.spec import ModelSpec
from tracker.native_stderr import tensorflow_chatter_left_out
from tracker.types import Inference

log = logging.getLogger(__name__)


def import_tensorflow():
    """tensorflow, imported with its C++ info/warning chatter off unless the user set the level
    (absl's start-up lines come regardless: callers leave them out with tracker.native_stderr)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


class TFVanilla(BackendBase):
    """Options: cache_dir (converted-model cache)."""

    name = "tf-vanilla"
    precisions = ("fp32",)

    @classmethod
    def check_runtime(cls) -> None:
        try:
            with tensorflow_chatter_left_out():
                import_tensorflow()
            import keras  # noqa: F401
        except ImportError as err:
            raise missing_runtime(cls.name, err.name or "tensorflow", err) from None

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, **options):
        # TensorFlow's C++ start-up lines come at its import and its runtime's start (in the load)
        with tensorflow_chatter_left_out():
            self._start(model, precision, threads, options)

    def _start(self, model: ModelSpec, precision: str, threads: int | None, options: dict) -> None:
        tf = import_tensorflow()
        import keras

        check_options(self.name, options, ("cache_dir",))
        self.precision = precision
        self.threads = threads or cores()
        try:
            tf.config.threading.set_intra_op_parallelism_threads(self.threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # the runtime already started in this process
            current = tf.config.threading.get_intra_op_parallelism_threads()
            if current != self.threads:
                log.warning("tf-vanilla: TensorFlow already runs with %s intra-op threads in this "
                            "process; %s requested", current or "default", self.threads)

        def load(path):
            import tracker.model.convert.keras  # noqa: F401  (registers the custom layers)

            return keras.saving.load_model(path, compile=False)

        self._model = convert(model, "tf", "fp32", cache_dir=options.get("cache_dir"), load=load)
        h, w, c = self._model.inputs[0].shape[1:]
        self._shape = (c, h, w)
        self._fn = tf.function(lambda x: self._model(x, training=False),
                               input_signature=[tf.TensorSpec((None, h, w, c), tf.float32)])
        self._tf = tf

    def infer(self, x) -> Inference:
        c, h, w = self._shape
        x = check_batch(self.name, x, self._shape)
        nhwc = x.transpose(0, 2, 3, 1) if c > 1 else x.reshape(x.shape[0], h, w, 1)
        out = self._fn(self._tf.constant(nhwc))
        return Inference(out["prob"].numpy(), out["embedding"].numpy())

    def close(self) -> None:
        self._fn = self._model = None
