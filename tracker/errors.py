"""The project's exceptions and the exit code each maps to.

A `TrackerError` is a user-facing failure: its message is one line that names the thing, the bad
value and what was expected, and the CLI prints it without a traceback and exits with `exit_code`.
Exit codes (docs/ARCHITECTURE.md, section 5): 0 ok, 1 unexpected, 2 bad config or input, 3 backend unavailable.
"""

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_BAD_INPUT = 2
EXIT_BACKEND_UNAVAILABLE = 3


class TrackerError(Exception):
    """Base of every expected failure; `str(err)` is the one line shown to the user."""

    exit_code = EXIT_UNEXPECTED


class InputError(TrackerError):
    """A bad file, argument or value supplied by the user (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(InputError):
    """The YAML config (or a CLI override of it) is invalid (exit 2)."""


class ModelError(InputError):
    """A prototxt or caffemodel that is missing, corrupt or inconsistent (exit 2)."""


class BackendUnavailable(TrackerError):
    """A backend whose runtime is not installed or cannot run here (exit 3)."""

    exit_code = EXIT_BACKEND_UNAVAILABLE


class BackendFailure(TrackerError):
    """A backend that was running failed (e.g. its worker process died); callers may recover."""

    exit_code = EXIT_UNEXPECTED
