"""The engine's threads: the BLAS thread limit, the helper threads that share a batch, and how a
batch is split between them.

Several images: one worker thread per core, each running the whole net on chunks of images with
single-threaded BLAS, the chunks claimed from a shared counter (`Parallel`), so a worker that the
OS does not schedule in time claims nothing and is never waited for, and im2col, pooling and the
element-wise passes run in parallel too.

One image: the BLAS's own threads split each GEMM. On the 2-core EPYC dev machine, quiet, that
ran the face CNN's conv2 GEMM in 1.04 ms against 2.0-2.4 on one thread, and the whole pass in
3.4 ms against 4.0-4.3 for worker threads claiming bands of output rows, whose concurrent small
GEMMs slowed each other down (2 workers on 16 parts: 1.48x). The BLAS's static split waits for
a late helper thread: with another process busy on one core, a 2-thread sgemm after 1 ms of
other numpy work took 4.0 ms (median) against 2.3 on one thread. That is what the engine's
`ThreadTuner` is for: it times both settings and keeps one core while the machine is busy.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

_blas_libraries_found = None
_lock = threading.Lock()  # guards the module's process-wide state: the libraries, the warm count


def _blas_libraries() -> list:
    """threadpoolctl's controllers of the loaded BLAS libraries, found once (finding them scans
    the process's libraries)."""
    global _blas_libraries_found
    with _lock:
        if _blas_libraries_found is None:
            from threadpoolctl import ThreadpoolController

            _blas_libraries_found = ThreadpoolController().select(user_api="blas").lib_controllers
        return _blas_libraries_found


@contextmanager
def blas_threads(n: int):
    """Run the block with every loaded BLAS limited to `n` threads, then restore each library's
    limit (the limit is process-wide). Each limit is read and set directly, and only where it
    differs from n: threadpoolctl's own `limit` context gathers every library's full description
    on entry, which cost every forward pass 0.015-0.022 ms (a trial script: the face CNN at batch
    1, Intel Xeon of the README, both modes, one BLAS thread or two, seven runs alternating the two
    ways in one process; "dl" on two threads took 0.95-1.11 ms against 0.97-1.13)."""
    libraries = _blas_libraries()
    before = [library.num_threads for library in libraries]
    for library, limit in zip(libraries, before):
        if limit != n:
            library.set_num_threads(n)
    try:
        yield
    finally:
        for library, limit in zip(libraries, before):
            if limit != n:
                library.set_num_threads(limit)


_blas_warmed = 0  # how many concurrent callers' OpenBLAS buffers have been warmed


def warm_blas(callers: int) -> None:
    """Warm OpenBLAS for up to `callers` threads calling it at once: each of `callers` threads,
    started together, runs single-threaded (64, 512) @ (512, 512) float32 GEMMs. Once per process
    for each count.

    Why, measured on the EPYC dev machine with numpy's OpenBLAS 0.3.31 (Haswell kernels): a
    single-threaded sgemm whose output has fewer than 512 columns runs 2-3x slower (the face CNN's
    conv3 as (64, 1200) @ (1200, 96): 0.95-1.15 ms) until one sgemm of at least about
    32 x 256 x 512 has run on the same OpenBLAS buffer (then 0.35-0.45 ms). OpenBLAS gives each
    concurrent caller a buffer of its own, so two workers need two warm buffers: warmed one at a
    time, two threads' concurrent conv3 GEMMs ran at 1.14-1.19x the throughput of one; warmed
    together, at 1.79-1.95x (`scripts/engine_timing.py --gemms`). Every GEMM of a pixel-major
    convolution has at most O output columns, so nothing in a forward pass warms a buffer. The
    cause inside OpenBLAS is not known. Threads that do not overlap (a busy machine) may share
    a buffer: then only speed is lost.
    """
    global _blas_warmed
    with _lock:
        if _blas_warmed >= callers:
            return
        _blas_warmed = callers
    import numpy as np

    start = threading.Barrier(callers)

    def warm() -> None:
        a, b = np.ones((64, 512), np.float32), np.ones((512, 512), np.float32)
        start.wait()
        for _ in range(4):  # ~1 ms each here: long enough for the callers' GEMMs to overlap
            np.matmul(a, b)

    with blas_threads(1):
        threads = [threading.Thread(target=warm, name=f"warm-blas-{k}") for k in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def thread_plan(n: int, cores: int, mixes_images: bool) -> tuple[int, int]:
    """(image workers, BLAS threads) for a "dl" batch of n images on `cores` cores (see the
    module docstring): several images, one worker per core with single-threaded BLAS; one image,
    or a net that mixes images (`mixes_images`: batch statistics, axis-0 layers), one chunk on
    the calling thread with `cores` BLAS threads."""
    if mixes_images or n == 1:
        return 1, cores
    return min(cores, n), 1


class Parallel:
    """Shares `parts` independent pieces of work between the calling thread and `workers - 1`
    helper threads of a pool, each with single-threaded BLAS.

    Pieces are claimed one by one from a shared counter, so a helper that the OS does not
    schedule in time (a busy machine) simply claims nothing and the calling thread does the
    rest: the worst case is the single-threaded time, never a wait for an idle helper to wake.
    The caller waits only for pieces a helper has already started.
    """

    def __init__(self, pool: ThreadPoolExecutor, workers: int):
        self.pool, self.workers = pool, workers

    def run(self, fn, parts: int) -> None:
        """Call fn(part, worker) for part in range(parts); worker is 0 for the calling thread and
        1..workers-1 for helpers (at most one piece at a time per worker)."""
        lock = threading.Lock()
        done = threading.Event()
        state = {"next": 0, "finished": 0}
        errors: list[BaseException] = []

        def work(worker: int) -> None:
            while True:
                with lock:
                    part = state["next"]
                    if part >= parts:
                        return
                    state["next"] = part + 1
                try:
                    fn(part, worker)
                except BaseException as err:  # noqa: BLE001 - re-raised on the calling thread
                    errors.append(err)
                with lock:
                    state["finished"] += 1
                    if state["finished"] == parts:
                        done.set()

        for worker in range(1, min(self.workers, parts)):
            self.pool.submit(work, worker)
        work(0)
        done.wait()
        if errors:
            raise errors[0]


class HelperThreads:
    """The helper threads of one Net, kept across forward passes: started on first use, replaced
    by a larger pool when more are needed, stopped by `close` (and started again on demand)."""

    def __init__(self, name: str):
        self.name = name  # the threads are named engine-<name>-...
        self._executor: ThreadPoolExecutor | None = None
        self._size = 0

    def sharing(self, workers: int) -> Parallel:
        """A sharer for `workers` workers: the calling thread plus `workers - 1` helpers."""
        if self._executor is None or self._size < workers - 1:
            self.close()
            self._executor = ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix=f"engine-{self.name}")
            self._size = workers - 1
        return Parallel(self._executor, workers)

    def close(self) -> None:
        """Stop the helper threads, waiting for them to finish."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
