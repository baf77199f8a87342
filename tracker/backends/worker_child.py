"""The backend worker's child process: loads one backend and serves `infer` calls from the parent.

Started by `tracker.backends.worker.WorkerBackend` on any Python >= 3.9 interpreter (the product's
own, or another virtual environment such as the MXNet one) as

    PYTHON -c BOOTSTRAP ROOT REQ_FD REP_FD SHM_FD JOB_JSON

where ROOT is appended to sys.path (after the interpreter's own site-packages, so that its numpy
wins), REQ_FD/REP_FD are the inherited request and reply pipes, SHM_FD is a memfd shared with the
parent (-1 for the pipe transport) and JOB_JSON describes the backend (see `WorkerBackend._job`).

What this module imports at the top is the standard library only (`tracker.child_process`
included: it imports nothing else): a "hello" goes to the parent before numpy or the backend is
imported, so that the parent can tell "this is not a usable Python" (no hello) from "the backend
failed to load" (hello, then an error).

Messages are frames: a 4-byte little-endian length, a JSON header, then for the pipe transport
the raw float32 bytes the header announces. Child -> parent:

    {"event": "hello", "pid", "python", "executable"}
    {"event": "ready", "versions": {...}, "probs_dim": P, "embedding_dim": D, "load_s": s}
    {"event": "result", "n": N}                            [+ N*P then N*D float32 (pipe)]
    {"event": "error", "stage": "load"|"infer", "type": class name, "message": one line,
     "recoverable": bool}      recoverable: a bad input; the child goes on serving. Otherwise the
                               child exits right after sending it (its state is unknown).
Parent -> child:
    {"op": "infer", "n": N}                                [+ N*C*H*W float32 (pipe)]
    {"op": "close"}                                        (or EOF: the parent is gone)
A parent that is gone (killed outright: no close, no signal reaches the child's own session) is
also noticed within a second while a call runs or hangs: a thread polls the parent's pid and
ends the child.

Shared-memory layout (float32, each region 64-byte aligned): input (max_batch, C, H, W), then
probs (max_batch, P), then embedding (max_batch, D). The child sizes the memfd (ftruncate) once it
knows P and D from a warm-up pass on one zero image; pages are only backed where written.
"""

from __future__ import annotations

import importlib
import json
import mmap
import os
import platform
import resource
import struct
import sys
import time

from tracker.child_process import exit_with_parent, loaded_versions, one_line

_LEN = struct.Struct("<I")
ALIGN = 64


def region_offsets(max_batch: int, per_image: int, probs_dim: int, embedding_dim: int) -> tuple[int, int, int]:
    """(probs offset, embedding offset, total bytes) of the shared-memory layout (shared with the parent)."""

    def aligned(nbytes: int) -> int:
        return (nbytes + ALIGN - 1) // ALIGN * ALIGN

    probs_at = aligned(max_batch * per_image * 4)
    embedding_at = probs_at + aligned(max_batch * probs_dim * 4)
    return probs_at, embedding_at, embedding_at + aligned(max_batch * embedding_dim * 4)


def write_frame(fd: int, header: dict, *payloads) -> None:
    """Write one frame (blocking): length, JSON header, then each payload buffer as raw bytes."""
    data = json.dumps(header).encode()
    for part in (_LEN.pack(len(data)) + data, *payloads):
        view = memoryview(part).cast("B")
        while view:
            view = view[os.write(fd, view):]


def _read_into(fd: int, view: memoryview) -> bool:
    """Fill `view` from fd (blocking); False on EOF before it is full."""
    while view:
        got = os.readv(fd, [view])
        if got == 0:
            return False
        view = view[got:]
    return True


def read_frame(fd: int) -> dict | None:
    """One JSON header from fd (blocking); None on EOF."""
    size = bytearray(_LEN.size)
    if not _read_into(fd, memoryview(size)):
        return None
    data = bytearray(_LEN.unpack(size)[0])
    if not _read_into(fd, memoryview(data)):
        return None
    return json.loads(data)


def _load(job: dict):
    """The backend object the job names, created and checked as the registry would."""
    from pathlib import Path

    from tracker.model.spec import ModelSpec

    module_name, class_name = job["target"].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    check = getattr(cls, "check_runtime", None)
    if check is not None:
        check()
    m = job["model"]
    model = ModelSpec(Path(m["prototxt"]), Path(m["weights"]), m["probs"], m["embedding"])
    return cls(model, precision=job["precision"], threads=job["threads"], **job["options"])


def serve(job: dict, req_fd: int, rep_fd: int, shm_fd: int, parent: int) -> int:
    """Load the backend, warm it up, report ready, then answer requests until close or EOF, or
    until `parent` (the worker's process) is gone."""
    stage = "load"
    try:
        # after the hello: a thread that cannot start (TasksMax) is a failure to retry, not a bad interpreter.
        # The guard killed outright sends nothing to this child's own session, and a hung call never
        # reads the request pipe's end.
        exit_with_parent(parent)
        t0 = time.perf_counter()
        import numpy as np

        from tracker.errors import InputError

        backend = _load(job)
        chw = tuple(job["input_shape"])
        per_image = int(np.prod(chw))
        warm = backend.infer(np.zeros((1, *chw), np.float32))
        probs_dim, embedding_dim = warm.probs.shape[1], warm.embedding.shape[1]
        max_batch = job["max_batch"]
        views = None
        if shm_fd >= 0:
            probs_at, embedding_at, total = region_offsets(max_batch, per_image, probs_dim, embedding_dim)
            os.ftruncate(shm_fd, total)
            shm = mmap.mmap(shm_fd, total)
            views = (
                np.frombuffer(shm, np.float32, max_batch * per_image, 0).reshape(max_batch, *chw),
                np.frombuffer(shm, np.float32, max_batch * probs_dim, probs_at).reshape(max_batch, probs_dim),
                np.frombuffer(shm, np.float32, max_batch * embedding_dim, embedding_at).reshape(max_batch, embedding_dim),
            )
        else:
            inbuf = np.empty((max_batch, *chw), np.float32)
        versions = {"python": platform.python_version(), **loaded_versions(backend)}
        write_frame(rep_fd, {"event": "ready", "versions": versions, "probs_dim": int(probs_dim),
                             "embedding_dim": int(embedding_dim), "load_s": time.perf_counter() - t0})
        stage = "infer"
        while True:
            msg = read_frame(req_fd)
            if msg is None or msg["op"] == "close":
                break
            n = msg["n"]
            if views is not None:
                x = views[0][:n]
            else:
                x = inbuf[:n]
                if not _read_into(req_fd, x.data.cast("B")):
                    break
            try:
                out = backend.infer(x)
            except InputError as err:  # a bad input leaves the backend usable
                write_frame(rep_fd, {"event": "error", "stage": stage, "type": err.__class__.__name__,
                                     "message": one_line(err), "recoverable": True})
                continue
            probs = np.asarray(out.probs, np.float32).reshape(n, -1)
            embedding = np.asarray(out.embedding, np.float32).reshape(n, -1)
            if probs.shape[1] != probs_dim or embedding.shape[1] != embedding_dim:
                raise RuntimeError(f"backend returned probs {out.probs.shape} and embedding {out.embedding.shape} "
                                   f"for {n} inputs; expected ({n}, {probs_dim}) and ({n}, {embedding_dim})")
            if views is not None:
                views[1][:n] = probs
                views[2][:n] = embedding
                write_frame(rep_fd, {"event": "result", "n": n})
            else:
                write_frame(rep_fd, {"event": "result", "n": n}, np.ascontiguousarray(probs), np.ascontiguousarray(embedding))
        backend.close()
        return 0
    except BaseException as err:  # noqa: BLE001 - every failure goes to the parent with its type
        try:
            write_frame(rep_fd, {"event": "error", "stage": stage, "type": err.__class__.__name__,
                                 "message": one_line(err), "recoverable": False})
        except OSError:  # the parent is gone; nobody to tell
            pass
        return 1


def main(argv: list[str]) -> int:
    parent = os.getppid()  # first: the parent waits for the hello, so this is the worker's
    req_fd, rep_fd, shm_fd, job = int(argv[0]), int(argv[1]), int(argv[2]), json.loads(argv[3])
    limit = job.get("memory_limit_mb")
    if limit:
        # Address space, not RSS: the one per-process limit the kernel enforces without cgroups.
        resource.setrlimit(resource.RLIMIT_AS, (limit * 2**20, limit * 2**20))
    write_frame(rep_fd, {"event": "hello", "pid": os.getpid(), "python": platform.python_version(),
                         "executable": sys.executable})
    return serve(job, req_fd, rep_fd, shm_fd, parent)
