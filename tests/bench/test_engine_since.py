"""scripts/engine_since.py: run for real at tiny settings (a git worktree of a commit, the engine of
each checkout in its own processes). No timing is asserted: only that every stage of both commits
was timed and printed, and that the worktree is gone afterwards.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "engine_since.py"
NUMBER = r"(\d+\.\d+)"
FACE_CNN_STAGES = ["conv1..pool1", "conv2..pool2", "conv3..relu3", "fc1..relu4", "fc2..prob"]


def load_script():
    spec = importlib.util.spec_from_file_location("engine_since", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worktrees() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "worktree", "list", "--porcelain"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line.startswith("worktree ")]


def test_stages_run_from_one_layer_with_weights_to_the_next():
    from tracker.model.caffe_io import load_net

    netdef = load_net(REPO / "models" / "face_cnn.prototxt", None)
    stage = load_script().stage_of_layers([(layer.name, layer.type) for layer in netdef.layers])
    assert sorted(set(stage.values())) == sorted(FACE_CNN_STAGES)
    assert stage["relu2"] == stage["pool2"] == "conv2..pool2" and stage["prob"] == "fc2..prob"
    # layers before the first with weights make a stage of their own; a lone layer is named alone
    assert load_script().stage_of_layers([("norm", "LRN"), ("conv", "Convolution"), ("fc", "InnerProduct")]) == {
        "norm": "norm", "conv": "conv", "fc": "fc"}


def test_times_both_commits_stage_by_stage_and_removes_its_worktree():
    before = worktrees()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--before", "HEAD", "--modes", "dl,caffe", "--batches", "2",
                           "--rounds", "2", "--seconds", "0.05"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert worktrees() == before
    lines = proc.stdout.splitlines()
    for mode in ("dl", "caffe"):
        start = lines.index(f"{mode} batch 2: ms per image, range over 2 rounds (HEAD -> this checkout)")
        rows = lines[start + 1 : start + 1 + len(FACE_CNN_STAGES) + 1]
        assert [row.split()[0] for row in rows] == [*FACE_CNN_STAGES, "whole"]
        for row in rows:  # before's range -> after's range, and their ratio
            figures = [float(f) for f in re.findall(NUMBER, row)]
            assert len(figures) == 5 and all(f > 0 for f in figures), row
    # the two commits alternate which goes first
    assert re.findall(r"round \d: (\w+)", proc.stderr) == ["before", "after", "after", "before"]


def test_a_bad_option_is_one_line_and_exit_2():
    for args, named in ((["--before", "no-such-commit"], "--before 'no-such-commit'"),
                        (["--modes", "fast"], "--modes 'fast'"), (["--batches", "8,0"], "--batches '8,0'")):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and named in proc.stderr, proc.stderr
