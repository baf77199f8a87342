"""scripts/backend_overhead.py: run for real on onnxruntime (fp32, batch 1; int8 with auto) at tiny
settings, and its one-line errors. No timing is asserted: only that the variants were timed
(positive, at least one call per round) and that the ratios and the wrapper cost are what the
medians say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_scripts import load_script

from tracker import shared_data
from tracker.backends import availability

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "backend_overhead.py"
ROUNDS = 2


def _run(*args: str, cache: Path | None = None, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(extra_env or {}))
    if cache is not None:
        env["TRACKER_CACHE_DIR"] = str(cache)  # the converted ONNX file: the session's, not the user's cache
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_onnxruntime_fp32_batch_1_writes_every_variant_and_its_ratios(tmp_path, backend_caches):
    why = availability("onnxruntime")
    if why:
        pytest.skip(why)
    if shared_data.find("bench/peer_bench.py") is None:
        if os.environ.get("CI"):
            raise RuntimeError("bench/peer_bench.py missing from the shared data; CI must have it")
        pytest.skip("bench/peer_bench.py not in the shared data: no raw variant to compare against")
    out = tmp_path / "overhead.json"
    proc = _run("--backends", "onnxruntime", "--precisions", "fp32", "--batches", "1", "--seconds", "0.01",
                "--rounds", str(ROUNDS), "--json", str(out), cache=backend_caches("onnxruntime"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["peer_bench"] and result["machine"]["cores"] >= 1
    assert len(result["machine"]["load_average"]["start"]) == 3 and len(result["machine"]["load_average"]["end"]) == 3
    (row,) = result["rows"]
    assert (row["backend"], row["precision"], row["batch"]) == ("onnxruntime", "fp32", 1)
    ms = row["ms_per_image"]
    assert set(ms) == {"raw", "file", "session", "backend"}
    assert all(v > 0 for v in ms.values())
    assert all(row["calls"][v] >= ROUNDS for v in ms)
    assert row["raw_runtime"] == "onnxruntime" and row["reference"] == "raw"
    assert row["ratio_raw"] == pytest.approx(ms["backend"] / ms["raw"])
    assert row["ratio_file"] == pytest.approx(ms["backend"] / ms["file"])
    assert row["wrapper_us"] == pytest.approx(1000 * (ms["backend"] - ms["session"]))
    # the graph comparison: the op types of both models and the session options
    lines = result["graphs"]["onnxruntime fp32"]
    assert any(line.startswith("converted graph") and "Conv" in line for line in lines)
    assert any(line.startswith("raw graph") and "Conv" in line for line in lines)
    assert any("session options" in line for line in lines)
    # the printed table has the row
    table = [line.split() for line in proc.stdout.splitlines()]
    assert ["onnxruntime", "fp32", "1"] in [cells[:3] for cells in table]


@pytest.mark.parametrize("args, option, value", [
    (["--batches", "1,0"], "--batches", "'1,0'"),
    (["--batches", "eight"], "--batches", "'eight'"),
    (["--batches", "1,100000"], "--batches", "'1,100000'"),  # a batch is allocated whole: GBs
    (["--backends", "onnxruntime,nope"], "--backends", "'nope'"),
    (["--precisions", "fp16"], "--precisions", "'fp16'"),
    (["--seconds", "0"], "--seconds", "'0'"),
])
def test_bad_argument_is_one_line_and_exit_2(args, option, value):
    proc = _run(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert option in lines[0] and value in lines[0] and "expected" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_missing_peer_bench_is_one_line_and_no_raw(monkeypatch, tmp_path):
    script = load_script("backend_overhead")
    monkeypatch.setattr(script.shared_data, "find", lambda relative: None)
    peer, why = script.load_peer_bench()
    assert peer is None
    assert "\n" not in why and "bench/peer_bench.py not found" in why and "without the raw column" in why
    assert script.RawRunners(None, str(tmp_path)).get("onnxruntime") is None


def test_auto_int8_is_timed_against_every_int8_backend_of_the_run(tmp_path, backend_caches):
    """The auto row's references include the other backends in the same rounds, not only the
    int8 files (ONNX Runtime's int8 file with default options is slower than its backend)."""
    why = availability("onnxruntime")
    if why:
        pytest.skip(why)
    from tracker.machine import machine_key

    state = tmp_path / "state"
    state.mkdir()
    profile = {"schema": 1, "machine": machine_key(),
               "results": [{"backend": "onnxruntime", "precision": "int8", "batch": 1, "ms_per_image": 0.2}],
               "picks": [{"precision": "int8", "batch": 1, "backend": "onnxruntime"}]}
    (state / "profile.json").write_text(json.dumps(profile))
    out = tmp_path / "overhead.json"
    proc = _run("--backends", "onnxruntime,auto", "--precisions", "int8", "--batches", "1", "--seconds", "0.01",
                "--rounds", str(ROUNDS), "--json", str(out), cache=backend_caches("onnxruntime"),
                extra_env={"STATE_DIRECTORY": str(state)})  # auto reads this profile, not the user's
    assert proc.returncode == 0, proc.stderr
    auto = next(row for row in json.loads(out.read_text())["rows"] if row["backend"] == "auto")
    assert auto["picked"] == "onnxruntime"
    ms = auto["ms_per_image"]
    assert {"file:onnxruntime", "backend:onnxruntime", "session", "backend"} <= set(ms)
    references = {k: v for k, v in ms.items() if ":" in k}
    assert auto["reference"] == min(references, key=references.get)
    assert auto["ratio_raw"] == pytest.approx(ms["backend"] / references[auto["reference"]])
