"""The project's Caffe engine: runs a `NetDef` (from `caffe_io.load_net`) forward with numpy.

    net = Net(load_net(prototxt, caffemodel), dtype=np.float32, mode="dl")
    out = net.forward(x, ["prob", "fc1"])     # x (N, C, H, W); dict of (N, ...) arrays (copies)

Layer arithmetic is Caffe's (one `tracker.model.ops` operator per layer type, on the functions of
`tracker.model.layers`). Blob naming is Caffe's too: an in-place layer (top == bottom) overwrites
its blob, so reading "fc1" of the face CNN gives fc1 after its ReLU; every named blob (inputs and
tops) can be read out.

Two execution modes, same results (within float rounding):

"caffe" -- Caffe's own CPU algorithm. Blobs are whole-batch NCHW arrays. Convolution loops over
    the images: im2col of one image into a column buffer reused for every image, then one sgemm
    per group through numpy's OpenBLAS, which also adds the bias (a row of ones in the column
    buffer; a 1x1 convolution, whose columns are the image itself, adds it after the sgemm);
    ReLU is its own pass;
    InnerProduct is one GEMM over the batch; pooling is Caffe's ceil-mode pooling. OpenBLAS runs
    with `threads` threads, as Caffe linked to OpenBLAS does. The blobs live in the workspace
    below, planned for the whole batch (a blob's memory is reused once no later layer reads it,
    so peak memory is about two layers' activations for the batch) and kept between forwards,
    as Caffe keeps its blobs (`Net._forward_caffe` says when it is freed).

"dl" -- the same layers executed for deep-learning shapes:
    * the batch is cut into chunks that fit ONE preallocated workspace (`workspace_bytes`, 64 MiB
      by default, shared by the worker threads; `workspace.py`);
    * convolution runs each image in bands of output rows (at most ~1 MB of columns per BLAS
      thread, so a band's columns are still in cache when its GEMM reads them): im2col straight
      from a strided view of the input, one GEMM whose result is the band of the top blob
      itself, in one of two orientations (`tracker.model.ops`): channel-major, (O, C*kh*kw) @
      cols, the top in (C, N, H, W) memory, for few input channels; pixel-major, cols @
      (kh*kw*C, O), the top in (N, H, W, C) memory. Either is passed on as its NCHW-shaped
      transposed view, so no layout transpose is ever copied (pooling and element-wise layers
      keep that memory order; an InnerProduct reads (N, H, W, C) memory as it lies, its weights
      permuted to that order once, and gathers any other order into rows);
    * the bias and an in-place ReLU that follows a Convolution/InnerProduct are applied in place
      on the GEMM output (the ReLU layer is then not run separately; `schedule.py`);
    * an InnerProduct multiplies by its weights as (K, N), and a single image (a matrix-vector
      product) by Caffe's (N, K) rows, which OpenBLAS reads faster once they have left the cache;
    * a channel-major convolution whose top only a MAX pooling with tiling windows reads (conv1
      + pool1 of the face CNN) is pooled as it is computed: one GEMM gives every output of each
      pooling window at once, the max is taken over contiguous rows, the bias and ReLU follow on
      the pooled values, and the convolution's top is never written (`ops.PooledConvolution`; a
      forward that asks for that blob runs a schedule without this fusion);
    * any other convolution whose top only a MAX pooling reads (conv2 + pool2) leaves its bias
      and ReLU to the pooling, which adds them to the pooled values only (exact: both commute
      with a max; not when a pooling window lies wholly past the input; its top is then hidden
      the same way);
    * several images are split between one worker thread per core, with single-threaded BLAS
      (chunks claimed by whichever worker is free; each runs the whole net on its chunk); a
      single image has its GEMMs split by the BLAS's own threads (`parallel.py`).

In both modes threads=None means 1 core or all cores, whichever the timing of the Net's own
passes shows faster for the batch size (`tracker.model.tuning`). BLAS thread limits are
process-wide: `forward` sets them for its duration and restores them.

The package:
    net.py        `Net`: settings and input checks, the choice of cores, the two forward paths
    schedule.py   the ops in execution order: in place or not, memory order, the fusions
    workspace.py  the arena, its slots planned from blob lifetimes, chunk sizes ("dl"), views
    parallel.py   the BLAS thread limit, the worker threads, how a batch is split between them
"""

from tracker.model.engine.net import MODES, Net, check_net
from tracker.model.engine.parallel import blas_threads
from tracker.model.engine.workspace import DEFAULT_WORKSPACE_BYTES

__all__ = ["DEFAULT_WORKSPACE_BYTES", "MODES", "Net", "blas_threads", "check_net"]
