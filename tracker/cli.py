"""The `tracker` command line: runs the guard, the benchmark and the tools around them.

    tracker [--config F] [--backend B] [--source S] [--demo] [--frames N]     run the guard
    tracker --check-config [--config F]                                         validate only
    tracker --list-backends                                                     what runs here
    tracker --backend a,b|all --benchmark [--batches 1,2,..] [--passes 100]     the study's benchmark
    tracker --benchmark --detectors yunet,blazeface,haar|all                    the face detectors
    tracker convert --to tf|tflite|onnx [...]                                   Caffe -> other engines
    tracker enroll NAME IMAGE_OR_FOLDER...                                      store a person
    tracker enroll --refresh                                                    recompute for new weights
    tracker eval-mot DETECTIONS [--gt GT] [--out TRACKS] | --tracks T --gt GT   tracker metrics
    tracker train --out W [--data SET]... [--epochs N] [--resume]               train the face CNN
    tracker eval-faces --pairs FILE --images DIR | --folder DIR                 face CNN accuracy
    tracker identify IMAGE_OR_FOLDER... [--aligned] [--json]                    who each face is

A user mistake prints one line (`tracker: error: ...`) and exits 2 (3 for a missing runtime);
only an unexpected failure prints a traceback (exit 1). Only this module knows `pipeline`.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import select
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from tracker.arguments import CONFIG_DEFAULT, ArgumentParser, batch_list, config_path, float_between, int_between, path_to, positive_int, words
from tracker.blas_idle import bound_idle_spin
from tracker.errors import EXIT_UNEXPECTED, InputError, TrackerError
from tracker.images import set_opencv_environment

if TYPE_CHECKING:
    from tracker.config import Config

SUBCOMMANDS = {  # name: what it does, as the main help lists them
    "enroll": "store a person from photos of their face (--refresh: for new weights)",
    "identify": "who each face in photos is",
    "eval-faces": "the face CNN's accuracy on LFW-format pairs or a folder of people",
    "convert": "the Caffe model for another engine (tf, tflite, onnx)",
    "train": "train the face CNN",
    "eval-mot": "the tracker alone on MOTChallenge detections, and its metrics",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# What `tracker --benchmark` needs beyond the guard (pyproject's `bench` extra).
BENCH_MODULES = ("matplotlib", "tqdm", "psutil")
DEMO_FRAMES = 400  # 40 s of the synthetic scene at its default 10 fps: two people cross, one waits


# The benchmark's defaults, filled in once its options are checked: the parser's are None, so that
# an option given without --benchmark is refused whatever its value (at its default it was ignored)
BENCH_DEFAULTS = {"batches": [1, 2, 4, 8, 16, 32, 64, 128, 256], "passes": 100, "out": Path("bench-out")}


def _main_parser() -> ArgumentParser:
    subcommands = "\n".join(f"  tracker {name:<11} {what}" for name, what in SUBCOMMANDS.items())
    p = ArgumentParser(prog="tracker", description="Home-surveillance guard and its backend benchmark.",
                       epilog=f"subcommands (each with its own --help):\n{subcommands}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # (the epilog's lines kept)
    p.add_argument("--config", type=config_path, help=f"YAML config ({CONFIG_DEFAULT})")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                   help="log lines from this level up (default: INFO for the guard, WARNING for the rest)")
    p.add_argument("--backend", type=words("a backend name (with --benchmark: a comma list or 'all')"),
                   help="backend name; with --benchmark a comma list or 'all'")
    p.add_argument("--precision", choices=("fp32", "int8"), help="model precision (default from config)")
    p.add_argument("--source", type=words("a source: 'synthetic', a camera, a URL, a video file or an image folder"),
                   help="override source: 'synthetic', 'picamera2' or 'picamera2:N', a device index or /dev/videoN, a URL, "
                        "a video file or an image folder")
    p.add_argument("--demo", action="store_true",
                   help="run on the built-in synthetic scene instead of the camera (the config's MQTT and web page "
                        "still apply; state in <state_dir>/demo)")
    p.add_argument("--frames", type=positive_int,
                   help="stop after this many frames captured (frames a camera's queue dropped count too)")
    p.add_argument("--check-config", action="store_true", help="validate the config and exit")
    p.add_argument("--list-backends", action="store_true", help="list backends and whether they run here")
    p.add_argument("--benchmark", action="store_true", help="time forward passes per batch size")
    p.add_argument("--batches", type=batch_list, help="benchmark: comma-separated batch sizes (default 1,2,4,...,256)")
    # every pass time is kept and written to results.json after each cell: 117 cells of 100,000 took 1.4 GB
    p.add_argument("--passes", type=int_between(1, 10_000), help="benchmark: forward passes per batch size (default 100)")
    # an hour a cell at most: a warm-up's passes report progress, so --timeout never ended one of 1e300 s
    p.add_argument("--warmup", type=float_between(0, 3600, what="a number of seconds"), metavar="S",
                   help="benchmark: untimed passes for this many seconds before each cell's timed ones, at least one (default 1)")
    p.add_argument("--out", type=path_to("a folder for the benchmark's results"), help="benchmark: output directory (default bench-out)")
    p.add_argument("--timeout", type=int_between(1, 86_400), help="benchmark: kill a cell after this many seconds without progress (default 600)")
    p.add_argument("--memory-limit", type=int_between(1, 1 << 20), metavar="MB",
                   help="benchmark: memory limit of each cell's processes (a memory cgroup; address space where none can be made), "
                        "e.g. to emulate a 1 GB device")
    p.add_argument("--detectors", type=words("detector names, a comma list or 'all'"),
                   help="benchmark: the face detectors to measure, a comma list or 'all' (with --backend too: both benchmarks)")
    p.add_argument("--profile-when-busy", action="store_true",
                   help="benchmark: write auto's calibration profile even if the machine's load average exceeds its cores")
    p.add_argument("--worker", action="store_true",
                   help="benchmark: run each backend behind the worker (a child process of the cell's process; also backend.worker in the config)")
    return p


# Options that only the benchmark reads: given without --benchmark they would be ignored in silence.
_BENCHMARK_ONLY = ("batches", "passes", "warmup", "out", "timeout", "memory_limit", "detectors", "profile_when_busy",
                   "worker")


def _load_config(args):
    from tracker.config import load_config

    return load_config(args.config)


def effective_config(config: Config, args: argparse.Namespace) -> Config:
    """The config with the command line's overrides (--backend, --precision, --frames, --demo)
    applied and validated like the file. --demo: the synthetic scene (paced at its fps unless the
    config's source.realtime is false, at the camera's size scaled down to the scene's largest if
    it is larger), DEMO_FRAMES long unless --frames says otherwise, state in
    `<state_dir>/demo` so that the demo's enrolments never mix with real ones. (--source is parsed
    by `make_source`.)"""
    from tracker.config import parse_config

    data = config.model_dump()
    if args.backend:
        data["backend"]["name"] = args.backend
    if args.precision:
        data["backend"]["precision"] = args.precision
    if args.backend or args.precision:  # refused under the option's name, not the config key's
        from tracker.backends import check_request

        check_request(data["backend"]["name"], data["backend"]["precision"], name_from="--backend",
                      precision_from="--precision" if args.precision else "--backend")
    if args.demo:
        from tracker.sources.synthetic import fitting_size

        width, height = fitting_size(config.source.width, config.source.height)  # a large camera's aspect
        data["source"].update(kind="synthetic", uri="", frames=args.frames or DEMO_FRAMES, width=width, height=height)
        data["state_dir"] = config.resolved_state_dir() / "demo"
    elif args.frames:
        data["source"]["frames"] = args.frames
    return parse_config(data, "command line")


def _refuse_ignored_options(parser: ArgumentParser, args: argparse.Namespace) -> None:
    """InputError for an option the run would ignore in silence: a second of the modes
    --check-config, --list-backends, --benchmark (only the first would run); one only the
    benchmark reads, without --benchmark; one only the backends' benchmark reads (--precision too),
    with --detectors alone; --profile-when-busy with --memory-limit (that run writes no profile);
    --source with --demo; the guard's own (--source, --demo, --frames) with --list-backends or
    --benchmark; --backend or --precision with --list-backends."""
    modes = [name for name in ("check_config", "list_backends", "benchmark") if getattr(args, name)]
    if len(modes) > 1:
        first, second = ("--" + name.replace("_", "-") for name in modes[:2])
        raise InputError(f"{second}: not with {first}; expected one of --check-config, --list-backends, --benchmark")
    given = [name for name in _BENCHMARK_ONLY if getattr(args, name) != parser.get_default(name)]
    if given and not args.benchmark:
        option = "--" + given[0].replace("_", "-")
        raise InputError(f"{option}: only with --benchmark; expected tracker --benchmark {option} ...")
    backend_only = [name for name in given if name not in ("out", "detectors")] + (["precision"] if args.precision else [])
    if backend_only and args.detectors and not args.backend:  # the detector benchmark has no cells
        option = "--" + backend_only[0].replace("_", "-")
        raise InputError(f"{option}: the detector benchmark does not take it; expected it with --backend (the backends' "
                         "benchmark)")
    if args.profile_when_busy and args.memory_limit:
        raise InputError("--profile-when-busy: not with --memory-limit, whose run writes no calibration profile (it "
                         "emulates a smaller device); expected one of the two")
    if args.demo and args.source:
        raise InputError(f"--source {args.source!r}: --demo runs the built-in synthetic scene; expected one of the two")
    mode = "--list-backends" if args.list_backends else "--benchmark" if args.benchmark else None
    guard_only = [option for option, value in (("--source", args.source), ("--demo", args.demo),
                                               ("--frames", args.frames)) if value]
    if mode and guard_only:
        raise InputError(f"{guard_only[0]}: not with {mode}, which runs no guard; expected it when running the guard")
    if args.list_backends and (args.backend or args.precision):
        option = "--backend" if args.backend else "--precision"
        raise InputError(f"{option}: --list-backends lists every backend and precision; expected it alone")


def _run_main(argv: list[str]) -> int:
    parser = _main_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        misplaced = next((word for word in extra if word in SUBCOMMANDS), None)
        if misplaced is not None:  # `tracker --config F identify X`: the options of the guard came first
            raise InputError(f"{misplaced!r} after options ({' '.join(argv[:argv.index(misplaced)])}); "
                             f"expected the subcommand first: tracker {misplaced} ... --config F")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _refuse_ignored_options(parser, args)
    guard = not (args.check_config or args.list_backends or args.benchmark)
    configure_logging(args.log_level or ("INFO" if guard else "WARNING"))
    config = _load_config(args)
    if args.check_config:
        from tracker.config import DEFAULT_CONFIG
        from tracker.preflight import check_runnable, check_source

        # --backend/--precision/--demo/--source change what the run would refuse: check what the run uses
        effective = effective_config(config, args)
        detector = check_runnable(effective, config_path=args.config or DEFAULT_CONFIG)
        check_source(effective, args.source)
        # the state's folder made absolute: a relative state_dir is taken from the working folder (/ under systemd)
        print(f"config ok: {args.config or DEFAULT_CONFIG} (detector {detector}; state in "
              f"{effective.resolved_state_dir().resolve()})")
        return 0
    if args.list_backends:
        from tracker.bench import print_backend_list

        return print_backend_list(config)
    if args.benchmark:
        _require_bench_extra()
        vars(args).update({name: value for name, value in BENCH_DEFAULTS.items() if getattr(args, name) is None})
        from tracker.bench import run_benchmark_command

        if args.detectors:
            from tracker.bench.detectors import parse_detector_names, run_detector_benchmark

            names = parse_detector_names(args.detectors)
            if not args.backend:
                return run_detector_benchmark(config, names, args.out)
            # both: the detectors first, once the backends' request is checked (a mistake in it is
            # said before anything is measured)
            return run_benchmark_command(config, args, first=lambda: run_detector_benchmark(config, names, args.out))
        return run_benchmark_command(config, args)
    from tracker.config import DEFAULT_CONFIG
    from tracker.pipeline import run_guard

    return run_guard(effective_config(config, args), config_path=args.config or DEFAULT_CONFIG,
                     source_spec=args.source, enroll_scene_people=args.demo)


def _require_bench_extra() -> None:
    """InputError (exit 2) naming the extra when the benchmark's own modules are not installed: the
    guard runs without them (a 1 GB Pi that only guards need not carry matplotlib)."""
    import importlib.util

    missing = [name for name in BENCH_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise InputError(f"--benchmark: {', '.join(missing)} not installed; expected the bench extra: "
                         "pip install 'tracker[bench]' (scripts/setup installs it)")


def _run_subcommand(name: str, argv: list[str]) -> int:
    if name == "convert":
        from tracker.model.convert import convert_command

        return convert_command(argv)
    if name == "enroll":
        from tracker.enroll import enroll_command

        return enroll_command(argv)
    if name == "train":
        from tracker.train.command import train_command

        return train_command(argv)
    if name == "eval-faces":
        from tracker.evaluate_faces import eval_faces_command

        return eval_faces_command(argv)
    if name == "identify":
        from tracker.identify import identify_command

        return identify_command(argv)
    from tracker.tracking.evaluate import eval_mot_command

    return eval_mot_command(argv)


def configure_logging(level: str) -> None:
    """The one logging set-up: lines with time, level and module on stderr from `level` up. Does
    nothing when the process already has handlers (an embedding application, or pytest)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _reader_gone(stream) -> bool:
    """Whether `stream` is a pipe whose reader has closed it: poll reports an error on its end.
    (Flushing it to find out worked only while something was left in the buffer: a failed write
    had usually emptied it, and the user saw a traceback for `tracker eval-mot ... | head`.)"""
    poller = select.poll()
    poller.register(stream.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # (EFBIG: a write past the file system's file size)


def main(argv: list[str] | None = None) -> int:
    bound_idle_spin()  # first: OpenBLAS reads it when numpy loads it (nothing above imports numpy)
    set_opencv_environment()  # and OpenCV its own (image bound, FFmpeg quiet) when cv2 loads
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            # `convert` says what it converts (and any cache rebuild); the others only warn
            configure_logging("INFO" if argv[0] == "convert" else "WARNING")
            code = _run_subcommand(argv[0], argv[1:])
        else:
            code = _run_main(argv)
        sys.stdout.flush()  # here, not at exit, where a full disk is a message Python prints itself
        return code
    except TrackerError as err:
        print(f"tracker: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if _reader_gone(sys.stdout):  # our reader went away (e.g. `| head`): not a failure of ours
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush is silent
            return 0
        traceback.print_exc()  # another pipe (a child's): an unexpected failure
        return EXIT_UNEXPECTED
    except OSError as err:
        if err.errno not in _DISK_FULL:
            traceback.print_exc()
            return EXIT_UNEXPECTED
        # what the guard writes as it runs (logs, outbox, snapshots) takes a full disk in its
        # stride: a full disk that stops a command is its output's (stdout sent to a file)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush is silent
        print(f"tracker: error: cannot write {err.filename or 'the output'} ({err.strerror}); expected room on the "
              "disk it goes to", file=sys.stderr)
        return EXIT_UNEXPECTED
    except Exception:  # an unexpected failure: the traceback is the useful report
        traceback.print_exc()
        return EXIT_UNEXPECTED


__all__ = ["main"]
