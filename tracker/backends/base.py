"""The backend contract (DESIGN.md section 2) and the description of a model to run.

Every backend module imports its runtime lazily (inside functions or `__init__`), so importing a
backend module never fails because a runtime is missing; `check_runtime()` says whether it can run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from tracker.types import Inference

REPO_MODELS = Path(__file__).resolve().parents[2] / "models"


@dataclass(frozen=True)
class ModelSpec:
    """A Caffe classifier and which of its blobs the guard reads.

    prototxt, weights: the canonical Caffe files (text NetParameter, binary NetParameter).
    probs:     name of the blob holding class probabilities, (N, classes), rows sum to 1.
    embedding: name of the blob holding the embedding, (N, D), read after in-place layers ran.
    """

    prototxt: Path
    weights: Path
    probs: str = "prob"
    embedding: str = "fc1"


def default_model() -> ModelSpec:
    """The face CNN of DESIGN.md section 1, as shipped in `models/`."""
    return ModelSpec(REPO_MODELS / "face_cnn.prototxt", REPO_MODELS / "face_cnn.caffemodel", "prob", "fc1")


@runtime_checkable
class Backend(Protocol):
    """One engine running one model.

    infer(x): x is (N, C, H, W) float32, C-contiguous, N >= 1; returns an `Inference` with probs
    (N, classes) and embedding (N, D), both float32, owned by the caller (not views of buffers the
    backend will overwrite). close() frees the runtime; a closed backend is not used again.
    """

    name: str

    def infer(self, x: np.ndarray) -> Inference: ...

    def close(self) -> None: ...


class BackendBase:
    """Shared defaults for concrete backends.

    Subclasses set `name`, list the precisions they run in `precisions`, and implement
    `check_runtime` (raise `BackendUnavailable` naming the extra when the runtime is missing),
    `__init__(model, *, precision, threads, cache_dir)`, `infer` and, if needed, `close`.
    """

    name: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)

    @classmethod
    def check_runtime(cls) -> None:
        """Raise BackendUnavailable if this backend cannot run on this machine."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
