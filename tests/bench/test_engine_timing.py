"""scripts/engine_timing.py: run for real at tiny settings (the engine on the face CNN, threads and
processes really started). No timing is asserted: only that every part was timed and printed,
with positive figures, in the shape its docstring gives.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "engine_timing.py"
NUMBER = r"(\d+\.\d+)"


def test_scaling_elementwise_and_layers_print_every_part():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--scaling", "--elementwise", "--layers", "--threads", "1",
                           "--modes", "dl", "--batches", "2", "--seconds", "0.05"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # --elementwise: fc1 in both weight layouts, four row counts each
    fc1 = [line for line in lines if line.startswith("fc1 (M, 6144)")]
    assert len(fc1) == 2 and "Caffe's (N, K)" in fc1[0] and "(K, N)" in fc1[1]
    assert all(len(re.findall(rf"M=\d {NUMBER} ms", line)) == 4 for line in fc1)
    # and one image from a cold cache, both layouts, one and two threads
    cold = [line for line in lines if line.startswith("fc1 of one image from a cold cache")]
    assert len(cold) == 2 and "(K, N)" in cold[0] and "(N, K) rows" in cold[1]
    assert all(len(re.findall(rf"[12] thread\(s\) {NUMBER} ms", line)) == 2 for line in cold)
    # --scaling: the one-worker baseline, then three ways with one ratio per round
    (head,) = [i for i, line in enumerate(lines) if line.startswith("two cores at batch 8 (chunks of 4)")]
    assert len(re.findall(NUMBER, lines[head].split("alone", 2)[2])) == 3
    ways = lines[head + 1 : head + 4]
    assert [w.split(":")[0].strip() for w in ways] == ["the engine's two workers", "two threads, a Net each",
                                                      "two processes, a Net each"]
    for way in ways:
        ratios = [float(r) for r in re.findall(rf"{NUMBER}x", way)]
        assert len(ratios) == 3 and all(r > 0 for r in ratios), way
    # --layers: the summary line, then one line per step of the "dl" schedule
    (summary,) = [i for i, line in enumerate(lines) if line.startswith("dl ")]
    assert re.match(rf"dl +2:{NUMBER}ms\(rss \d+MB\)$", lines[summary])
    assert lines[summary + 1] == "  dl batch 2: ms per image, by step"
    names = ["conv1+pool1", "conv2", "pool2", "conv3", "fc1", "fc2", "prob"]
    steps = lines[summary + 2 : summary + 9]
    assert [s.split()[0] for s in steps] == names
    assert all(float(re.findall(NUMBER, s)[0]) > 0 for s in steps)
    assert "gemm" in steps[4] and "(x @ W)" in steps[4]  # fc1 runs on (K, N) weights
    # then the same steps by kind of work: calls, four kinds and outside numpy
    assert re.fullmatch(rf"  dl batch 2: numpy calls per image and ms per image by kind of work \(a second run, each call's "
                        rf"timing cost of {NUMBER} us taken out\)", lines[summary + 9])
    assert lines[summary + 10].split() == ["step", "calls", "gemm", "copies", "element-wise", "other", "outside", "numpy"]
    kinds = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in lines[summary + 11 : summary + 18]}
    assert list(kinds) == names and all(len(v) == 6 for v in kinds.values())
    assert all(v[0] > 0 for v in kinds.values())  # every step calls numpy
    assert all(kinds[name][1] > 0 for name in ("conv1+pool1", "conv2", "conv3", "fc1", "fc2"))  # its GEMMs
    assert kinds["conv2"][2] > 0 and kinds["prob"][3] > 0  # conv2 copies its input; the softmax is element-wise


def test_numpy_calls_times_the_operators_calls_by_step_and_kind_and_then_lets_numpy_be():
    script = load_script("engine_timing")
    from tracker.model import layers as L
    from tracker.model import ops as O

    x = np.arange(-8, 8, dtype=np.float32).reshape(1, 1, 4, 4)
    with script.NumpyCalls() as numpy_calls:
        assert O.np is not np and L.np is not np
        numpy_calls.current.step = "relu"
        relu = L.relu(x)
        numpy_calls.current.step = "ave"  # AVE pooling reads np.multiply.outer: an attribute of a ufunc

        def on_another_thread() -> None:  # as a "dl" worker runs its steps: named on its own thread
            numpy_calls.current.step = "worker"
            L.relu(x)

        worker = threading.Thread(target=on_another_thread)
        worker.start()
        worker.join()
        ave = L.pool2d(x, L.POOL_AVE, (2, 2), (2, 2), (0, 0), (2, 2))
        seconds, calls = numpy_calls.take()
        assert script.NumpyCalls.wrapping_cost() > 0
        assert numpy_calls.take() == ({}, {})  # measuring that cost recorded nothing here
    assert O.np is np and L.np is np
    np.testing.assert_array_equal(relu, np.maximum(x, 0))
    np.testing.assert_array_equal(ave, x.reshape(2, 2, 2, 2).mean(axis=(1, 3)).reshape(1, 1, 2, 2))
    for step in ("relu", "worker"):  # np.zeros and np.maximum
        assert calls[step] == 2 and {k for s, k in seconds if s == step} == {"other", "element-wise"}
    assert calls["ave"] >= 1 and all(v > 0 for v in seconds.values())


def test_phases_print_a_round_of_cross_core_reads_and_both_thread_counts():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--phases", "0", "--modes", "caffe", "--batches", "1", "--seconds", "0.05"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    head, round_line, summary = proc.stdout.splitlines()
    assert head.startswith("phases: CPU ") and "256 KB" in head
    match = re.fullmatch(rf"  \d\d:\d\d:\d\d read {NUMBER} against {NUMBER} ns \({NUMBER}x\); "
                         rf"caffe {NUMBER} ms on 2 threads, {NUMBER} on 1 \({NUMBER}x\); dl {NUMBER} on 2 workers", round_line)
    assert match and all(float(v) > 0 for v in match.groups()), round_line
    assert re.match(rf"caffe +1:{NUMBER}ms", summary)


def test_phases_on_one_cpu_is_a_clear_usage_error():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--phases", "1"], capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith("--phases: needs two CPUs; this process may run on 1")


def process_state(pid: int) -> str:
    """The one-letter state of process pid from /proc ("R" running, "S" asleep, "Z" exited and
    not yet reaped), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def wait_for_state(pid: int, states: set[str], seconds: float = 10.0) -> str:
    """Poll pid's state until it is one of `states` or `seconds` have passed; the last state read."""
    deadline = time.monotonic() + seconds
    while (state := process_state(pid)) not in states and time.monotonic() < deadline:
        time.sleep(0.05)
    return state


def test_phases_probe_raises_instead_of_hanging_when_its_writer_dies(monkeypatch):
    """The writer cannot be pinned to a CPU that does not exist and exits at once: the probe gives
    up (at the latest after PROBE_WAIT_S), with this process's CPU affinity as it was."""
    script = load_script("engine_timing")
    monkeypatch.setattr(script, "PROBE_WAIT_S", 0.2)
    before = os.sched_getaffinity(0)
    with script.CrossCoreProbe((1 << 20, min(before))) as probe, \
            pytest.raises(RuntimeError, match=f"the writer process on CPU {1 << 20} did not answer"):
        probe.read_ns()
    assert os.sched_getaffinity(0) == before


def test_phases_probe_writer_sleeps_between_probes_and_serves_each():
    """One writer serves every probe, and between probes it is asleep on its pipe, not spinning:
    the passes timed between probes have both cores."""
    script = load_script("engine_timing")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    with script.CrossCoreProbe((cpus[0], cpus[-1])) as probe:
        for _ in range(2):
            other, own = probe.read_ns()
            assert other > 0 and own > 0
            # "S" and nothing else, for a while: a writer spinning for its turn would read "R"
            assert wait_for_state(probe.pid, {"S"}) == "S"
            for _ in range(20):
                time.sleep(0.01)
                assert process_state(probe.pid) == "S"
        pid = probe.pid
    assert process_state(pid) == "gone"  # closed: killed and reaped


def test_phases_probe_writer_leaves_when_its_reader_is_killed(tmp_path):
    """Killed between probes, the reader leaves no writer behind: the writer reads the end of its
    pipe and exits (reaped by init, or a zombie where nothing reaps it). The reader's output goes
    to a file: the writer's inherited copy of a pipe would hold `subprocess.run` until it left."""
    code = ("import os, signal, sys; sys.path.insert(0, sys.argv[1]); import engine_timing as et; "
            "cpus = sorted(os.sched_getaffinity(0))[:2]; probe = et.CrossCoreProbe((cpus[0], cpus[-1])); "
            "probe.read_ns(); print(probe.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    out = tmp_path / "reader.out"
    with out.open("w") as stdout:
        proc = subprocess.run([sys.executable, "-c", code, str(SCRIPT.parent)], stdout=stdout, stderr=subprocess.STDOUT,
                              timeout=300)
    assert proc.returncode == -signal.SIGKILL, out.read_text()
    writer = int(out.read_text().split()[0])
    # sooner than PROBE_WAIT_S, after which a writer spinning for its turn would leave anyway
    assert wait_for_state(writer, {"gone", "Z"}, seconds=load_script("engine_timing").PROBE_WAIT_S / 2) in {"gone", "Z"}


@pytest.mark.parametrize("args, message", [
    (["--batches", "x"], "argument --batches: bad value 'x'; expected comma-separated batch sizes from 1 to 256, e.g. 1,2,4,8"),
    (["--batches", "0"], "argument --batches: bad value '0'; expected comma-separated batch sizes from 1 to 256, e.g. 1,2,4,8"),
    (["--batches", "100000"], "argument --batches: bad value '100000'; expected comma-separated batch sizes from 1 to 256, e.g. 1,2,4,8"),
    (["--modes", "bogus"], "--modes: unknown engine mode 'bogus'; expected a comma list of caffe, dl, or all"),
    (["--threads", "0"], "argument --threads: bad value '0'; expected an integer >= 1"),
    (["--workspace-mb", "-5"], "argument --workspace-mb: bad value '-5'; expected a number of MB > 0 and <= 4096"),
    (["--seconds", "nan"], "argument --seconds: bad value 'nan'; expected a number > 0"),
])
def test_bad_argument_is_one_line_and_exit_2_before_any_timing(args, message, capsys):
    script = load_script("engine_timing")
    assert script.main([*args, "--gemms"]) == 2  # --gemms: minutes of work, never started
    out, err = capsys.readouterr()
    assert out == "" and err == f"engine_timing.py: {message}\n"


def test_unknown_against_backend_is_refused_before_any_timing(capsys):
    script = load_script("engine_timing")
    assert script.main(["--against", "bogus", "--gemms"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("engine_timing.py: argument --against: unknown backend 'bogus'; expected one of ")
    assert "onnxruntime" in err and err.count("\n") == 1
