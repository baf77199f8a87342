"""Lines a native library writes straight to file descriptor 2, left out for a block.

TensorFlow's C++ side logs through absl before TF_CPP_MIN_LOG_LEVEL takes effect: at each import,
"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR" and INFO
lines about oneDNN and the CUDA drivers (twice), then, on a machine without a GPU, an ERROR line
"failed call to cuInit". Seven lines at every `tracker convert --to tf/tflite` and every start of
the tf-vanilla backend, the last of them an E that reads, in a guard's journal, as a fault that is
none; and the LiteRT converter's quantiser prints "fully_quantize: 0, inference_type: 6, ..." twice
for an int8 model. Python's own settings cannot reach them: they are written by C++ to the
descriptor.

`tensorflow_chatter_left_out()` is the block for TensorFlow's import, start and conversions: those
lines left out, unless the user asked TensorFlow for its INFO or WARNING lines
(TF_CPP_MIN_LOG_LEVEL 0 or 1), who then gets every line. (With the level at 2, as the project sets it unless told otherwise, the
only INFO and WARNING lines absl writes are those before its initialisation.)

`left_out(noise)` points descriptor 2 at a pipe for the block; a thread passes each line on to the
real stderr as soon as it is whole, but those that `noise` matches. Nothing is held back or lost:
the process's other threads (its own log lines) go through as they are written, and a child started
in the block, which inherits the pipe, keeps its stderr passed on after the block (the thread ends
when the last writer closes the pipe).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

# absl's INFO and WARNING lines ("I0000 00:00:1796682738.811752   23153 port.cc:153] ..."), its
# notice before InitializeLog, CUDA's "failed call to cuInit" on a machine without a GPU, and the
# LiteRT quantiser's settings line
TENSORFLOW_CHATTER = re.compile(rb"(WARNING: All log messages before absl::InitializeLog\(\) is called"
                                rb"|[IW]\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\]"
                                rb"|E\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\] failed call to cuInit"
                                rb"|fully_quantize: \d+, inference_type: \d+, )")
# a line longer than this without its newline is passed on in parts (the buffer stays bounded)
_MAX_LINE = 64 << 10
# how long the end of the block waits for the lines written just before it to be passed on
_DRAIN_S = 2.0


def tensorflow_chatter_left_out() -> contextlib.AbstractContextManager:
    """`left_out(TENSORFLOW_CHATTER)`, or nothing done when TF_CPP_MIN_LOG_LEVEL asks for
    TensorFlow's INFO or WARNING lines (0 or 1; see the module docstring)."""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() in ("0", "1"):
        return contextlib.nullcontext()
    return left_out(TENSORFLOW_CHATTER)


@contextlib.contextmanager
def left_out(noise: re.Pattern[bytes]) -> Iterator[None]:
    """Descriptor 2 through the filter for the block (see the module docstring): every line that
    does not start with a match of `noise` reaches the real stderr. A process without descriptor 2
    runs the block as it is."""
    _flush_stderr()
    try:
        real = os.dup(2)
    except OSError:  # no stderr at all (started with 2>&-): nothing to filter
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=_pass_on, args=(read_end, real, noise), name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        _flush_stderr()
        restored = os.dup(real)  # the thread owns `real` and closes it when the pipe ends
        os.dup2(restored, 2)  # the pipe's write end held by descriptor 2 is closed here
        os.close(restored)
        thread.join(_DRAIN_S)


def _flush_stderr() -> None:
    """Python's own buffered stderr written out (None in a process started without descriptor 2)."""
    if sys.stderr is not None:
        sys.stderr.flush()


def _pass_on(read_end: int, real: int, noise: re.Pattern[bytes]) -> None:
    """Copy whole lines from `read_end` to `real` until the pipe ends, leaving out those `noise`
    matches at their start; then close both."""
    pending = b""
    try:
        while chunk := os.read(read_end, 1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = [line + b"\n" for line in lines if not noise.match(line)]
            if len(pending) > _MAX_LINE:
                kept.append(pending)
                pending = b""
            if kept:
                os.write(real, b"".join(kept))
        if pending and not noise.match(pending):
            os.write(real, pending)
    finally:
        os.close(read_end)
        os.close(real)
