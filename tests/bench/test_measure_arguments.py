"""The measurement scripts' bad options: one line naming the option, the value and what is
expected, exit 2, before any run (each run takes minutes, and a bad count or output path was a
traceback at its end). Nothing here runs a benchmark: every case is refused while parsing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from repo_scripts import SCRIPTS, load_script

NOT_A_FOLDER = "/nonexistent/results.json"
JSON_FILE = "a JSON file to write in an existing folder"


@pytest.mark.parametrize("script, args, message", [
    ("bench_pipeline", ["--frames", "1"], "argument --frames: bad value '1'; expected an integer >= 2"),
    ("bench_pipeline", ["--paced-seconds", "0.01"],
     "--paced-fps 30 for --paced-seconds 0.01: fewer than 2 frames; expected a paced run of 2 frames or more "
     "(or --paced-fps 0 to skip it)"),
    ("bench_pipeline", ["--out", NOT_A_FOLDER], f"argument --out: bad value {NOT_A_FOLDER!r}: cannot write in "
     f"'/nonexistent' (No such file or directory); expected {JSON_FILE}"),
    ("bench_web", ["--repeats", "0"], "argument --repeats: bad value '0'; expected an integer >= 1"),
    ("bench_web", ["--repeats", "-1"], "argument --repeats: bad value '-1'; expected an integer >= 1"),
    ("bench_web", ["--out", NOT_A_FOLDER], f"argument --out: bad value {NOT_A_FOLDER!r}: cannot write in "
     f"'/nonexistent' (No such file or directory); expected {JSON_FILE}"),
    ("worker_overhead", ["--calls", "0"], "argument --calls: bad value '0'; expected an integer >= 1"),
    ("worker_overhead", ["--bench-runs", "-1"], "argument --bench-runs: bad value '-1'; expected an integer >= 0"),
    ("soak_demo", ["--interval", "0"], "argument --interval: bad value '0'; expected a number of seconds >= 0.1 and <= 30"),
    ("soak_demo", ["--interval", "61", "--duration", "61", "--warmup", "1"],
     "argument --interval: bad value '61'; expected a number of seconds >= 0.1 and <= 30"),
    ("soak_demo", ["--out", NOT_A_FOLDER], f"argument --out: bad value {NOT_A_FOLDER!r}: cannot write in "
     f"'/nonexistent' (No such file or directory); expected {JSON_FILE}"),
])  # fmt: skip
def test_bad_option_is_one_line_and_exit_2_before_any_run(script, args, message):
    proc = subprocess.run([sys.executable, str(SCRIPTS / f"{script}.py"), *args], capture_output=True, text=True,
                          timeout=60, cwd=SCRIPTS.parent)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"{script}.py: {message}\n"


@pytest.mark.parametrize("script", ["bench_pipeline", "bench_web", "soak_demo", "backend_overhead"])
def test_an_out_that_is_a_folder_is_refused_before_any_run(script, tmp_path):
    option = "--json" if script == "backend_overhead" else "--out"
    proc = subprocess.run([sys.executable, str(SCRIPTS / f"{script}.py"), option, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, cwd=SCRIPTS.parent)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"{script}.py: argument {option}: bad value {str(tmp_path)!r}: a folder; expected ")
    assert proc.stderr.count("\n") == 1


def test_soak_removes_its_state_folder_when_the_run_fails(tmp_path, monkeypatch):
    """A traceback after the run (a median of no samples) left /tmp/tracker-soak-* behind."""
    script = load_script("soak_demo")
    monkeypatch.setattr(script.tempfile, "tempdir", str(tmp_path))

    def fails(args, state: Path) -> int:
        assert state.parent == tmp_path and state.is_dir()
        raise RuntimeError("the report failed")

    monkeypatch.setattr(script, "soak", fails)
    with pytest.raises(RuntimeError):
        script.main(["--duration", "60", "--warmup", "0"])
    assert not any(tmp_path.iterdir())
