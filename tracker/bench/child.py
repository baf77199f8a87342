"""The benchmark's child process: one cell (backend x precision x batch), a column's priming load,
an int8 quality check, a runoff (tracker.bench.runoff) or an availability probe.

    python -m tracker.bench.child FD JOB_JSON

The parent (tracker.bench.runner) starts one child per cell so that a crash, a signal, an
out-of-memory or a hang costs that cell only, and so that the peak RSS of a cell is that of a
process that ran this batch size alone. Results go back as JSON lines on the inherited pipe FD
(never stdout: runtimes print there). Messages, in order:

    {"event": "loaded", "load_s": s, "versions": {module: version}}   and again after the first pass: see run_cell
    {"event": "progress", "done": k}                 k passes done, the warm-up counted as one (throttled)
    {"event": "result", "pass_ns": [int, ...], "warmup_passes": int, "peak_rss_kb": int, "rss_processes": int,
     "rss_method": str}
    {"event": "error", "stage": "loading the backend"|"the warm-up passes"|"pass k/N", "type": exception class,
     "message": one line, "unavailable": bool}
    {"event": "probe", "backend": name, "available": bool, "reason": str|None, "precisions": [..]}
    {"event": "quality", ...}                        see run_quality
    {"event": "runoff", "ms_per_image": {name: ms}, "calls": {name: int}}   see run_runoff
    {"event": "primed", "load_s": s}                 see run_prime

A cell job: {"mode": "cell", "backend", "entry" (its registry Entry as a list), "precision",
"batch", "passes", "warmup_s", "threads", "model": {"prototxt", "weights", "probs", "embedding"},
"input_shape": [C, H, W], "seed", "memory_limit_mb", "options"}; a quality job is the same with
"mode": "quality" (batch, passes, warmup_s and seed unused), a priming job with "mode": "prime" (the
same unused). A runoff job is the cell job of its first candidate with "mode": "runoff",
"candidates": [[name, entry, options], ...], "rounds" and "seconds" (passes and warmup_s unused);
its progress messages count rounds. A probe job: {"mode": "probe", "backends": [[name, entry],
...]}. Heavy modules are imported only after the memory limit is in place.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

from tracker.child_process import exit_with_parent, loaded_versions, one_line

_PROGRESS_EVERY_S = 0.2


class _Channel:
    """JSON lines to the parent over the inherited pipe."""

    def __init__(self, fd: int):
        self._file = os.fdopen(fd, "w", buffering=1, encoding="utf-8")

    def send(self, **message) -> None:
        self._file.write(json.dumps(message) + "\n")


def _register(name: str, entry: list) -> str:
    """Make `name` resolve to the parent's registry entry in this process; returns its target.

    The parent resolved the name (it may know backends this process's literal registry lacks,
    e.g. one a test registered); creating through the registry keeps its checks and error texts.
    """
    from tracker import backends

    backends.REGISTRY[name] = backends.Entry(*entry)
    return backends.REGISTRY[name].target


def _family() -> list[int]:
    """This process and its descendants (a backend behind the worker runs in a grandchild)."""
    import psutil

    me = psutil.Process()
    return [me.pid] + [p.pid for p in me.children(recursive=True)]


def _reset_peak_rss() -> bool:
    """Reset the peak RSS (VmHWM) of this process and its descendants to their current RSS;
    False where the kernel can't (then the peak counts from each process's start)."""
    done = True
    for pid in _family():
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            done = False
    return done


def _vmhwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:  # it exited meanwhile, or no /proc: nothing to add
        pass
    return 0


def _peak_rss_kb() -> tuple[int, int]:
    """(peak RSS in KiB, processes counted): the sum of the VmHWM of this process and its
    descendants since the last reset. A sum of peaks: an upper bound of the simultaneous peak."""
    pids = _family()
    total = sum(_vmhwm_kb(pid) for pid in pids)
    if total == 0:  # no /proc (not Linux): this process's own peak since it started
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return (maxrss // 1024 if sys.platform == "darwin" else maxrss), 1
    return total, len(pids)


class _Stage:
    """What the child is doing, for the error message if it fails."""

    text = "loading the backend"


def _create(job: dict, precision: str):
    """The job's backend at `precision`, created through the registry."""
    from tracker.backends import create_backend
    from tracker.model.spec import ModelSpec

    _register(job["backend"], job["entry"])
    m = job["model"]
    spec = ModelSpec(Path(m["prototxt"]), Path(m["weights"]), m["probs"], m["embedding"])
    return create_backend(job["backend"], spec, precision=precision, threads=job["threads"], **job["options"])


def _cell_input(job: dict):
    """The same input for every backend and run: (batch, C, H, W) float32, standard normal from
    the job's seed, (C, H, W) from the model's input blob."""
    import numpy as np

    return np.random.default_rng(job["seed"]).standard_normal((job["batch"], *job["input_shape"]), dtype=np.float32)


def run_cell(job: dict, channel: _Channel, stage: _Stage) -> None:
    """Load the backend, untimed warm-up passes (one, then more until `warmup_s` seconds have passed
    since it ended), then `passes` timed forward passes of one batch.

    "loaded" is sent once the backend is created and again once its first pass has returned (load_s
    up to then, the versions of the modules loaded by then), and the warm-up's seconds count from
    then, because a backend may load lazily on its first call (`auto` creates its engine then):
    counted from before it, the load used up the warm-up and the engine's first-pass transient fell
    into the timed passes, and `auto`'s load_s read 0.08 s (its own constructor; TensorFlow's 3 s)
    beside the versions of no engine."""
    t0 = time.perf_counter()
    backend = _create(job, job["precision"])
    passes = job["passes"]
    x = _cell_input(job)
    channel.send(event="loaded", load_s=time.perf_counter() - t0, versions=loaded_versions(backend))

    # Peak RSS of the cell counts what loading left resident, not loading's transient peak.
    rss_method = "vmhwm-reset-after-load" if _reset_peak_rss() else "peak-since-start"
    stage.text = "the warm-up passes"
    backend.infer(x)
    channel.send(event="loaded", load_s=time.perf_counter() - t0, versions=loaded_versions(backend))  # again: see above
    warmup_passes = 1
    warm_until = time.perf_counter() + job["warmup_s"]
    last_report = time.monotonic()
    while time.perf_counter() < warm_until:
        backend.infer(x)
        warmup_passes += 1
        if time.monotonic() - last_report >= _PROGRESS_EVERY_S:  # a warm-up longer than --timeout is no hang
            channel.send(event="progress", done=0)
            last_report = time.monotonic()
    channel.send(event="progress", done=1)
    pass_ns = []
    last_report = time.monotonic()
    for k in range(passes):
        stage.text = f"pass {k + 1}/{passes}"
        start = time.perf_counter_ns()
        backend.infer(x)
        pass_ns.append(time.perf_counter_ns() - start)
        if time.monotonic() - last_report >= _PROGRESS_EVERY_S:
            channel.send(event="progress", done=k + 2)
            last_report = time.monotonic()
    # sent before close(): a runtime that crashes while shutting down does not void the timings
    peak_kb, processes = _peak_rss_kb()
    channel.send(event="result", pass_ns=pass_ns, warmup_passes=warmup_passes, peak_rss_kb=peak_kb,
                 rss_processes=processes, rss_method=rss_method)
    backend.close()


def run_prime(job: dict, channel: _Channel, stage: _Stage) -> None:
    """Load the backend once and close it, before its column's cells: a backend that converts its
    model when it loads (ONNX Runtime, LiteRT, TensorFlow, MXNet) then finds the converted files in
    the cache in every cell, so a cell's peak RSS is the backend's, not the converter's (LiteRT
    int8 at batch 1 on a cold cache: 764 MB, TensorFlow imported to convert; warm: 71 MB)."""
    stage.text = "loading the backend"
    t0 = time.perf_counter()
    backend = _create(job, job["precision"])
    channel.send(event="primed", load_s=time.perf_counter() - t0)
    backend.close()


def run_quality(job: dict, channel: _Channel, stage: _Stage) -> None:
    """What int8 costs: the backend at `precision` against the same backend at fp32 on the fixed
    quality set of face crops (tracker.model.convert.calibration, held out from calibration).

    Sends {"event": "quality", "set_id", **tracker.bench.quality.compare(...)}: crops,
    top1_agreement, decided_crops / top1_agreement_decided (crops fp32 decides by >= DECIDED_GAP nats; see
    tracker.bench.quality for why), embedding_cosine_mean, embedding_cosine_min.
    """
    from tracker.bench.quality import compare, quality_crops

    stage.text = "making the quality set"
    x, set_id = quality_crops(job["input_shape"])
    stage.text = "loading the backend"
    reference, candidate = _create(job, "fp32"), _create(job, job["precision"])
    stage.text = "comparing outputs"
    metrics = compare(reference, candidate, x)
    # sent before close(), as a cell's result is
    channel.send(event="quality", set_id=set_id, **metrics)
    reference.close()
    candidate.close()


def run_runoff(job: dict, channel: _Channel, stage: _Stage) -> None:
    """Load every candidate, then time them interleaved on the cell's input for `rounds` rounds of
    `seconds` each (tracker.bench.interleave). Sends the median ms per image of each and its
    number of timed calls."""
    from tracker.bench.interleave import time_interleaved

    x = _cell_input(job)
    candidates = {}
    for name, entry, options in job["candidates"]:
        stage.text = f"loading {name}"
        candidates[name] = _create({**job, "backend": name, "entry": entry, "options": options}, job["precision"])
    rounds = job["rounds"]
    stage.text = "the untimed first calls"

    def on_round(done: int) -> None:
        stage.text = f"round {done + 1}/{rounds}" if done < rounds else "closing the backends"
        channel.send(event="progress", done=done)

    timed = time_interleaved({name: backend.infer for name, backend in candidates.items()}, x, job["seconds"], rounds,
                             on_round)
    # sent before close(), as a cell's result is
    channel.send(event="runoff", ms_per_image={name: s * 1e3 / job["batch"] for name, (s, _) in timed.items()},
                 calls={name: calls for name, (_, calls) in timed.items()})
    for backend in candidates.values():
        backend.close()


def run_probe(job: dict, channel: _Channel) -> int:
    """For each backend: can it run here (its check_runtime), and which precisions it offers."""
    from tracker.backends import availability, backend_class

    for name, entry in job["backends"]:
        target = _register(name, entry)
        try:
            precisions = list(backend_class(name).precisions)
            reason = availability(name)
        except Exception as err:  # a backend module that is missing or broken cannot run here
            precisions, reason = [], f"backend {name!r}: cannot load {target} ({err.__class__.__name__}: {one_line(err)})"
        channel.send(event="probe", backend=name, available=reason is None, reason=reason, precisions=precisions)
    return 0


def main(argv: list[str]) -> int:
    # Before the memory limit (its thread's stack would count against it): a benchmark killed
    # outright (kill -9, the OOM killer) sends this child's own session nothing, and a cell inside a
    # hung or long pass went on, reparented to init.
    exit_with_parent(os.getppid())
    fd, job = int(argv[0]), json.loads(argv[1])
    limit = job.get("memory_limit_mb")
    if limit and job.get("memory_cap") == "rlimit-as":
        # No memory cgroup could be made (tracker.bench.memory_cap): address space, not RSS, the
        # only limit the kernel enforces per process without cgroups.
        resource.setrlimit(resource.RLIMIT_AS, (limit * 2**20, limit * 2**20))
    channel = _Channel(fd)
    if job["mode"] == "probe":
        return run_probe(job, channel)
    stage = _Stage()
    try:
        {"cell": run_cell, "prime": run_prime, "quality": run_quality, "runoff": run_runoff}[job["mode"]](job, channel, stage)
        return 0
    except BaseException as err:  # noqa: BLE001 - every failure, MemoryError included, is the job's result
        from tracker.errors import BackendUnavailable

        channel.send(
            event="error",
            stage=stage.text,
            type=err.__class__.__name__,
            message=one_line(err),
            unavailable=isinstance(err, BackendUnavailable),
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
