"""The durable event outbox: a small SQLite file (WAL) that holds every event until the broker
acknowledges it, so a broker outage, a crash or a restart of the guard loses nothing.

Contract (the MQTT sink is the only user; this module knows nothing about MQTT):
- `add(event_id, payload)` commits the event to disk (synchronous=FULL) before it returns, so an
  event is durable before anything tries to send it. Adding an id that is already there is a no-op.
- Events keep the order they were added in: `seq` is an increasing integer; `pending(after, limit)`
  returns `(seq, payload)` rows with seq > after, oldest first.
- `remove(seq)` deletes an event once it is acknowledged; `remove(seq, dropped=True)` one that will
  never be sent (the broker refused it, or it is larger than the broker accepts), counted in
  `dropped` in the same commit.
- Bounded: at most `max_events` rows and none older than `max_age_s` seconds. Beyond either bound
  the oldest rows are deleted and counted in `dropped`, which is kept in the file too, so the count
  survives restarts. A full outbox is said once when it becomes full and once when an event fits
  again (with how many were dropped meanwhile), not at every event it drops (a broker down for
  days would fill the journal); so are events that age out while others wait: said at the first,
  and once no event waits any more (with how many aged out), not at every `expire`. An event's age
  is never overestimated, because a Pi without network has no real time to stamp with (see
  tracker.clock): each row keeps the boot it was added in and the uptime then, beside its
  wall-clock stamp and whether that stamp came from a synchronized clock.
  Within one boot the age is the uptime since; a stamp taken unsynchronized is corrected from the
  uptime once the clock is synchronized; a row of an earlier boot is aged by its wall-clock stamp
  while the clock is synchronized, and if that stamp was never trustworthy, from the moment this
  boot first saw the row (a lower bound: such a row is kept longer, never dropped early).
- A file that is not a healthy SQLite database is renamed `<name>.corrupt-<UTC timestamp>` (with its
  -wal/-shm companions), an error is logged, and a new empty outbox is started; `recovered_from`
  then names the renamed file.
- A disk that is full or failing (SQLite's FULL or IOERR) loses no event while it can still be
  sent: the outbox is kept in memory instead (`durable` False; a crash loses what only memory
  holds), within the same bounds, and events go out as usual. Said once when it happens and once
  when it is over, not at every event:
  - when the file cannot be opened at start, the memory outbox starts empty (the file's own events
    wait there for a later start); `close()` saves the events still unsent into the file, for the
    next start, if the disk takes them by then, and otherwise says how many are lost;
  - when `add` cannot write the file while the guard runs, the memory outbox starts as a copy of
    the file (same seq numbers, so a caller's cursor stays valid) and takes the event. The whole
    outbox is written back into the file once the disk takes it: tried by `add` and `expire` at
    most every FILE_RETRY_S seconds (a write that fails costs a full copy), and by `close()`, which
    otherwise says how many events only memory held and are lost.
  Any other failure to open it is the path's fault: InputError.
Thread-safe: one connection guarded by a lock (the sink's publisher and MQTT network threads share it).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path

from tracker.clock import Reading, now
from tracker.errors import InputError

log = logging.getLogger(__name__)

# Columns added since the first outboxes (which `_open` extends in place; their rows get these
# defaults, so their age counts from the first start of this version: their stamps' clock is unknown).
# boot: the boot `uptime` counts from; uptime: seconds since that boot when the row was added (or
# first seen in that boot); trusted: 1 if `created` came from a synchronized clock (or was corrected
# from one).
_BOOT_COLUMNS = ("boot TEXT NOT NULL DEFAULT ''", "uptime REAL NOT NULL DEFAULT 0", "trusted INTEGER NOT NULL DEFAULT 0")
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    id      TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,          -- wall-clock Unix seconds when added
    payload BLOB NOT NULL,
    {", ".join(_BOOT_COLUMNS)}
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
_FIRST_COLUMNS = ["seq", "id", "created", "payload"]
_COLUMNS = _FIRST_COLUMNS + [column.split()[0] for column in _BOOT_COLUMNS]


_DISK_TROUBLE = {10, 13}  # SQLite's primary result codes IOERR and FULL
FILE_RETRY_S = 60.0  # while the disk refuses the file at run time: how often the outbox tries it again
_TABLES = {"events", "meta", "sqlite_sequence"}  # an outbox's (sqlite_sequence: AUTOINCREMENT's)


def foreign_database(path: Path) -> str | None:
    """What the SQLite database at `path` is instead of an outbox ("an SQLite database of other
    tables (...)"), or None: no file, an outbox (of either column set), or a file that cannot be
    read as a database (not one, or damaged: the outbox moves it aside at start). Opened read-only,
    for the checks before a run: the outbox's own open would move another program's database aside
    as corrupt, or add its tables to it (Home Assistant's database has an `events` table too)."""
    try:
        db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    except (sqlite3.Error, OSError):
        return None
    try:
        tables = sorted(row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        columns = [row[1] for row in db.execute("PRAGMA table_info(events)")]
    except sqlite3.Error:
        return None
    finally:
        db.close()
    if set(tables) <= _TABLES and ("events" not in tables or columns in (_FIRST_COLUMNS, _COLUMNS)):
        return None
    return f"an SQLite database of other tables ({', '.join(tables)})"


class Outbox:
    def __init__(self, path: Path, max_events: int = 10_000, max_age_s: float = 7 * 24 * 3600,
                 clock: Callable[[], Reading] = now):
        if max_events < 1 or max_age_s <= 0:
            raise ValueError(f"outbox bounds must be positive (max_events={max_events}, max_age_s={max_age_s})")
        self.path = Path(path)
        self.max_events = max_events
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self.recovered_from: Path | None = None
        self.durable = True
        # while the disk refuses writes at run time: the file's connection, written back into every
        # FILE_RETRY_S (from `_retry_at`, the clock's uptime)
        self._refusing_file: sqlite3.Connection | None = None
        self._retry_at = 0.0
        self._dropped_in_file = 0  # an outbox kept in memory from the start: the file's drop count then
        self._closed = False
        self._expire_failing = False  # the last expire() could not write (logged once)
        self._full_since_dropped: int | None = None  # while full (said once): `dropped` when it became full
        self._aged_out: int | None = None  # while events age out with others waiting (said once): how many so far
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._open(self.path)
        except sqlite3.OperationalError as err:
            if not _disk_trouble(err):  # a setup problem, not the disk
                raise InputError(f"outbox {str(self.path)!r}: cannot open ({err}); expected a writable file path "
                                 "(mqtt.outbox.path)") from None
            log.error("outbox %s: cannot open (%s): the disk is full or failing; events are kept in memory, saved into "
                      "the file at a clean stop if the disk has room by then (a crash loses them); free some space",
                      self.path, err)
            self.durable = False
            self._db = self._open(":memory:")
            # the count goes on from the file's (Home Assistant's total_increasing must never see it fall)
            self._dropped_in_file = _dropped_read_only(self.path)
            _store_dropped(self._db, self._dropped_in_file)
        except sqlite3.DatabaseError as err:  # not a database, malformed, or not our schema
            self.recovered_from = self._move_aside(err)
            self._db = self._open(self.path)
        self._dropped = _read_dropped(self._db)
        self.expire()

    # -- opening and recovery -------------------------------------------------------------------

    def _open(self, target: Path | str) -> sqlite3.Connection:
        db = sqlite3.connect(target, timeout=5.0, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # an added event survives power loss
            status = db.execute("PRAGMA quick_check").fetchone()[0]
            if status != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {status}")
            db.executescript(_SCHEMA)
            columns = [row[1] for row in db.execute("PRAGMA table_info(events)")]
            if columns == _FIRST_COLUMNS:  # all columns or none: a half-extended table would read as foreign
                db.executescript("BEGIN IMMEDIATE;" + "".join(f"ALTER TABLE events ADD COLUMN {c};" for c in _BOOT_COLUMNS)
                                 + "COMMIT;")
                columns = _COLUMNS
            if columns != _COLUMNS:
                raise sqlite3.DatabaseError(f"unexpected events table columns {columns}")
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _move_aside(self, err: Exception) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            part = Path(str(self.path) + suffix)
            if part.exists():
                part.rename(Path(str(target) + suffix))
        log.error(
            "outbox %s is corrupt (%s): moved it aside to %s and started a new, empty outbox; "
            "events that were waiting in it are not sent",
            self.path, err, target,
        )
        return target

    # -- the contract ---------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Events deleted unsent (the bounds, `remove(dropped=True)`), since the file was created."""
        return self._dropped

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0]

    def add(self, event_id: str, payload: bytes) -> int:
        """Store one event, durably unless the disk refuses it (then in memory, as the module
        docstring says); returns how many older events the count bound dropped."""
        with self._lock:
            reading = self._clock()
            self._retry_file(reading)
            try:
                excess = self._insert(event_id, payload, reading)
            except sqlite3.OperationalError as err:
                if not (self.durable and _disk_trouble(err)):
                    raise
                self._keep_in_memory(err, reading)
                excess = self._insert(event_id, payload, reading)
            self._dropped += excess  # only once committed: a failed commit dropped nothing
            news: tuple | None = None  # (level, message, args): said once the lock is released
            if excess and self._full_since_dropped is None:
                self._full_since_dropped = self._dropped - excess
                news = (logging.WARNING, "outbox full (%d events): each new event now drops the oldest unsent one "
                        "(%d dropped so far); said again when there is room", self.max_events, self._dropped)
            elif not excess and self._full_since_dropped is not None:
                news = (logging.INFO, "outbox has room again: %d unsent event(s) were dropped while it was full",
                        self._dropped - self._full_since_dropped)
                self._full_since_dropped = None
        if news is not None:
            log.log(*news)
        return excess

    def _insert(self, event_id: str, payload: bytes, reading: Reading) -> int:
        """One event added and the count bound applied, in one commit (lock held); returns how many
        older events the bound dropped."""
        with _transaction(self._db):
            self._db.execute(
                "INSERT OR IGNORE INTO events (id, created, payload, boot, uptime, trusted) VALUES (?, ?, ?, ?, ?, ?)",
                (event_id, reading.wall, bytes(payload), reading.boot, reading.uptime, int(reading.synchronized)),
            )
            return _trim(self._db, self.max_events, self._dropped)

    def _keep_in_memory(self, err: sqlite3.Error, reading: Reading) -> None:
        """The disk refused a write to the file (lock held): go on with a copy of the file in memory
        (its events, seq numbers and drop count), the file kept open to write the copy back into."""
        memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            self._db.backup(memory)  # reads only: a full disk allows it
        except sqlite3.Error:
            memory.close()
            raise err from None  # the write's failure is the one to report
        self._refusing_file, self._db = self._db, memory
        self.durable = False
        self._retry_at = reading.uptime + FILE_RETRY_S
        log.error("outbox %s: the disk refuses writes (%s): events are kept in memory (at most %d) and sent as usual, "
                  "written back into the file once the disk takes them (tried every %.0f s; a crash loses them); "
                  "free some space", self.path, err, self.max_events, FILE_RETRY_S)

    def _retry_file(self, reading: Reading) -> None:
        """Write the memory outbox back into the file that refused a write, if the last try was
        FILE_RETRY_S ago, and go on with the file if the disk takes it (lock held)."""
        if self._refusing_file is None or reading.uptime < self._retry_at:
            return
        self._retry_at = reading.uptime + FILE_RETRY_S
        if self._write_back(self._refusing_file):
            log.info("outbox %s: the disk takes writes again: the %d unsent event(s) kept in memory are in the file "
                     "again", self.path, self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0])

    def _write_back(self, file: sqlite3.Connection) -> bool:
        """The memory outbox copied over `file`, the file that refused a write, in one commit (lock
        held): the file then holds exactly the unsent events and the drop count, and is the outbox
        again. False (and nothing changed) if the disk still refuses it."""
        try:
            self._db.backup(file)
        except sqlite3.Error as err:
            log.debug("outbox %s: the disk still refuses writes (%s)", self.path, err)
            return False
        self._db.close()
        self._db, self._refusing_file = file, None
        self.durable = True
        return True

    def pending(self, after: int = 0, limit: int = 100) -> list[tuple[int, bytes]]:
        """Up to `limit` events with seq > `after`, oldest first, as (seq, payload)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        return [(int(seq), bytes(payload)) for seq, payload in rows]

    def remove(self, seq: int, dropped: bool = False) -> bool:
        """Delete an acknowledged event, or (`dropped`) one that will never be sent, counted in `dropped`
        in the same commit (so the count survives restarts, as the bounds' drops do, and a deletion
        the disk refuses counts nothing); False if it was already gone (dropped by a bound, or
        removed twice: counted once)."""
        with self._lock:
            if not dropped:
                return self._db.execute("DELETE FROM events WHERE seq = ?", (seq,)).rowcount > 0
            with _transaction(self._db):
                gone = self._db.execute("DELETE FROM events WHERE seq = ?", (seq,)).rowcount
                if gone:
                    _store_dropped(self._db, self._dropped + gone)
            self._dropped += gone
            return gone > 0

    def expire(self) -> int:
        """Drop (and count) events older than max_age_s (aged as the module docstring says);
        returns how many. Said as the module docstring says (once while others wait: the sink calls
        it every minute, and a broker down longer than max_age_s has events age out at most calls).
        A disk that refuses the deletion (full) is logged once until it works again, without a
        traceback: the rows stay, to be dropped by a later call."""
        try:
            with self._lock:
                reading = self._clock()
                self._retry_file(reading)
                at = {"boot": reading.boot, "uptime": reading.uptime, "wall": reading.wall,
                      "synchronized": reading.synchronized, "age": self.max_age_s}
                with _transaction(self._db):
                    # rows of an earlier boot whose stamp was never trustworthy: aged from now on
                    self._db.execute("UPDATE events SET boot = :boot, uptime = :uptime WHERE boot != :boot AND NOT trusted", at)
                    if reading.synchronized:  # this boot's stamps taken before the clock was set, set right
                        self._db.execute("UPDATE events SET created = :wall - (:uptime - uptime), trusted = 1 "
                                         "WHERE boot = :boot AND NOT trusted", at)
                    gone = self._db.execute(
                        "DELETE FROM events WHERE CASE WHEN boot = :boot THEN uptime < :uptime - :age "
                        "ELSE created < :wall - :age AND :synchronized END", at).rowcount
                    if gone:
                        _store_dropped(self._db, self._dropped + gone)
                self._dropped += gone
                waiting = (gone or self._aged_out is not None) and self._db.execute(
                    "SELECT EXISTS (SELECT 1 FROM events)").fetchone()[0]
        except sqlite3.Error as err:
            if not self._expire_failing:
                log.error("outbox: cannot drop the events older than %.0f s (%s); tried again every minute",
                          self.max_age_s, err)
            self._expire_failing = True
            return 0
        self._expire_failing = False
        aged_out = (self._aged_out or 0) + gone  # in this episode
        if gone and self._aged_out is None:
            log.warning("outbox: dropped %d unsent event(s) older than %.0f s%s", gone, self.max_age_s,
                        "; those that age out next are dropped too, said once no event waits any more" if waiting else "")
        if waiting:
            self._aged_out = aged_out if aged_out else None
        elif self._aged_out is not None:
            log.info("outbox: no unsent event waits any more; %d were dropped in all (the first said above) for "
                     "being older than %.0f s", aged_out, self.max_age_s)
            self._aged_out = None
        return gone

    def close(self) -> None:
        """Close the database. An outbox kept in memory first saves its unsent events (and its drop
        count) into the file: all of them over the file's copy if the disk refused a write at run
        time (`_write_back`), else appended to the file's own (`_save_to_file`). Closing again does
        nothing (an outbox kept in memory would read its closed database)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._refusing_file is not None:
                self._close_refusing_file(self._refusing_file)
            elif not self.durable:
                self._save_to_file()
            self._db.close()

    def _close_refusing_file(self, file: sqlite3.Connection) -> None:
        """At close, the memory outbox written back into `file`, which refused a write at run time
        (lock held); if the disk still refuses it, an error says how many unsent events only memory
        held, if any: they are lost (the file keeps what it held then: sent again by the next start,
        the delivered ones too)."""
        if self._write_back(file):
            log.info("outbox %s: %d unsent event(s) kept in memory saved to the file, for the next start",
                     self.path, self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
            return
        file_last = file.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
        lost = self._db.execute("SELECT COUNT(*) FROM events WHERE seq > ?", (file_last,)).fetchone()[0]
        if lost:
            log.error("outbox %s: %d unsent event(s) kept in memory are lost: the disk still refuses writes",
                      self.path, lost)
        file.close()
        self._refusing_file = None

    def _save_to_file(self) -> None:
        """The memory outbox's unsent events appended to the file's, oldest first, with their ages
        and ids (lock held): the disk that refused the file at start may take them now (a full disk
        freed), and they are then sent by the next start, as a durable outbox's are. What the disk
        still refuses is lost: an error says how many."""
        columns = _COLUMNS[1:]  # all but seq: the file numbers them after its own
        rows = self._db.execute(f"SELECT {', '.join(columns)} FROM events ORDER BY seq").fetchall()
        if not rows and self._dropped == self._dropped_in_file:  # nothing the file does not hold already
            return
        try:
            db = self._open(self.path)
        except sqlite3.DatabaseError as err:  # still full or failing, or damaged: not moved aside now
            log.error("outbox %s: %d unsent event(s) kept in memory are lost: the file still cannot be opened (%s)",
                      self.path, len(rows), err)
            return
        try:
            with _transaction(db):
                db.executemany(f"INSERT OR IGNORE INTO events ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                               rows)
                # the drops made in memory counted too (the memory's count started from the file's)
                dropped = _read_dropped(db) + self._dropped - self._dropped_in_file
                _store_dropped(db, dropped)
                _trim(db, self.max_events, dropped)
        except sqlite3.Error as err:
            log.error("outbox %s: %d unsent event(s) kept in memory are lost: the file refused them (%s)",
                      self.path, len(rows), err)
        else:
            log.info("outbox %s: %d unsent event(s) kept in memory saved to the file, for the next start",
                     self.path, len(rows))
        finally:
            db.close()


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT on `db` (its lock held). On a failure the transaction is rolled
    back, unless SQLite already has (it does so itself on a full disk), and the failure itself is raised."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with suppress(sqlite3.Error):  # the failure that got us here is the one to report
                db.execute("ROLLBACK")
        raise


def _disk_trouble(err: sqlite3.Error) -> bool:
    """Whether SQLite's `err` is the disk's (full or failing), not the file's or the caller's."""
    return (getattr(err, "sqlite_errorcode", 0) & 0xFF) in _DISK_TROUBLE


def _dropped_read_only(path: Path) -> int:
    """The drop count in the outbox file at `path`, read without writing anything (the disk refuses
    writes; a WAL database opened read-only still needs its -shm file, so as an immutable file if
    that fails: a cleanly closed outbox has nothing in its -wal); 0 if it cannot be read at all, or
    (missed) when a crash left the count in the -wal and its -shm is gone too."""
    for mode in ("mode=ro", "immutable=1"):
        try:
            db = sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True)
            try:
                return _read_dropped(db)
            finally:
                db.close()
        except sqlite3.Error:
            continue
    return 0


def _read_dropped(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM meta WHERE key='dropped'").fetchone()
    return int(row[0]) if row else 0


def _store_dropped(db: sqlite3.Connection, total: int) -> None:
    db.execute(
        "INSERT INTO meta (key, value) VALUES ('dropped', ?) ON CONFLICT(key) DO UPDATE SET value = ?",
        (total, total),
    )


def _trim(db: sqlite3.Connection, max_events: int, dropped: int) -> int:
    """Delete the oldest events beyond `max_events` (in a transaction of `db`), storing the drop
    count, `dropped` so far plus these, if there were any; returns how many it deleted."""
    count = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    excess = max(0, count - max_events)
    if excess:
        db.execute("DELETE FROM events WHERE seq IN (SELECT seq FROM events ORDER BY seq LIMIT ?)", (excess,))
        _store_dropped(db, dropped + excess)
    return excess
