"""`tracker --benchmark` and `tracker --list-backends`: checking the request, then the run.

Order of a run: every user mistake is found before anything is measured (backend names,
precisions, the output directory, the model files and the blobs read from them, runtimes of
explicitly named backends); then, with --detectors, the detectors' benchmark (tracker.bench.detectors);
then the sgemm peak; then one child per cell, backend after backend, batch sizes ascending; then,
when the run writes the calibration profile, the runoffs of the fastest cells' backends
(tracker.bench.runoff), one child each; then `auto`'s columns, which read that profile. After each
cell and runoff results.json, results.csv and the profile are rewritten, after each column the plots
(a file that cannot be written is a warning: the measurements stay in memory and are printed at the
end). Ctrl-C, SIGTERM or SIGHUP kills the running child and everything below it, prints what was
measured and exits 130; stopped before its first cell ended, a run writes nothing, so the files of
an earlier run into the same --out stay as they were, and the web page goes on showing that run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import tracker.bench.runoff as runoff
from tracker.arguments import comma_names
from tracker.backends import REGISTRY, precision_refused, run_options
from tracker.bench.memory_cap import cap_method
from tracker.bench.profile import profile_path, record_last_run, recorded_at_start, update_profile
from tracker.bench.report import Column, Results, make_row, prepare_out, quality_line, runoff_line, summary_line
from tracker.bench.runner import Probe, probe_backends, run_cell, run_job
from tracker.errors import BackendUnavailable, InputError, TrackerError
from tracker.interrupts import interrupts_held, stop_as_ctrl_c
from tracker.machine import base_versions, cores, load_average, machine_info, machine_key, memory_mb, sgemm_peak
from tracker.model.engine import check_net
from tracker.model.spec import ModelSpec, check_outputs

SEED = 0  # the benchmark's input batch: np.random.default_rng(SEED), standard normal float32
DEFAULT_TIMEOUT_S = 600.0
# Untimed passes before a cell's timed ones: one, then more for this long after it (a backend may
# load on its first call): the first passes of a fresh process are not its steady state. With one warm-up pass
# (docs/benchmark-epyc-genoa-2core/one-warmup-pass/results.json, 30 timed passes) the Caffe
# engine's batch-1 passes 5-14 took 4.1 falling to 2.0 ms (its thread tuner's first passes on two
# cores) against 1.5-1.8 after, and ONNX Runtime's passes 3-4 took 0.96 against 0.47-0.57 after:
# a transient that moves the median of 30 passes. A guard runs for hours; its steady state is what
# the table is for.
DEFAULT_WARMUP_S = 1.0


def parse_backend_names(text: str, given_by: str) -> tuple[list[str], bool]:
    """`a,b` or `all` -> (registered names in order, whether `all` was asked); a mistake is named
    by `given_by`, the option or config key the text came from."""
    return comma_names(text, list(REGISTRY), given_by, "backend")


def _entries(names: list[str]) -> list[tuple[str, list]]:
    """(name, registry entry as a list) for the children, which rebuild the entry field by field."""
    return [(name, list(REGISTRY[name])) for name in names]


def _model(config) -> tuple[ModelSpec, dict]:
    """The ModelSpec to run and what the benchmark needs to know of it (loads and checks both files)."""
    from tracker.model.caffe_io import load_net
    from tracker.model.shapes import count_macs, count_params

    spec = config.model.spec()
    netdef = load_net(spec.prototxt, spec.weights)
    check_net(netdef)  # as every cell would (one input, layers the engine runs, activations within bounds)
    check_outputs(spec, netdef)  # every cell would fail on it, and the profile would lose its backends
    (shape,) = netdef.inputs.values()
    info: dict = {
        "prototxt": str(spec.prototxt),
        "weights": str(spec.weights),
        "input_shape": list(shape[1:]),
        "params": count_params(netdef),
        "macs_per_image": count_macs(netdef, 1),
    }
    info["flops_per_image"] = 2 * info["macs_per_image"]
    return spec, info


def _columns(names: list[str], probes: dict[str, Probe], precision: str | None, explicit: bool) -> list[Column]:
    """The (backend, precision) pairs to run: one precision if asked for, else each one a backend offers."""
    if precision is not None:
        lacking = [n for n in names if probes[n].available and precision not in probes[n].precisions]
        if explicit and lacking:
            raise precision_refused("--precision", lacking[0], precision)
        return [Column(n, precision) for n in names if probes[n].available and precision in probes[n].precisions]
    return [Column(n, p) for n in names if probes[n].available for p in probes[n].precisions]


def _backend_options(name: str, state_dir: Path, worker: bool = False) -> dict:
    """Constructor options beyond the contract's; `auto` needs to know where the profile is;
    `worker` runs the backend in a worker child (create_backend(worker=True))."""
    options = run_options(name, state_dir)
    return {**options, "worker": True} if worker else options


def _busy(load: list[float] | None, cores: int) -> str | None:
    """Why the machine counts as busy for calibrating `auto` (its 1-minute load average above its
    core count: more runnable threads than cores), or None."""
    if load is not None and load[0] > cores:
        return f"the 1-minute load average was {load[0]:g} on {cores} cores when the run started"
    return None


def _warn(message: str) -> None:
    print(f"tracker: warning: {message}", file=sys.stderr)


def run_benchmark_command(config, args, first: Callable[[], int] | None = None) -> int:
    """`tracker --benchmark`: see the module docstring of tracker.bench for outputs and schema.
    `first`: another benchmark of the same command (the detectors'), run once this one's request
    is checked and before it measures anything; its non-zero exit code (an interrupt) ends here."""
    # From the start, not from the first cell: a SIGTERM while the runtimes were probed or the sgemm
    # peak measured ended the process (exit 143) and left the probe's child running.
    with stop_as_ctrl_c():
        return _benchmark(config, args, first)


def _benchmark(config, args, first: Callable[[], int] | None) -> int:
    load_at_start = load_average()  # how busy the machine is besides this command: before its own work
    # without --backend, the config's backend; a mistake in it is the config's, not an option's
    requested, given_by = (args.backend, "--backend") if args.backend else (config.backend.name, "config: key 'backend.name'")
    names, all_mode = parse_backend_names(requested, given_by)
    batches = sorted(set(args.batches))
    passes = args.passes
    timeout_s = float(getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S)
    warmup_s = getattr(args, "warmup", None)
    warmup_s = DEFAULT_WARMUP_S if warmup_s is None else float(warmup_s)
    memory_limit = getattr(args, "memory_limit", None)
    worker = bool(getattr(args, "worker", False) or config.backend.worker)
    out = prepare_out(Path(args.out))
    spec, model_info = _model(config)
    state_dir = Path(config.resolved_state_dir())
    profile = profile_path(state_dir)
    # Whether the run writes auto's profile (said once the request is checked): not under
    # --memory-limit, which emulates a smaller device whose failures say nothing about this one, nor
    # on a busy machine unless --profile-when-busy.
    busy = _busy(load_at_start, cores())
    profile_ok = memory_limit is None and not (busy and not getattr(args, "profile_when_busy", False))

    try:
        probes = probe_backends(_entries(names))
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: the probe's child is killed
        return _stopped_before_any_cell(out)
    unavailable = {n: p.reason or "unavailable" for n, p in probes.items() if not p.available}
    if not all_mode and unavailable:
        raise BackendUnavailable(next(iter(unavailable.values())))
    if all_mode and "auto" in names and probes["auto"].available and not profile_ok and not profile.exists():
        # auto without a profile would only time its documented default; a run that writes one runs
        # auto's columns after it has
        probes["auto"] = Probe(False, f"no calibration profile at {profile}, and this run writes none", probes["auto"].precisions)
        unavailable["auto"] = probes["auto"].reason or "unavailable"
    columns = _columns(names, probes, args.precision, not all_mode)
    if not columns:
        raise InputError(f"{given_by}: bad value {requested!r}: no backend with precision {args.precision!r} can run "
                         "here; expected one that runs on this machine")
    if first is not None and (code := first()):
        return code

    print("benchmark: measuring this machine's sgemm peak ...", file=sys.stderr)
    try:
        peak = sgemm_peak()
    except KeyboardInterrupt:
        return _stopped_before_any_cell(out)
    machine = machine_info(peak, load_at_start)
    if memory_limit is not None:
        _warn(f"not writing the calibration profile {profile}: --memory-limit emulates a smaller device, and `auto` "
              "would learn its failures as this machine's")
    elif not profile_ok:
        _warn(f"not writing the calibration profile {profile}: {busy}, so `auto` would learn the load, not the "
              "engines; run again on a quiet machine, or add --profile-when-busy to write it anyway")
    settings = {
        "backends": names,
        "columns": [{"backend": c.backend, "precision": c.precision, "label": c.label} for c in columns],
        "batches": batches,
        "passes": passes,
        "warmup_s": warmup_s,
        "threads": config.backend.threads,
        "timeout_s": timeout_s,
        "memory_limit_mb": memory_limit,
        "memory_limit_method": cap_method(memory_limit),
        "seed": SEED,
        "model": model_info,
        "process": "one child process per cell (backend x precision x batch)"
                   + (", each backend behind the worker (a grandchild)" if worker else ""),
        "worker": worker,
        "rss": "peak RSS of the cell's process from after the backend loaded to the last pass (VmHWM reset after loading; "
               "the model converted and cached by a priming load before the column's cells), plus the peaks of its "
               "descendants (a worker); for a failed cell, the child's ru_maxrss at exit",
        "profile": str(profile) if profile_ok else None,
    }
    results = Results(machine, base_versions(), settings, columns, unavailable)
    measured: dict[tuple[str, str, int], float] = {}
    failed: set[tuple[str, str, int]] = set()
    held = recorded_at_start(profile, machine_key())

    unwritable: set[str] = set()  # the files whose last write failed (and were warned about)

    def save(what: str, write):
        """write(), or, if the disk refuses it, a warning (once until a write succeeds again) and
        None: the run goes on."""
        try:
            written = write()
        except OSError as err:
            if what not in unwritable:
                unwritable.add(what)
                _warn(f"cannot write {what} in {out} ({err.strerror or err}); the run goes on and prints its table")
            return None
        unwritable.discard(what)
        return written

    def write_data() -> None:
        save("results.json and results.csv", lambda: results.write_data(out))

    def write_plots() -> list[Path]:
        return save("the plots", lambda: results.write_plots(out)) or []

    def record_profile() -> None:
        nonlocal profile_ok
        if not profile_ok:
            return
        try:
            with interrupts_held():  # a Ctrl-C in the write would lose the cell just measured from the profile
                warning = update_profile(profile, machine_key(), measured, failed, held)
        except OSError as err:
            profile_ok = False
            _warn(f"cannot write the calibration profile {profile} ({err.strerror or err}); auto will not see this run")
            return
        if warning:  # only the first write can replace a profile; later ones merge into ours
            _warn(warning)

    def cell_job(column: Column, batch: int) -> dict:
        return {
            "mode": "cell",
            "backend": column.backend,
            "entry": list(REGISTRY[column.backend]),
            "precision": column.precision,
            "batch": batch,
            "passes": passes,
            "warmup_s": warmup_s,
            "threads": config.backend.threads,
            "model": {"prototxt": str(spec.prototxt), "weights": str(spec.weights), "probs": spec.probs, "embedding": spec.embedding},
            "input_shape": model_info["input_shape"],
            "seed": SEED,
            "memory_limit_mb": memory_limit,
            "options": _backend_options(column.backend, state_dir, worker),
        }

    def measure(column: Column) -> None:
        """The column's priming load (tracker.bench.child.run_prime; a failure there is left to
        the cells, which meet it and record it each), its cells, batch sizes ascending, then its
        quality check."""
        bar.set_description(f"{column.label} loading")
        if run_job({**cell_job(column, batches[0]), "mode": "prime"}, timeout_s, "primed").get("interrupted"):
            raise KeyboardInterrupt
        for batch in batches:
            bar.set_description(f"{column.label} batch {batch}")
            start = bar.n

            def progress(done: int, start: int = start) -> None:
                bar.update(start + done - bar.n)

            outcome = run_cell(cell_job(column, batch), timeout_s, progress)
            bar.update(start + passes + 1 - bar.n)
            row = make_row(column, batch, passes, outcome, model_info["macs_per_image"], peak["gflops"])
            results.add(row, outcome.versions)
            key = (column.backend, column.precision, batch)
            if row["status"] == "ok":
                measured[key] = row["median_ms_per_image"]
            else:
                failed.add(key)
            bar.write(summary_line(row), file=sys.stderr)
            write_data()
            record_profile()
            if outcome.interrupted:
                raise KeyboardInterrupt
        if column.precision != "fp32" and "fp32" in probes[column.backend].precisions:
            bar.set_description(f"{column.label} quality")
            quality = run_job({**cell_job(column, batches[-1]), "mode": "quality"}, timeout_s, "quality")
            stopped = quality.pop("interrupted", False)
            results.add_quality({"backend": column.backend, "precision": column.precision, "reference": "fp32", **quality})
            bar.write(quality_line(results.quality[-1]), file=sys.stderr)
            write_data()
            if stopped:
                raise KeyboardInterrupt
        write_plots()

    def run_off(plan: runoff.Runoff) -> None:
        """One runoff (tracker.bench.runoff); its medians replace the candidates' in the profile."""
        rounds, seconds = runoff.ROUNDS, runoff.SECONDS_PER_ROUND
        bar.set_description(f"runoff {plan.precision} batch {plan.batch}")
        cells = {r["backend"]: r for r in results.rows
                 if (r["precision"], r["batch"]) == (plan.precision, plan.batch) and r["backend"] in plan.backends}
        job = {**cell_job(Column(plan.backends[0], plan.precision), plan.batch), "mode": "runoff",
               "candidates": [[name, list(REGISTRY[name]), _backend_options(name, state_dir, worker)] for name in plan.backends],
               "rounds": rounds, "seconds": seconds}
        start = bar.n

        def progress(done: int) -> None:
            bar.update(start + done - bar.n)

        def stage(done: int | None) -> str:
            return "loading the candidates" if done is None else f"round {done + 1}/{rounds}" if done < rounds else "closing the backends"

        got = run_job(job, timeout_s, "runoff", progress, stage)
        stopped = got.pop("interrupted", False)
        bar.update(start + rounds - bar.n)
        entry = {"precision": plan.precision, "batch": plan.batch, "backends": list(plan.backends),
                 "cell_median_ms_per_image": {name: cells[name]["median_ms_per_image"] for name in plan.backends},
                 "rounds": rounds, "seconds_per_round": seconds, **got}
        results.add_runoff(entry)
        if "error" not in got:
            medians = runoff.profile_medians(got["ms_per_image"], entry["cell_median_ms_per_image"])
            measured.update({(name, plan.precision, plan.batch): ms for name, ms in medians.items()})
        bar.write("runoff " + runoff_line(entry), file=sys.stderr)
        write_data()
        record_profile()
        if stopped:
            raise KeyboardInterrupt

    from tqdm import tqdm

    total = len(columns) * len(batches) * (passes + 1)
    bar = tqdm(total=total, unit="pass", file=sys.stderr, disable=None, dynamic_ncols=True)
    interrupted = False
    try:
        # auto last: its cells then run on the profile this run's other columns and runoffs wrote
        for column in [c for c in columns if c.backend != "auto"]:
            measure(column)
        if profile_ok:
            plans = runoff.plan_runoffs(results.rows, memory_mb(available=True))
            bar.total += runoff.ROUNDS * len(plans)
            for plan in plans:
                run_off(plan)
        for column in [c for c in columns if c.backend == "auto"]:
            measure(column)
        # The machine is shared: the peak is the better of a measurement before and after the cells.
        results.machine["load_average"]["end"] = load_average()
        results.update_peak(sgemm_peak())
        results.complete = True
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: the running child and all below it are killed
        interrupted = True
    finally:
        bar.close()
    if not results.rows:
        return _stopped_before_any_cell(out)
    write_data()
    plots = write_plots()
    try:
        record_last_run(state_dir, out)
    except OSError as err:
        _warn(f"cannot record this run in {state_dir} ({err.strerror or err}); the web page will not show it")
    print(results.table())
    print()
    print(results.details())
    print()
    files = [*([] if "results.json and results.csv" in unwritable else [out / "results.json", out / "results.csv"]), *plots]
    print("wrote " + ", ".join(str(f) for f in files) + (f"; calibration profile {profile}" if profile_ok and measured else ""))
    if profile_ok and measured:
        print("\n".join(_auto_picks(state_dir, probes)))
    refused = list(dict.fromkeys(row["label"] for row in results.rows if row["status"] == "unavailable"))
    if refused and not all_mode and not interrupted:
        # a backend named explicitly that its probe passed but that cannot be created here (LiteRT
        # without its XNNPACK delegate): exit 3 as for one the probe refuses, once all is kept and shown
        raise BackendUnavailable(f"--backend: {', '.join(refused)} could not be created here (the table's notes "
                                 "above say why); expected backends that run on this machine")
    return 130 if interrupted else 0


def _stopped_before_any_cell(out: Path) -> int:
    """Say that the run was stopped before a cell ended (an earlier run's files in `out` stay as
    they are); the exit code of a stop, 130."""
    print(f"benchmark: stopped before any cell was measured; nothing written (the files in {out}, if any, are an "
          "earlier run's)", file=sys.stderr)
    return 130


def _auto_picks(state_dir: Path, probes: dict[str, Probe]) -> list[str]:
    """Lines saying what `auto` would pick per batch size, from tracker.backends.auto.describe_picks,
    passing over the backends `probes` found unavailable (one not probed counts as available)."""
    from tracker.backends.auto import describe_picks

    try:
        picks = describe_picks(state_dir, lambda name: name not in probes or probes[name].available)
    except TrackerError as err:
        return [f"auto: {err}"]
    lines = [f"auto would pick (profile {profile_path(state_dir)}):"]
    lines += [f"  batch {batch:>4}: {backend} ({precision})" for batch, backend, precision in picks]
    return lines


def print_backend_list(config) -> int:
    """`tracker --list-backends`: every registered backend, whether it runs here (and if not, why
    and which extra installs it), its precisions, and what `auto` would pick per batch size."""
    with stop_as_ctrl_c():  # a SIGTERM kills the probe's child too (KeyboardInterrupt: exit 130)
        probes = probe_backends(_entries(list(REGISTRY)))
    header = ("backend", "here", "precisions", "extra")
    rows = [
        (name, "yes" if p.available else "no", ",".join(p.precisions) or "?",
         REGISTRY[name].setup or REGISTRY[name].extra or "(base)")
        for name, p in probes.items()
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for row, p in zip(rows, probes.values()):
        line = "  ".join(v.ljust(w) for v, w in zip(row, widths))
        print(f"{line}  {p.reason}" if p.reason else line.rstrip())
    for line in _auto_picks(Path(config.resolved_state_dir()), probes):
        print(line)
    return 0
