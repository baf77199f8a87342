"""scripts/engine_timing.py: run for real at tiny settings (the engine on the face CNN, threads and
processes really started). No timing is asserted: only that every part was timed and printed,
with positive figures, in the shape its docstring gives.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert re.match(rf"dl +2:{NUMBER}ms\(rss \d+MB\)$", lines[-9])
    steps = lines[-7:]
    assert [s.split()[0] for s in steps] == ["conv1+pool1", "conv2", "pool2", "conv3", "fc1", "fc2", "prob"]
    assert all(float(re.findall(NUMBER, s)[0]) > 0 for s in steps)
    assert "gemm" in steps[4] and "(x @ W)" in steps[4]  # fc1 runs on (K, N) weights


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


def test_phases_probe_raises_instead_of_hanging_when_its_writer_dies(monkeypatch):
    """The writer cannot be pinned to a CPU that does not exist and exits at once: the probe gives
    up after PROBE_WAIT_S, with this process's CPU affinity as it was."""
    spec = importlib.util.spec_from_file_location("engine_timing", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "PROBE_WAIT_S", 0.2)
    before = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError, match="did not answer within 0.2 s"):
        script.cross_core_read_ns((1 << 20, min(before)))
    assert os.sched_getaffinity(0) == before
