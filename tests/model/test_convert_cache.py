"""The converted-model cache: keyed by the caffemodel's sha256, rebuilt when the caffemodel
changes, stale or corrupt entries rebuilt with a log line, atomic writes."""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pytest
from backend_parity import write_quirky

from tracker.model.convert import convert


def _onnx_session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture
def model(tmp_path):
    return write_quirky(tmp_path / "model")


def test_entry_is_keyed_by_caffemodel_sha256(tmp_path, model, caplog):
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="tracker.model.convert.cache"):
        path = convert(model, "onnx", cache_dir=cache)
    sha = hashlib.sha256(model.weights.read_bytes()).hexdigest()
    assert path == cache / sha / "onnx-fp32.onnx" and path.is_file()
    meta = json.loads((cache / sha / "onnx-fp32.onnx.json").read_text())
    assert meta["key"]["caffemodel_sha256"] == sha
    assert meta["artifact_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "converting onnx" in caplog.text
    # a hit: nothing rebuilt, nothing logged, the same bytes
    before = path.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tracker.model.convert.cache"):
        assert convert(model, "onnx", cache_dir=cache) == path
    assert path.stat().st_mtime_ns == before and caplog.text == ""
    assert not [p for p in path.parent.iterdir() if ".tmp" in p.name]


def test_new_caffemodel_gets_a_new_entry(tmp_path, model):
    cache = tmp_path / "cache"
    first = convert(model, "onnx", cache_dir=cache)
    x = np.random.default_rng(0).standard_normal((1, 2, 23, 17)).astype(np.float32)
    before = _onnx_session(first).run(["prob"], {"data": x})[0]
    changed = write_quirky(tmp_path / "model", seed=1)  # same files, new weights
    second = convert(changed, "onnx", cache_dir=cache)
    assert second != first and second.parent.name == hashlib.sha256(changed.weights.read_bytes()).hexdigest()
    after = _onnx_session(second).run(["prob"], {"data": x})[0]
    assert np.abs(after - before).max() > 1e-3


def test_corrupt_entry_is_rebuilt_with_a_log_line(tmp_path, model, caplog):
    cache = tmp_path / "cache"
    path = convert(model, "onnx", cache_dir=cache)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])  # a truncated model
    with caplog.at_level(logging.WARNING, logger="tracker.model.convert.cache"):
        again = convert(model, "onnx", cache_dir=cache, load=_onnx_session)
    assert "is corrupt (checksum mismatch); rebuilding it" in caplog.text and str(path) in caplog.text
    assert again is not None and path.read_bytes() == good


def test_entry_that_does_not_load_is_rebuilt(tmp_path, model, caplog):
    """Checksum right, content unusable (e.g. written by a broken converter): the loader decides."""
    cache = tmp_path / "cache"
    path = convert(model, "onnx", cache_dir=cache)
    good = path.read_bytes()
    path.write_bytes(b"not an onnx model")
    meta_path = path.with_name(path.name + ".json")
    meta = json.loads(meta_path.read_text())
    meta["artifact_sha256"] = hashlib.sha256(b"not an onnx model").hexdigest()
    meta_path.write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="tracker.model.convert.cache"):
        convert(model, "onnx", cache_dir=cache, load=_onnx_session)
    assert "is corrupt (it does not load" in caplog.text
    assert path.read_bytes() == good


def test_stale_entry_is_rebuilt_with_a_log_line(tmp_path, model, caplog):
    """Same caffemodel, another model description (here: another embedding blob): stale."""
    cache = tmp_path / "cache"
    path = convert(model, "onnx", cache_dir=cache)
    with caplog.at_level(logging.WARNING, logger="tracker.model.convert.cache"):
        again = convert(type(model)(model.prototxt, model.weights, "prob", "fc2"), "onnx", cache_dir=cache)
    assert again == path
    assert "is stale (built for a different embedding); rebuilding it" in caplog.text


def test_missing_record_is_corrupt(tmp_path, model, caplog):
    cache = tmp_path / "cache"
    path = convert(model, "onnx", cache_dir=cache)
    path.with_name(path.name + ".json").unlink()
    with caplog.at_level(logging.WARNING, logger="tracker.model.convert.cache"):
        convert(model, "onnx", cache_dir=cache)
    assert "is corrupt (its record onnx-fp32.onnx.json is unreadable" in caplog.text


@pytest.mark.parametrize("record", [{"key": None, "artifact_sha256": "0"}, {"key": "x", "artifact_sha256": "0"},
                                    {"key": {}, "artifact_sha256": 7}, [], "[" * 200_000])  # (nested: a RecursionError)
def test_a_record_of_the_wrong_shape_is_corrupt(tmp_path, model, caplog, record):
    cache = tmp_path / "cache"
    path = convert(model, "onnx", cache_dir=cache)
    path.with_name(path.name + ".json").write_text(record if isinstance(record, str) else json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="tracker.model.convert.cache"):
        assert convert(model, "onnx", cache_dir=cache) == path
    assert "is corrupt (its record onnx-fp32.onnx.json is unreadable" in caplog.text


def test_cache_dir_from_environment(tmp_path, model, monkeypatch):
    monkeypatch.setenv("TRACKER_CACHE_DIR", str(tmp_path / "env-cache"))
    path = convert(model, "onnx")
    assert path.is_relative_to(tmp_path / "env-cache")


def test_a_cache_folder_that_cannot_be_written_is_one_line(tmp_path, model):
    from tracker.errors import InputError

    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match=r"converted-model cache '.*afile/[0-9a-f]{64}': cannot write \(Not a directory\); "
                                         r"expected a writable folder with room \(--cache-dir, or \$TRACKER_CACHE_DIR\)"):
        convert(model, "onnx", cache_dir=tmp_path / "afile")


def test_a_runtime_missing_when_loading_is_not_a_corrupt_entry(tmp_path, model, caplog):
    """A cached file that is fine is kept when its runtime is what fails (a Pi without the runtime
    would otherwise rebuild it, and say the rebuild's error instead of the real one)."""
    from tracker.errors import BackendUnavailable

    path = convert(model, "onnx", cache_dir=tmp_path / "cache")
    before = path.stat().st_mtime_ns

    def no_runtime(_path):
        raise BackendUnavailable("onnxruntime is not installed")

    with caplog.at_level(logging.WARNING, logger="tracker.model.convert.cache"):
        with pytest.raises(BackendUnavailable, match="onnxruntime is not installed"):
            convert(model, "onnx", cache_dir=tmp_path / "cache", load=no_runtime)
    assert "corrupt" not in caplog.text and path.stat().st_mtime_ns == before


def test_convert_out_on_a_full_disk_leaves_the_file_there_whole(tmp_path, model, capsys):
    from tmpfs import tmpfs

    from tracker.model.convert import convert_command

    with tmpfs(tmp_path / "small", "size=4k") as small:  # one page: the previous model's
        (small / "face.onnx").write_bytes(b"the previous model")
        args = ["--to", "onnx", "--prototxt", str(model.prototxt), "--weights", str(model.weights),
                     "--cache-dir", str(tmp_path / "cache"), "--out", str(small / "face.onnx")]
        from tracker.errors import InputError

        with pytest.raises(InputError, match="cannot write"):
            convert_command(args)
        assert (small / "face.onnx").read_bytes() == b"the previous model"
        assert sorted(p.name for p in small.iterdir()) == ["face.onnx"]


@pytest.mark.parametrize("to, out, message", [
    ("onnx", "", r"--out '.*': is a folder; expected a file path"),
    ("onnx", "a-file/m.onnx", r"--out '.*m.onnx': '.*a-file' is not a folder; expected a file path in an existing folder"),
    ("onnx", "no-such-folder/m.onnx", r"--out '.*m.onnx': '.*no-such-folder' does not exist; expected a file path in an "
                                      r"existing folder"),
    ("onnx", "read-only/m.onnx", r"--out '.*m.onnx': cannot write in '.*read-only' \("),
    ("tf", "face.tf", r"--out '.*face.tf': --to tf writes a Keras 3 model, which Keras loads only from a file "
                      r"named \*.keras; expected a path ending .keras"),
])
def test_convert_out_that_cannot_be_written_is_refused_before_converting(tmp_path, model, to, out, message):
    from tmpfs import tmpfs

    from tracker.errors import InputError
    from tracker.model.convert import convert_command

    (tmp_path / "a-file").write_text("")
    with tmpfs(tmp_path / "read-only", "ro,size=4k"), pytest.raises(InputError, match=message):
        convert_command(["--to", to, "--prototxt", str(model.prototxt), "--weights", str(model.weights),
                         "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / out)])
    assert not (tmp_path / "cache").exists()  # nothing was converted
    assert not (tmp_path / "no-such-folder").exists()  # nor a folder made


def test_a_cache_that_fills_up_while_converting_is_one_line(tmp_path, model):
    from tmpfs import tmpfs

    from tracker.errors import InputError

    with tmpfs(tmp_path / "cache", "size=4k") as cache:  # room for the probe's empty file, not for the model
        with pytest.raises(InputError, match=r"converted-model cache .*: cannot write \(No space left on device\); "
                                             r"expected a writable folder with room"):
            convert(model, "onnx", cache_dir=cache)


def test_a_failed_build_leaves_no_folder_it_made(tmp_path, model):
    """A damaged caffemodel failed its build after its folder (named by its sha256) was made: each
    try left an empty folder in the cache. One the cache had already is left, with its entries."""
    from tracker.errors import ModelError
    from tracker.model.spec import ModelSpec

    cache = tmp_path / "cache"
    damaged = tmp_path / "damaged.caffemodel"
    damaged.write_bytes(model.weights.read_bytes()[:1000])
    with pytest.raises(ModelError, match="is truncated or corrupt"):
        convert(ModelSpec(model.prototxt, damaged, model.probs, model.embedding), "onnx", cache_dir=cache)
    assert list(cache.iterdir()) == []
    built = convert(model, "onnx", cache_dir=cache)
    (tmp_path / "other.prototxt").write_text("not a net {")  # the same weights' folder, another failing build
    with pytest.raises(ModelError):
        convert(ModelSpec(tmp_path / "other.prototxt", model.weights, model.probs, model.embedding), "onnx", cache_dir=cache)
    assert built.is_file() and sorted(p.name for p in built.parent.iterdir()) == ["onnx-fp32.onnx", "onnx-fp32.onnx.json"]
