"""`tracker --benchmark`: the study's benchmark, reproduced on the machine it runs on.

    tracker --benchmark --backend a,b|all [--batches 1,2,4,...,256] [--passes 100] [--warmup 1]
            [--precision fp32|int8] [--out DIR] [--timeout S] [--memory-limit MB] [--profile-when-busy]
            [--worker] [--detectors a,b|all]

For each backend x precision x batch size (a *cell*): load the backend, one untimed warm-up pass
and more for `--warmup S` seconds after it (default 1: see command.DEFAULT_WARMUP_S for why), then
`--passes` timed passes on the same seeded random batch (N, C, H, W) float32 (shape from the
model's input blob). Each cell runs in a fresh child process (tracker.bench.child), so a crash, a
signal, an out-of-memory or a hang is a failed cell with its cause and the run goes on (and a
benchmark killed outright leaves no cell running: the child ends within a second); and the
peak RSS of a cell is that of a process that ran this batch size only. `--memory-limit MB` caps the
memory of the child and its children with a memory cgroup of their own, as physical memory caps a
small device (tracker.bench.memory_cap; RLIMIT_AS where no cgroup can be made, said in the results);
`--timeout S` (default 600) kills a child that makes no progress (loading, or one pass) for S s.
Without --precision every precision a backend offers is run (int8 rows beside fp32); for each
int8 column a quality line says how often its top-1 class agrees with the same backend's fp32 and
how close the embeddings are (cosine), on a fixed held-out set of face crops.

Metrics of a cell (pass times are wall-clock perf_counter_ns around `backend.infer(x)`):
    ms_per_image   mean pass time / batch (the study's number)
    median_ms_per_image  median pass time / batch (what `auto`'s profile keeps, unless a runoff
                   replaced it: stalls move it less than the mean)
    p50_ms, p95_ms percentiles of the pass times (ms per pass, not per image)
    images_per_s   batch / mean pass time
    gflops         2 * multiply-adds per image (counted from the model) * batch / mean pass time
    peak_fraction  gflops / this machine's sgemm peak (numpy float32 1024^3 matmul on all cores,
                   best of >= 3 repeats, measured before and after the cells; the better counts)
    peak_rss_mb    peak RSS (MiB) of the cell's process from after loading to the last pass (VmHWM
                   reset after loading; plus its descendants' peaks, e.g. a worker's, summed); each
                   column's model is converted and cached by a priming load before its cells, so
                   no cell counts what converting left resident

Outputs in --out (default bench-out/), rewritten atomically: results.json and results.csv after
every cell, per_image_ms_linear.png and per_image_ms_log.png after every column (a backend at one
precision); and the calibration profile `<state_dir>/profile.json` read by `auto` (tracker.bench.profile: the
cells' medians, and for the fastest cells of each batch size their runoff's (tracker.bench.runoff:
those backends timed again, interleaved in one child); not written under --memory-limit, which
emulates another device, nor when the 1-minute load average at the start exceeds the cores, unless
--profile-when-busy; no runoffs then either). `auto`'s own columns run after the runoffs.
The terminal gets a progress bar (stderr, on a terminal only), one line per finished cell and
runoff, then
the table (batch sizes as rows, backends as columns, per-image ms; failed cells with a short
reason) and every metric per backend. Exit 0 when the run completed (failed cells are results),
130 when interrupted (what was measured is printed and kept), 2 for a bad request, 3 when a
backend named explicitly cannot run here.

results.json (schema 1):
    schema: 1;  complete: bool (false if interrupted)
    machine: {cpu: str, cores: int, arch: str, system: str, memory_mb: float|null,
              blas: {name, version, architecture, threads, idle_poll_log2_ticks: int|null
                     (OPENBLAS_THREAD_TIMEOUT; null: OpenBLAS's default)}, sgemm_peak_gflops: float,
              sgemm: {n, repeats, best_s},
              load_average: {start: [1, 5, 15 min], end: [..]|null}}  how busy the machine was
    versions: {python, numpy, tracker, runtimes: {label: {module: version}}}
    settings: {backends: [name], columns: [{backend, precision, label}], batches: [int],
               passes: int, warmup_s: float, threads: int|null, timeout_s: float,
               memory_limit_mb: int|null, memory_limit_method: "cgroup-v2"|"cgroup-v1"|"rlimit-as"|null,
               seed: int,
               model: {prototxt, weights, input_shape: [C,H,W], params, macs_per_image,
                       flops_per_image}, process: str, worker: bool (each backend behind the
               worker), rss: str, profile: path|null}
    unavailable: {name: reason}     backends that cannot run here (with --backend all)
    rows: [{backend, precision, label ("name" or "name int8"), batch, status: "ok"|"failed"|
            "unavailable", passes, warmup_passes (untimed, before them; null unless measured),
            pass_ms: [float] (every timed pass, ms), ms_per_image, median_ms_per_image,
            p50_ms, p95_ms, images_per_s, gflops, peak_fraction (null unless ok), peak_rss_mb,
            rss_method, rss_processes, load_s (s from creating the backend to its first pass's
            result), reason (short, for the table), error (cause, one line),
            error_detail (cause + tail of the child's output)}]
    quality: [{backend, precision, reference: "fp32", crops, set_id, top1_agreement (0..1),
               decided_crops, decided_gap, top1_agreement_decided (on the crops fp32 decides by
               >= decided_gap nats: tracker.bench.quality), embedding_cosine_mean,
               embedding_cosine_min} or {backend, precision, reference, error}]      one per non-fp32 column: that backend at fp32 vs at its reduced
               precision on the fixed quality set of face crops (tracker.model.convert.calibration)
    runoffs: [{precision, batch, backends: [name] (fastest cell first),
               cell_median_ms_per_image: {name: ms}, rounds, seconds_per_round,
               ms_per_image: {name: interleaved median ms}, calls: {name: timed calls}} or
              {..., error}]  one per runoff, in the order run; the profile got ms_per_image
              rescaled to the cells' level (tracker.bench.runoff.profile_medians)
results.csv: one line per cell with the columns of tracker.bench.report.CSV_FIELDS, plus one
line per unavailable backend.
"""

from __future__ import annotations


def run_benchmark_command(config, args, first=None) -> int:
    """Entry from tracker.cli (`--benchmark`); imports the benchmark only when it runs."""
    from tracker.bench.command import run_benchmark_command as run

    return run(config, args, first)


def print_backend_list(config) -> int:
    """Entry from tracker.cli (`--list-backends`)."""
    from tracker.bench.command import print_backend_list as show

    return show(config)


__all__ = ["print_backend_list", "run_benchmark_command"]
