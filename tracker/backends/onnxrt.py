"""`onnxruntime`: ONNX Runtime's CPU execution provider on the converted ONNX model.

The model comes from the converter cache (tracker.model.convert, target "onnx"): NCHW like Caffe,
so batches go in as they are. fp32, or int8 (static QDQ quantisation calibrated on face crops,
with float32 outputs; its softmax runs in float32).
`threads` sets intra_op_num_threads (default: every core this process may use); inter-op
parallelism is 1 (the graph is a chain, nothing runs side by side). An idle pool thread spins
for at most SPIN_US before it sleeps (`session.intra_op.spin_duration_us`, ONNX Runtime 1.26 and
later).
"""

from __future__ import annotations

from tracker.backends.base import BackendBase, check_batch, check_options
from tracker.backends.registry import missing_runtime
from tracker.machine import cores
from tracker.model.convert import convert
from tracker.model.spec import ModelSpec
from tracker.types import Inference

# How long an idle pool thread spins, waiting for work, before it sleeps (microseconds). By default
# it spins on for a count of iterations: at a camera's pace (20 batch-1 calls 50 ms apart, two
# threads; the paced child of tests/backends/test_backend_onnxrt.py, on the Intel Xeon of the
# README) 0.50-0.51 s of process CPU time beyond the calls' own, which on a Pi is the detector's.
# Stopping the spin whenever a run returns (`session.force_spinning_stop`, this backend's former
# setting) cost about 0 there, but woke the pool's threads for every run: back to back, the
# backend took 1.006-1.045x the raw runtime's time at batch 1 (`scripts/backend_overhead.py
# --backends onnxruntime`, runs of the README). With 1 ms the paced child read 0.03-0.04 s, and
# the backend 0.986-1.014x the raw runtime at batch 1 to 256 (three runs of the README). ONNX
# Runtime's own guidance for this setting is 500-2000 us.
SPIN_US = 1000


class OnnxRuntime(BackendBase):
    """Options: cache_dir (converted-model cache), calibration (int8: folder of face images)."""

    name = "onnxruntime"
    precisions = ("fp32", "int8")

    @classmethod
    def check_runtime(cls) -> None:
        try:
            import onnx  # noqa: F401  (the converter needs it)
            import onnxruntime  # noqa: F401
        except ImportError as err:
            raise missing_runtime(cls.name, err.name or "onnxruntime", err) from None

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, **options):
        import onnxruntime as ort

        check_options(self.name, options, ("cache_dir", "calibration"))
        self.precision = precision
        settings = ort.SessionOptions()
        settings.intra_op_num_threads = threads or cores()
        settings.inter_op_num_threads = 1
        settings.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        settings.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_US))
        self._session = convert(
            model, "onnx", precision, calibration=options.get("calibration"), cache_dir=options.get("cache_dir"),
            load=lambda path: ort.InferenceSession(
                str(path), settings, providers=["CPUExecutionProvider"],
                # int8 keeps conv1..pool1 in float: see tracker.model.convert.onnx.quantize_int8
                disabled_optimizers=["QDQPropagationTransformer"] if precision == "int8" else None))
        self._shape = tuple(self._session.get_inputs()[0].shape[1:])  # (C, H, W); batch is symbolic

    def infer(self, x) -> Inference:
        x = check_batch(self.name, x, self._shape)
        prob, embedding = self._session.run(["prob", "embedding"], {"data": x})
        return Inference(prob, embedding)

    def close(self) -> None:
        self._session = None
