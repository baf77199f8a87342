"""A loaded Caffe net as the engine, the converters and the shape rules see it: `NetDef` of
`LayerDef`s (made by `caffe_io.load_net`; built directly by tests and the training exporter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class LayerDef:
    """One layer of a loaded net.

    type: the current (V2) type string, e.g. "Convolution". param: the layer's LayerParameter
    (V1 upgraded; `blobs` cleared, the arrays are in `blobs`). blobs: float32 arrays in Caffe's
    shapes, e.g. conv weights (O, I/group, kh, kw) and bias (O,), InnerProduct weights
    (num_output, K) (or (K, num_output) with transpose), BatchNorm (C,), (C,), (1,); empty for
    layers without parameters, and for every layer when the net was loaded without weights.
    """

    name: str
    type: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    param: Any  # caffe_pb.LayerParameter (protobuf messages carry no static types)
    blobs: tuple[np.ndarray, ...]


@dataclass(frozen=True, eq=False)
class NetDef:
    """A net ready to run: its inputs (blob name -> declared shape, batch first, in order) and
    its TEST-phase layers in execution order (Input layers are folded into `inputs`)."""

    name: str
    inputs: dict[str, tuple[int, ...]]
    layers: list[LayerDef]
