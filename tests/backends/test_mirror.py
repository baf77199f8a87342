"""tracker.backends.mirror on the project's Caffe engine with the shipped weights: the mirror-mean
embedding computed apart, its invariance to mirroring the face, and who chooses it (the config,
else the weights' card, whose entries are checked)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tracker.backends import create_backend
from tracker.backends.mirror import MirrorMean, embedder
from tracker.errors import ModelError
from tracker.files import file_sha256
from tracker.model import face_cnn
from tracker.model.card import card_path, read_card, write_card
from tracker.model.spec import default_model


@pytest.fixture(scope="module")
def engine():
    backend = create_backend("caffe-openblas-dl", default_model())
    yield backend
    backend.close()


def crops(n: int, seed: int = 3) -> np.ndarray:
    """Smooth random (n, 1, 88, 88) float32 inputs in [0, 1], not mirror-symmetric."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 1, 11, 11), dtype=np.float32)
    return np.ascontiguousarray(np.kron(x, np.ones((8, 8), np.float32)))


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_embedding_is_the_unit_mean_of_the_crops_and_their_mirror_images(engine):
    x = crops(5)
    mirrored = np.ascontiguousarray(x[..., ::-1])
    plain, flipped = engine.infer(x), engine.infer(mirrored)
    out = MirrorMean(engine).infer(x)
    assert out.embedding.shape == (5, 128) and out.embedding.dtype == np.float32
    np.testing.assert_allclose(out.embedding, unit(unit(plain.embedding) + unit(flipped.embedding)), atol=1e-5)
    np.testing.assert_allclose(out.probs, (plain.probs + flipped.probs) / 2, atol=1e-6)
    assert out.probs.dtype == np.float32
    # the weights really do tell a face from its mirror image: the mean is not the plain embedding
    assert np.abs(unit(plain.embedding) - out.embedding).max() > 1e-3


def test_a_face_and_its_mirror_image_get_the_same_embedding_one_at_a_time_or_in_a_batch(engine):
    x = crops(4, seed=7)
    mirror_mean = MirrorMean(engine)
    batch = mirror_mean.infer(x).embedding
    np.testing.assert_allclose(mirror_mean.infer(np.ascontiguousarray(x[..., ::-1])).embedding, batch, atol=1e-5)
    upside_down = mirror_mean.infer(np.ascontiguousarray(x[:, :, ::-1])).embedding  # only left-right is averaged
    assert np.abs(upside_down - batch).max() > 1e-3
    one_by_one = np.concatenate([mirror_mean.infer(x[i:i + 1]).embedding for i in range(len(x))])
    np.testing.assert_allclose(one_by_one, batch, atol=1e-5)


def test_the_embedding_chosen_by_the_config_else_the_card_decides_the_wrapping(engine, tmp_path):
    from tracker.config import parse_config
    from tracker.identity import chosen_embedding

    shipped = default_model().weights
    assert read_card(shipped, file_sha256(shipped))["embedding"] == "mirror-mean"
    assert chosen_embedding(parse_config({})) == "mirror-mean"
    assert isinstance(embedder(engine, "mirror-mean"), MirrorMean) and embedder(engine, "single") is engine
    assert chosen_embedding(parse_config({"identity": {"embedding": "single"}})) == "single"
    random_weights = face_cnn.generate(tmp_path / "random.caffemodel")
    untrained = parse_config({"model": {"weights": str(random_weights)}})
    assert chosen_embedding(untrained) == "single"  # no card: one pass
    write_card(random_weights, {"weights_sha256": file_sha256(random_weights), "crop": "aligned-v1"})
    assert chosen_embedding(untrained) == "single"  # a card from before the entry: one pass


def test_a_card_with_an_unknown_embedding_is_one_line(tmp_path):
    from tracker.config import parse_config
    from tracker.identity import chosen_embedding

    weights = tmp_path / "face.caffemodel"
    shutil.copyfile(default_model().weights, weights)
    card = json.loads(card_path(default_model().weights).read_text())
    config = parse_config({"model": {"weights": str(weights)}})
    for bad, message in [({"embedding": "flip-max"}, r"embedding 'flip-max'; expected one of single, mirror-mean$"),
                         ({"thresholds_for": {"flip-max": {}}}, r"embedding 'flip-max'; expected one of"),
                         ({"thresholds_for": ["single"]}, r"thresholds_for \['single'\]; expected a mapping"),
                         ({"thresholds_for": {"single": {"identity_threshold": 2}}},
                          r"thresholds_for.single.identity_threshold 2; expected a cosine in \[-1, 1\]$")]:
        card_path(weights).write_text(json.dumps({**card, **bad}))
        with pytest.raises(ModelError, match=r"face.caffemodel.json': " + message):
            chosen_embedding(config)


def test_closing_closes_the_backend_it_wraps():
    closed = []

    class Backend:
        name = "stand-in"

        def close(self):
            closed.append(True)

    wrapped = MirrorMean(Backend())
    assert wrapped.name == "stand-in"
    wrapped.close()
    assert closed == [True]
