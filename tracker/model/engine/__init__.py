"""The project's Caffe engine: runs a `NetDef` (from `caffe_io.load_net`) forward with numpy.

    net = Net(load_net(prototxt, caffemodel), dtype=np.float32, mode="dl")
    out = net.forward(x, ["prob", "fc1"])     # x (N, C, H, W); dict of (N, ...) arrays (copies)

Layer arithmetic is Caffe's (one `tracker.model.ops` operator per layer type, on the functions of
`tracker.model.layers`). Blob naming is Caffe's too: an in-place layer (top == bottom) overwrites
its blob, so reading "fc1" of the face CNN gives fc1 after its ReLU; every named blob (inputs and
tops) can be read out.

Two execution modes, same results (within float rounding):

"caffe" -- Caffe's own CPU algorithm. Blobs are whole-batch NCHW arrays. Convolution loops over
    the images: im2col of one image into ONE column buffer shared by every convolution layer,
    then one sgemm per group through numpy's OpenBLAS, then the bias; ReLU is its own pass;
    InnerProduct is one GEMM over the batch; pooling is Caffe's ceil-mode pooling. OpenBLAS runs
    with `threads` threads, as Caffe linked to OpenBLAS does. Blobs no later layer reads are
    released, so peak memory is about two layers' activations for the batch.

"dl" -- the same layers executed for deep-learning shapes:
    * the batch is cut into chunks that fit ONE preallocated workspace (`workspace_bytes`, 64 MiB
      by default, shared by the worker threads; `workspace.py`);
    * convolution does one im2col for the whole chunk, straight from a strided view of the input
      into a (C*kh*kw, n*OH*OW) column buffer, and ONE GEMM (O, C*kh*kw) @ cols whose
      (O, n*OH*OW) result is the top blob itself, kept in (C, N, H, W) memory and passed on as its
      NCHW-shaped transposed view, so no layout transpose is ever copied (pooling and element-wise
      layers keep that memory order; InnerProduct gathers it once into rows);
    * the bias and an in-place ReLU that follows a Convolution/InnerProduct are applied in place
      on the GEMM output (the ReLU layer is then not run separately; `schedule.py`);
    * BLAS is single-threaded; the cores are used by worker threads instead: several images are
      split between one worker per core (chunks claimed by whichever worker is free; each runs
      the whole net on its chunk), and a single image has each Convolution's output rows and
      each InnerProduct's outputs claimed by the workers (`parallel.py`).

In both modes threads=None means 1 core or all cores, whichever the timing of the Net's own
passes shows faster for the batch size (`tracker.model.tuning`). BLAS thread limits are
process-wide: `forward` sets them for its duration and restores them.

The package:
    net.py        `Net`: settings and input checks, the choice of cores, the two forward paths
    schedule.py   the ops in execution order: in place or not, memory order, the ReLU fusion
    workspace.py  "dl": the arena, its slots planned from blob lifetimes, chunk sizes, views
    parallel.py   the BLAS thread limit, the worker threads, how a batch is split between them
"""

from tracker.model.engine.net import MODES, Net
from tracker.model.engine.parallel import blas_threads
from tracker.model.engine.workspace import DEFAULT_WORKSPACE_BYTES

__all__ = ["DEFAULT_WORKSPACE_BYTES", "MODES", "Net", "blas_threads"]
