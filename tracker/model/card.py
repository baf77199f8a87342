"""The card beside a caffemodel: `<weights>.json`, what the weights need to be used well.

A caffemodel says nothing about the crops it was trained on or the similarity at which two faces
are the same person, yet both belong to the weights: another caffemodel brings its own. The card:

    {"schema": 1,
     "weights_sha256": "<sha256 of the caffemodel>",   # the card applies to these bytes only
     "crop": "aligned-v1",                              # tracker.crops definition trained on
     "embedding": "mirror-mean",                        # how a face becomes its embedding (EMBEDDINGS)
     "blob": "fc1",                                     # the embedding's blob (model.embedding; absent: fc1)
     "identity_threshold": 0.52,                        # cosine of such embeddings: same person at or above
     "threshold_far": 0.01,                             # the false-accept rate it was set for
     "reid_threshold": 0.79,                            # the tracker's: a lost face is back at or above
     "reid_far": 0.001,                                 # the false-accept rate that one was set for
     "threshold_pairs": "pairsDevTrain.txt ...",        # where that was measured
     "thresholds_for": {"single": {"identity_threshold": 0.51, ...}},  # the same, other embeddings
     "classes": ["lfw-devtrain:George_W_Bush", ...],    # fc2's outputs, in order
     "training": {...}}                                 # how it was made (tracker train)

The thresholds hold for embeddings made the card's way, `embedding`: "single" (one pass of the
crop; the default, for cards from before the entry) or "mirror-mean" (the crop and its mirror
image in one batch, the mean of their unit embeddings: `tracker.backends.mirror`). The guard embeds
faces the card's way unless `identity.embedding` says otherwise, and then takes that embedding's
thresholds from `thresholds_for` (`thresholds`). All of them are cosines of the blob `blob`
names (`thresholds_blob`; the cards before the entry, the shipped one among them, were all fc1's):
with another `model.embedding` they do not apply.

`read_card` returns None when there is no card; a card of other bytes is a ModelError (exit 2): a
threshold calibrated for other weights is a wrong threshold, and falling back to a default one
silently would name strangers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, get_args

from tracker.errors import ModelError
from tracker.files import atomic_write, read_regular_file
from tracker.model.spec import EMBEDDING_BLOB

SCHEMA = 1
Embedding = Literal["single", "mirror-mean"]  # the card's `embedding`: see the module docstring
EMBEDDINGS: tuple[str, ...] = get_args(Embedding)
THRESHOLDS = ("identity_threshold", "reid_threshold")  # absent when training had no pairs to set them on
MAX_CARD_BYTES = 1 << 20  # a card is under 2 KB; the bound keeps /dev/zero under that name from filling memory


def card_path(weights: Path) -> Path:
    return Path(weights).with_name(Path(weights).name + ".json")


def read_card(weights: Path, weights_sha256: str) -> dict | None:
    """The card of the caffemodel `weights` whose bytes hash to `weights_sha256`, or None when there
    is none; ModelError for a malformed card or one of other weights, and for anything under its
    name that is not a regular file of at most MAX_CARD_BYTES (a FIFO hung every command's start)."""
    path = card_path(weights)
    if not path.exists():
        return None
    try:
        card = json.loads(read_regular_file(path, MAX_CARD_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: nested past Python's limit
        raise ModelError(f"model card {str(path)!r}: unreadable ({type(err).__name__}: {err}); expected the JSON that "
                         "`tracker train` writes beside its caffemodel, or no file") from None
    if not isinstance(card, dict) or isinstance(card.get("schema"), bool) or card.get("schema") != SCHEMA:
        raise ModelError(f"model card {str(path)!r}: schema {card.get('schema') if isinstance(card, dict) else None!r}; "
                         f"expected {SCHEMA}")
    if card.get("weights_sha256") != weights_sha256:
        raise ModelError(f"model card {str(path)!r} belongs to other weights (sha256 {str(card.get('weights_sha256'))[:12]}..., "
                         f"the caffemodel's is {weights_sha256[:12]}...): its threshold would be wrong; expected the card "
                         "`tracker train` wrote with these weights, or no card and identity.threshold set")

    others = card.get("thresholds_for", {})
    if not isinstance(others, dict) or not all(isinstance(entry, dict) for entry in others.values()):
        raise ModelError(f"model card {str(path)!r}: thresholds_for {others!r}; expected a mapping of embedding "
                         "to its thresholds")
    blob = card.get("blob", EMBEDDING_BLOB)
    if not isinstance(blob, str) or not blob:
        raise ModelError(f"model card {str(path)!r}: blob {blob!r}; expected the name of the embedding's blob")
    for name in [card.get("embedding", EMBEDDINGS[0]), *others]:
        if name not in EMBEDDINGS:
            raise ModelError(f"model card {str(path)!r}: embedding {name!r}; expected one of {', '.join(EMBEDDINGS)}")
    for where, entries in [("", card), *((f"thresholds_for.{name}.", entry) for name, entry in others.items())]:
        for key in THRESHOLDS:
            threshold = entries.get(key)
            if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                          or not -1.0 <= threshold <= 1.0):  # true is an int to Python, and 1.0
                raise ModelError(f"model card {str(path)!r}: {where}{key} {threshold!r}; expected a cosine in [-1, 1]")
    return card


def embedding_recipe(card: dict | None) -> str:
    """The card's `embedding` (one of EMBEDDINGS); "single" for no card or a card without one."""
    return (card or {}).get("embedding", EMBEDDINGS[0])


def thresholds_blob(card: dict) -> str:
    """The blob whose embeddings the card's thresholds are cosines of: its `blob`, else fc1."""
    return card.get("blob", EMBEDDING_BLOB)


def thresholds(card: dict | None, embedding: str) -> dict:
    """The threshold entries (identity_threshold, reid_threshold, ...) `card` holds for embeddings
    made the `embedding` way: its own for its own embedding, else `thresholds_for`'s; {} for none."""
    if card is None:
        return {}
    if embedding == embedding_recipe(card):
        return card
    return card.get("thresholds_for", {}).get(embedding, {})


def write_card(weights: Path, card: dict) -> Path:
    """Write `card` (schema added) beside `weights`, atomically; returns its path."""
    path = card_path(weights)
    atomic_write(path, json.dumps({"schema": SCHEMA, **card}, indent=1).encode())
    return path
