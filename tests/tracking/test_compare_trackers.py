"""scripts/compare_trackers.py on a sequence: one row per tracker setting, read from eval-mot's table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tracker.tracking.mot import read_mot, write_mot
from tracker.tracking.noisy import noisy_detections

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_trackers.py"


def test_a_sequence_whose_folder_name_holds_a_space(testdata, tmp_path):
    """The name is the table's first cell: read by splitting on spaces, 'TUD Campus' put 'Campus'
    where MOTA was (a ValueError's traceback)."""
    seq = tmp_path / "TUD Campus"
    seq.mkdir()
    gt = read_mot(testdata / "mot" / "TUD-Campus" / "gt.txt", "gt")
    write_mot(seq / "gt.txt", gt)
    write_mot(seq / "det.txt", noisy_detections(gt)[0])
    proc = subprocess.run([sys.executable, str(SCRIPT), str(seq)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "| tracker (online) | TUD Campus MOTA / IDF1 |" and len(lines) == 2 + 5
    for line in lines[2:]:
        mota, idf1 = (float(x) for x in line.split("|")[2].split(" / "))
        assert 50 < mota <= 100 and 50 < idf1 <= 100  # noisy detections of the ground truth track well


def test_a_missing_sequence_is_one_line_and_exit_2(tmp_path):
    """A folder the user named that is not there is their mistake: exit 2, not 1."""
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"compare_trackers.py: {str(tmp_path / 'nope' / 'det.txt')!r}: not found; "
                           "expected a folder with det.txt and gt.txt\n")
