"""`auto`: picks per batch size from this machine's calibration profile; ignores (with a warning
saying why) a missing, corrupt or foreign profile and then runs the documented default."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re

import numpy as np
import pytest
from backend_parity import assert_parity, face_inputs

from tracker.backends import backend_class, create_backend
from tracker.backends.auto import DEFAULTS, TIE_MARGIN, describe_picks
from tracker.errors import BackendUnavailable, TrackerError
from tracker.machine import machine_key
from tracker.model.spec import default_model

# opencv-dnn fastest at batch 1 and 2, onnxruntime from 4 on; int8 only on onnxruntime
RESULTS = [
    ("opencv-dnn", "fp32", 1, 1.0), ("onnxruntime", "fp32", 1, 2.0),
    ("opencv-dnn", "fp32", 2, 1.5), ("onnxruntime", "fp32", 2, 1.6),
    ("opencv-dnn", "fp32", 4, 3.0), ("onnxruntime", "fp32", 4, 1.0),
    ("opencv-dnn", "fp32", 8, 3.0), ("onnxruntime", "fp32", 8, 0.9),
    ("onnxruntime", "int8", 1, 0.5), ("opencv-dnn", "int8", 2, 0.1),  # a row for a precision it lacks,
    ("onnxruntime", "int8", 2, 0.4), ("mxnet-gone", "fp32", 1, 0.1),  # of a backend this version lacks,
    ("onnxruntime", "fp16", 1, 0.1), ("onnxruntime", "FP32", 1, 0.1),  # of precisions none has
]


def write_profile(state_dir, machine=None, results=RESULTS, picks=()):
    state_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"backend": b, "precision": p, "batch": n, "ms_per_image": ms} for b, p, n, ms in results]
    document = {"schema": 1, "machine": machine or machine_key(), "results": rows,
                "picks": [{"precision": p, "batch": n, "backend": b} for p, n, b in picks]}
    (state_dir / "profile.json").write_text(json.dumps(document))


@pytest.fixture
def auto(tmp_path):
    write_profile(tmp_path / "state")
    backend = create_backend("auto", default_model(), state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"))
    yield backend
    backend.close()


def test_picks_the_fastest_at_the_nearest_measured_batch_at_or_above(auto):
    assert [auto.pick(n) for n in (1, 2, 3, 4, 5, 8, 64)] == [
        "opencv-dnn", "opencv-dnn", "onnxruntime", "onnxruntime", "onnxruntime", "onnxruntime", "onnxruntime"]


def test_a_backend_measured_alone_at_some_sizes_competes_there_with_the_others_next_sizes(tmp_path):
    """A profile merges runs: `--backend caffe-openblas --batches 2,4` after a run of all at 1, 8
    left caffe-openblas the only candidate, and so the pick, at 2 to 4, where onnxruntime measured
    four times faster on both sides."""
    write_profile(tmp_path, results=[("onnxruntime", "fp32", 1, 0.5), ("caffe-openblas", "fp32", 1, 2.0),
                                     ("onnxruntime", "fp32", 8, 0.3), ("caffe-openblas", "fp32", 8, 1.5),
                                     ("caffe-openblas", "fp32", 2, 1.9), ("caffe-openblas", "fp32", 4, 1.7)])
    backend = create_backend("auto", default_model(), state_dir=str(tmp_path))
    try:
        assert [backend.pick(n) for n in (1, 2, 3, 4, 5, 8)] == ["onnxruntime"] * 6
    finally:
        backend.close()
    assert [name for _, name, _ in describe_picks(tmp_path)] == ["onnxruntime"] * 4  # at 1, 2, 4, 8


def test_a_backend_is_not_picked_beyond_or_below_the_sizes_it_was_measured_at(tmp_path):
    """A cell that failed (out of memory at 64) leaves no entry: the backend does not run there on
    its time at 8; nor does a backend measured only at 64 run at 1 on its time at 64."""
    write_profile(tmp_path, results=[("onnxruntime", "fp32", 1, 0.5), ("caffe-openblas-dl", "fp32", 1, 2.0),
                                     ("onnxruntime", "fp32", 8, 0.3), ("caffe-openblas-dl", "fp32", 8, 1.5),
                                     ("caffe-openblas-dl", "fp32", 64, 0.9), ("opencv-dnn", "fp32", 64, 0.1)])
    picks = {batch: name for batch, name, _ in describe_picks(tmp_path)}
    assert picks == {1: "onnxruntime", 8: "onnxruntime", 64: "opencv-dnn"}
    write_profile(tmp_path, results=[("onnxruntime", "fp32", 1, 0.5), ("onnxruntime", "fp32", 8, 0.3),
                                     ("caffe-openblas-dl", "fp32", 1, 2.0), ("caffe-openblas-dl", "fp32", 8, 1.5),
                                     ("caffe-openblas-dl", "fp32", 64, 0.9)])
    assert {batch: name for batch, name, _ in describe_picks(tmp_path)} == {1: "onnxruntime", 8: "onnxruntime",
                                                                            64: "caffe-openblas-dl"}


def test_runs_the_pick_and_keeps_sub_backends(auto):
    x = face_inputs()
    assert_parity(auto, default_model(), x[:1])
    opencv = auto._live["opencv-dnn"]
    assert_parity(auto, default_model(), x[:5])
    assert list(auto._live) == ["opencv-dnn", "onnxruntime"]
    auto.infer(x[:2])
    assert auto._live["opencv-dnn"] is opencv  # created once, kept


def test_sub_backends_are_bounded(tmp_path):
    write_profile(tmp_path / "state")
    with create_backend("auto", default_model(), state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"), max_live=1) as auto:
        auto.infer(face_inputs()[:1])
        auto.infer(face_inputs()[:4])
        assert list(auto._live) == ["onnxruntime"]


def test_int8_picks_among_int8_rows_of_backends_that_have_it(tmp_path, caplog):
    """A row of a backend without int8 (fastest in the profile) was auto's pick, listed as such,
    and failed at its first batch."""
    write_profile(tmp_path / "state")
    with caplog.at_level(logging.WARNING, logger="tracker.backends.auto"):
        with create_backend("auto", default_model(), precision="int8", state_dir=str(tmp_path / "state"),
                            cache_dir=str(tmp_path / "cache")) as auto:
            assert auto.pick(2) == "onnxruntime"
            out = auto.infer(face_inputs()[:2])
            assert list(auto._live) == ["onnxruntime"] and out.probs.shape == (2, 848)
    assert "cannot create" not in caplog.text


def test_a_default_that_cannot_be_created_gives_way_to_the_next_fastest(tmp_path, caplog, monkeypatch):
    """int8's default (LiteRT) fastest in the profile, but its runtime gone: onnxruntime runs."""
    write_profile(tmp_path / "state", results=[("tf-neon-vfpv4", "int8", 1, 0.15), ("onnxruntime", "int8", 1, 0.30)])

    def missing(cls):
        raise BackendUnavailable("tf-neon-vfpv4: LiteRT is not installed (a test)")

    monkeypatch.setattr(backend_class("tf-neon-vfpv4"), "check_runtime", classmethod(missing))
    with caplog.at_level(logging.WARNING, logger="tracker.backends.auto"):
        with create_backend("auto", default_model(), precision="int8", state_dir=str(tmp_path / "state"),
                            cache_dir=str(tmp_path / "cache")) as auto:
            assert auto.pick(1) == DEFAULTS["int8"] == "tf-neon-vfpv4"
            assert auto.infer(face_inputs()[:1]).probs.shape == (1, 848)
            assert list(auto._live) == ["onnxruntime"]
    assert "cannot create tf-neon-vfpv4 for batch 1" in caplog.text


def test_describe_picks(tmp_path):
    write_profile(tmp_path)
    picks = describe_picks(tmp_path)
    assert (1, "opencv-dnn", "fp32") in picks and (4, "onnxruntime", "fp32") in picks
    assert (2, "onnxruntime", "int8") in picks and len(picks) == 6  # (no fp16, FP32 or mxnet-gone)


@pytest.mark.parametrize("case, reason", [
    ("missing", "profile.json does not exist"),
    ("corrupt", "is unreadable (JSONDecodeError"),
    ("foreign", "was measured on another machine"),
    ("old-schema", "is not a schema-1 profile"),
    ("schema true", "is not a schema-1 profile"),
    ("nested", "is unreadable (RecursionError"),
    ("fifo", "is unreadable (OSError: [Errno 22] not a regular file)"),  # it hung the guard's start
    ("huge", "is unreadable (OSError: [Errno 27] larger than 4000000 bytes)"),
])
def test_unusable_profile_is_ignored_with_a_warning_and_the_default_runs(tmp_path, caplog, case, reason):
    state = tmp_path / "state"
    if case == "corrupt":
        state.mkdir()
        (state / "profile.json").write_text('{"schema": 1, "machine": ')
    elif case == "foreign":
        write_profile(state, machine={"cpu": "Raspberry Pi 3 Model B Rev 1.2 (Cortex-A53)", "cores": 4, "arch": "aarch64"})
    elif case == "old-schema":
        state.mkdir()
        (state / "profile.json").write_text(json.dumps({"schema": 0, "results": []}))
    elif case == "schema true":
        state.mkdir()
        (state / "profile.json").write_text(json.dumps({"schema": True, "machine": machine_key(), "results": []}))
    elif case == "nested":  # a traceback at the guard's start and in the benchmark
        state.mkdir()
        (state / "profile.json").write_text("[" * 100_000)
    elif case == "fifo":
        state.mkdir()
        os.mkfifo(state / "profile.json")
    elif case == "huge":
        state.mkdir()
        with open(state / "profile.json", "wb") as huge:
            huge.truncate(4_000_001)
    with caplog.at_level(logging.WARNING, logger="tracker.backends.auto"):
        with create_backend("auto", default_model(), state_dir=str(state)) as auto:
            for n in (1, 3, 1):
                assert auto.pick(n) == DEFAULTS["fp32"] == "caffe-openblas-dl"
                assert auto.infer(face_inputs()[:n]).probs.shape == (n, 848)
            assert list(auto._live) == ["caffe-openblas-dl"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "tracker.backends.auto"]
    assert len(warnings) == 1 and reason in warnings[0] and "running caffe-openblas-dl for every batch size" in warnings[0]
    with pytest.raises(TrackerError, match=re.escape(reason)):
        describe_picks(state)


def test_auto_needs_a_batch():
    with create_backend("auto", default_model(), state_dir="/nonexistent") as auto:
        with pytest.raises(TrackerError, match="N >= 1"):
            auto.infer(np.zeros((0, 1, 88, 88), np.float32))


@pytest.mark.parametrize("onnx_ms", [0.99, 1.0, 1.02])
def test_backends_within_the_tie_margin_are_ranked_by_the_registry_so_noise_cannot_swap_the_pick(tmp_path, onnx_ms):
    # onnxruntime a little faster, as fast, or a little slower than opencv-dnn: the same pick, by
    # the registry's order (onnxruntime before opencv-dnn); beyond the margin the faster one wins.
    results = [("opencv-dnn", "fp32", 1, 1.0), ("onnxruntime", "fp32", 1, onnx_ms),
               ("opencv-dnn", "fp32", 2, 1.0), ("onnxruntime", "fp32", 2, 1.0 + TIE_MARGIN + 0.01)]
    write_profile(tmp_path, results=results)
    picks = {batch: backend for batch, backend, _ in describe_picks(tmp_path)}
    assert picks == {1: "onnxruntime", 2: "opencv-dnn"}


@pytest.mark.parametrize("onnx_ms", [0.99, 1.0, 1.02])
def test_a_recorded_pick_holds_within_the_tie_margin_and_yields_beyond_it(tmp_path, onnx_ms):
    # the same measurements as above, but the profile records opencv-dnn as the pick at both
    # sizes: it holds at batch 1 (tied), not at batch 2, where onnxruntime is beyond the margin
    # faster; a malformed pick is ignored
    results = [("opencv-dnn", "fp32", 1, 1.0), ("onnxruntime", "fp32", 1, onnx_ms),
               ("opencv-dnn", "fp32", 2, 1.0 + TIE_MARGIN + 0.01), ("onnxruntime", "fp32", 2, 1.0)]
    write_profile(tmp_path, results=results, picks=[("fp32", 1, "opencv-dnn"), ("fp32", 2, "opencv-dnn"),
                                                     ("fp32", "two", "opencv-dnn")])
    picks = {batch: backend for batch, backend, _ in describe_picks(tmp_path)}
    assert picks == {1: "opencv-dnn", 2: "onnxruntime"}


def test_entries_with_infinite_numbers_are_left_out_not_fatal(tmp_path):
    """JSON's Infinity as a batch (int() overflows) or as a time: each entry is one bad entry, left
    out; --list-backends, auto and the benchmark all read the profile through read_profile."""
    write_profile(tmp_path, results=RESULTS + [("onnxruntime", "fp32", float("inf"), 1.0), ("opencv-dnn", "fp32", 8, float("inf"))],
                  picks=[("fp32", float("inf"), "onnxruntime")])
    assert sorted(describe_picks(tmp_path)) == sorted(describe_picks_of(tmp_path, RESULTS))


def test_entries_whose_batch_is_not_an_integer_are_left_out(tmp_path):
    """int() took 1.7 and true for batch 1: a hand-edited entry could replace batch 1's time."""
    write_profile(tmp_path, results=RESULTS + [("onnxruntime", "fp32", 1.7, 0.01), ("onnxruntime", "fp32", True, 0.01),
                                               ("onnxruntime", "fp32", "1", 0.01)])
    assert sorted(describe_picks(tmp_path)) == sorted(describe_picks_of(tmp_path, RESULTS))


def describe_picks_of(tmp_path, results):
    other = tmp_path / "reference"
    write_profile(other, results=results)
    return describe_picks(other)


def test_the_guard_reads_the_profile_in_its_configs_state_dir(tmp_path, caplog):
    """As the benchmark writes it and --list-backends reads it (the guard read the default config's)."""
    from tracker.config import parse_config
    from tracker.stages import build_stages

    write_profile(tmp_path / "state")
    config = parse_config({"state_dir": str(tmp_path / "state"), "backend": {"name": "auto"},
                           "sinks": {"console": False}, "web": {"enabled": False}})
    with caplog.at_level(logging.WARNING, logger="tracker.backends.auto"):
        stages = build_stages(config, realtime=False)
    try:
        auto = stages.backend
        while not hasattr(auto, "pick"):  # under the embedding's and the restarts' wrappers
            auto = auto.backend
        assert [auto.pick(n) for n in (1, 4)] == ["opencv-dnn", "onnxruntime"]
        assert "auto:" not in caplog.text
    finally:
        stages.close()


def test_a_stop_reaches_a_sub_backends_worker(tmp_path):
    """MXNet runs in a worker child: a guard stopping while that child hangs waited out the call's
    timeout (20 s + 2 s per image), since the stop never got past `auto`."""
    import os
    import signal
    import threading

    from tracker.backends.worker import WorkerFailure

    write_profile(tmp_path / "state", results=[("mxnet-openblas-dl", "fp32", 1, 0.5), ("onnxruntime", "fp32", 1, 1.0)])
    with create_backend("auto", default_model(), state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache")) as auto:
        auto.infer(face_inputs()[:1])
        child = auto._live["mxnet-openblas-dl"].worker.pid
        os.kill(child, signal.SIGSTOP)  # hung
        try:
            threading.Timer(0.5, auto.interrupt).start()
            with pytest.raises(WorkerFailure, match="stopped waiting for .* \\(the guard is stopping\\)"):
                auto.infer(face_inputs()[:1])
        finally:
            with contextlib.suppress(ProcessLookupError):  # the failed call killed it
                os.kill(child, signal.SIGCONT)


def test_a_sub_backend_whose_worker_dies_while_loading_gives_way_to_the_next_fastest(tmp_path, caplog, monkeypatch):
    """An MXNet worker killed while it loads (the OOM killer): `auto` restarted, tried MXNet again,
    and lost every batch of that size for good."""
    fake = tmp_path / "mx"
    (fake / "lib" / "python3.11" / "site-packages" / "mxnet").mkdir(parents=True)
    (fake / "lib" / "python3.11" / "site-packages" / "mxnet" / "__init__.py").write_text("")
    (fake / "bin").mkdir()
    python = fake / "bin" / "python"
    python.write_text("#!/bin/sh\nkill -9 $$\n")  # dies as the worker's child starts
    python.chmod(0o755)
    monkeypatch.setenv("TRACKER_MXNET_PYTHON", str(python))
    write_profile(tmp_path / "state", results=[("mxnet-openblas-dl", "fp32", 1, 0.5), ("onnxruntime", "fp32", 1, 1.0)])
    with caplog.at_level(logging.WARNING, logger="tracker.backends.auto"):
        with create_backend("auto", default_model(), state_dir=str(tmp_path / "state"),
                            cache_dir=str(tmp_path / "cache")) as auto:
            assert auto.infer(face_inputs()[:1]).probs.shape == (1, 848)
            assert list(auto._live) == ["onnxruntime"]
    assert "cannot create mxnet-openblas-dl for batch 1" in caplog.text and "signal 9" in caplog.text
