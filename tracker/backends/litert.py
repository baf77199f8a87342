"""`tf-neon-vfpv4`: the LiteRT (TensorFlow Lite) interpreter with the XNNPACK delegate.

XNNPACK is TensorFlow's hand-tuned CPU kernel library: NEON (and the VFPv4 FMA) on ARM, SSE/AVX
on x86 -- the "TensorFlow built for NEON" configuration of the study, without building TF. LiteRT
applies it by default (OpResolverType.AUTO); the backend checks that it did -- the interpreter's
execution plan then holds DELEGATE nodes, and LiteRT logs "Created TensorFlow Lite XNNPACK
delegate for CPU" -- and raises BackendUnavailable if not, since without it this is not the
configuration the name promises. `xnnpack_nodes` records how many delegate nodes there are.

The model comes from the converter cache (tracker.model.convert, target "tflite"): fp32, or
full-integer int8 calibrated on face crops (with float32 outputs, its softmax run in float32 by
the interpreter). It is NHWC, so each batch is transposed at the
boundary (for 1-channel input that is a free reshape). A LiteRT interpreter has fixed tensor
shapes, so there is one interpreter per batch size, kept and re-used across calls; at most
`max_interpreters` (default 3) are kept, and together sized for at most MAX_KEPT_IMAGES images,
least recently used first out, because each holds its own activation buffers (about 0.6 MB per
image for the face CNN: three interpreters of about 500 images, as the guard's mirror-mean
embedding makes of full batches, took the process past 1 GB) and packed weights. `threads` is the
interpreter's and XNNPACK's thread count (default: every core this process may use).
"""

from __future__ import annotations

from collections import OrderedDict

from tracker.backends.base import BackendBase, check_batch, check_options
from tracker.backends.registry import missing_runtime
from tracker.errors import BackendUnavailable, InputError
from tracker.machine import cores
from tracker.model.convert import convert
from tracker.model.spec import ModelSpec
from tracker.types import Inference

DEFAULT_MAX_INTERPRETERS = 3
# Batch sizes the kept interpreters may add up to: one of the largest a guard makes (256 crops and
# their mirror images), about 300 MB of activations for the face CNN; the newest is always kept.
MAX_KEPT_IMAGES = 512


class LiteRTXNNPACK(BackendBase):
    """Options: cache_dir, calibration (int8: folder of face images), max_interpreters."""

    name = "tf-neon-vfpv4"
    precisions = ("fp32", "int8")

    @classmethod
    def check_runtime(cls) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter  # noqa: F401
        except ImportError as err:
            raise missing_runtime(cls.name, err.name or "ai_edge_litert", err) from None

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, **options):
        from ai_edge_litert.interpreter import Interpreter

        check_options(self.name, options, ("cache_dir", "calibration", "max_interpreters"))
        self._max = int(options.get("max_interpreters", DEFAULT_MAX_INTERPRETERS))
        if self._max < 1:
            raise InputError(f"backend {self.name!r}: max_interpreters {self._max}; expected >= 1")
        self.precision = precision
        self.threads = threads or cores()
        self._new = lambda content: Interpreter(model_content=content, num_threads=self.threads)
        self._content = convert(model, "tflite", precision, calibration=options.get("calibration"),
                                cache_dir=options.get("cache_dir"), load=self._probe)
        self._interpreters: OrderedDict[int, object] = OrderedDict()

    def _probe(self, path) -> bytes:
        """Load the flatbuffer once: find the signature's tensors and check XNNPACK applies."""
        content = path.read_bytes()
        probe = self._new(content)
        runner = probe.get_signature_runner()
        inputs, outputs = runner.get_input_details(), runner.get_output_details()
        (_, data), = inputs.items()
        self._input = data["index"]
        self._shape_nhwc = tuple(int(d) for d in data["shape_signature"][1:])
        self._prob = outputs["prob"]["index"]
        self._embedding = outputs["embedding"]["index"]
        del runner
        probe.allocate_tensors()  # delegates are applied here
        self.xnnpack_nodes = sum(op["op_name"] == "DELEGATE" for op in probe._get_ops_details())
        if not self.xnnpack_nodes:
            raise BackendUnavailable(f"backend {self.name!r}: LiteRT did not apply its XNNPACK delegate "
                                     f"to {path.name}; this LiteRT build lacks it")
        return content

    def _interpreter(self, batch: int):
        it = self._interpreters.get(batch)
        if it is not None:
            self._interpreters.move_to_end(batch)
            return it
        while self._interpreters and (len(self._interpreters) >= self._max
                                      or sum(self._interpreters) + batch > MAX_KEPT_IMAGES):
            self._interpreters.popitem(last=False)
        it = self._new(self._content)
        it.resize_tensor_input(self._input, (batch,) + self._shape_nhwc, strict=True)
        it.allocate_tensors()
        self._interpreters[batch] = it
        return it

    def infer(self, x) -> Inference:
        h, w, c = self._shape_nhwc
        x = check_batch(self.name, x, (c, h, w))
        it = self._interpreter(x.shape[0])
        it.set_tensor(self._input, x.transpose(0, 2, 3, 1) if c > 1 else x.reshape(x.shape[0], h, w, 1))
        it.invoke()
        return Inference(it.get_tensor(self._prob), it.get_tensor(self._embedding))

    def close(self) -> None:
        self._interpreters.clear()
