"""Backends: `create_backend` makes one by name from the registry (`registry.py`), in this process
or behind a worker process (`worker.py`). Importing this package imports no runtime."""

from __future__ import annotations

from pathlib import Path

from tracker.backends.registry import REGISTRY, Entry, availability, backend_class, missing_runtime
from tracker.errors import InputError

__all__ = ["REGISTRY", "Entry", "availability", "backend_class", "create_backend", "missing_runtime", "run_options"]


def run_options(name: str, state_dir: Path) -> dict:
    """The options beyond the contract's that backend `name` takes from the run: `auto` reads its
    calibration profile in the run's state_dir (without it, the default config's)."""
    return {"state_dir": str(state_dir)} if name == "auto" else {}


def check_request(name: str, precision: str, *, name_from: str, precision_from: str):
    """The class of backend `name` at `precision`; InputError naming `name_from` (the option or
    config key that asked) for an unknown backend, and `precision_from` for a precision it lacks."""
    if name not in REGISTRY:
        raise InputError(f"{name_from}: unknown backend {name!r}; expected one of {', '.join(REGISTRY)}")
    cls = backend_class(name)
    if precision not in cls.precisions:
        raise precision_refused(precision_from, name, precision)
    return cls


def precision_refused(where: str, name: str, precision: str) -> InputError:
    """The error for backend `name`, which has no `precision` model, named by `where` (the option
    or config key that asked for it), listing the backends that have one."""
    having = [n for n in REGISTRY if precision in backend_class(n).precisions]
    return InputError(f"{where}: backend {name!r} has no {precision!r} model; "
                      f"backends with {precision!r}: {', '.join(having) or 'none'}")


def create_backend(name: str, model=None, *, precision: str = "fp32", threads: int | None = None,
                   worker: bool = False, worker_options: dict | None = None, **options):
    """Create backend `name` for `model` (a ModelSpec; default: the face CNN).

    worker=True runs it in a child process (tracker.backends.worker.WorkerBackend, keyword
    arguments from `worker_options`); backends that always run in a worker (`runs_in_worker`,
    e.g. MXNet) ignore `worker` and receive `worker_options` as an option. Raises InputError for
    an unknown name or a precision the backend lacks (listing the backends that have it),
    BackendUnavailable (exit 3) when its runtime is missing.
    """
    from tracker.model.spec import default_model

    cls = backend_class(name)
    if precision not in cls.precisions:
        raise precision_refused("precision", name, precision)
    if getattr(cls, "runs_in_worker", False):
        if worker_options:
            options["worker_options"] = worker_options
    elif worker:
        from tracker.backends.worker import WorkerBackend

        # the child checks the runtime: importing it here would defeat the isolation
        return WorkerBackend(name, model or default_model(), precision, threads, options=options, **(worker_options or {}))
    cls.check_runtime()
    return cls(model or default_model(), precision=precision, threads=threads, **options)
