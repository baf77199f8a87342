"""The engine's process-wide BLAS thread limit (`tracker.model.engine.parallel.blas_threads`), on
numpy's own OpenBLAS."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info

from tracker.model.engine.parallel import _blas_libraries, blas_threads


def blas_limits() -> list[int]:
    """Every loaded BLAS library's thread limit, as threadpoolctl reads it afresh."""
    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]


def test_the_limit_holds_inside_and_each_library_gets_its_own_back_after():
    start = blas_limits()
    assert start, "numpy's BLAS is not visible to threadpoolctl"
    for n in (1, max(start) + 1):
        with blas_threads(n):
            assert blas_limits() == [n] * len(start)
        assert blas_limits() == start
    with pytest.raises(RuntimeError, match="in the block"), blas_threads(max(start) + 1):
        raise RuntimeError("in the block")
    assert blas_limits() == start


def test_only_a_library_whose_limit_differs_is_set(monkeypatch):
    libraries = _blas_libraries()
    calls: list[tuple[int, int]] = []
    for index, library in enumerate(libraries):
        def spy(n, _set=library.set_num_threads, _index=index):
            calls.append((_index, n))
            _set(n)

        monkeypatch.setattr(library, "set_num_threads", spy)
    limits = [library.num_threads for library in libraries]
    with blas_threads(limits[0]):
        pass
    differing = [(i, limit) for i, limit in enumerate(limits) if limit != limits[0]]  # set, then restored
    assert calls == [(i, limits[0]) for i, _ in differing] + differing
    calls.clear()
    other = max(limits) + 1
    with blas_threads(other):
        pass
    assert calls == [(i, other) for i in range(len(libraries))] + [(i, limit) for i, limit in enumerate(limits)]
