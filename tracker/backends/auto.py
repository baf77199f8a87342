"""`auto`: for each batch, the backend this machine measured fastest at that batch size.

The calibration profile is `<state_dir>/profile.json`, written by `tracker --benchmark`
(tracker.bench.profile, schema 1): {"machine": {"cpu", "cores", "arch"}, "results": [{"backend",
"precision", "batch", "ms_per_image"}, ...], "picks": [{"precision", "batch", "backend"}, ...]}.
For a batch of N images at precision P, `auto` looks at the profile's entries of precision P,
takes the smallest batch size measured there >= N (the largest one if N is beyond them all:
per-image time flattens out at large batches), ranks the backends measured at or around it
(`rank_all`: each with its entry at its own smallest measured size >= it) and runs the backend
with the lowest ms_per_image (a cell's median, or a runoff's: see tracker.bench.profile), except
among ties: backends within TIE_MARGIN of the lowest count as tied, and a tie goes to the
profile's recorded pick for that batch size if it is among them, else to the first in the
registry's order. The benchmark
records as the new pick what `rank` puts first given the previous profile's pick, so a pick holds
for as long as it stays within the margin: noise between two benchmark runs cannot swap it
between two engines that are equally fast here, not even when their gap moves across the margin
(the registry's order alone held only while the gap stayed inside it).

Measured sizes are normally 1, 2, 4, ..., 256, so a batch of 3 is served by the winner at 4. Why
up: the batcher hands over at most max_batch crops and usually fewer, a batch of 3 padded into a
batch-4 engine pays about what 4 does, and rounding down would choose for batch 2 a backend whose
per-call overhead was amortised over fewer images than it will see -- at or above is the
conservative side for the small-batch engines that win streaming. At a measured size the pick is
exactly that size's winner.

Without a usable profile -- none yet, unreadable, not schema 1, measured on another machine
(cpu, cores or arch differ from this one's), or without entries for P -- `auto` says why once
(a logging warning) and runs DEFAULTS[P] for every batch: caffe-openblas-dl for fp32 (the
project's own engine, always installed), tf-neon-vfpv4 for int8.

Sub-backends are created on first use and kept (at most `max_live`, default 3, least recently used
closed first: each holds a runtime and a model in memory); they get the same precision, threads
and cache_dir. A sub-backend that cannot be created (its runtime was removed since the profile
was measured, or its worker died while loading: out of memory) is skipped with a warning for the
next fastest at that batch size, then the default. `interrupt()` (the guard is stopping) reaches
every live sub-backend that has one (a worker's: MXNet's), and those created after it.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from tracker.backends.base import Backend, BackendBase
from tracker.backends.registry import REGISTRY
from tracker.errors import BackendFailure, BackendUnavailable, InputError, TrackerError
from tracker.files import read_regular_file
from tracker.model.spec import ModelSpec
from tracker.types import Inference

log = logging.getLogger(__name__)

DEFAULTS = {"fp32": "caffe-openblas-dl", "int8": "tf-neon-vfpv4"}
PROFILE_NAME = "profile.json"
PROFILE_SCHEMA = 1
MAX_PROFILE_BYTES = 4_000_000  # every backend and precision at 256 batch sizes takes about 0.6 MB
DEFAULT_MAX_LIVE = 3
# The bound on auto (1.05x the fastest), so a tie or a held pick stays within it as the
# profile measured it. 3% was too narrow to hold a pick: on the 2-core EPYC VM, in int8 at batch 8,
# ONNX Runtime's runoff median against LiteRT's read -7%, -2%, +4%, +1%, -4%, -2%, -8% and -1% in
# eight benchmark runs on 2026-12-04; replayed on them, 3% and the registry's order alone change
# the pick five times, 5% and the held pick never (README, "Benchmark").
TIE_MARGIN = 0.05


def default_state_dir() -> Path:
    from tracker.config import Config

    return Config().resolved_state_dir()


class UnusableProfile(TrackerError):
    """A profile file exists but cannot be used; the message says why, as a phrase that follows
    the profile's name ("is not a schema-1 profile")."""


def read_profile(path: Path, machine: dict) -> tuple[list[tuple[str, str, int, float]], dict[tuple[str, int], str]]:
    """The measurements and recorded picks of the profile at `path`, which must be a schema-1
    profile of `machine`: ([(backend, precision, batch, ms per image), ...], `recorded_picks`).
    Entries that are malformed, not positive, `auto`'s own, or of a backend or precision this
    version does not have (`_measurable`) are left out: one bad entry does not spoil the others,
    and a backend gone since is never named as `auto`'s pick. The one reader of the file, for
    `auto` and for the benchmark that merges into it; each words what it then does.

    Raises FileNotFoundError when there is none, UnusableProfile when it is unreadable, of
    another schema or of another machine.
    """
    try:  # (a regular file, bounded: a FIFO there hung the guard's start, --list-backends and the benchmark)
        data = json.loads(read_regular_file(path, MAX_PROFILE_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise  # not unusable: none yet, which each caller treats as such
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nested past Python's limit
        raise UnusableProfile(f"is unreadable ({err.__class__.__name__}: {err})") from None
    if (not isinstance(data, dict) or isinstance(data.get("schema"), bool) or data.get("schema") != PROFILE_SCHEMA
            or not isinstance(data.get("results"), list)):  # (true == 1 to Python)
        raise UnusableProfile(f"is not a schema-{PROFILE_SCHEMA} profile")
    if data.get("machine") != machine:
        raise UnusableProfile(f"was measured on another machine ({data.get('machine')}); this one is {machine}")
    measured = []
    for entry in data["results"]:
        try:
            backend, precision = str(entry["backend"]), str(entry["precision"])
            batch, ms = _batch_size(entry["batch"]), float(entry["ms_per_image"])
        except (KeyError, TypeError, ValueError):
            continue
        if _measurable(backend, precision) and batch >= 1 and 0 < ms < float("inf"):
            measured.append((backend, precision, batch, ms))
    return measured, recorded_picks(data)


def _batch_size(value) -> int:
    """A profile entry's batch size: a JSON integer; ValueError for anything else (int() took
    1.7 and true for batch 1, and raised OverflowError for Infinity)."""
    if type(value) is not int:
        raise ValueError(f"batch {value!r} is not an integer")
    return value


def _measurable(backend: str, precision: str) -> bool:
    """Whether `backend` is one `auto` may pick and has `precision` (a registered backend other
    than `auto`; importing its class imports no runtime)."""
    from tracker.backends.registry import backend_class

    return backend in REGISTRY and backend != "auto" and precision in backend_class(backend).precisions


def load_profile(state_dir: Path, shown: str | None = None) -> tuple[dict[str, dict[int, list[tuple[float, str]]]],
                                                                     str | None]:
    """The profile's ranking per precision and batch -- {precision: {batch: [(ms, backend), ...]
    best first (`rank`)}} -- or ({}, why it cannot be used), naming the profile as `shown` (the web
    page's "this device's calibration profile": its visitors are not told the guard's paths) or
    by its path."""
    from tracker.machine import machine_key

    path = Path(state_dir) / PROFILE_NAME
    shown = shown or f"calibration profile {path}"
    try:
        measured, picks = read_profile(path, machine_key())
    except FileNotFoundError:
        return {}, f"{shown} does not exist (run `tracker --benchmark --backend all` to measure this machine)"
    except UnusableProfile as err:
        return {}, f"{shown} {err}; ignoring it"
    ranking = rank_all(measured, picks)
    if not ranking:
        return {}, f"{shown} has no measurements; ignoring it"
    return ranking, None


def rank(candidates: list[tuple[float, str]], held: str | None = None) -> list[tuple[float, str]]:
    """(ms, backend) fastest first, except that those within TIE_MARGIN of the fastest come first,
    `held` (the recorded pick) first among them, then in the registry's order (see the module
    docstring)."""
    order = list(REGISTRY)
    ordered = sorted(candidates)
    tied = [c for c in ordered if c[0] <= ordered[0][0] * (1 + TIE_MARGIN)]
    tied.sort(key=lambda c: (c[1] != held, order.index(c[1]) if c[1] in order else len(order)))
    return tied + ordered[len(tied):]


def rank_all(measured: Iterable[tuple[str, str, int, float]],
             held: dict[tuple[str, int], str]) -> dict[str, dict[int, list[tuple[float, str]]]]:
    """(backend, precision, batch, ms per image) entries ranked per precision and batch size:
    {precision: {batch: rank(candidates, held.get((precision, batch)))}} for every batch size
    measured at that precision. The candidates at a size are the backends of that precision
    measured at it or at sizes on both sides of it, each with its time at its own nearest measured
    size at or above (`measured_batch`). Not only those measured at that size: a profile merges
    runs, and a run of one slow backend at sizes no other was measured at left it alone, and so
    `auto`'s pick, there. Not those measured on one side only: a backend whose cell failed at a
    size (the benchmark then drops its entry) is not taken to run there, and a time measured at
    large batches says nothing of a small one."""
    times: dict[str, dict[str, dict[int, float]]] = {}  # precision -> backend -> batch -> ms
    for backend, precision, batch, ms in measured:
        times.setdefault(precision, {}).setdefault(backend, {})[batch] = ms
    ranking: dict[str, dict[int, list[tuple[float, str]]]] = {}
    for precision, per_backend in times.items():
        batches = sorted({batch for per_batch in per_backend.values() for batch in per_batch})
        ranking[precision] = {
            batch: rank([(per_batch[measured_batch(per_batch, batch)], backend) for backend, per_batch in per_backend.items()
                         if min(per_batch) <= batch <= max(per_batch)],
                        held.get((precision, batch)))
            for batch in batches}
    return ranking


def recorded_picks(profile: dict) -> dict[tuple[str, int], str]:
    """A profile document's "picks" as {(precision, batch): backend}; malformed or missing
    entries are left out (a profile without picks ranks by the registry's order alone)."""
    entries = profile.get("picks")
    picks: dict[tuple[str, int], str] = {}
    for entry in entries if isinstance(entries, list) else ():
        try:
            picks[(str(entry["precision"]), _batch_size(entry["batch"]))] = str(entry["backend"])
        except (KeyError, TypeError, ValueError):
            continue
    return picks


def measured_batch(batches, n: int) -> int:
    """The smallest measured batch size >= n, else the largest measured."""
    above = [b for b in batches if b >= n]
    return min(above) if above else max(batches)


def describe_picks(state_dir: Path, runs_here: Callable[[str], bool] = lambda name: True,
                   shown: str | None = None) -> list[tuple[int, str, str]]:
    """What `auto` would run: (batch, backend, precision) for every measured batch size of every
    precision in the profile (for `tracker --list-backends`), skipping, as `Auto` does, backends
    for which `runs_here(name)` is False (the caller knows: it probed them). TrackerError saying
    why when the profile cannot be used (and what `auto` then runs), naming it as `shown` (see
    load_profile)."""
    ranking, why = load_profile(Path(state_dir), shown)
    if why:
        raise TrackerError(f"{why}; auto runs {DEFAULTS['fp32']} (fp32) / {DEFAULTS['int8']} (int8)")
    return [(batch, next((name for _, name in per_batch[batch] if runs_here(name)), DEFAULTS[precision]), precision)
            for precision, per_batch in sorted(ranking.items()) for batch in sorted(per_batch)]


class Auto(BackendBase):
    """Options: state_dir (where profile.json is; default the config's state dir), cache_dir
    (passed to sub-backends), max_live (sub-backends kept, default 3)."""

    name = "auto"
    precisions = ("fp32", "int8")

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, **options):
        from tracker.backends.base import check_options

        check_options(self.name, options, ("state_dir", "cache_dir", "max_live"))
        self.model, self.precision, self.threads = model, precision, threads
        self._cache_dir = options.get("cache_dir")
        self._max_live = int(options.get("max_live", DEFAULT_MAX_LIVE))
        if self._max_live < 1:
            raise InputError(f"backend 'auto': max_live {self._max_live}; expected >= 1")
        state_dir = options.get("state_dir")
        ranking, why = load_profile(Path(state_dir) if state_dir is not None else default_state_dir())
        self._ranking = ranking.get(precision, {})
        if why is None and not self._ranking:
            why = f"the calibration profile has no {precision} measurements"
        if why:
            log.warning("auto: %s; running %s for every batch size", why, DEFAULTS[precision])
        self._live: OrderedDict[str, Backend] = OrderedDict()
        self._choice: dict[int, str] = {}  # batch size -> backend that serves it (bounded by max batch seen)
        self._broken: set[str] = set()
        self._interrupted = False

    def candidates(self, n: int) -> list[str]:
        """Backends for a batch of `n`, best first, ending with the default."""
        names = []
        if self._ranking:
            names = [b for _, b in self._ranking[measured_batch(self._ranking, n)]]
        return [b for b in dict.fromkeys(names + [DEFAULTS[self.precision]]) if b not in self._broken]

    def pick(self, n: int) -> str:
        """The backend `auto` runs for a batch of `n` (creating nothing)."""
        return self._choice.get(n) or self.candidates(n)[0]

    def _backend(self, n: int) -> Backend:
        chosen = self._choice.get(n)
        if chosen is not None and chosen in self._live:
            self._live.move_to_end(chosen)
            return self._live[chosen]
        from tracker.backends import create_backend

        names = self.candidates(n)
        for name in names:
            if name in self._live:
                backend = self._live[name]
                self._live.move_to_end(name)
                break
            options = {"cache_dir": self._cache_dir} if self._cache_dir is not None else {}
            try:
                backend = create_backend(name, self.model, precision=self.precision, threads=self.threads, **options)
            except (BackendUnavailable, InputError, BackendFailure) as err:
                if name == names[-1]:  # none left to fall back on (the default is last, or ranked above it)
                    raise
                log.warning("auto: cannot create %s for batch %d (%s); using the next fastest", name, n, err)
                self._broken.add(name)
                self._choice.clear()
                continue
            if len(self._live) >= self._max_live:
                _, old = self._live.popitem(last=False)
                old.close()
            self._live[name] = backend
            if self._interrupted:  # the stop came while it was being made
                self.interrupt()
            break
        self._choice[n] = name
        return backend

    def interrupt(self) -> None:
        """The guard is stopping (may be called from a signal handler): a live sub-backend's call
        that waits ends at once (see RestartingBackend.interrupt)."""
        self._interrupted = True
        for backend in list(self._live.values()):
            interrupt = getattr(backend, "interrupt", None)
            if interrupt is not None:
                interrupt()

    def infer(self, x) -> Inference:
        n = x.shape[0] if hasattr(x, "shape") and len(x.shape) else 0
        if n < 1:
            raise InputError(f"backend 'auto': input of shape {getattr(x, 'shape', type(x).__name__)}; "
                             f"expected (N, C, H, W) float32 with N >= 1")
        return self._backend(n).infer(x)

    def close(self) -> None:
        while self._live:
            self._live.popitem(last=False)[1].close()
