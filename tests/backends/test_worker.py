"""The backend worker with real child processes: results, every way a child can fail, restarts.

The misbehaving backends are in tests/worker_faults.py, imported by the child through PYTHONPATH;
the faults are real (SIGKILL, SIGABRT, MemoryError under RLIMIT_AS, a hang), nothing of the worker
is mocked. Timeouts are bounded (pytest-timeout guards every test); no timing is asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import worker_faults
from processes import running

from tracker.backends import create_backend
from tracker.backends.worker import InputsLost, RestartingBackend, Stop, WorkerBackend, WorkerFailure
from tracker.errors import BackendUnavailable, InputError
from tracker.model.spec import default_model

TESTS = Path(__file__).resolve().parents[1]  # tests/, which holds worker_faults.py
pytestmark = pytest.mark.timeout(120)


def faulty(fault="none", after=2, **kwargs) -> WorkerBackend:
    """A worker running worker_faults.Faulty (input shape: the face CNN's, 1x88x88)."""
    options = {"fault": fault, "after": after}
    if "marker" in kwargs:
        options["marker"] = str(kwargs.pop("marker"))
    return WorkerBackend("faulty", default_model(), target="worker_faults:Faulty", options=options,
                         env={"PYTHONPATH": str(TESTS)}, **kwargs)


def batch(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 88, 88), dtype=np.float32)


def assert_gone(pid: int) -> None:
    """The child was reaped: no such process any more (a zombie would still answer)."""
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ---- results -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_real_backend_behind_worker_matches_in_process(transport):
    x = batch(5)
    local = create_backend("caffe-openblas")
    # the worker splits 5 inputs into chunks of 2, 2, 1; the engine's float sums may depend on N
    parts = [local.infer(x[i:i + 2]) for i in (0, 2, 4)]
    want = type(parts[0])(np.concatenate([p.probs for p in parts]), np.concatenate([p.embedding for p in parts]))
    remote = create_backend("caffe-openblas", worker=True, worker_options={"transport": transport, "max_batch": 2})
    try:
        assert isinstance(remote, WorkerBackend) and remote.transport == transport
        assert remote.runtime_versions["numpy"] == np.__version__
        assert remote.runtime_versions["worker_python"] == sys.executable
        got = remote.infer(x)
        assert got.probs.shape == (5, 848) and got.embedding.shape == (5, 128)
        assert got.probs.dtype == np.float32 and got.embedding.dtype == np.float32
        # the same engine in another process: the same arithmetic
        np.testing.assert_array_equal(got.probs, want.probs)
        np.testing.assert_array_equal(got.embedding, want.embedding)
        assert remote.child_peak_rss_kb() > 10_000  # the child holds numpy and the face CNN
        again = remote.infer(x[4:])
        np.testing.assert_array_equal(again.probs, want.probs[4:])
        assert not np.shares_memory(again.probs, got.probs)
    finally:
        remote.close()
    assert_gone(remote.pid)


def test_results_are_owned_by_the_caller():
    w = faulty()
    try:
        first = w.infer(batch(3, seed=1))
        kept = first.probs.copy()
        w.infer(batch(3, seed=2))  # overwrites the shared buffers
        np.testing.assert_array_equal(first.probs, kept)
        np.testing.assert_allclose(first.probs, worker_faults.expected(batch(3, seed=1)).probs, rtol=1e-6)
    finally:
        w.close()


def test_parent_rejects_bad_input_without_the_child():
    w = faulty()
    try:
        with pytest.raises(InputError, match="dtype float32; found float64"):
            w.infer(batch(2).astype(np.float64))
        with pytest.raises(InputError, match=r"shape \('N', 1, 88, 88\)"):
            w.infer(np.zeros((2, 1, 28, 28), np.float32))
        with pytest.raises(InputError, match="N >= 1"):
            w.infer(np.zeros((0, 1, 88, 88), np.float32))
        np.testing.assert_allclose(w.infer(batch(1)).embedding, worker_faults.expected(batch(1)).embedding)
    finally:
        w.close()


def test_input_error_in_the_child_keeps_it_running():
    w = faulty("reject", after=3)
    try:
        w.infer(batch(1))
        with pytest.raises(InputError, match="call 3 rejected"):
            w.infer(batch(1))
        # the same process goes on serving: its call counter kept counting
        with pytest.raises(InputError, match="call 4 rejected"):
            w.infer(batch(1))
        os.kill(w.pid, 0)
    finally:
        w.close()


# ---- a child that dies ---------------------------------------------------------------------


def test_kill_9_mid_batch(tmp_path):
    marker = tmp_path / "in-batch"
    w = faulty("wait", marker=marker)
    pid = w.pid

    def killer():
        for _ in range(600):  # at most 60 s
            if marker.exists():
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=killer)
    thread.start()
    with pytest.raises(WorkerFailure) as err:
        w.infer(batch(4))
    thread.join()
    assert err.value.returncode == -signal.SIGKILL
    assert err.value.lost_inputs == 4
    assert "killed by signal 9 (SIGKILL" in str(err.value) and "4 inputs lost" in str(err.value)
    assert_gone(pid)
    with pytest.raises(WorkerFailure, match="not running .*killed by signal 9") as again:
        w.infer(batch(2))
    assert again.value.lost_inputs == 2
    w.close()


@pytest.mark.parametrize("fault, cause, code", [
    ("abort", r"killed by signal 6 \(SIGABRT\)", -signal.SIGABRT),
    ("exit", "exited with code 7", 7),
    ("kill", r"killed by signal 9 \(SIGKILL: out of memory", -signal.SIGKILL),
])
def test_child_death_is_reported_with_its_cause(fault, cause, code):
    w = faulty(fault, after=3)
    w.infer(batch(1))
    with pytest.raises(WorkerFailure, match=cause) as err:
        w.infer(batch(3))
    assert err.value.returncode == code and err.value.lost_inputs == 3
    assert_gone(w.pid)


@pytest.mark.native_only  # under qemu-user the address-space limit also bounds the emulator's own mappings
def test_out_of_memory_under_a_memory_limit():
    # 64 MiB per input: batch 32 wants 2 GiB in a child limited to 1 GiB of address space
    w = faulty("greedy", memory_limit_mb=1024)
    with pytest.raises(WorkerFailure, match="out of memory in the worker.*MemoryError") as err:
        w.infer(batch(32))
    assert err.value.lost_inputs == 32
    assert_gone(w.pid)


def test_exception_in_the_child_is_a_failure_with_its_message():
    w = faulty("crash")
    with pytest.raises(WorkerFailure, match="RuntimeError in the worker during the call: faulty engine broke on call 2"):
        w.infer(batch(1))
    assert_gone(w.pid)


def test_failure_while_loading():
    with pytest.raises(WorkerFailure, match="RuntimeError in the worker during loading: faulty engine broke on call 1") as err:
        faulty("crash", after=1)  # the warm-up is call 1
    assert err.value.lost_inputs == 0


def test_an_error_sent_just_before_the_child_exits_is_the_failure(exit_within_one_wait):
    """A child that fails sends its error and exits at once; when both come within one wait on
    the pipe, the failure is still the child's own message, not its death."""
    from tracker.backends import worker

    waited = exit_within_one_wait(worker)
    with pytest.raises(WorkerFailure, match="RuntimeError in the worker during loading: faulty engine broke on call 1"):
        faulty("crash", after=1)
    assert waited, "the child's exit was never waited for: the race did not run"


def test_hang_times_out_and_the_child_is_killed():
    w = faulty("hang", call_timeout_s=1.5)
    with pytest.raises(WorkerFailure, match=r"timeout after 1.5 s during the infer of 2 inputs") as err:
        w.infer(batch(2))
    assert err.value.lost_inputs == 2 and err.value.returncode == -signal.SIGKILL
    assert_gone(w.pid)


def test_a_guard_that_stops_ends_a_call_to_a_hung_worker_at_once():
    """interrupt() (the guard's stop, from its SIGTERM handler) ends a wait that finds no reply,
    not the call's deadline (here a minute); the worker's restart is not attempted either."""
    backend = RestartingBackend(lambda: faulty("hang", call_timeout_s=60))
    worker = backend.backend
    threading.Timer(0.5, backend.interrupt).start()
    with pytest.raises(InputsLost, match="stopped waiting for the infer of 2 inputs \\(the guard is stopping\\)"):
        backend.infer(batch(2))
    assert_gone(worker.pid)
    with pytest.raises(InputsLost, match="not restarted: the guard is stopping"):
        backend.infer(batch(1))
    backend.close()


def test_a_guard_that_stops_does_not_wait_five_seconds_for_a_hung_idle_worker_to_close(monkeypatch):
    """close() after interrupt() kills a child that does not exit within half a second (a grace
    of an hour here: the old code waited it out, and the test's timeout failed it)."""
    import tracker.backends.worker as worker_module

    monkeypatch.setattr(worker_module, "_EXIT_GRACE_S", 3600.0)
    worker = faulty()
    worker.infer(batch(1))
    os.kill(worker.pid, signal.SIGSTOP)  # hung between calls
    worker.interrupt()
    closing = threading.Thread(target=worker.close)
    closing.start()
    closing.join(60)
    assert not closing.is_alive()
    assert_gone(worker.pid)


def test_a_worker_the_system_cannot_start_for_now_is_a_failure_to_retry(monkeypatch):
    """fork's EAGAIN (the unit's TasksMax reached) during a restart was an InputError: exit 2,
    which systemd does not restart, and a message blaming the interpreter."""
    import errno

    import tracker.backends.worker as worker_module

    clock = FakeClock()
    backend = RestartingBackend(lambda: faulty("none"), backoff_initial_s=1, clock=clock)
    os.kill(backend.backend.pid, signal.SIGKILL)
    with pytest.raises(InputsLost):
        backend.infer(batch(1))
    real = worker_module.ChildProcess

    def no_process(*args, **kwargs):
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(worker_module, "ChildProcess", no_process)
    clock.now += 1
    with pytest.raises(InputsLost, match=r"worker cannot be started now \(Resource temporarily unavailable\)"):
        backend.infer(batch(1))
    monkeypatch.setattr(worker_module, "ChildProcess", real)
    clock.now += 2
    assert backend.infer(batch(1)).probs.shape[0] == 1  # restarted once the system could
    backend.close()


def test_a_worker_without_descriptors_left_is_a_failure_to_retry_and_leaks_none(monkeypatch):
    """EMFILE from the worker's pipes or its shared memory (the guard out of descriptors for a
    moment) came out of a restart as a bare OSError, a traceback that stopped the guard, and left
    the pipes made before it open."""
    import errno

    def no_descriptor(*args):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", no_descriptor)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(WorkerFailure, match=r"worker cannot be started now \(Too many open files\)"):
        faulty("none", transport="shm")
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_stop_reaches_a_worker_that_a_restart_is_starting():
    """The stop came while a restart waited for its new worker's start-up (seconds on a Pi): the
    guard waited it out, past systemd's stop timeout, which then killed it before its `left`
    events. The factory hands the restarting backend's `stop` to the workers it makes."""
    stop = Stop()
    workers = iter([lambda: faulty("kill", stop=stop),
                    lambda: WorkerBackend("never-ready", default_model(), target="worker_faults:NeverReady",
                                          env={"PYTHONPATH": str(TESTS)}, ready_timeout_s=60, stop=stop)])
    backend = RestartingBackend(lambda: next(workers)(), backoff_initial_s=0, stop=stop)
    with pytest.raises(InputsLost, match="killed by signal 9"):
        backend.infer(batch(1))
    threading.Timer(0.5, backend.interrupt).start()
    with pytest.raises(InputsLost, match=r"stopped waiting for .* \(the guard is stopping\)"):
        backend.infer(batch(1))  # the restart
    backend.close()


def test_a_stop_reaches_any_backend_that_waits_on_a_worker():
    """MXNet's backend holds its WorkerBackend inside: the stop is forwarded to whatever backend
    has an `interrupt`, and one in this process (none) is left alone."""
    from tracker.backends import backend_class

    stopped = []

    class HoldsAWorker:
        name = "holds-a-worker"

        def interrupt(self):
            stopped.append(True)

    RestartingBackend(HoldsAWorker).interrupt()
    RestartingBackend(lambda: _Flaky([], fail=False)).interrupt()  # no interrupt: nothing to do
    assert stopped == [True] and callable(backend_class("mxnet-openblas").interrupt)


def test_a_wait_for_the_worker_pings_systemds_watchdog(tmp_path, monkeypatch):
    """A call may take longer than WatchdogSec (20 s + 2 s an image by default; 30 s in the unit):
    the bounded wait is not a hung guard. The pings go to a socket standing in for systemd's."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify"))
    listener.settimeout(0)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    w = faulty("hang", call_timeout_s=3.5)
    with pytest.raises(WorkerFailure, match="timeout after 3.5 s"):
        w.infer(batch(1))
    pings = []
    with contextlib.suppress(BlockingIOError):
        while True:
            pings.append(listener.recv(64))
    listener.close()
    assert pings.count(b"WATCHDOG=1") >= 2, pings


def test_output_tail_is_in_the_error():
    w = WorkerBackend("faulty", default_model(), target="worker_faults:Faulty", options={"fault": "abort"},
                      env={"PYTHONPATH": str(TESTS)})
    with pytest.raises(WorkerFailure, match="child output: .*faulty: aborting on call 2") as err:
        w.infer(batch(1))
    assert "faulty: aborting on call 2" in err.value.output_tail


# ---- a child that never gets going -------------------------------------------------------


def test_never_ready_times_out():
    with pytest.raises(WorkerFailure, match=r"timeout after 2 s during loading the backend"):
        WorkerBackend("never", default_model(), target="worker_faults:NeverReady", env={"PYTHONPATH": str(TESTS)},
                      ready_timeout_s=2)


def test_missing_interpreter(tmp_path):
    with pytest.raises(InputError, match=r"worker python '.*/nope/python' does not exist; expected .*Python"):
        WorkerBackend("caffe-openblas", python=tmp_path / "nope" / "python")
    with pytest.raises(InputError, match="is not an executable file"):
        WorkerBackend("caffe-openblas", python=tmp_path)


@pytest.mark.parametrize("program", ["/bin/sh", "/bin/true"])
def test_interpreter_that_is_not_python(program):
    with pytest.raises(InputError, match=rf"worker python '{program}' could not run the worker \(exited with code \d+ before saying hello"):
        WorkerBackend("caffe-openblas", python=program)


def test_missing_runtime_in_the_child_keeps_its_exit_code():
    with pytest.raises(BackendUnavailable, match="runtime 'nothing' is not importable") as err:
        WorkerBackend("unavailable", default_model(), target="worker_faults:Unavailable", env={"PYTHONPATH": str(TESTS)})
    assert err.value.exit_code == 3


# ---- restarts ------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_restarting_backend_recovers_a_killed_worker_and_counts_lost_inputs():
    clock = FakeClock()
    started = []

    def factory():
        w = faulty("kill", after=3)  # warm-up is call 1; the second infer kills the child
        started.append(w.pid)
        return w

    backend = RestartingBackend(factory, backoff_initial_s=0.5, clock=clock)
    try:
        assert backend.name == "faulty"
        np.testing.assert_allclose(backend.infer(batch(2)).probs, worker_faults.expected(batch(2)).probs, rtol=1e-6)
        with pytest.raises(InputsLost) as err:
            backend.infer(batch(3))
        assert err.value.lost_inputs == 3 and "killed by signal 9" in err.value.cause
        assert "restart in 0.5 s" in str(err.value)
        assert_gone(started[0])
        # before the back-off delay: inputs are lost at once, no restart yet
        with pytest.raises(InputsLost, match="restarting in") as err:
            backend.infer(batch(1))
        assert err.value.lost_inputs == 1 and len(started) == 1
        clock.now += 0.5
        out = backend.infer(batch(2, seed=5))  # restarted, then served
        np.testing.assert_allclose(out.embedding, worker_faults.expected(batch(2, seed=5)).embedding)
        assert len(started) == 2 and started[1] != started[0]
        assert (backend.restarts, backend.consecutive_failures) == (1, 0) and backend.backend is not None
    finally:
        backend.close()
    assert_gone(started[1])


class _Flaky:
    """A unit-test stand-in for a backend: fails on the calls listed."""

    name = "flaky"

    def __init__(self, log, fail: bool):
        self.log, self.fail = log, fail

    def infer(self, x):
        if self.fail:
            raise WorkerFailure("boom", cause="boom", lost_inputs=len(x))
        return "ok"

    def close(self):
        self.log.append("closed")


def test_a_call_that_fails_as_the_guard_stops_promises_no_restart():
    """The call a stop cut short said "restart in 0.5 s" in the guard's last error line, though a
    stopping guard restarts nothing."""
    backend = RestartingBackend(lambda: _Flaky([], fail=True), backoff_initial_s=0.5, clock=FakeClock())
    backend.interrupt()
    with pytest.raises(InputsLost) as lost:
        backend.infer(batch(1))
    assert "restart in" not in str(lost.value) and "not restarted: the guard is stopping" in str(lost.value)


def test_backoff_doubles_to_its_cap_and_resets_after_success():
    clock, log = FakeClock(), []
    plan = iter([True, True, True, True, False])  # each created backend fails or works
    backend = RestartingBackend(lambda: _Flaky(log, next(plan)), backoff_initial_s=1, backoff_max_s=3, clock=clock)
    delays = []
    for _ in range(4):
        with pytest.raises(InputsLost) as err:
            backend.infer(np.zeros((2, 1)))
        delays.append(float(re.search(r"restart in (\S+) s", str(err.value))[1]))
        clock.now += delays[-1] - 0.01
        with pytest.raises(InputsLost, match="restarting in"):  # not before the delay
            backend.infer(np.zeros((1, 1)))
        clock.now += 0.01
    assert delays == [1, 2, 3, 3] and backend.restarts == 3
    assert backend.infer(np.zeros((1, 1))) == "ok" and backend.consecutive_failures == 0 and backend.restarts == 4
    backend.backend.fail = True
    with pytest.raises(InputsLost, match=r"restart in 1 s"):  # reset by the success
        backend.infer(np.zeros((1, 1)))
    assert log.count("closed") == 5


def test_restart_errors_other_than_failures_propagate():
    clock = FakeClock()
    makes = iter([lambda: _Flaky([], True), lambda: (_ for _ in ()).throw(BackendUnavailable("runtime gone"))])
    backend = RestartingBackend(lambda: next(makes)(), backoff_initial_s=0, clock=clock)
    with pytest.raises(InputsLost):
        backend.infer(np.zeros((1, 1)))
    with pytest.raises(BackendUnavailable, match="runtime gone"):
        backend.infer(np.zeros((1, 1)))


# ---- the benchmark behind the worker ---------------------------------------------------------


def test_benchmark_runs_a_backend_behind_the_worker(tmp_path, capsys):
    from tracker.cli import main

    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    out = tmp_path / "out"
    code = main(["--config", str(config), "--benchmark", "--worker", "--backend", "caffe-openblas-dl",
                 "--batches", "1,3", "--passes", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["worker"] is True
    assert [(r["batch"], r["status"]) for r in results["rows"]] == [(1, "ok"), (3, "ok")]
    assert all(len(r["pass_ms"]) == 2 and min(r["pass_ms"]) > 0 for r in results["rows"])
    # the versions are what the worker child ran
    assert results["versions"]["runtimes"]["caffe-openblas-dl"]["worker_python"] == sys.executable


def test_a_dropped_worker_takes_its_child_with_it():
    w = faulty()
    pid = w.pid
    del w  # no close(): the finaliser kills and reaps the child
    import gc

    gc.collect()
    assert_gone(pid)


def test_a_closed_worker_dropped_later_signals_nobody(monkeypatch):
    """The finaliser of a worker closed long before sent SIGKILL to its reaped child's process
    group id again, which by then could be another's (its condition was always true)."""
    w = faulty()
    w.close()
    signalled = []
    monkeypatch.setattr(os, "killpg", lambda pgid, signum: signalled.append(pgid))
    monkeypatch.setattr(os, "kill", lambda pid, signum: signalled.append(pid))
    del w
    import gc

    gc.collect()
    assert signalled == []


def test_a_child_whose_guard_was_killed_does_not_outlive_it():
    """SIGKILL of the guard (the OOM killer, kill -9 in a terminal) while its worker's call hung:
    the child, in a session of its own, went on for the hour the call took, reparented to init."""
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, numpy as np\n"
        f"sys.path[:0] = [{str(TESTS.parent)!r}]\n"
        "from tracker.backends.worker import WorkerBackend\n"
        "from tracker.model.spec import default_model\n"
        "w = WorkerBackend('faulty', default_model(), target='worker_faults:Faulty', options={'fault': 'hang'},\n"
        f"                  env={{'PYTHONPATH': {str(TESTS)!r}}})\n"
        "print(w.pid, flush=True)\n"
        "w.infer(np.zeros((1, 1, 88, 88), np.float32))\n")], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        time.sleep(0.5)  # the call is in the child's hang
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30  # it polls its parent every second
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        parent.stdout.close()


def test_interrupted_call_leaves_no_stale_reply(tmp_path):
    marker = tmp_path / "in-batch"
    w = faulty("wait", marker=marker)

    def interrupt():
        for _ in range(600):
            if marker.exists():
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=interrupt)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        w.infer(batch(2))
    thread.join()
    assert_gone(w.pid)
    with pytest.raises(WorkerFailure, match="interrupted during a call"):
        w.infer(batch(1))
