"""`tracker --benchmark` and `tracker --list-backends`, end to end through tracker.cli.main.

The benchmark tests run the real caffe backends at small settings. The failure tests register
test-only backends (defined at the bottom of this file, imported by the benchmark's child through
PYTHONPATH) that fail for real inside the child: a segmentation fault, SIGKILL, a hang; and the
real caffe-openblas fails with a MemoryError under the child's address-space limit. The benchmark
must report each cell with its cause and go on. No timing is asserted: only that timings exist, are positive and consistent.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tracker import backends
from tracker.backends.base import BackendBase
from tracker.bench import command as bench_command
from tracker.cli import main
from tracker.errors import BackendUnavailable
from tracker.machine import machine_key
from tracker.types import Inference

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[1]
FACE_CNN_MACS = 49_371_200  # docs/ARCHITECTURE.md section 1 (98.7 MFLOP: two per multiply-add)
REAL = ["caffe-openblas", "caffe-openblas-dl"]


# ---- helpers -----------------------------------------------------------------------------


@pytest.fixture
def state_dir(tmp_path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def config_file(tmp_path, state_dir) -> Path:
    path = tmp_path / "tracker.yaml"
    path.write_text(f"state_dir: {state_dir}\n")
    return path


@pytest.fixture
def test_backends(monkeypatch):
    """Register the test-only backends below, and let the benchmark's children import them."""
    for name, cls in TEST_BACKENDS.items():
        monkeypatch.setitem(backends.REGISTRY, name, backends.Entry(f"test_bench:{cls}", "testextra"))
    paths = [str(TESTS), str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.fixture
def load(monkeypatch):
    """Sets the 1-minute load average the benchmark sees (tracker.bench.command's readings):
    whether a run may write auto's profile depends on it, and a test machine's own load varies."""

    def set_load(one_minute: float) -> None:
        monkeypatch.setattr(bench_command, "load_average", lambda: [one_minute, one_minute, one_minute])

    return set_load


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def bench(capsys, config_file, out, *argv) -> tuple[int, str, str]:
    """`tracker --benchmark`; one warm-up pass per cell unless argv sets --warmup (the suite's time)."""
    warmup = () if "--warmup" in argv else ("--warmup", "0")
    return run_cli(capsys, "--config", config_file, "--benchmark", "--out", out, *warmup, *argv)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def rows_of(doc: dict, label: str) -> list[dict]:
    return [r for r in doc["rows"] if r["label"] == label]


# ---- the benchmark -------------------------------------------------------------------------


def test_benchmark_writes_table_json_csv_plots_and_profile(capsys, config_file, state_dir, tmp_path, load):
    load(0.5)
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", ",".join(REAL), "--batches", "2,1", "--passes", "3")
    assert code == 0, stderr

    # The table: batch sizes as rows, backends as columns, a per-image time in every cell.
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["batch"])
    assert lines[header].split() == ["batch", *REAL]
    for offset, batch in enumerate([1, 2], start=1):
        cells = lines[header + offset].split()
        assert cells[0] == str(batch) and len(cells) == 3
        assert all(float(c) > 0 for c in cells[1:])
    # ... then the same table of medians
    medians = next(i for i, line in enumerate(lines) if line.startswith("Per-image forward time (ms), median"))
    assert lines[medians + 1].split() == ["batch", *REAL]
    assert [lines[medians + 1 + k].split()[0] for k in (1, 2)] == ["1", "2"]

    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == 1 and doc["complete"] is True
    machine = doc["machine"]
    assert isinstance(machine["cpu"], str) and machine["cpu"]
    assert isinstance(machine["cores"], int) and machine["cores"] >= 1
    assert isinstance(machine["arch"], str) and machine["arch"]
    assert machine["blas"]["name"] and machine["blas"]["version"]
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT")  # the command set it (tracker.blas_idle)
    assert machine["blas"]["idle_poll_log2_ticks"] == (int(timeout) if timeout else None)
    assert machine["sgemm_peak_gflops"] > 0
    assert len(machine["load_average"]["start"]) == len(machine["load_average"]["end"]) == 3
    assert doc["versions"]["python"] == sys.version.split()[0]
    assert doc["versions"]["numpy"] == np.__version__
    assert set(doc["versions"]["runtimes"]) == set(REAL)
    settings = doc["settings"]
    assert settings["batches"] == [1, 2] and settings["passes"] == 3
    assert settings["model"]["macs_per_image"] == FACE_CNN_MACS
    assert settings["model"]["input_shape"] == [1, 88, 88]
    assert doc["unavailable"] == {}

    assert len(doc["rows"]) == 4
    for row in doc["rows"]:
        assert row["status"] == "ok" and row["precision"] == "fp32" and row["error"] is None
        assert len(row["pass_ms"]) == 3 and all(t > 0 for t in row["pass_ms"])
        mean_ms = sum(row["pass_ms"]) / 3
        assert row["ms_per_image"] == pytest.approx(mean_ms / row["batch"], rel=1e-6)
        assert row["median_ms_per_image"] == pytest.approx(np.median(row["pass_ms"]) / row["batch"], rel=1e-5)
        assert row["images_per_s"] == pytest.approx(1000 * row["batch"] / mean_ms, rel=1e-6)
        assert min(row["pass_ms"]) <= row["p50_ms"] <= row["p95_ms"] <= max(row["pass_ms"])
        gflops = 2 * FACE_CNN_MACS * row["batch"] / (mean_ms / 1e3) / 1e9
        assert row["gflops"] == pytest.approx(gflops, rel=1e-6)
        assert row["peak_fraction"] == pytest.approx(gflops / machine["sgemm_peak_gflops"], rel=1e-6)
        # numpy alone is ~25 MB resident; the model's weights are 4 MB more
        assert 20 < row["peak_rss_mb"] < 4000
        assert row["rss_processes"] == 1 and row["rss_method"] == "vmhwm-reset-after-load"
        assert row["load_s"] > 0
    assert [(r["label"], r["batch"]) for r in doc["rows"]] == [(b, n) for b in REAL for n in (1, 2)]

    with open(out / "results.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert [(r["backend"], int(r["batch"]), r["status"]) for r in csv_rows] == [(b, n, "ok") for b in REAL for n in (1, 2)]
    for r, j in zip(csv_rows, doc["rows"]):
        assert float(r["ms_per_image"]) == pytest.approx(j["ms_per_image"])
        assert float(r["peak_rss_mb"]) == pytest.approx(j["peak_rss_mb"])

    for name in ("per_image_ms_linear.png", "per_image_ms_log.png"):
        assert png_size(out / name) == (1000, 550)
        assert (out / name).stat().st_size > 10_000  # axes, two lines and a legend, not a blank image

    profile = json.loads((state_dir / "profile.json").read_text())
    assert profile["schema"] == 1
    assert profile["machine"] == {k: machine[k] for k in ("cpu", "cores", "arch")}
    assert {(e["backend"], e["precision"], e["batch"]) for e in profile["results"]} == {(b, "fp32", n) for b in REAL for n in (1, 2)}
    assert [(e["precision"], e["batch"]) for e in profile["picks"]] == [("fp32", 1), ("fp32", 2)]
    # each entry is its runoff's median rescaled (the runoff tests below), or its cell's where the runoff failed
    from tracker.bench.runoff import profile_medians

    ran_off = {(name, r["batch"]): ms for r in doc["runoffs"] if "error" not in r
               for name, ms in profile_medians(r["ms_per_image"], r["cell_median_ms_per_image"]).items()}
    for entry in profile["results"]:
        (row,) = [r for r in doc["rows"] if (r["backend"], r["batch"]) == (entry["backend"], entry["batch"])]
        assert entry["ms_per_image"] == ran_off.get((row["backend"], row["batch"]), row["median_ms_per_image"])
    assert "auto would pick (profile" in stdout


def test_the_fastest_cells_run_off_interleaved_and_the_profile_takes_their_medians(capsys, config_file, state_dir, tmp_path,
                                                                                   load, monkeypatch):
    """Both batch sizes have a runoff of the two real engines, each in a child of its own; `auto`,
    named first, still runs after them."""
    from tracker.bench import runoff

    load(0.5)
    monkeypatch.setattr(runoff, "ROUNDS", 3)
    monkeypatch.setattr(runoff, "SECONDS_PER_ROUND", 0.02)
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", ",".join(["auto", *REAL]), "--precision", "fp32", "--batches", "1,2",
                                 "--passes", "2")
    assert code == 0, stderr
    doc = json.loads((out / "results.json").read_text())
    assert [(r["backend"], r["batch"]) for r in doc["rows"]] == [(b, n) for b in [*REAL, "auto"] for n in (1, 2)]
    assert [(r["precision"], r["batch"]) for r in doc["runoffs"]] == [("fp32", 1), ("fp32", 2)]
    profile = {(e["backend"], e["batch"]): e["ms_per_image"] for e in json.loads((state_dir / "profile.json").read_text())["results"]}
    for entry in doc["runoffs"]:
        cells = {r["backend"]: r["median_ms_per_image"] for r in doc["rows"] if r["batch"] == entry["batch"] and r["backend"] != "auto"}
        assert entry["backends"] == sorted(cells, key=cells.get)  # fastest cell first
        assert entry["cell_median_ms_per_image"] == cells
        assert (entry["rounds"], entry["seconds_per_round"]) == (3, 0.02)
        assert set(entry["ms_per_image"]) == set(REAL) and all(ms > 0 for ms in entry["ms_per_image"].values())
        assert all(calls >= 3 for calls in entry["calls"].values())  # at least one call per round
        # the profile: the runoff's ratios at the level (geometric mean) of the candidates' cells
        ran, got = entry["ms_per_image"], {name: profile[(name, entry["batch"])] for name in entry["ms_per_image"]}
        first = entry["backends"][0]
        assert all(got[n] / got[first] == pytest.approx(ran[n] / ran[first]) for n in ran)
        assert math.prod(got.values()) == pytest.approx(math.prod(cells[n] for n in got))
        assert f"runoff fp32 batch {entry['batch']}: " in stderr
    assert "runoffs: the fastest cells' backends timed again, interleaved in one process" in stdout
    assert ("auto", 1) not in profile  # auto's own time is never a candidate


def test_all_on_a_fresh_machine_runs_auto_on_the_profile_it_writes_first(capsys, config_file, state_dir, tmp_path, load,
                                                                          monkeypatch):
    """`auto`'s columns run after the profile is written: a first `--backend all` left auto out
    ("no calibration profile yet"), as only a run that writes no profile must."""
    monkeypatch.setattr(bench_command, "REGISTRY", {name: backends.REGISTRY[name] for name in ("caffe-openblas-dl", "auto")})
    argv = ("--backend", "all", "--precision", "fp32", "--batches", "1", "--passes", "1")
    load(0.5)
    code, stdout, stderr = bench(capsys, config_file, tmp_path / "out", *argv)
    assert code == 0, stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(r["backend"], r["status"]) for r in doc["rows"]] == [("caffe-openblas-dl", "ok"), ("auto", "ok")]
    assert doc["unavailable"] == {}
    (state_dir / "profile.json").unlink()
    load(9.0)  # busy: the run writes no profile, and auto would time its default
    code, stdout, stderr = bench(capsys, config_file, tmp_path / "busy", *argv)
    assert code == 0, stderr
    doc = json.loads((tmp_path / "busy" / "results.json").read_text())
    assert [r["backend"] for r in doc["rows"]] == ["caffe-openblas-dl"]
    assert doc["unavailable"] == {"auto": f"no calibration profile at {state_dir / 'profile.json'}, and this run writes none"}


def test_a_runoff_that_fails_leaves_the_cells_medians_in_the_profile(capsys, config_file, state_dir, tmp_path, test_backends,
                                                                      load, monkeypatch):
    """test-segfault-late passes its cell (3 calls) and faults in the runoff's first round."""
    from tracker.bench import runoff

    load(0.5)
    monkeypatch.setattr(runoff, "ROUNDS", 3)
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-segfault-late,test-sigkill", "--batches", "1",
                                 "--passes", "2")
    assert code == 0, stderr
    doc = json.loads((out / "results.json").read_text())
    (entry,) = doc["runoffs"]
    assert entry["error"] == "killed by signal 11 (SIGSEGV) during round 1/3"
    assert "ms_per_image" not in entry
    assert "failed: killed by signal 11 (SIGSEGV) during round 1/3; the profile keeps their cells' medians" in stdout
    profile = {e["backend"]: e["ms_per_image"] for e in json.loads((state_dir / "profile.json").read_text())["results"]}
    assert profile == {r["backend"]: r["median_ms_per_image"] for r in doc["rows"]}


def _row(backend, batch, ms, precision="fp32", rss=50.0, status="ok"):
    return {"backend": backend, "precision": precision, "batch": batch, "status": status, "median_ms_per_image": ms,
            "peak_rss_mb": rss}


def test_a_runoff_ranks_its_candidates_at_their_cells_level():
    from tracker.bench.runoff import profile_medians

    # fp32 batch 64 on the EPYC VM: the runoff ran in a slow phase (0.96-1.29 ms against cells of
    # 0.50-0.79); caffe-openblas-dl (cell 0.822) did not run off and must not overtake all four
    cells = {"onnxruntime": 0.497, "tf-vanilla": 0.563, "mxnet-openblas-dl": 0.791, "tf-neon-vfpv4": 0.788}
    ran = {"onnxruntime": 0.959, "tf-vanilla": 1.018, "mxnet-openblas-dl": 1.018, "tf-neon-vfpv4": 1.294}
    got = profile_medians(ran, cells)
    assert sorted(got, key=got.get) == sorted(ran, key=ran.get) and max(got.values()) < 0.822
    assert math.prod(got.values()) == pytest.approx(math.prod(cells.values()))


def test_runoff_plan_takes_the_fastest_cells_that_fit_in_memory():
    from tracker.bench.runoff import MAX_CANDIDATES, Runoff, plan_runoffs

    assert MAX_CANDIDATES == 4
    rows = [
        # batch 1: however far behind, a second backend runs off; auto and failed cells are no candidates
        _row("a", 1, 1.0), _row("b", 1, 9.0), _row("auto", 1, 0.5), _row("d", 1, None, status="failed"),
        # batch 8: five, the slowest left out
        _row("a", 8, 1.0), _row("b", 8, 1.1), _row("c", 8, 1.2), _row("d", 8, 1.3), _row("e", 8, 1.4),
        # batch 64: one candidate, no runoff
        _row("a", 64, 1.0),
        # int8 apart from fp32
        _row("a", 1, 0.5, "int8"), _row("b", 1, 0.4, "int8"),
    ]
    assert plan_runoffs(rows, None) == [
        Runoff("fp32", 1, ("a", "b")), Runoff("fp32", 8, ("a", "b", "c", "d")), Runoff("int8", 1, ("b", "a")),
    ]
    # Memory: the fastest first, as many as fit; none when the fastest two do not fit together.
    heavy = [_row("a", 8, 1.0, rss=300), _row("b", 8, 1.1, rss=300), _row("c", 8, 1.2, rss=100)]
    assert plan_runoffs(heavy, 700) == [Runoff("fp32", 8, ("a", "b", "c"))]
    assert plan_runoffs(heavy, 650) == [Runoff("fp32", 8, ("a", "b"))]
    assert plan_runoffs(heavy, 599) == []


def test_peak_rss_behind_the_worker_counts_the_worker_process_too(capsys, config_file, tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "caffe-openblas-dl", "--batches", "1", "--passes", "1", "--worker")
    assert code == 0, stderr
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["status"] == "ok" and row["rss_processes"] == 2
    # two interpreters with numpy and the model each: more than the ~25 MB numpy alone takes in one
    assert row["peak_rss_mb"] > 50


def test_cells_warm_up_for_the_seconds_asked_before_their_timed_passes(capsys, config_file, tmp_path, test_backends):
    # test-segfault runs at batch 1 (a matmul of microseconds a pass): 0.3 s is many passes
    for warmup, passes_seen in (("0.3", lambda n: n > 1), ("0", lambda n: n == 1)):
        out = tmp_path / f"out-{warmup}"
        code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-segfault", "--batches", "1",
                                     "--passes", "2", "--warmup", warmup)
        assert code == 0, stderr
        doc = json.loads((out / "results.json").read_text())
        assert doc["settings"]["warmup_s"] == float(warmup)
        (row,) = doc["rows"]
        assert passes_seen(row["warmup_passes"]) and len(row["pass_ms"]) == 2, row["warmup_passes"]
        assert f"mean of 2 passes after the warm-up (one pass, then {float(warmup):g} s more), on" in stdout


def test_a_backend_that_loads_on_its_first_call_still_warms_up_for_the_seconds_asked(capsys, config_file, tmp_path,
                                                                                     test_backends):
    """`auto` creates its engine in its first call: the warm-up's seconds counted from before that
    call were spent loading, and the cell was timed after one pass."""
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-lazy", "--batches", "1", "--passes", "2",
                                 "--warmup", "0.2")
    assert code == 0, stderr
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["status"] == "ok" and row["warmup_passes"] > 1, row
    assert row["load_s"] >= 0.5, row  # its load is in its first call (it read the constructor's time alone)


def test_a_warm_up_longer_than_the_timeout_is_no_hang(capsys, config_file, tmp_path, test_backends):
    """The child reports progress while it warms up, as it does while it times passes."""
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-segfault", "--batches", "1",
                                 "--passes", "2", "--warmup", "3", "--timeout", "1")
    assert code == 0, stderr
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["status"] == "ok" and row["warmup_passes"] > 1, row


def test_a_runoff_whose_backends_fail_to_close_keeps_its_timings(capsys, config_file, state_dir, tmp_path, test_backends,
                                                                 load, monkeypatch):
    """The runoff's result is sent before the candidates are closed: a close that raises voids
    nothing, as for a cell."""
    from tracker.bench import runoff

    load(0.5)
    monkeypatch.setattr(runoff, "ROUNDS", 3)
    monkeypatch.setattr(runoff, "SECONDS_PER_ROUND", 0.02)
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-close-raises,test-int8", "--precision",
                                 "fp32", "--batches", "1", "--passes", "2")
    assert code == 0, stderr
    (entry,) = json.loads((out / "results.json").read_text())["runoffs"]
    assert "error" not in entry and set(entry["ms_per_image"]) == {"test-close-raises", "test-int8"}, entry


def test_failed_cells_are_reported_with_their_cause_and_the_run_goes_on(capsys, config_file, state_dir, tmp_path, test_backends,
                                                                        load):
    load(0.5)
    out = tmp_path / "out"
    names = ["test-segfault", "test-sigkill"]
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", ",".join(names), "--batches", "1,4", "--passes", "2")
    assert code == 0, stderr
    doc = json.loads((out / "results.json").read_text())
    cells = {(r["label"], r["batch"]): r for r in doc["rows"]}
    assert len(cells) == 4
    for name in names:
        assert cells[(name, 1)]["status"] == "ok"  # batch 1 works; each fails from batch 4 on
        assert cells[(name, 4)]["status"] == "failed"
        assert cells[(name, 4)]["ms_per_image"] is None and cells[(name, 4)]["pass_ms"] == []
    assert cells[("test-segfault", 4)]["error"] == "killed by signal 11 (SIGSEGV) during the warm-up passes"
    assert cells[("test-sigkill", 4)]["error"] == "killed by signal 9 (out of memory?) during the warm-up passes"
    # The child's last words come with the cause; the peak RSS it reached is kept.
    assert "about to fault" in cells[("test-segfault", 4)]["error_detail"]
    assert cells[("test-sigkill", 4)]["peak_rss_mb"] > 0
    # Table cells carry the short reason, the notes the whole cause.
    table, notes = stdout.split("failed cells:")
    assert "failed: signal 11 (SIGSEGV)" in table and "failed: signal 9 (OOM?)" in table
    assert "test-segfault at batch 4: killed by signal 11 (SIGSEGV) during the warm-up passes; output: about to fault" in notes
    # A failed cell is no candidate for auto.
    profile = json.loads((state_dir / "profile.json").read_text())
    assert {(e["backend"], e["batch"]) for e in profile["results"]} == {(n, 1) for n in names}


def test_a_busy_machine_writes_no_profile_unless_told_to(capsys, config_file, state_dir, tmp_path, load):
    load(machine_key()["cores"] + 0.5)
    argv = ("--backend", "caffe-openblas-dl", "--batches", "1", "--passes", "1")
    code, stdout, stderr = bench(capsys, config_file, tmp_path / "out", *argv)
    assert code == 0, stderr
    assert f"not writing the calibration profile {state_dir / 'profile.json'}: the 1-minute load average was" in stderr
    assert "--profile-when-busy" in stderr and "warning: the machine was busy" in stdout
    assert not (state_dir / "profile.json").exists()
    assert json.loads((tmp_path / "out" / "results.json").read_text())["settings"]["profile"] is None

    code, stdout, stderr = bench(capsys, config_file, tmp_path / "out", *argv, "--profile-when-busy")
    assert code == 0, stderr
    assert [e["backend"] for e in json.loads((state_dir / "profile.json").read_text())["results"]] == ["caffe-openblas-dl"]


def test_memory_limit_too_small_for_batch_256_is_a_failed_cell_with_its_cause(capsys, tmp_path, monkeypatch):
    """The study's failure on a small Pi, for real: caffe-openblas under a 120 MB memory limit runs
    batch 1 (~50 MB RSS) and fails batch 256 (~190 MB: its conv1 output alone is 105 MiB). In a
    memory cgroup (tracker.bench.memory_cap) the kernel's OOM killer ends the cell; under the
    RLIMIT_AS fallback numpy's allocation fails with MemoryError."""
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nbackend:\n  threads: 1\n")
    # one BLAS thread: OpenBLAS reserves address space per thread, which would make an RLIMIT_AS
    # limit depend on the core count
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config, out, "--backend", "caffe-openblas", "--batches", "1,256", "--passes", "1", "--memory-limit", "120")
    assert code == 0, stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["settings"]["memory_limit_mb"] == 120
    ok, failed = doc["rows"]
    assert (ok["batch"], ok["status"]) == (1, "ok")
    assert (failed["batch"], failed["status"]) == (256, "failed")
    if doc["settings"]["memory_limit_method"].startswith("cgroup"):
        assert failed["reason"] == "signal 9 (OOM?)"
        assert failed["error"].startswith("killed by signal 9") and "during the warm-up passes" in failed["error"]
        assert "out of memory: the OOM killer ended a process of this cell" in failed["error"]
    else:
        assert doc["settings"]["memory_limit_method"] == "rlimit-as" and failed["reason"] == "MemoryError"
        assert failed["error"].startswith("MemoryError: Unable to allocate") and failed["error"].endswith("during the warm-up passes")
    assert f"failed: {failed['reason']}" in stdout
    assert not (tmp_path / "state" / "profile.json").exists()  # an emulated device is not this machine
    assert "not writing the calibration profile" in stderr and "--memory-limit emulates a smaller device" in stderr


def test_a_hanging_cell_times_out_and_its_child_is_killed(capsys, config_file, tmp_path, test_backends):
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-hang", "--batches", "4,1", "--passes", "2", "--timeout", "5")
    assert code == 0, stderr
    doc = json.loads((out / "results.json").read_text())
    assert [(r["batch"], r["status"]) for r in doc["rows"]] == [(1, "ok"), (4, "failed")]
    assert doc["rows"][1]["error"] == "timeout after 5 s without progress during the warm-up passes"
    assert "failed: timeout 5 s" in stdout


def test_a_child_that_answers_and_exits_within_one_wait_is_heard(exit_within_one_wait):
    """What a child wrote just before it exited is read, though its exit is noticed first (a
    cell of the web page's benchmark test lost its result this way on a loaded machine)."""
    from tracker.bench import runner

    waited = exit_within_one_wait(runner)
    probes = runner.probe_backends([("caffe-openblas-dl", list(backends.REGISTRY["caffe-openblas-dl"]))])
    assert waited, "the child's exit was never waited for: the race did not run"
    assert probes["caffe-openblas-dl"].available, probes


def benchmark_process(config_file, out, backend_class: str, batches: str, **env: str) -> subprocess.Popen:
    """`tracker --benchmark` of the test-only backend `backend_class` of this file (registered as
    "test-backend"), 2 passes a cell, in a process of its own: the signals sent to it must not
    reach pytest."""
    code = (
        "import sys; from tracker import backends; "
        f"backends.REGISTRY['test-backend'] = backends.Entry('test_bench:{backend_class}', None); "
        "from tracker.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, "--config", str(config_file), "--benchmark", "--backend", "test-backend",
         "--batches", batches, "--passes", "2", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)]), **env},
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_keeps_and_prints_what_was_measured(tmp_path, config_file, signum):
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP to the benchmark while a cell hangs: the cell's child
    dies, the finished cells are printed and stay in results.json, exit 130. (SIGTERM used to end
    the benchmark at once and leave the cell's child running.)"""
    out = tmp_path / "out"
    proc = benchmark_process(config_file, out, "HangsFromBatch4", "1,4")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out / "results.json").exists():
            time.sleep(0.1)  # the first cell is recorded; the second one then hangs
        assert (out / "results.json").exists(), proc.stderr.read() if proc.poll() is not None else "no results.json"
        time.sleep(0.5)
        children = _children(proc.pid)
        assert children, "the hanging cell's child"
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
        assert not [pid for pid in children if os.path.exists(f"/proc/{pid}")], "the cell's child outlived the benchmark"
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False
    assert [(r["batch"], r["status"]) for r in doc["rows"]] == [(1, "ok")]
    assert (out / "per_image_ms_linear.png").exists()


def test_a_cell_measured_before_the_run_is_stopped_is_kept(tmp_path, config_file):
    """SIGTERM while the cell's child closes its backend (a runtime can take seconds): the child
    had sent its timings, and they are recorded before the run stops."""
    out, closing = tmp_path / "out", tmp_path / "closing"
    proc = benchmark_process(config_file, out, "HangsInClose", "1,2", TRACKER_TEST_CLOSING=str(closing))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not closing.exists() and proc.poll() is None:
            time.sleep(0.05)
        assert closing.exists(), proc.stderr.read() if proc.poll() is not None else "the backend never closed"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False and [(r["batch"], r["status"]) for r in doc["rows"]] == [(1, "ok")]


def test_a_run_stopped_before_its_first_cell_ended_writes_nothing(tmp_path, config_file, state_dir):
    """An earlier run's files in --out, and the web page's pointer to that run, stay as they were
    (they were replaced by an empty run's)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"earlier": true}')
    state_dir.mkdir()
    (state_dir / "benchmark.json").write_text('{"out": "an earlier run"}')
    proc = benchmark_process(config_file, out, "HangsFromBatch4", "4")  # the first cell hangs
    try:
        for line in proc.stderr:  # the children before it probe the backends
            if "measuring this machine's sgemm peak" in line:
                break
        # Until the hanging cell's child runs: the run is measuring then. (Any child was not enough:
        # `uname -p`, which platform.platform() runs for results.json's machine, is one, and once in
        # a suite run the SIGTERM came then, before the run takes it as Ctrl-C: exit -15.)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _jobs(proc.pid, "cell") and proc.poll() is None:
            time.sleep(0.1)
        assert _jobs(proc.pid, "cell"), proc.stderr.read() if proc.poll() is not None else "no cell started"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "stopped before any cell was measured; nothing written" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in out.iterdir()) == ["results.json"] and (out / "results.json").read_text() == '{"earlier": true}'
    assert (state_dir / "benchmark.json").read_text() == '{"out": "an earlier run"}'


def test_a_blob_the_config_names_that_is_not_in_the_net_is_refused_before_measuring(capsys, tmp_path, state_dir):
    """Every cell failed on it, the run exited 0, and the profile lost the backend's entries."""
    config = tmp_path / "bad.yaml"
    config.write_text(f"state_dir: {state_dir}\nmodel: {{probs: nope}}\n")
    code, stdout, stderr = bench(capsys, config, tmp_path / "out", "--backend", "caffe-openblas-dl", "--batches", "1")
    assert code == 2 and stderr.count("\n") == 1 and not (tmp_path / "out" / "results.json").exists()
    assert "config: key 'model.probs': blob 'nope' is not in the net" in stderr and "expected one of data, conv1" in stderr
    code, _, stderr = run_cli(capsys, "--config", config, "--check-config")  # the guard's check says so too
    assert code == 2 and "config: key 'model.probs': blob 'nope'" in stderr


def test_with_the_detectors_the_backends_request_is_checked_before_anything_is_measured(capsys, config_file, tmp_path):
    code, _, stderr = bench(capsys, config_file, tmp_path / "out", "--detectors", "haar", "--backend",
                            "caffe-openblas-dl", "--precision", "int8", "--batches", "1")
    assert code == 2 and "--precision: backend 'caffe-openblas-dl' has no 'int8' model" in stderr
    assert not (tmp_path / "out" / "detectors.json").exists()  # the detectors' 4 rows and budget were measured first


def test_the_load_at_the_start_is_read_before_the_detectors_load_the_machine(capsys, config_file, state_dir, tmp_path,
                                                                            monkeypatch):
    """It was read after the detectors' benchmark had run, so the command's own work counted as
    the machine being busy, and could keep the profile from being written."""
    import tracker.bench.detectors as detectors

    ran: list[str] = []
    monkeypatch.setattr(detectors, "run_detector_benchmark", lambda *args: ran.append("detectors") or 0)
    monkeypatch.setattr(bench_command, "load_average", lambda: [9.0] * 3 if ran else [0.5] * 3)
    code, _, stderr = bench(capsys, config_file, tmp_path / "out", "--detectors", "haar", "--backend",
                            "caffe-openblas-dl", "--batches", "1", "--passes", "1")
    assert code == 0 and ran == ["detectors"], stderr
    load = json.loads((tmp_path / "out" / "results.json").read_text())["machine"]["load_average"]
    assert load == {"start": [0.5] * 3, "end": [9.0] * 3}
    assert (state_dir / "profile.json").exists() and "not writing the calibration profile" not in stderr


def test_a_ctrl_c_while_the_profile_is_written_keeps_the_cell_in_it(capsys, config_file, state_dir, tmp_path,
                                                                    monkeypatch, load):
    """The interrupt stopped the write: the cell measured was in results.json but not in the
    profile, and the interrupted run never wrote the profile again."""
    load(0.5)
    write = bench_command.update_profile

    def interrupted_write(*args):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the write begins
        return write(*args)

    monkeypatch.setattr(bench_command, "update_profile", interrupted_write)
    code, _, stderr = bench(capsys, config_file, tmp_path / "out", "--backend", "caffe-openblas-dl", "--batches", "1,2",
                            "--passes", "1")
    assert code == 130, stderr
    profile = json.loads((state_dir / "profile.json").read_text())
    assert [(r["backend"], r["batch"]) for r in profile["results"]] == [("caffe-openblas-dl", 1)]


def test_empty_option_values_are_refused_not_taken_for_options_left_out(capsys, config_file, tmp_path):
    for option in ("--backend", "--detectors"):
        code, _, stderr = bench(capsys, config_file, tmp_path / "out", option, "")
        assert code == 2 and f"argument {option}: bad value ''; expected" in stderr and stderr.count("\n") == 1
    code, _, stderr = run_cli(capsys, "--config", config_file, "--source", " ", "--frames", "1")
    assert code == 2 and "argument --source: bad value ' '; expected a source" in stderr


def test_each_column_loads_once_before_its_cells_so_no_cell_counts_the_converters_memory(tmp_path, config_file):
    """A backend that converts its model when it loads (LiteRT int8 imports TensorFlow for it) left
    that memory resident in the first cell: 764 MB of peak RSS against 71 MB with the cache warm."""
    out, loads = tmp_path / "out", tmp_path / "loads"
    proc = benchmark_process(config_file, out, "CountsLoads", "1,2", TRACKER_TEST_LOADS=str(loads))
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    records = [line.split() for line in loads.read_text().splitlines()]
    assert [passes for _, passes in records][0] == "0" and all(int(p) > 0 for _, p in records[1:])  # priming: no pass
    assert len(records) == 3 and len({pid for pid, _ in records}) == 3  # a process each: priming, batch 1, batch 2
    assert [(r["batch"], r["status"]) for r in json.loads((out / "results.json").read_text())["rows"]] == [(1, "ok"), (2, "ok")]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def _jobs(pid: int, mode: str) -> list[int]:
    """The children of `pid` that run a job of `mode` ("cell", "probe": their job, JSON in their
    argv, says so)."""
    found = []
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if f'"mode": "{mode}"'.encode() in f.read():
                    found.append(child)
        except FileNotFoundError:  # it ended meanwhile
            pass
    return found


def test_a_cell_whose_benchmark_was_killed_does_not_outlive_it(tmp_path, config_file):
    """SIGKILL of the benchmark (the OOM killer, kill -9) while a cell's child hung (here in its
    backend's close, after its result): the child, in a session of its own, went on for the hour
    it hung, reparented to init."""
    from processes import running

    closing = tmp_path / "closing"
    proc = benchmark_process(config_file, tmp_path / "out", "HangsInClose", "1", TRACKER_TEST_CLOSING=str(closing))
    cells: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not closing.exists() and proc.poll() is None:
            time.sleep(0.05)
        assert closing.exists(), proc.stderr.read() if proc.poll() is not None else "no cell hung in its close"
        cells = _jobs(proc.pid, "cell")
        assert cells
        proc.kill()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 30  # it polls its parent every second
        while any(running(pid) for pid in cells) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(running(pid) for pid in cells), "the cell's child outlived the benchmark"
    finally:
        for pid in cells:  # the old code's orphan, so that it does not sleep on for an hour
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["--benchmark", "--list-backends"])
def test_a_sigterm_while_the_runtimes_are_probed_kills_the_probe_and_exits_130(tmp_path, config_file, mode):
    """The probe ran before SIGTERM was taken as Ctrl-C: the process ended at once (exit -15) and
    its probe child, which imports every runtime, ran on without it."""
    code = (
        "import sys; from tracker import backends; "
        "backends.REGISTRY['test-backend'] = backends.Entry('test_bench:ChecksForAnHour', None); "
        "from tracker.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = ["--backend", "test-backend", "--batches", "1", "--out", str(tmp_path / "out")] if mode == "--benchmark" else []
    proc = subprocess.Popen([sys.executable, "-c", code, "--config", str(config_file), mode, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])})
    probes: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not probes and proc.poll() is None:
            time.sleep(0.05)
            probes = _jobs(proc.pid, "probe")
        assert probes, proc.stderr.read() if proc.poll() is not None else "no probe started"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        left = [pid for pid in probes if os.path.exists(f"/proc/{pid}")]
    finally:
        proc.kill()
        for pid in probes:  # the old code's orphan, so that it does not sleep on for an hour
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 130, stderr
    assert not left, "the probe's child outlived the command"
    assert "Traceback" not in stderr
    if mode == "--benchmark":  # said, as a stop during the first cell is (it was exit 130 without a word)
        assert stderr.strip().splitlines()[-1].startswith("benchmark: stopped before any cell was measured"), stderr


def test_results_that_cannot_be_written_are_a_warning_and_the_table_is_printed(capsys, config_file, tmp_path):
    out = tmp_path / "out"
    (out / "results.json").mkdir(parents=True)  # what a full disk does to every write, on one file
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "caffe-openblas-dl", "--batches", "1", "--passes", "2")
    assert code == 0, stderr
    assert stderr.count("tracker: warning: cannot write results.json and results.csv in") == 1  # once, not per cell
    assert "caffe-openblas-dl" in stdout and "ms/image" in stdout.lower()
    assert f"wrote {out / 'per_image_ms_linear.png'}" in stdout  # the plots were written; the data files are not named


def test_int8_column_gets_a_quality_line_against_fp32(capsys, config_file, tmp_path, test_backends):
    from tracker.model.convert.calibration import QUALITY_COUNT, QUALITY_SEED, sample_set

    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-int8", "--batches", "1", "--passes", "1")
    assert code == 0, stderr
    doc = json.loads((out / "results.json").read_text())
    assert [(r["label"], r["precision"], r["status"]) for r in doc["rows"]] == [("test-int8", "fp32", "ok"), ("test-int8 int8", "int8", "ok")]
    (quality,) = doc["quality"]
    assert (quality["backend"], quality["precision"], quality["reference"]) == ("test-int8", "int8", "fp32")
    # the same comparison, made here on the same fixed crops
    x = sample_set(None, QUALITY_COUNT, QUALITY_SEED).make((1, 88, 88))
    ref, int8 = Int8Linear(None).infer(x), Int8Linear(None, precision="int8").infer(x)
    a, b = ref.embedding.astype(np.float64), int8.embedding.astype(np.float64)
    cosine = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert quality["crops"] == len(x) == QUALITY_COUNT
    assert quality["top1_agreement"] == pytest.approx(np.mean(ref.probs.argmax(1) == int8.probs.argmax(1)))
    assert quality["embedding_cosine_mean"] == pytest.approx(cosine.mean(), rel=1e-5)
    assert quality["embedding_cosine_min"] == pytest.approx(cosine.min(), rel=1e-5)
    assert quality["embedding_cosine_min"] < 1  # rounding to int8 did change something
    assert "test-int8 int8: top-1 agreement " in stdout
    table_header = next(line for line in stdout.splitlines() if line.startswith("batch"))
    assert table_header.split() == ["batch", "test-int8", "test-int8", "int8"]


def test_a_quality_check_whose_backends_fail_to_close_keeps_its_figures(capsys, config_file, tmp_path, test_backends):
    """The comparison is sent before the two backends are closed, as a cell's timings are: a close
    that raises voided it ("quality check failed: RuntimeError ... during comparing outputs")."""
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "test-int8-close-raises", "--batches", "1",
                                 "--passes", "1")
    assert code == 0, stderr
    (quality,) = json.loads((out / "results.json").read_text())["quality"]
    assert "error" not in quality and 0 <= quality["top1_agreement"] <= 1, quality
    assert "test-int8-close-raises int8: top-1 agreement " in stdout


def test_unavailable_backend_is_exit_3_naming_the_extra(capsys, config_file, tmp_path, test_backends):
    code, stdout, stderr = bench(capsys, config_file, tmp_path / "out", "--backend", "caffe-openblas,test-missing", "--batches", "1", "--passes", "1")
    assert code == 3
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert "test-missing" in stderr and "pip install -e '.[testextra]'" in stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_backend_named_explicitly_that_cannot_be_created_here_is_exit_3_after_the_run(capsys, config_file, tmp_path,
                                                                                        test_backends):
    """Its runtime checks out, creating it does not (as LiteRT without its XNNPACK delegate): every
    cell said "unavailable" and the run exited 0."""
    out = tmp_path / "out"
    code, stdout, stderr = bench(capsys, config_file, out, "--backend", "caffe-openblas-dl,test-refused", "--batches", "1",
                                 "--passes", "1")
    assert code == 3, stderr
    assert stderr.endswith("tracker: error: --backend: test-refused could not be created here (the table's notes above "
                           "say why); expected backends that run on this machine\n"), stderr
    assert "test-refused at batch 1: BackendUnavailable: backend 'test-refused': no delegate here" in stdout
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["backend"], r["status"]) for r in rows] == [("caffe-openblas-dl", "ok"), ("test-refused", "unavailable")]
    assert "caffe-openblas-dl" in stdout  # the table was printed first


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--backend", "caffe-openblas,nosuch"], "--backend: unknown backend 'nosuch'; expected a comma list of "
                                                  "caffe-openblas, caffe-openblas-dl"),
        (["--backend", "caffe-openblas,,caffe-openblas-dl"], "--backend: an empty name in 'caffe-openblas,,caffe-openblas-dl'"),
        (["--batches", "0"], "argument --batches: bad value '0'; expected comma-separated batch sizes from 1 to 256"),
        (["--batches", "1,,2"], "argument --batches: bad value '1,,2'"),
        (["--batches", "512"], "argument --batches: bad value '512'; expected comma-separated batch sizes from 1 to 256"),
        (["--batches", "-1"], "argument --batches: bad value '-1'"),
        (["--batches", "a,b"], "argument --batches: bad value 'a,b'"),
        (["--batches", "1,,x"], "argument --batches: bad value '1,,x'"),
        (["--passes", "0"], "argument --passes: bad value '0'; expected an integer from 1 to 10000"),
        (["--passes", "10001"], "argument --passes: bad value '10001'; expected an integer from 1 to 10000"),
        (["--passes", "many"], "argument --passes: bad value 'many'"),
        (["--timeout", "-5"], "argument --timeout: bad value '-5'"),
        (["--timeout", "1" + "0" * 400], "expected an integer from 1 to 86400"),  # OverflowError before
        (["--memory-limit", "20000000000000"], "argument --memory-limit: bad value '20000000000000'; expected an integer from 1 to 1048576"),
        (["--detectors", "haar", "--backend", "nosuch"], "unknown backend 'nosuch'"),  # before the detectors run
        (["--detectors", "haar", "--passes", "7"], "--passes: the detector benchmark does not take it"),
        (["--memory-limit", "512", "--profile-when-busy"], "--profile-when-busy: not with --memory-limit, whose run writes "
                                                            "no calibration profile"),
        (["--warmup", "-1"], "argument --warmup: bad value '-1'; expected a number of seconds >= 0"),
        (["--warmup", "nan"], "argument --warmup: bad value 'nan'"),
        (["--warmup", "1e300"], "argument --warmup: bad value '1e300'; expected a number of seconds >= 0 and <= 3600"),
        (["--backend", "caffe-openblas", "--precision", "int8"], "backend 'caffe-openblas' has no 'int8' model; backends "
                                                                 "with 'int8': tf-neon-vfpv4, onnxruntime, auto"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, config_file, tmp_path, argv, expected):
    code, stdout, stderr = bench(capsys, config_file, tmp_path / "out", *argv)
    assert code == 2
    assert stderr.startswith("tracker: error: ") and stderr.count("\n") == 1, stderr
    assert expected in stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_bad_backend_in_the_config_is_named_as_the_configs(capsys, tmp_path, state_dir):
    """Without --backend the benchmark runs the config's backend; its mistake named --backend, an
    option the user never gave."""
    config = tmp_path / "bad.yaml"
    config.write_text(f"state_dir: {state_dir}\nbackend: {{name: nosuch}}\n")
    code, stdout, stderr = bench(capsys, config, tmp_path / "out", "--batches", "1")
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith("tracker: error: config: key 'backend.name': unknown backend 'nosuch'; expected")


def test_output_directory_that_cannot_be_created_is_exit_2(capsys, config_file, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, stdout, stderr = bench(capsys, config_file, blocker / "out", "--backend", "caffe-openblas")
    assert code == 2 and stderr.count("\n") == 1
    assert f"--out: cannot use {str(blocker / 'out')!r} as the output directory" in stderr
    assert "expected a writable directory" in stderr


# ---- the calibration profile ---------------------------------------------------------------


def _entry(backend, batch, ms, precision="fp32"):
    return {"backend": backend, "precision": precision, "batch": batch, "ms_per_image": ms}


def test_profile_merges_with_this_machines_profile_and_replaces_another_machines(tmp_path):
    from tracker.bench.profile import update_profile
    from tracker.machine import machine_key

    here = machine_key()
    path = tmp_path / "state" / "profile.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"schema": 1, "machine": here, "results": [
        _entry("onnxruntime", 1, 0.5), _entry("onnxruntime", 8, 0.2, "int8"),
        _entry("caffe-openblas", 1, 9.0), _entry("caffe-openblas", 256, 3.0),
    ]}))  # fmt: skip
    measured = {("caffe-openblas", "fp32", 1): 2.0, ("auto", "fp32", 1): 0.4}
    failed = {("caffe-openblas", "fp32", 256)}
    assert update_profile(path, here, measured, failed, {}) is None
    merged = json.loads(path.read_text())
    assert merged["machine"] == here
    # kept: other backends; replaced: the re-measured cell; removed: the one failing now; auto never
    assert merged["results"] == [_entry("caffe-openblas", 1, 2.0), _entry("onnxruntime", 1, 0.5), _entry("onnxruntime", 8, 0.2, "int8")]

    other = {"cpu": "Raspberry Pi 3 Model B Rev 1.2 (Cortex-A53)", "cores": 4, "arch": "aarch64"}
    path.write_text(json.dumps({"schema": 1, "machine": other, "results": [_entry("onnxruntime", 1, 30.0)]}))
    warning = update_profile(path, here, measured, set(), {})
    assert "measured on another machine" in warning and "Cortex-A53" in warning
    assert json.loads(path.read_text())["results"] == [_entry("caffe-openblas", 1, 2.0)]

    path.write_text("{ not json")
    assert "unreadable" in update_profile(path, here, measured, set(), {})
    assert json.loads(path.read_text())["results"] == [_entry("caffe-openblas", 1, 2.0)]
    assert [p.name for p in path.parent.iterdir()] == ["profile.json"]  # no temporary file left


def test_profile_picks_hold_within_the_tie_margin_through_runs_that_write_after_every_cell(tmp_path):
    from tracker.backends.auto import TIE_MARGIN, describe_picks
    from tracker.bench.profile import recorded_at_start, update_profile
    from tracker.machine import machine_key

    # int8 at batch 8, three benchmark runs; each writes the profile after LiteRT's cell, then
    # after ONNX Runtime's: ONNX Runtime ahead by 7%, then a tie (LiteRT's cell alone, against the
    # last run's ONNX Runtime, looks 15% faster), then LiteRT ahead by 21%
    assert 0.015 < TIE_MARGIN < 0.07
    runs = [(0.273, 0.255, "onnxruntime"), (0.216, 0.213, "onnxruntime"), (0.219, 0.266, "tf-neon-vfpv4")]
    here, path = machine_key(), tmp_path / "state" / "profile.json"
    for litert, ort, expected in runs:
        held, measured = recorded_at_start(path, here), {}
        for key, ms in ((("tf-neon-vfpv4", "int8", 8), litert), (("onnxruntime", "int8", 8), ort)):
            measured[key] = ms
            update_profile(path, here, measured, set(), held)
        assert json.loads(path.read_text())["picks"] == [{"precision": "int8", "batch": 8, "backend": expected}]
        assert describe_picks(path.parent) == [(8, expected, "int8")]  # what auto runs


# ---- --list-backends -----------------------------------------------------------------------


def test_list_backends_names_every_backend_with_availability_precisions_and_extra(capsys, config_file, test_backends):
    code, stdout, stderr = run_cli(capsys, "--config", config_file, "--list-backends")
    assert code == 0, stderr
    lines = {line.split()[0]: line for line in stdout.splitlines()[1:] if line and not line.startswith((" ", "auto would", "auto:"))}
    assert set(lines) >= set(backends.REGISTRY)
    for name in REAL:
        assert lines[name].split()[1:4] == ["yes", "fp32", "(base)"]
    missing = lines["test-missing"].split(None, 4)
    assert missing[1:4] == ["no", "fp32", "testextra"]
    assert "tracker_test_no_such_runtime" in missing[4] and "pip install -e '.[testextra]'" in missing[4]
    assert any(line.startswith("auto") for line in stdout.splitlines()[len(lines) + 1 :])


def test_list_backends_says_auto_would_pick_only_backends_that_run_here(capsys, config_file, state_dir, test_backends):
    """auto passes over a backend whose runtime is gone; the listing said it would pick it."""
    state_dir.mkdir()
    rows = [{"backend": "test-missing", "precision": "fp32", "batch": 8, "ms_per_image": 0.1},
            {"backend": "caffe-openblas-dl", "precision": "fp32", "batch": 8, "ms_per_image": 0.5}]
    (state_dir / "profile.json").write_text(json.dumps({"schema": 1, "machine": machine_key(), "results": rows, "picks": []}))
    code, stdout, stderr = run_cli(capsys, "--config", config_file, "--list-backends")
    assert code == 0, stderr
    assert stdout.splitlines()[-1] == "  batch    8: caffe-openblas-dl (fp32)", stdout


# ---- test-only backends (imported by the benchmark's child process) -------------------------


class _Linear(BackendBase):
    """A real but tiny model: fixed random projections of the input to 848 probs and 128 features."""

    name = "test-linear"
    fail_from_batch = 4

    def __init__(self, model, *, precision="fp32", threads=None, **options):
        rng = np.random.default_rng(0)
        self._w = rng.standard_normal((88 * 88, 848 + 128), dtype=np.float32) / 88

    def infer(self, x: np.ndarray) -> Inference:
        if x.shape[0] >= self.fail_from_batch:
            print("about to fault", file=sys.stderr, flush=True)
            self.fail(x.shape[0])
        y = x.reshape(x.shape[0], -1) @ self._w
        logits = y[:, :848] - y[:, :848].max(axis=1, keepdims=True)
        probs = np.exp(logits)
        return Inference(probs / probs.sum(axis=1, keepdims=True), np.maximum(y[:, 848:], 0))

    def fail(self, batch: int) -> None:
        pass


class SegfaultsFromBatch4(_Linear):
    def fail(self, batch):
        ctypes.string_at(0)  # reads address 0: a real SIGSEGV


class KilledFromBatch4(_Linear):
    def fail(self, batch):
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does


class SegfaultsAfter10Calls(_Linear):
    """Runs its cell (a warm-up and a few passes) and faults in a runoff, which calls it more."""

    fail_from_batch = 2**30
    calls = 0

    def infer(self, x: np.ndarray) -> Inference:
        self.calls += 1
        if self.calls > 10:
            ctypes.string_at(0)
        return super().infer(x)


class HangsFromBatch4(_Linear):
    def fail(self, batch):
        time.sleep(3600)


class Int8Linear(_Linear):
    """fp32, or int8: the same weights rounded to a symmetric per-output int8 grid."""

    precisions = ("fp32", "int8")
    fail_from_batch = 2**30

    def __init__(self, model, *, precision="fp32", threads=None, **options):
        super().__init__(model, precision=precision, threads=threads)
        if precision == "int8":
            scale = np.abs(self._w).max(axis=0) / 127
            self._w = np.round(self._w / scale).astype(np.int8).astype(np.float32) * scale


class Int8CloseRaises(Int8Linear):
    def close(self):
        raise RuntimeError("the runtime failed while shutting down")


class ChecksForAnHour(_Linear):
    """Checking its runtime hangs (an import that never ends)."""

    @classmethod
    def check_runtime(cls):
        time.sleep(3600)


class RefusedWhenCreated(_Linear):
    """Its runtime checks out; creating it is refused."""

    def __init__(self, model, **options):
        raise BackendUnavailable("backend 'test-refused': no delegate here")


class LoadsOnFirstCall(_Linear):
    """Its first call takes 0.5 s (a lazy load, as `auto` creates its engine); the others are a matmul."""

    fail_from_batch = 2**30

    def infer(self, x):
        if not getattr(self, "loaded", False):
            time.sleep(0.5)
            self.loaded = True
        return super().infer(x)


class CloseRaises(_Linear):
    fail_from_batch = 2**30

    def close(self):
        raise RuntimeError("the runtime failed while shutting down")


class HangsInClose(_Linear):
    """Its cells run; closing it after passes (in a cell, not in the column's priming load) says so
    in the file $TRACKER_TEST_CLOSING names, then hangs."""

    fail_from_batch = 2**30

    def infer(self, x):
        self.ran = True
        return super().infer(x)

    def close(self):
        if getattr(self, "ran", False):
            Path(os.environ["TRACKER_TEST_CLOSING"]).write_text("closing")
            time.sleep(3600)


class CountsLoads(_Linear):
    """Appends "<pid> <passes run>" to the file $TRACKER_TEST_LOADS names when it closes."""

    fail_from_batch = 2**30

    def infer(self, x):
        self.passes = getattr(self, "passes", 0) + 1
        return super().infer(x)

    def close(self):
        with open(os.environ["TRACKER_TEST_LOADS"], "a") as f:
            f.write(f"{os.getpid()} {getattr(self, 'passes', 0)}\n")


class MissingRuntime(_Linear):
    @classmethod
    def check_runtime(cls):
        try:
            import tracker_test_no_such_runtime  # noqa: F401
        except ImportError as err:
            raise backends.missing_runtime("test-missing", "tracker_test_no_such_runtime", err) from None


TEST_BACKENDS = {
    "test-segfault": "SegfaultsFromBatch4",
    "test-segfault-late": "SegfaultsAfter10Calls",
    "test-sigkill": "KilledFromBatch4",
    "test-hang": "HangsFromBatch4",
    "test-missing": "MissingRuntime",
    "test-int8": "Int8Linear",
    "test-close-raises": "CloseRaises",
    "test-lazy": "LoadsOnFirstCall",
    "test-refused": "RefusedWhenCreated",
    "test-int8-close-raises": "Int8CloseRaises",
}


