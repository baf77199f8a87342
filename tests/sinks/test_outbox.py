"""The durable outbox on real SQLite files: order, bounds, restarts, and corrupt files."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tmpfs import tmpfs

from tracker.clock import Reading, now
from tracker.errors import InputError
from tracker.sinks.outbox import FILE_RETRY_S, Outbox


class Clock:
    """A machine's clocks: `t` the wall clock (set it to step it, as NTP does), `up` the seconds
    since boot `boot`, `synced` what the kernel says of the wall clock; `advance` moves both."""

    def __init__(self, t: float = 1_000_000.0, synced: bool = True):
        self.t, self.up, self.boot, self.synced = t, 100.0, "boot-1", synced

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.up += seconds

    def reboot(self, t: float, synced: bool) -> None:
        self.t, self.up, self.boot, self.synced = t, 10.0, self.boot + "+", synced

    def __call__(self) -> Reading:
        return Reading(wall=self.t, boot=self.boot, uptime=self.up, synchronized=self.synced)


def test_order_remove_and_duplicate_ids(tmp_path):
    box = Outbox(tmp_path / "o.db")
    seqs = [box.add(f"e{i}", b"payload %d" % i) for i in range(5)]
    assert seqs == [0] * 5  # nothing dropped
    rows = box.pending()
    assert [p for _, p in rows] == [b"payload %d" % i for i in range(5)]
    assert [s for s, _ in rows] == sorted(s for s, _ in rows)
    box.add("e2", b"again")  # an id already stored is not stored twice
    assert len(box) == 5
    assert box.remove(rows[1][0]) and not box.remove(rows[1][0])  # a second ack is harmless
    assert [p for _, p in box.pending(after=rows[0][0], limit=2)] == [b"payload 2", b"payload 3"]
    box.close()


def test_count_bound_drops_the_oldest_and_counts_across_restarts(tmp_path, caplog):
    box = Outbox(tmp_path / "o.db", max_events=3)
    for i in range(7):
        box.add(f"e{i}", b"%d" % i)
    assert [p for _, p in box.pending()] == [b"4", b"5", b"6"] and box.dropped == 4
    assert any("outbox full (3 events)" in r.getMessage() for r in caplog.records)
    box.close()
    again = Outbox(tmp_path / "o.db", max_events=3)  # a restarted guard resumes where it stopped
    assert [p for _, p in again.pending()] == [b"4", b"5", b"6"] and again.dropped == 4
    again.close()


def test_a_full_outbox_is_said_once_when_full_and_once_when_there_is_room_again(tmp_path, caplog):
    """A full outbox logged a warning for every event it dropped: a broker down for days filled
    the journal with one line per event."""
    caplog.set_level(logging.INFO, logger="tracker.sinks.outbox")
    box = Outbox(tmp_path / "o.db", max_events=3)
    for i in range(50):
        box.add(f"e{i}", b"%d" % i)
    assert [r.getMessage() for r in caplog.records] == [
        "outbox full (3 events): each new event now drops the oldest unsent one (1 dropped so far); said again when "
        "there is room"]
    assert box.dropped == 47
    caplog.clear()
    box.remove(box.pending()[0][0])  # the broker is back and acknowledges one
    box.add("fits", b"fits")
    box.add("drops", b"drops")  # full again: a new episode, said again
    assert [r.getMessage() for r in caplog.records] == [
        "outbox has room again: 47 unsent event(s) were dropped while it was full",
        "outbox full (3 events): each new event now drops the oldest unsent one (48 dropped so far); said again when "
        "there is room"]
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"]
    box.close()


def test_age_bound_within_a_boot(tmp_path):
    clock = Clock()
    box = Outbox(tmp_path / "o.db", max_age_s=60, clock=clock)
    box.add("old", b"old")
    clock.advance(50)
    box.add("new", b"new")
    clock.advance(20)  # "old" is 70 s old now, "new" 20 s
    assert box.expire() == 1 and [p for _, p in box.pending()] == [b"new"] and box.dropped == 1
    box.close()
    clock.advance(100)
    reopened = Outbox(tmp_path / "o.db", max_age_s=60, clock=clock)  # expiry also applies at start
    assert len(reopened) == 0 and reopened.dropped == 2
    reopened.close()


def test_events_that_age_out_while_others_wait_are_said_once_not_every_minute(tmp_path, caplog):
    """A broker down for longer than max_age_s, an event a minute: each minutely expire dropped the
    event that had just aged out with a warning of its own, a line a minute for the rest of the
    outage. Said at the first now, and once no event waits any more (the broker back), with the count."""
    caplog.set_level(logging.INFO, logger="tracker.sinks.outbox")
    clock = Clock()
    box = Outbox(tmp_path / "o.db", max_age_s=3600, clock=clock)
    for minute in range(180):
        box.add(f"e{minute}", b"%d" % minute)
        clock.advance(60)
        box.expire()  # as the sink does every minute
    assert box.dropped == 120 and len(box) == 60
    assert [r.getMessage() for r in caplog.records] == [
        "outbox: dropped 1 unsent event(s) older than 3600 s; those that age out next are dropped too, said once no "
        "event waits any more"]
    caplog.clear()
    for seq, _ in box.pending(limit=100):  # the broker is back and acknowledges them all
        box.remove(seq)
    box.expire()
    box.expire()
    assert [r.getMessage() for r in caplog.records] == [
        "outbox: no unsent event waits any more; 120 were dropped in all (the first said above) for being older "
        "than 3600 s"]
    box.close()


def pending(box: Outbox) -> list[bytes]:
    return [payload for _, payload in box.pending()]


def test_a_pi_that_boots_with_an_old_time_and_gets_the_real_one_later_drops_nothing_early(tmp_path):
    """A Pi 3 has no clock of its own: it boots with the time saved at its last shutdown, two weeks
    ago if it was off that long, and steps to the real time when NTP first answers. Events stored
    before that looked two weeks old after it and were dropped by a 7-day bound."""
    week = 7 * 24 * 3600
    clock = Clock(t=1_000_000.0, synced=False)
    box = Outbox(tmp_path / "o.db", max_age_s=week, clock=clock)
    box.add("at the door", b"1")
    clock.advance(600)
    clock.t += 2 * week  # NTP answers: the real time
    clock.synced = True
    assert box.expire() == 0 and pending(box) == [b"1"]
    box.add("later", b"2")
    clock.advance(week - 300)  # the first event is a week old now (by uptime), the second not
    assert box.expire() == 1 and pending(box) == [b"2"] and box.dropped == 1
    box.close()


def test_an_earlier_boots_events_are_aged_by_a_stamp_only_a_synchronized_clock_made(tmp_path):
    clock = Clock(t=1_000_000.0, synced=False)
    box = Outbox(tmp_path / "o.db", max_age_s=1000, clock=clock)
    box.add("before NTP", b"1")
    clock.advance(100)
    clock.t = 5_000_000.0  # NTP: the first event was added at 4,999,900 by this boot's uptime
    clock.synced = True
    box.expire()
    box.add("after NTP", b"2")  # at 5,000,000
    clock.advance(50)
    box.add("never synchronized", b"3")
    box.close()
    clock.reboot(t=4_000_000.0, synced=False)  # an old saved time, no network yet
    box = Outbox(tmp_path / "o.db", max_age_s=1000, clock=clock)
    assert pending(box) == [b"1", b"2", b"3"]  # nothing can be aged by that clock
    clock.advance(600)
    clock.t, clock.synced = 5_000_980.0, True  # NTP again
    assert box.expire() == 1 and pending(box) == [b"2", b"3"]  # 1,080 s since the corrected first stamp
    clock.advance(30)  # the second event is 1,010 s old, the third 960 s (stamped while synchronized)
    assert box.expire() == 1 and pending(box) == [b"3"]
    clock.advance(60)
    assert box.expire() == 1 and pending(box) == []
    box.close()


def test_an_earlier_boots_event_stamped_unsynchronized_is_aged_from_when_this_boot_first_sees_it(tmp_path):
    clock = Clock(t=1_000_000.0, synced=False)
    box = Outbox(tmp_path / "o.db", max_age_s=1000, clock=clock)
    box.add("offline all along", b"1")
    box.close()
    clock.reboot(t=9_000_000.0, synced=True)  # its stamp cannot say how long ago it was
    box = Outbox(tmp_path / "o.db", max_age_s=1000, clock=clock)
    assert pending(box) == [b"1"]
    clock.advance(990)
    assert box.expire() == 0
    clock.advance(20)
    assert box.expire() == 1 and pending(box) == []
    box.close()


def test_an_outbox_of_the_first_format_is_extended_and_keeps_its_events(tmp_path):
    path = tmp_path / "o.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript("""
            CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
                                 created REAL NOT NULL, payload BLOB NOT NULL);
            CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
            INSERT INTO events (id, created, payload) VALUES ('a', 1.0, x'31'), ('b', 2.0, x'32');
            INSERT INTO meta VALUES ('dropped', 3);""")
    clock = Clock(t=10_000_000.0)
    box = Outbox(path, max_age_s=60, clock=clock)  # stamps of 1970: by the old rule, dropped at once
    assert pending(box) == [b"1", b"2"] and box.dropped == 3 and box.recovered_from is None
    box.add("c", b"3")
    clock.advance(61)
    assert box.expire() == 3 and box.dropped == 6
    box.close()


def test_the_machines_clock_reading():
    first, second = now(), now()
    assert first.boot == second.boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert 0 < first.uptime <= second.uptime and isinstance(first.synchronized, bool)


# A seccomp filter that answers adjtimex and clock_adjtime (glibc's adjtimex) with EPERM, as the
# @clock deny of systemd's ProtectClock=yes and SystemCallFilter=~@privileged does: classic BPF
# (load the call's number, two compares, allow or EPERM), installed in a child with ctypes.
DENY_CLOCK_READS = """
import ctypes, logging, platform, struct, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from tracker import clock
calls = {"x86_64": (159, 305), "aarch64": (171, 266)}[platform.machine()]  # adjtimex, clock_adjtime
code = b"".join(struct.pack("HBBI", *insn) for insn in [
    (0x20, 0, 0, 0),                  # A = seccomp_data.nr
    (0x15, 2, 0, calls[0]),           # == adjtimex: to the EPERM below
    (0x15, 1, 0, calls[1]),           # == clock_adjtime: likewise
    (0x06, 0, 0, 0x7FFF0000),         # SECCOMP_RET_ALLOW
    (0x06, 0, 0, 0x00050000 | 1)])    # SECCOMP_RET_ERRNO | EPERM
program = ctypes.create_string_buffer(code)
fprog = struct.pack("HxxxxxxP", len(code) // 8, ctypes.addressof(program))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
print(clock.now().synchronized, clock.now().synchronized)
"""


def test_a_clock_the_sandbox_will_not_let_us_ask_about_is_not_trusted():
    """Under the unit's old ProtectClock=yes adjtimex answered -1, which counted as synchronized:
    stamps a Pi took on its fake-hwclock time before NTP answered were trusted across restarts, and
    the outbox could age an event past its limit at once. Now unknown: untrusted, said once."""
    child = subprocess.run([sys.executable, "-c", DENY_CLOCK_READS], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["False", "False"]
    assert child.stderr.count("clock: the kernel refused adjtimex") == 1, child.stderr


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign schema"])
def test_corrupt_file_is_moved_aside_and_a_new_outbox_started(tmp_path, caplog, damage):
    path = tmp_path / "outbox.sqlite3"
    if damage == "garbage":
        path.write_bytes(b"\x00\x01garbage" * 1000)
    elif damage == "truncated":
        Outbox(path).close()
        db = sqlite3.connect(path)  # grow it in one transaction (one add per commit is slow)
        db.executemany("INSERT INTO events (id, created, payload) VALUES (?, 1e12, ?)",
                       [(f"e{i}", b"x" * 200) for i in range(2000)])
        db.commit()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE events (what TEXT)")
    box = Outbox(path)
    assert box.recovered_from is not None and box.recovered_from.exists()
    assert box.recovered_from.name.startswith("outbox.sqlite3.corrupt-")
    assert len(box) == 0
    box.add("fresh", b"works")
    assert [p for _, p in box.pending()] == [b"works"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "corrupt" in errors[0] and str(box.recovered_from) in errors[0]
    box.close()


def fill(path) -> None:
    """Write zeros to `path` until its file system is full, to the last byte."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (b"\0" * 4096, b"\0"):
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk)


def test_an_age_bound_the_full_disk_refuses_is_said_once_and_applied_once_there_is_room(tmp_path, caplog):
    """The minutely expiry on a full disk was a traceback a minute: it is said once, nothing is
    counted as dropped that the disk kept, and the bound is applied once there is room."""
    clock = Clock()
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        box = Outbox(disk / "outbox.sqlite3", max_events=2, max_age_s=60, clock=clock)
        for event_id in ("a", "b"):
            box.add(event_id, b"x" * 100)
        fill(disk / "filler")
        clock.advance(120)
        with caplog.at_level(logging.ERROR, logger="tracker.sinks.outbox"):
            assert [box.expire() for _ in range(3)] == [0, 0, 0]  # the guard tries every minute
        assert caplog.text.count("cannot drop the events older than 60 s (database or disk is full)") == 1
        assert "Traceback" not in caplog.text and box.dropped == 0 and len(box) == 2
        (disk / "filler").unlink()
        assert box.expire() == 2 and box.dropped == 2
        box.close()
        assert Outbox(disk / "outbox.sqlite3", clock=clock).dropped == 2


def test_events_the_disk_refuses_while_running_are_kept_in_memory_and_go_back_into_the_file(tmp_path, caplog):
    """The disk filled while the guard ran: each event the file refused was dropped and counted,
    though the broker could still take it. The outbox now goes on in memory, a copy of the file
    (same seq numbers, the count bound and the drop count kept; SQLite's own rollback of the
    refused commit counts nothing), says so once, tries the file again at most every FILE_RETRY_S,
    and once the disk takes it the file holds exactly the unsent events again, said once."""
    clock = Clock()
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        box = Outbox(disk / "outbox.sqlite3", max_events=3, clock=clock)
        for event_id in ("a", "b", "c"):
            box.add(event_id, event_id.encode())
        fill(disk / "filler")
        with caplog.at_level(logging.INFO, logger="tracker.sinks.outbox"):
            assert box.add("d", b"d") == 1  # refused by the file; in memory, where the bound drops "a"
            assert not box.durable and box.dropped == 1
            assert box.pending() == [(2, b"b"), (3, b"c"), (4, b"d")]
            assert box.remove(2)  # "b" acknowledged
            box.add("e", b"e")
            (disk / "filler").unlink()  # room again, but the file is not tried at every event
            clock.advance(FILE_RETRY_S / 2)
            box.add("f", b"f")  # the bound drops "c"
            assert not box.durable
            clock.advance(FILE_RETRY_S / 2)
            box.expire()  # the sink's minutely call
            assert box.durable
            box.add("g", b"g")  # into the file again: the bound drops "d"
        said = [r.getMessage() for r in caplog.records if "the disk" in r.getMessage()]  # (not the bound's)
        assert len(said) == 2, said
        assert "the disk refuses writes (database or disk is full): events are kept in memory" in said[0]
        assert "the disk takes writes again: the 3 unsent event(s) kept in memory are in the file again" in said[1]
        box.close()
        again = Outbox(disk / "outbox.sqlite3", clock=clock)
        assert again.pending() == [(5, b"e"), (6, b"f"), (7, b"g")] and again.dropped == 3
        again.close()


def test_events_the_disk_refuses_until_close_are_saved_then_or_said_lost(tmp_path, caplog):
    """The disk still refuses the file when the guard stops: the events only memory held are said
    lost, and the file keeps what it had; with room by then, close() saves them for the next start."""
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        box = Outbox(disk / "outbox.sqlite3")
        box.add("a", b"a")
        fill(disk / "filler")
        box.add("b", b"b")
        box.add("c", b"c")
        with caplog.at_level(logging.ERROR, logger="tracker.sinks.outbox"):
            box.close()
        assert "2 unsent event(s) kept in memory are lost: the disk still refuses writes" in caplog.text
        (disk / "filler").unlink()
        box = Outbox(disk / "outbox.sqlite3")
        assert box.pending() == [(1, b"a")]
        fill(disk / "filler")
        box.add("d", b"d")
        (disk / "filler").unlink()
        box.close()
        assert Outbox(disk / "outbox.sqlite3").pending() == [(1, b"a"), (2, b"d")]


def test_an_outbox_opened_on_a_full_disk_is_kept_in_memory(tmp_path, caplog):
    """SQLite cannot make its -shm and -wal files there (disk I/O error): the guard stopped with
    exit 2, which systemd does not restart; it now goes on, its events sent but not durable."""
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        box = Outbox(disk / "outbox.sqlite3")
        box.add("a", b"x")
        box.close()
        fill(disk / "filler")
        with caplog.at_level(logging.ERROR, logger="tracker.sinks.outbox"):
            in_memory = Outbox(disk / "outbox.sqlite3")
        assert not in_memory.durable and "the disk is full or failing; events are kept in memory" in caplog.text
        assert in_memory.add("b", b"y") == 0 and [p for _, p in in_memory.pending()] == [b"y"]
        in_memory.close()
        (disk / "filler").unlink()
        box = Outbox(disk / "outbox.sqlite3")  # room again: the file, and what it kept
        assert box.durable and [p for _, p in box.pending()] == [b"x"]
        box.close()


def test_an_outbox_kept_in_memory_saves_its_unsent_events_into_the_file_at_close(tmp_path, caplog):
    """A guard started on a full disk keeps its outbox in memory: a clean stop lost its unsent
    events without a word, and the sink said they were "left in the outbox for the next start".
    They are saved into the file now, after the file's own, if the disk has room by then; if it
    still has none, an error says how many are lost."""
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        box = Outbox(disk / "outbox.sqlite3", max_events=3)
        for i in range(5):
            box.add(f"e{i}", b"earlier run")  # the count bound drops two
        for seq, _ in box.pending()[:2]:
            box.remove(seq)  # one waits in the file since an earlier run
        box.close()
        fill(disk / "filler")
        in_memory = Outbox(disk / "outbox.sqlite3", max_events=3)
        assert in_memory.dropped == 2  # the count goes on: it read 0, and Home Assistant took it for a reset
        for i in range(4):
            in_memory.add(f"m{i}", b"%d" % i)  # the count bound drops m0
        in_memory.remove(in_memory.pending()[0][0])  # m1 acknowledged
        (disk / "filler").unlink()  # room again before the stop
        in_memory.close()
        again = Outbox(disk / "outbox.sqlite3", max_events=3)
        assert [p for _, p in again.pending()] == [b"earlier run", b"2", b"3"] and again.dropped == 3
        again.close()

        fill(disk / "filler")
        with caplog.at_level(logging.ERROR, logger="tracker.sinks.outbox"):
            Outbox(disk / "outbox.sqlite3").close()  # nothing new to save: no "0 ... lost" line
        assert "are lost" not in caplog.text
        in_memory = Outbox(disk / "outbox.sqlite3")
        in_memory.add("lost", b"lost")
        with caplog.at_level(logging.ERROR, logger="tracker.sinks.outbox"):
            in_memory.close()  # the disk still full at the stop
        assert "1 unsent event(s) kept in memory are lost: the file still cannot be opened" in caplog.text
        in_memory.close()  # again: nothing (it read its closed database: ProgrammingError)


def test_unopenable_path_is_one_clear_error(tmp_path):
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(InputError, match="mqtt.outbox.path"):
        Outbox(tmp_path / "dir.db")
    assert (tmp_path / "dir.db").is_dir()  # not mistaken for corruption and moved away


def test_bad_bounds_are_refused(tmp_path):
    with pytest.raises(ValueError):
        Outbox(tmp_path / "o.db", max_events=0)


def test_concurrent_adds_and_removes(tmp_path):
    """The publisher, the network thread and the pipeline share one outbox."""
    box = Outbox(tmp_path / "o.db")
    done = threading.Event()
    removed: list[int] = []

    def acker():
        after = 0
        while not done.is_set() or box.pending(after, 1):
            for seq, _ in box.pending(after, 10):
                assert box.remove(seq)
                removed.append(seq)
                after = seq

    thread = threading.Thread(target=acker)
    thread.start()
    for i in range(300):
        box.add(f"e{i}", b"p")
    done.set()
    thread.join(60)
    assert len(removed) == 300 and len(box) == 0
    box.close()
