"""tracker.native_stderr: a native library's start-up lines left out of descriptor 2, nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from tracker.native_stderr import TENSORFLOW_CHATTER, left_out, tensorflow_chatter_left_out

# as TensorFlow 2.x wrote them on this project's x86-64 machines at `import tensorflow` (and an int8 conversion)
NOISE = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
         b"I0000 00:00:1796682738.811752   23153 port.cc:153] oneDNN custom operations are on.\n"
         b"I0000 00:00:1796682738.812487   23153 cudart_stub.cc:31] Could not find cuda drivers on your machine\n"
         b"E0000 00:00:1796682741.491536   23153 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
         b"fully_quantize: 0, inference_type: 6, input_inference_type: FLOAT32, output_inference_type: FLOAT32\n")


def test_the_start_up_lines_are_left_out_and_every_other_line_kept(capfd):
    """Another thread's lines, an error of the library's own that is not the cuInit one, and a
    last line without its newline all come through, in order."""
    def other_thread():
        print("the guard's own log line", file=sys.stderr, flush=True)

    with left_out(TENSORFLOW_CHATTER):
        os.write(2, NOISE[:60])  # a line written in two parts
        os.write(2, NOISE[60:])
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        os.write(2, b"E0000 00:00:1.5   1 loader.cc:9] a real failure\nno newline")
    os.write(2, b"\nafter the block\n")
    assert capfd.readouterr().err == ("the guard's own log line\nE0000 00:00:1.5   1 loader.cc:9] a real failure\n"
                                      "no newline\nafter the block\n")


def test_a_child_started_in_the_block_keeps_its_stderr_after_it(capfd):
    """It inherits the pipe: its lines are still passed on once the block has ended (none lost)."""
    with left_out(TENSORFLOW_CHATTER):
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); "
                                  "sys.stderr.write('I0000 00:00:1.0   7 port.cc:1] noise\\nfrom the child\\n')"],
                                 stdin=subprocess.PIPE)
    child.communicate(b"", timeout=60)
    assert child.returncode == 0
    for _ in range(200):  # the filter's thread passes the child's lines on as they come
        err = capfd.readouterr().err
        if err:
            break
        threading.Event().wait(0.05)
    assert err == "from the child\n"


def test_a_process_without_stderr_runs_the_block_as_it_is(tmp_path):
    """Started with 2>&- (no descriptor 2): the block runs, unfiltered, rather than fail."""
    script = ("import os\nfrom tracker.native_stderr import TENSORFLOW_CHATTER, left_out\n"
              "with left_out(TENSORFLOW_CHATTER):\n    print('ran')\n")
    proc = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, timeout=60,
                          stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0 and proc.stdout == "ran\n"


def test_a_user_who_asks_tensorflow_for_its_info_lines_gets_every_line(capfd, monkeypatch):
    """TF_CPP_MIN_LOG_LEVEL=0 or 1 is a request for them: the filter stood in its way (and left the
    continuation of a line it dropped, alone)."""
    for level, expected in (("0", NOISE), ("1", NOISE), ("2", b"")):
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
        with tensorflow_chatter_left_out():
            os.write(2, NOISE)
        assert capfd.readouterr().err == expected.decode(), level
