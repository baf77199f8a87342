"""scripts/engine_since.py: run for real at tiny settings (a git worktree of a commit, the engine of
each checkout in its own processes). No timing is asserted: only that every stage of both commits
was timed and printed, that each process ran its own checkout's engine, and that no worktree or
temporary folder is left behind, after a failure too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "engine_since.py"
NUMBER = r"(\d+\.\d+)"
FACE_CNN_STAGES = ["conv1..pool1", "conv2..pool2", "conv3..relu3", "fc1..relu4", "fc2..prob"]


def worktrees(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True, text=True, check=True)
    return [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("worktree ")]


def test_stages_run_from_one_layer_with_weights_to_the_next():
    from tracker.model.caffe_io import load_net

    netdef = load_net(REPO / "models" / "face_cnn.prototxt", None)
    stage = load_script("engine_since").stage_of_layers([(layer.name, layer.type) for layer in netdef.layers])
    assert list(dict.fromkeys(stage.values())) == FACE_CNN_STAGES
    assert stage["relu2"] == stage["pool2"] == "conv2..pool2" and stage["prob"] == "fc2..prob"
    # layers before the first with weights make a stage of their own; a lone layer is named alone
    assert load_script("engine_since").stage_of_layers([("norm", "LRN"), ("conv", "Convolution"), ("fc", "InnerProduct")]) == {
        "norm": "norm", "conv": "conv", "fc": "fc"}


def test_report_gives_each_commits_range_and_the_median_ratio_after_over_before():
    def rounds(*pass_ms):  # one round per figure: every pass of it that many ms, conv1 a tenth
        return [{"dl/8": {"pass": [ms / 1000] * 3, "stages": {"conv1": [ms / 10000] * 3}}} for ms in pass_ms]

    lines = load_script("engine_since").report({"before": rounds(2.0, 2.2, 2.4), "after": rounds(1.0, 1.0, 1.5)}, "abc123")
    assert lines[0] == "dl batch 8: ms per image, range over 3 rounds (abc123 -> this checkout)"
    assert re.findall(NUMBER, lines[1]) == ["0.200", "0.240", "0.100", "0.150", "0.50"] and "x0.50" in lines[1]
    assert lines[2].split()[:3] == ["whole", "pass", "(wall)"] and lines[2].endswith("x0.50")  # 1/2, 1/2.2, 1.5/2.4


def test_a_child_times_every_stage_of_its_own_checkout():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--child", str(REPO), "--modes", "dl", "--batches", "2",
                           "--seconds", "0.02"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])["dl/2"]
    assert list(result["stages"]) == FACE_CNN_STAGES
    assert all(len(times) >= 3 and min(times) > 0 for times in [result["pass"], *result["stages"].values()])


def test_times_both_commits_stage_by_stage_and_removes_its_worktree(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--before", "HEAD", "--modes", "dl,caffe", "--batches", "2",
                           "--rounds", "2", "--seconds", "0.02"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert not any(Path(tree).is_relative_to(tmp_path) for tree in worktrees(REPO)) and not any(tmp_path.iterdir())
    lines = proc.stdout.splitlines()
    for mode in ("dl", "caffe"):
        start = lines.index(f"{mode} batch 2: ms per image, range over 2 rounds (HEAD -> this checkout)")
        rows = lines[start + 1 : start + 1 + len(FACE_CNN_STAGES) + 1]
        assert [row.split()[0] for row in rows] == [*FACE_CNN_STAGES, "whole"]
        assert all(len(re.findall(NUMBER, row)) == 5 for row in rows)  # two ranges and their ratio
    # the two commits alternate which goes first
    assert re.findall(r"round \d: (\w+)", proc.stderr) == ["before", "after", "after", "before"]


def test_a_child_that_fails_is_one_line_naming_the_commit_and_leaves_nothing_behind(tmp_path):
    # a repository whose commit has no engine: its child finds the installed `tracker` instead of
    # its own checkout's, which the child refuses
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts")
    git = ["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "--quiet"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "no engine"], check=True)
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.run([sys.executable, str(repo / "scripts" / "engine_since.py"), "--before", "HEAD", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(temp)})
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 2, proc.stderr  # the round's line, then the error
    assert "timing the engine of HEAD failed" in proc.stderr and "not from" in proc.stderr
    assert worktrees(repo) == [str(repo)] and not any(temp.iterdir())


def test_a_bad_option_is_one_line_and_exit_2():
    for args, named in ((["--before", "no-such-commit"], "--before 'no-such-commit'"),
                        (["--modes", "fast"], "--modes 'fast'"), (["--batches", "8,0"], "--batches: bad value '8,0'"),
                        (["--threads", "0"], "--threads: '0'"), (["--seconds", "inf"], "--seconds: 'inf'")):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and named in proc.stderr, proc.stderr


def test_sigterm_mid_round_stops_the_child_and_removes_the_worktree(tmp_path):
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--before", "HEAD", "--seconds", "30"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        assert proc.stderr.readline() == "round 1: before\n"  # its child is running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.communicate()
    assert not any(Path(tree).is_relative_to(tmp_path) for tree in worktrees(REPO)) and not any(tmp_path.iterdir())


@pytest.mark.parametrize("batches", ["100000", "0", "1,x"])
def test_bad_batches_is_one_line_and_exit_2_before_any_worktree(batches):
    """--batches is the benchmarks' one type (tracker.arguments.batch_list): 100000 was taken and
    allocated whole in each commit's process."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--batches", batches, "--rounds", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"engine_since: argument --batches: bad value {batches!r}; expected comma-separated batch sizes from 1 to 256, e.g. 1,2,4,8"]
