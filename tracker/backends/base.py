"""The backend contract (docs/ARCHITECTURE.md, section 2) and the checks every backend shares.

Every backend module imports its runtime lazily (inside functions or `__init__`), so importing a
backend module never fails because a runtime is missing; `check_runtime()` says whether it can run.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from tracker.errors import InputError
from tracker.types import Inference


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


def check_batch(backend: str, x, shape: tuple[int, ...]) -> np.ndarray:
    """`x` as a C-contiguous float32 (N, *shape) array, N >= 1; InputError naming `backend` and
    what was expected otherwise (the contract's input check, shared by the converted backends)."""
    if not isinstance(x, np.ndarray) or x.ndim != 1 + len(shape) or x.shape[0] < 1 \
            or tuple(x.shape[1:]) != tuple(shape):
        found = x.shape if isinstance(x, np.ndarray) else type(x).__name__
        raise InputError(f"backend {backend!r}: input of shape {found}; expected (N, "
                         f"{', '.join(map(str, shape))}) float32 with N >= 1")
    return np.ascontiguousarray(x, dtype=np.float32)


def check_float32_batch(backend: str, x, input_shape: tuple[int, ...]) -> None:
    """InputError naming `backend` unless `x` is a float32 numpy array shaped (N, *input_shape[1:]),
    N >= 1. Strict, for the backends that hand `x` on as it is (the Caffe engine, the worker's
    shared memory); `check_batch` converts instead."""
    want = ("N", *input_shape[1:])
    if not isinstance(x, np.ndarray):
        raise InputError(f"{backend} input: expected a numpy float32 array of shape {want}; found {type(x).__name__}")
    if x.dtype != np.float32:
        raise InputError(f"{backend} input: expected dtype float32; found {x.dtype}")
    if x.ndim != len(input_shape) or x.shape[1:] != input_shape[1:] or x.shape[0] < 1:
        raise InputError(f"{backend} input: expected shape {want} with N >= 1; found {x.shape}")


def check_options(backend: str, options: dict, known: tuple[str, ...]) -> None:
    """InputError naming an option `backend` does not take."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(f"backend {backend!r}: unknown option {unknown[0]!r}; it takes "
                         f"{', '.join(known) or 'no options'}")
