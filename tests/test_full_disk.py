"""A full disk, or a log path that refuses writes, never stops the guard and never leaves half a
line: the events log and the latency log (tracker.files.LineFile) lose the lines the disk refuses,
say so once and count them, and write again when they can; a snapshot the disk refuses leaves its
event without a file. Unit cases on /dev/full and on small tmpfs mounts, then the guard itself."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
from test_pipeline_e2e import run_demo
from tmpfs import tmpfs

from tracker import files
from tracker.files import LineFile
from tracker.latency import FrameLatency, LatencyLog
from tracker.snapshots import SnapshotStore
from tracker.types import Box

LINE = json.dumps({"payload": "x" * 900}) + "\n"  # about 1 kB


def page(folder) -> int:
    """The file system's block: tmpfs gives room in whole pages (4 kB here, 16 or 64 kB on some
    aarch64 kernels)."""
    return os.statvfs(folder).f_frsize


def fill(folder, leave: int) -> None:
    """Fill the file system of `folder` up to `leave` bytes of room."""
    free = os.statvfs(folder).f_bavail * page(folder)
    (folder / "filler").write_bytes(b"\0" * max(0, free - leave))


def test_a_device_that_refuses_every_line_is_logged_once_and_counted(caplog):
    log = LineFile("/dev/full", "events log")
    assert [log.append(LINE) for _ in range(3)] == [False, False, False] and log.lost == 3
    assert caplog.text.count("events log: cannot write /dev/full (No space left on device)") == 1
    latency = LatencyLog("/dev/full")
    latency.write(FrameLatency(1, 0, "b", 0, 0, *([0.0] * 8), 0))
    assert caplog.text.count("latency log: cannot write /dev/full (No space left on device)") == 1
    log.end()
    latency.close()
    # a disk full until the end: the count is said then, as writing again would have said it
    assert "events log: 3 line(s) not written to /dev/full" in caplog.text
    assert "latency log: 1 line(s) not written to /dev/full" in caplog.text


def test_a_line_the_disk_fills_inside_is_taken_back_and_writing_resumes(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        log = LineFile(disk / "events.jsonl", "events log")
        fill(disk, page(disk) + 100)  # room for the file's first page and a bit
        written = 0
        while log.append(LINE):
            written += 1
        assert written == page(disk) // len(LINE) and log.lost == 1  # the page's whole lines
        content = (disk / "events.jsonl").read_text()
        assert content == LINE * written  # whole lines only: the one cut short was taken back
        assert not log.append(LINE) and log.lost == 2
        (disk / "filler").unlink()
        assert log.append(LINE) and (disk / "events.jsonl").read_text() == LINE * (written + 1)
        assert "events log: writing " in caplog.text and "2 line(s) lost meanwhile" in caplog.text
        log.close()


def test_a_snapshot_the_disk_refuses_leaves_no_file_and_its_event_keeps_the_jpeg(tmp_path, caplog):
    with tmpfs(tmp_path / "snaps", "size=64k") as folder:
        store = SnapshotStore(folder, keep=5)
        store.offer(1, np.full((240, 320, 3), 90, np.uint8), Box(10, 10, 200, 200))
        fill(folder, 0)
        path, jpeg = store.save(1, "ev1")
        assert path is None and jpeg[:3] == b"\xff\xd8\xff"
        assert sorted(p.name for p in folder.iterdir()) == ["filler"]  # no half snapshot
        (folder / "filler").unlink()
        path, again = store.save(1, "ev2")
        assert path == str(folder / "ev2.jpg") and again == jpeg
        assert caplog.text.count("snapshots: cannot write") == 1 and "1 snapshot(s) were not kept" in caplog.text


def test_the_guard_guards_on_when_its_logs_and_snapshots_cannot_be_written(tmp_path):
    """The demo with both logs on /dev/full and its snapshot folder read-only: every event still
    reaches the console, each log says once that it cannot write, and the run ends normally."""
    snapshots = tmp_path / "state" / "demo" / "snapshots"
    with tmpfs(snapshots, "ro,size=64k"):
        proc, _ = run_demo(tmp_path, 120, latency={"path": "/dev/full"}, sinks={"jsonl": "/dev/full"})
    printed = [line for line in proc.stdout.splitlines() if " track " in line]
    assert any("entered" in line for line in printed) and any("left" in line for line in printed), proc.stdout
    assert proc.stderr.count("events log: cannot write /dev/full") == 1
    assert proc.stderr.count("latency log: cannot write /dev/full") == 1
    assert proc.stderr.count("snapshots: cannot write") == 1, proc.stderr[-3000:]


def test_a_log_removed_from_under_the_guard_is_made_again(tmp_path, caplog):
    """Writes to a removed file succeed, into an inode nobody can read: the next line makes it anew."""
    log = LineFile(tmp_path / "events.jsonl", "events log")
    assert log.append(LINE)
    (tmp_path / "events.jsonl").unlink()
    assert log.append(LINE) and (tmp_path / "events.jsonl").read_text() == LINE
    assert "events log: " + str(tmp_path / "events.jsonl") + " was removed; writing a new one" in caplog.text
    log.close()


def test_a_log_whose_folder_is_removed_from_under_the_guard_is_made_again_with_its_folder(tmp_path):
    """The folder was never made again: every later line was lost for the rest of the run."""
    folder = tmp_path / "state"
    log = LineFile(folder / "events.jsonl", "events log")
    assert log.append(LINE)
    (folder / "events.jsonl").unlink()
    folder.rmdir()
    assert log.append(LINE) and (folder / "events.jsonl").read_text() == LINE and log.lost == 0
    log.close()


def test_a_rotation_the_file_system_refuses_is_logged_once_and_tried_again_a_minute_later(tmp_path, caplog,
                                                                                         monkeypatch):
    """The lines go on into the current file meanwhile; none is lost. (A refused rename, faked: as
    root here, no permission refuses one.)"""
    clock, refuse, rename = [0], [True], os.replace

    def replace(src, dst):
        if refuse[0]:
            raise PermissionError(1, "Operation not permitted")
        rename(src, dst)

    monkeypatch.setattr(files.time, "monotonic_ns", lambda: clock[0])
    monkeypatch.setattr(files.os, "replace", replace)
    path = tmp_path / "events.jsonl"
    log = LineFile(path, "events log", max_bytes=3 * len(LINE), backups=1)
    assert all(log.append(LINE) for _ in range(6))  # due to rotate from the fourth line
    assert caplog.text.count(f"events log: cannot rotate {path} (Operation not permitted)") == 1
    refuse[0] = False
    clock[0] += files.ROTATION_RETRY_NS - 1
    assert log.append(LINE) and not path.with_name("events.jsonl.1").exists()
    clock[0] += 1
    assert log.append(LINE)
    log.close()
    assert path.with_name("events.jsonl.1").read_text() == LINE * 7 and path.read_text() == LINE


def test_an_atomic_write_of_a_name_of_255_bytes(tmp_path):
    # its temporary file is named after it: a legal name must stay legal with what is added
    for name in ("n" * 250 + ".json", "a." + "b" * 253, "x" * 120 + "." + "y" * 134, "é" * 125 + ".npz"):
        path = tmp_path / name
        files.atomic_write(path, b"{}")
        assert path.read_bytes() == b"{}"
        path.unlink()
        assert list(tmp_path.iterdir()) == []


def test_an_atomic_write_through_a_link_replaces_the_file_it_names(tmp_path):
    """As `cp` and a shell's `>` write: the link stays (`tracker convert --out` a link to the
    model in use replaced the link by a file, and the model stayed as it was). A link to nothing
    makes the file it names."""
    (tmp_path / "models").mkdir()
    target = tmp_path / "models" / "face.onnx"
    target.write_bytes(b"old")
    link = tmp_path / "face.onnx"
    link.symlink_to(target)
    files.atomic_write(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["face.onnx"]  # no temporary left
    dangling = tmp_path / "later.onnx"
    dangling.symlink_to(tmp_path / "models" / "later.onnx")
    files.atomic_write(dangling, b"made")
    assert dangling.is_symlink() and (tmp_path / "models" / "later.onnx").read_bytes() == b"made"


def test_a_line_torn_by_a_crash_is_ended_before_the_next_line(tmp_path, caplog):
    """A guard stopped while it wrote a line (a power cut) leaves part of it at the end of the file:
    the next run's first line was glued to that part, and the reader skipped both as one bad line."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b", "ki', encoding="utf-8")
    log = LineFile(path, "events log")
    assert log.append('{"id": "c"}\n')
    log.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines == ['{"id": "a"}', '{"id": "b", "ki', '{"id": "c"}']
    assert f"events log: {path} ends in part of a line" in caplog.text
    assert log.append('{"id": "d"}\n')  # opened again: it ends in a whole line now, so nothing is added
    log.close()
    assert path.read_text(encoding="utf-8").splitlines()[-2:] == ['{"id": "c"}', '{"id": "d"}']
