"""The backend worker: any backend in a child process, possibly on another Python interpreter.

Why: MXNet 1.9.1 needs numpy < 1.24, which cannot share an interpreter with the rest of the
product; and an engine that crashes or eats the memory should take down a child, not the guard.

`WorkerBackend` satisfies the Backend contract (name, infer, close). The child
(`tracker.backends.worker_child`) loads the backend, runs one warm-up image, and reports ready with
its runtime versions. Each `infer` copies the batch into memory shared with the child (a memfd;
transport "shm", the default) or writes it down a pipe (transport "pipe", for systems without
memfd_create), and the results come back the same way. Shared memory is the default: measured
with scripts/worker_overhead.py (a backend that computes nothing, face-CNN-sized arrays, 2-core
x86-64 VM) a call costs 0.26 ms at batch 1 and 0.27 ms at batch 8 with shared memory, 0.31 and
0.68 ms through the pipe, whose cost grows with the bytes (64 KiB per pipe buffer); most of the
fixed part is two cross-core wake-ups.

Failure contract (never a hang):
- every wait has a deadline: `ready_timeout_s` for start-up, `call_timeout_s` (default
  20 s + 2 s per image) for each infer; on expiry the child is killed (SIGKILL) and reaped;
- a wait is bounded, so it is not a hung guard: while it finds no reply it pings systemd's
  watchdog (`tracker.daemon.watchdog`, every POLL_S at most), which would otherwise kill a guard
  whose worker takes longer than WatchdogSec to answer or start; and once `interrupt()` was called
  (the guard is stopping) it ends the call at once (WorkerFailure) instead of at its deadline,
  where a reply that comes before POLL_S is taken as ever;
- a child that dies (exit code, signal, out of memory) is noticed as soon as its reply pipe
  closes (at the latest within a second), reaped, and reported;
- either way the caller gets a `WorkerFailure` (a BackendFailure) naming the cause, with the tail of
  the child's output and `lost_inputs`, the number of inputs of the failed call (they produced no
  result). After a WorkerFailure the worker is dead: every later infer raises WorkerFailure at once.
  `RestartingBackend` below turns that into restarts with back-off.
- a bad interpreter (missing, not executable, or not a Python able to run the child) is an
  InputError (exit 2): it is a value the user or the config supplied. A child the system cannot
  start for now (no process, descriptor or memory left: EAGAIN, ENOMEM, EMFILE, from its pipes and
  shared memory too) is a WorkerFailure, which RestartingBackend retries (exit 2 stopped a guard
  systemd does not restart for it; a bare OSError, a traceback). A backend whose runtime is missing
  in the child's interpreter is BackendUnavailable (exit 3), as in process.

Bounds: one call at a time (not thread-safe: the pipeline has one inference thread); batches larger
than `max_batch` (default 256, the largest batch the config and the benchmark allow) are split into
chunks of at most `max_batch`; the shared memory is max_batch x (C*H*W + P + D) float32 (8.9 MB for
the face CNN at 256), and only the pages a batch touches are backed by RAM. The child's output
(stdout and stderr) is kept as a bounded tail (the last 16 KiB) for error messages, never on disk.
The child process itself (start, output tail, reaping) is `tracker.child_process.ChildProcess`, as
the benchmark's cells are; `describe_exit` there puts its end in words.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tracker import daemon
from tracker.backends.base import Backend, check_float32_batch
from tracker.backends.worker_child import _LEN, region_offsets, write_frame
from tracker.child_process import POLL_S, ChildProcess, describe_exit
from tracker.errors import (
    BackendFailure,
    BackendUnavailable,
    ConfigError,
    InputError,
    ModelError,
    TrackerError,
)
from tracker.types import Inference

ROOT = Path(__file__).resolve().parents[2]  # the directory holding the `tracker` package
DEFAULT_MAX_BATCH = 256
DEFAULT_READY_TIMEOUT_S = 120.0  # importing a runtime and loading a model on a Pi 3 can take a while
CALL_TIMEOUT_BASE_S = 20.0
CALL_TIMEOUT_PER_IMAGE_S = 2.0  # far above the slowest backend's per-image time on a Pi 3
_EXIT_GRACE_S = 5.0  # a closed or dead child gets this long to be reaped before SIGKILL
_STOPPING_GRACE_S = 0.5  # the same once the guard is stopping (interrupt()): it must stop within a second
# What spawning the child raises for an interpreter path that cannot be one (the user's value);
# anything else (EAGAIN, ENOMEM, EMFILE) is the system's state at that moment.
_BAD_INTERPRETER = {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ELOOP,
                    errno.ENAMETOOLONG}
_BOOTSTRAP = (
    "import sys; sys.path.append(sys.argv[1]); "
    "from tracker.backends.worker_child import main; raise SystemExit(main(sys.argv[2:]))"
)
# Errors the child may report that keep their class (and exit code) in the parent.
_ERRORS = {cls.__name__: cls for cls in (InputError, ConfigError, ModelError, BackendUnavailable, BackendFailure)}


class WorkerFailure(BackendFailure):
    """The worker's child failed; the worker is dead until restarted.

    cause: one line (e.g. "killed by signal 9 (SIGKILL: out of memory, or killed by another process)",
    "timeout after 30 s").
    lost_inputs: inputs of the call that failed (0 when it failed while starting or idle).
    output_tail: the last lines the child printed (may be empty). returncode: the child's exit
    code (negative: the signal), None if it could not be reaped.
    """

    def __init__(self, message: str, *, cause: str, lost_inputs: int, output_tail: str = "", returncode: int | None = None):
        super().__init__(message)
        self.cause = cause
        self.lost_inputs = lost_inputs
        self.output_tail = output_tail
        self.returncode = returncode


def check_interpreter(python: str | os.PathLike) -> str:
    """The interpreter path as a string; InputError if it does not exist or is not executable."""
    path = Path(python)
    if not path.exists():
        raise InputError(f"worker python {str(path)!r} does not exist; expected the path of a Python >= 3.9 interpreter")
    if path.is_dir() or not os.access(path, os.X_OK):
        raise InputError(f"worker python {str(path)!r} is not an executable file; expected the path of a Python >= 3.9 interpreter")
    return str(path)


def model_input_shape(model) -> tuple[int, ...]:
    """(C, H, W) of the model's single input, read from its prototxt (ModelError if not one input)."""
    from tracker.model.caffe_io import load_net

    inputs = load_net(model.prototxt, None).inputs
    if len(inputs) != 1:
        raise ModelError(f"model {model.prototxt}: {len(inputs)} inputs; a worker backend runs nets with exactly one (N, C, H, W) input")
    return tuple(next(iter(inputs.values()))[1:])


class Stop:
    """The guard is stopping: a flag raised from a signal handler (a plain attribute: no lock to
    take there) and read by every wait on a worker that shares it, a worker being started by a
    restart included (RestartingBackend hands its own to the workers its factory makes)."""

    def __init__(self) -> None:
        self.requested = False


class WorkerBackend:
    """Backend `name` (or any "module:Class" `target`) running in a child process.

    name, model, precision, threads: as for create_backend; the child creates the backend with them.
    target: "module:Class" to load in the child (default: the registry's entry for `name`).
    options: keyword options for the backend's constructor (JSON-serialisable).
    python: the child's interpreter (default: this one, sys.executable).
    env: extra environment for the child; a value of None removes that variable.
    memory_limit_mb: address-space limit (RLIMIT_AS) the child sets on itself before loading.
    max_batch, ready_timeout_s, call_timeout_s, transport ("shm" | "pipe"): see the module docstring.
    stop: the `Stop` its waits read (default: its own, which `interrupt()` raises).

    After start-up: `runtime_versions` (what the child runs, e.g. {"python": "3.11.7", "numpy":
    "1.23.5", "mxnet": "1.9.1"}), `pid`, `load_s`, `input_shape` (N-first, N = -1).
    """

    def __init__(self, name: str, model=None, precision: str = "fp32", threads: int | None = None, *,
                 target: str | None = None, options: dict | None = None, python: str | os.PathLike | None = None,
                 env: dict | None = None, memory_limit_mb: int | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S, call_timeout_s: float | None = None,
                 transport: str | None = None, input_shape: tuple[int, ...] | None = None, stop: Stop | None = None):
        from tracker.backends.registry import REGISTRY
        from tracker.model.spec import default_model

        self.name = name
        self.model = model or default_model()
        if target is None:
            if name not in REGISTRY:
                raise InputError(f"worker: unknown backend {name!r} and no target given; expected one of {', '.join(REGISTRY)}")
            target = REGISTRY[name].target
        if transport is None:
            transport = "shm" if hasattr(os, "memfd_create") else "pipe"
        if transport not in ("shm", "pipe"):
            raise InputError(f"worker transport: found {transport!r}; expected 'shm' or 'pipe'")
        if transport == "shm" and not hasattr(os, "memfd_create"):
            raise InputError("worker transport 'shm' needs os.memfd_create (Linux); use transport 'pipe'")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InputError(f"worker max_batch: found {max_batch!r}; expected a positive integer")
        self.max_batch = max_batch
        self.transport = transport
        self.python = check_interpreter(python or sys.executable)
        chw = tuple(input_shape) if input_shape is not None else model_input_shape(self.model)
        self.input_shape = (-1, *chw)
        self.ready_timeout_s = float(ready_timeout_s)
        self.call_timeout_s = call_timeout_s
        self._job = {
            "target": target,
            "model": {"prototxt": str(self.model.prototxt), "weights": str(self.model.weights),
                      "probs": self.model.probs, "embedding": self.model.embedding},
            "precision": precision,
            "threads": threads,
            "options": options or {},
            "input_shape": list(chw),
            "max_batch": max_batch,
            "memory_limit_mb": memory_limit_mb,
        }
        self._env = dict(os.environ)
        for key in ("NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC"):  # only the guard speaks to systemd
            self._env.pop(key, None)
        for key, value in (env or {}).items():
            if value is None:
                self._env.pop(key, None)
            else:
                self._env[key] = str(value)
        self.runtime_versions: dict = {}
        self.pid: int | None = None
        self.load_s: float | None = None
        self._proc: ChildProcess | None = None
        self._req = self._rep = self._shm_fd = -1  # pipe and shared-memory descriptors; -1: closed
        self._views: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # shared memory: inputs, probs, embeddings
        self._dead: str | None = None  # why the worker cannot serve (set on failure and close)
        self._stop = stop or Stop()  # raised: the guard is stopping, a wait without a reply ends the call
        self._start()

    @property
    def _child(self) -> ChildProcess:
        """The child process; only used once `_start` made it."""
        assert self._proc is not None, "worker child used before it was started"
        return self._proc

    # ------------------------------------------------------------------ start-up

    def _start(self) -> None:
        per_image = int(np.prod(self.input_shape[1:]))
        made: list[int] = []  # the descriptors made so far: closed again if one cannot be made
        try:
            made += os.pipe()
            made += os.pipe()
            if self.transport == "shm":
                made.append(os.memfd_create("tracker-worker", os.MFD_CLOEXEC))
        except OSError as err:  # EMFILE, ENFILE, ENOMEM: the system's state at this moment
            for fd in made:
                os.close(fd)
            raise self._cannot_start_now(err) from None
        req_r, req_w, rep_r, rep_w = made[:4]
        shm_fd = made[4] if self.transport == "shm" else -1
        child_fds = (req_r, rep_w) + ((shm_fd,) if shm_fd >= 0 else ())
        try:
            self._proc = ChildProcess(
                [self.python, "-c", _BOOTSTRAP, str(ROOT), str(req_r), str(rep_w), str(shm_fd), json.dumps(self._job)],
                pass_fds=child_fds, env=self._env)
        except OSError as err:
            for fd in made:
                os.close(fd)
            if err.errno not in _BAD_INTERPRETER:
                raise self._cannot_start_now(err) from None
            raise InputError(f"worker python {self.python!r} cannot be started ({err.strerror or err}); "
                             f"expected a Python >= 3.9 interpreter") from None
        finally:
            if self._proc is not None:
                for fd in (req_r, rep_w):
                    os.close(fd)
        self.pid = self._proc.pid
        self._req, self._rep, self._shm_fd = req_w, rep_r, shm_fd
        os.set_blocking(self._req, False)
        self._rbuf = bytearray()
        self._shm = None
        deadline = self._deadline(self.ready_timeout_s)
        hello = self._await("the start-up", deadline, lost=0, before_hello=True)
        if hello.get("event") != "hello":
            self._fail(f"sent {hello.get('event')!r} instead of hello", lost=0)
        ready = self._await("loading the backend", deadline, lost=0)
        if ready["event"] == "error":
            self._raise_child_error(ready, lost=0)
        self.runtime_versions = {**ready["versions"], "worker_python": self.python}
        self.load_s = ready["load_s"]
        self.probs_dim, self.embedding_dim = ready["probs_dim"], ready["embedding_dim"]
        if shm_fd >= 0:
            probs_at, embedding_at, total = region_offsets(self.max_batch, per_image, self.probs_dim, self.embedding_dim)
            self._shm = mmap.mmap(shm_fd, total)
            self._views = (
                np.frombuffer(self._shm, np.float32, self.max_batch * per_image, 0).reshape(self.max_batch, *self.input_shape[1:]),
                np.frombuffer(self._shm, np.float32, self.max_batch * self.probs_dim, probs_at).reshape(self.max_batch, self.probs_dim),
                np.frombuffer(self._shm, np.float32, self.max_batch * self.embedding_dim, embedding_at).reshape(self.max_batch, self.embedding_dim),
            )

    def _cannot_start_now(self, err: OSError) -> WorkerFailure:
        """The failure for a child the system cannot start at this moment (no process, descriptor or
        memory left), which RestartingBackend retries (see the module docstring)."""
        cause = f"cannot be started now ({err.strerror or err})"
        return WorkerFailure(f"backend {self.name!r} worker {cause}", lost_inputs=0, cause=cause)

    def interrupt(self) -> None:
        """The caller is stopping: see the module docstring. May be called from a signal handler."""
        self._stop.requested = True

    # ------------------------------------------------------------------ calls

    def infer(self, x: np.ndarray) -> Inference:
        """x (N, C, H, W) float32, N >= 1 -> Inference (arrays owned by the caller).

        Raises InputError for a bad x (checked here, the child is not involved), WorkerFailure
        when the child fails (it is then dead; see RestartingBackend), or the child's own
        InputError for an input its backend rejects (the child goes on).
        """
        if self._dead is not None:
            n = x.shape[0] if isinstance(x, np.ndarray) and x.ndim else 0
            raise WorkerFailure(f"backend {self.name!r} worker is not running ({self._dead})",
                                cause=self._dead, lost_inputs=n)
        check_float32_batch(self.name, x, self.input_shape)
        n = x.shape[0]
        try:
            parts = [self._call(x[i:i + self.max_batch], lost=n) for i in range(0, n, self.max_batch)]
        except TrackerError:  # the exchange with the child completed, or the child is gone
            raise
        except BaseException:  # e.g. Ctrl-C mid-call: a late reply would answer the next call
            self._shutdown()
            self._dead = "interrupted during a call"
            raise
        if len(parts) == 1:
            return parts[0]
        return Inference(np.concatenate([p.probs for p in parts]), np.concatenate([p.embedding for p in parts]))

    def _call(self, x: np.ndarray, lost: int) -> Inference:
        n = x.shape[0]
        timeout = self.call_timeout_s if self.call_timeout_s is not None else CALL_TIMEOUT_BASE_S + CALL_TIMEOUT_PER_IMAGE_S * n
        deadline = self._deadline(timeout)
        what = f"the infer of {n} input{'s' if n != 1 else ''}"
        if self._views is not None:
            np.copyto(self._views[0][:n], x)
            self._send({"op": "infer", "n": n}, (), deadline, what, lost)
        else:
            self._send({"op": "infer", "n": n}, (np.ascontiguousarray(x),), deadline, what, lost)
        reply = self._await(what, deadline, lost)
        if reply["event"] == "error":
            self._raise_child_error(reply, lost)
        if reply["event"] != "result" or reply["n"] != n:
            self._fail(f"answered {reply!r} to {what}", lost)
        if self._views is not None:
            return Inference(self._views[1][:n].copy(), self._views[2][:n].copy())
        probs = np.empty((n, self.probs_dim), np.float32)
        embedding = np.empty((n, self.embedding_dim), np.float32)
        self._read_exact(probs.data.cast("B"), deadline, what, lost)
        self._read_exact(embedding.data.cast("B"), deadline, what, lost)
        return Inference(probs, embedding)

    # ------------------------------------------------------------------ framing with deadlines

    def _send(self, header: dict, payloads, deadline: float, what: str, lost: int) -> None:
        data = json.dumps(header).encode()
        for part in (_LEN.pack(len(data)) + data, *payloads):
            view = memoryview(part).cast("B")
            while view:
                try:
                    view = view[os.write(self._req, view):]
                    continue
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    self._fail_dead(what, lost)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._fail(f"timeout after {self._wait_s:g} s during {what} (the child stopped reading)", lost)
                if not select.select([], [self._req], [], min(remaining, POLL_S))[1]:
                    self._still_waiting(what, lost)
                if self._child.poll() is not None:
                    self._fail_dead(what, lost)

    def _readable(self, deadline: float, what: str, lost: int) -> bool:
        """Wait up to POLL_S for the reply pipe: True once it has bytes (or its EOF) to read; False
        after a poll that found none (the child is alive, the watchdog pinged); fails at the deadline,
        once the child exited with nothing left to read, or when the guard is stopping."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._fail(f"timeout after {self._wait_s:g} s during {what}", lost)
        if select.select([self._rep], [], [], min(remaining, POLL_S))[0]:
            return True
        if self._child.exited_with_nothing_to_read(self._rep):
            self._fail_dead(what, lost)
        self._still_waiting(what, lost)
        return False

    def _fill(self, count: int, deadline: float, what: str, lost: int) -> None:
        """Read until self._rbuf holds `count` bytes, or fail (EOF: the child died; deadline: timeout)."""
        while len(self._rbuf) < count:
            if self._readable(deadline, what, lost):
                chunk = os.read(self._rep, max(65536, count - len(self._rbuf)))
                if not chunk:
                    self._fail_dead(what, lost)
                self._rbuf += chunk

    def _await(self, what: str, deadline: float, lost: int, before_hello: bool = False) -> dict:
        try:
            self._fill(_LEN.size, deadline, what, lost)
            size = _LEN.unpack_from(self._rbuf)[0]
            self._fill(_LEN.size + size, deadline, what, lost)
        except WorkerFailure as err:
            if before_hello and err.returncode is not None and err.returncode >= 0:
                # it ran and ended without a word: not a Python that can run the worker
                raise InputError(
                    f"worker python {self.python!r} could not run the worker ({describe_exit(err.returncode)} "
                    f"before saying hello{': ' + err.output_tail if err.output_tail else ''}); "
                    f"expected a Python >= 3.9 interpreter") from None
            raise
        header = json.loads(bytes(self._rbuf[_LEN.size:_LEN.size + size]))
        del self._rbuf[:_LEN.size + size]
        return header

    def _read_exact(self, view: memoryview, deadline: float, what: str, lost: int) -> None:
        """Fill view with payload bytes: first what is buffered, then straight from the pipe."""
        take = min(len(view), len(self._rbuf))
        view[:take] = self._rbuf[:take]
        del self._rbuf[:take]
        view = view[take:]
        while view:
            if self._readable(deadline, what, lost):
                got = os.readv(self._rep, [view])
                if not got:
                    self._fail_dead(what, lost)
                view = view[got:]

    def _still_waiting(self, what: str, lost: int) -> None:
        """A poll of the child found no reply yet (see the module docstring)."""
        daemon.watchdog()
        if self._stop.requested:
            self._fail(f"stopped waiting for {what} (the guard is stopping)", lost)

    def _deadline(self, timeout_s: float) -> float:
        self._wait_s = timeout_s
        return time.monotonic() + timeout_s

    # ------------------------------------------------------------------ failures

    def _raise_child_error(self, reply: dict, lost: int):
        """An error the child reported: keep tracker error classes, else WorkerFailure."""
        if reply.get("recoverable"):
            raise _ERRORS.get(reply["type"], InputError)(reply["message"])
        cls = _ERRORS.get(reply["type"])
        if cls is not None and cls is not BackendFailure and reply["stage"] == "load":
            self._shutdown()
            self._dead = f"{reply['type']} while loading"
            raise cls(reply["message"])
        kind = f"out of memory in the worker ({reply['type']})" if "MemoryError" in reply["type"] else f"{reply['type']} in the worker"
        self._fail(f"{kind} during {'loading' if reply['stage'] == 'load' else 'the call'}: {reply['message']}", lost)

    def _fail_dead(self, what: str, lost: int):
        """The child closed its pipe or exited: reap it and say how it ended."""
        self._child.reap(_EXIT_GRACE_S)
        self._fail(f"{describe_exit(self._child.returncode)} during {what}", lost)

    def _fail(self, cause: str, lost: int):
        """Kill and reap the child, mark the worker dead, raise WorkerFailure."""
        self._shutdown()
        returncode = self._proc.returncode if self._proc is not None else None
        tail = self._child.output_tail()
        self._dead = cause
        text = f"backend {self.name!r} worker (pid {self.pid}, {self.python}): {cause}"
        if lost:
            text += f"; {lost} input{'s' if lost != 1 else ''} lost"
        if tail:
            text += f"; child output: {tail}"
        raise WorkerFailure(text, cause=cause, lost_inputs=lost, output_tail=tail, returncode=returncode)

    def _shutdown(self) -> None:
        """Kill (if still running) and reap the child; release pipes and shared memory."""
        if self._proc is None:
            return
        self._proc.close()
        self._release()

    def _release(self) -> None:
        if self._shm is not None:
            self._views = None
            try:
                self._shm.close()
            except BufferError:  # a caller still holds a view; the mapping goes with the object
                pass
            self._shm = None
        for fd in (self._req, self._rep, self._shm_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._req = self._rep = self._shm_fd = -1

    def child_peak_rss_kb(self) -> int | None:
        """Peak resident memory (VmHWM, KiB) of the running child, None where /proc cannot say.
        A benchmark's RSS of its own process does not include this."""
        try:
            with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except (OSError, TypeError):
            pass
        return None

    def output_text(self) -> str:
        """The child's recent output (stdout and stderr, the last 16 KiB), for diagnostics."""
        return self._child.output_text()

    def close(self) -> None:
        """Ask the child to exit (it closes its backend), then reap it; SIGKILL after a grace period
        (short once the guard is stopping: a hung child held the stop for 5 s)."""
        if self._proc is None or self._req < 0:
            return
        if self._dead is None:
            try:
                os.set_blocking(self._req, True)
                write_frame(self._req, {"op": "close"})
            except OSError:
                pass
            self._child.reap(_STOPPING_GRACE_S if self._stop.requested else _EXIT_GRACE_S)
        self._shutdown()
        self._dead = self._dead or "closed"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # a worker dropped without close() nor a failure (both reaped its child, whose process group id
        # may be another's by now): never leave its child (or its descriptors) behind
        if getattr(self, "_proc", None) is not None and getattr(self, "_dead", "") is None:
            self._proc.kill()
            self._release()


class InputsLost(BackendFailure):
    """RestartingBackend.infer produced no result for its inputs: count them as dropped.

    lost_inputs: how many inputs (crops) of the call are lost (= len(x) of the call).
    cause: why (the worker's failure, or "restarting: ..." while waiting to restart).
    waiting: True when no backend was called (it waits for its restart, or is not restarted as the
    guard stops): the failure is the one an earlier InputsLost reported, not a new one.
    """

    def __init__(self, message: str, *, lost_inputs: int, cause: str, waiting: bool = False):
        super().__init__(message)
        self.lost_inputs = lost_inputs
        self.cause = cause
        self.waiting = waiting


class RestartingBackend:
    """A backend that restarts after a BackendFailure, with capped exponential back-off.

        backend = RestartingBackend(lambda: create_backend(name, model, worker=True), name=name)
        try:
            out = backend.infer(x)
        except InputsLost as err:          # err.lost_inputs inputs are gone: count their frames as dropped
            ...

    The first backend is created in the constructor, and its errors propagate (a configuration
    problem must stop the guard at start-up). Later, when the backend raises BackendFailure (a
    WorkerFailure: its child died, hung or ran out of memory), `infer` closes it and raises
    InputsLost for that call's inputs. A restart is attempted at the next `infer` once the delay
    has passed: `backoff_initial_s` after the first failure, doubling (`backoff_factor`) with
    each consecutive failure, capped at `backoff_max_s`; calls before then raise InputsLost at once
    (no blocking). A restart that fails with BackendFailure counts as another failure; any other
    error from the factory (bad config, runtime missing) propagates. A successful call resets the
    delay. `restarts` counts the restarts (the guard's MQTT state reports it). Not thread-safe
    (one inference thread).
    """

    def __init__(self, factory: Callable[[], Backend], *, name: str | None = None, backoff_initial_s: float = 0.5,
                 backoff_max_s: float = 30.0, backoff_factor: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, stop: Stop | None = None):
        if not (backoff_initial_s >= 0 and backoff_max_s >= backoff_initial_s and backoff_factor >= 1):
            raise InputError(f"restart back-off: found initial {backoff_initial_s}, max {backoff_max_s}, factor "
                             f"{backoff_factor}; expected 0 <= initial <= max and factor >= 1")
        self._factory = factory
        self._clock = clock
        self.backoff_initial_s, self.backoff_max_s, self.backoff_factor = backoff_initial_s, backoff_max_s, backoff_factor
        first = factory()
        self._backend: Backend | None = first  # None between a failure and the restart
        self.name = name or first.name
        self.restarts = 0
        self.consecutive_failures = 0
        self.last_cause: str | None = None
        self._next_attempt = 0.0
        self.stop = stop or Stop()  # raised: the guard is stopping, no restart, and a worker's waits end early

    @property
    def backend(self):
        """The running backend, or None while waiting to restart."""
        return self._backend

    def delay_after(self, failures: int) -> float:
        """Seconds between consecutive failure number `failures` (>= 1) and the next restart."""
        return min(self.backoff_max_s, self.backoff_initial_s * self.backoff_factor ** (failures - 1))

    def _failed(self, cause: str, lost: int, err: BaseException) -> InputsLost:
        self.consecutive_failures += 1
        self.last_cause = cause
        delay = self.delay_after(self.consecutive_failures)
        self._next_attempt = self._clock() + delay
        then = "not restarted: the guard is stopping" if self.stop.requested else f"restart in {delay:g} s"
        return InputsLost(f"backend {self.name!r}: {lost} input{'s' if lost != 1 else ''} lost ({err}); {then}",
                          lost_inputs=lost, cause=cause)

    def interrupt(self) -> None:
        """The guard is stopping (may be called from a signal handler): a worker's call that waits
        ends at once (the backend's `interrupt`: a WorkerBackend, or MXNet's over one; a backend
        in this process has none), and a failed backend is not restarted: its calls raise
        InputsLost at once. A worker being started by a restart at that moment stops waiting for
        its start-up if the factory handed it `stop` (WorkerBackend's `stop`: the guard does)."""
        self.stop.requested = True
        interrupt = getattr(self._backend, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def infer(self, x: np.ndarray) -> Inference:
        """As the wrapped backend's infer; raises InputsLost (a BackendFailure) when the inputs are lost."""
        n = x.shape[0] if isinstance(x, np.ndarray) and x.ndim else 0
        if self._backend is None:
            wait = self._next_attempt - self._clock()
            if wait > 0 or self.stop.requested:
                when = "not restarted: the guard is stopping" if self.stop.requested else f"restarting in {wait:.3g} s"
                raise InputsLost(f"backend {self.name!r}: {when}, after: {self.last_cause}; {n} inputs lost",
                                 lost_inputs=n, cause=f"restarting: {self.last_cause}", waiting=True)
            try:
                self._backend = self._factory()
            except BackendFailure as err:
                raise self._failed(getattr(err, "cause", str(err)), n, err) from err
            self.restarts += 1
        try:
            out = self._backend.infer(x)
        except BackendFailure as err:
            backend, self._backend = self._backend, None
            try:
                backend.close()
            except TrackerError:
                pass
            raise self._failed(getattr(err, "cause", str(err)), getattr(err, "lost_inputs", n) or n, err) from err
        self.consecutive_failures = 0
        return out

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
