"""How long numpy's OpenBLAS lets its idle threads spin: bounded, before numpy loads it.

After every call it splits between threads, each OpenBLAS helper thread waits for the next one by
polling, for 2**28 ticks of the CPU's counter, before it sleeps (OpenBLAS 0.3.31,
`blas_thread_server`). That is about 0.1 s on an x86 time-stamp counter (2-3 GHz) and 14 s on the
19.2 MHz counter of a Raspberry Pi 3, whose OpenBLAS polls with `nop`s and never yields the core.
So a guard that runs one face at a time on several BLAS threads (the Caffe engine picks all cores
when that is faster) kept every helper's core busy between frames: on the Intel Xeon of the README,
20 batch-1 forward passes 50 ms apart took 0.03-0.04 s of inference and 1.06-1.07 s of process CPU
time; with the bound, 0.07 s (`scripts/engine_timing.py --idle-cpu`, both modes). The polling also
takes the core from whatever else the process runs meanwhile: of two Python threads sharing a
convolution after a two-thread GEMM, one ran its half at half the other's speed.

OPENBLAS_THREAD_TIMEOUT sets that wait, as log2 of the ticks (OpenBLAS clamps it to 4-30), and
OpenBLAS reads it once, when it is loaded: `bound_idle_spin` must run before anything imports
numpy. The bounds below still cover the gaps between one forward pass's GEMMs (an im2col, a
pooling: 0.1-0.2 ms on the Xeon, about ten times that on a Pi), so that OpenBLAS does not sleep
and wake between them: with 2**16 ticks (about 25 us) the "caffe" mode's passes took 1.03-1.20x
their time with 2**28 (a trial script); with 2**20, the bound below, both modes read the same as
with 2**28 within the host's noise (`scripts/engine_timing.py --modes caffe,dl --threads 2`, three
processes of each alternating, batch 1 to 64; docs/ENGINE.md, "OpenBLAS's and ONNX Runtime's idle
threads put to sleep").
"""

from __future__ import annotations

import os
import platform

# log2 of the counter ticks an idle OpenBLAS thread polls for, per `platform.machine()`: about
# 0.3-0.5 ms on an x86 time-stamp counter of 2-3.5 GHz; 0.85 ms on the 19.2 MHz counter of a Pi 3,
# 0.3 ms on the 54 MHz one of a Pi 4 or 5. Elsewhere OpenBLAS's own default stays.
IDLE_SPIN_LOG2_TICKS = {"x86_64": 20, "amd64": 20, "aarch64": 14, "arm64": 14}


def bound_idle_spin() -> None:
    """Set OPENBLAS_THREAD_TIMEOUT for this machine unless the environment already sets it (the
    user's choice wins). Takes effect in this process only if numpy has not been imported yet;
    child processes inherit it either way."""
    ticks = IDLE_SPIN_LOG2_TICKS.get(platform.machine().lower())
    if ticks is not None:
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", str(ticks))
