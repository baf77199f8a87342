"""The shared data's search path (tracker.shared_data): $TRACKER_SHARED_DIR first, then `shared/`
beside the checkout, and one line naming the file, where it was looked for and how to provide it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracker import shared_data
from tracker.detect.model_files import ModelFile
from tracker.errors import EXIT_BAD_INPUT, InputError
from tracker.sources.synthetic import DEFAULT_FACES, scene_chips

REPO = Path(__file__).resolve().parents[1]


def test_the_variable_comes_first_then_the_checkouts_neighbour(monkeypatch, tmp_path):
    monkeypatch.delenv(shared_data.ENV, raising=False)
    assert shared_data.search_path() == [REPO.parent / "shared"]
    monkeypatch.setenv(shared_data.ENV, str(tmp_path))
    assert shared_data.search_path() == [tmp_path, REPO.parent / "shared"]
    assert shared_data.find("datasets/mine.txt") is None
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "mine.txt").write_text("x")
    assert shared_data.find("datasets/mine.txt") == tmp_path / "datasets" / "mine.txt"


def test_the_detectors_models_are_found_in_the_shared_data_too(monkeypatch, tmp_path):
    monkeypatch.setenv(shared_data.ENV, str(tmp_path))
    spec = ModelFile("yunet", "m.onnx", "ab" * 32, "mine", "its home page")
    assert tmp_path / "models" / "mine" / "m.onnx" in spec.search_path()
    (tmp_path / "models" / "mine").mkdir(parents=True)
    (tmp_path / "models" / "mine" / "m.onnx").write_bytes(b"x")
    assert spec.find() == tmp_path / "models" / "mine" / "m.onnx"


def test_an_absent_file_is_one_line_naming_it_where_and_how(monkeypatch, tmp_path):
    monkeypatch.setenv(shared_data.ENV, str(tmp_path))
    monkeypatch.setattr(shared_data, "_CHECKOUT", tmp_path / "installed")  # not a source checkout
    with pytest.raises(InputError) as err:
        scene_chips()
    text = str(err.value)
    assert err.value.exit_code == EXIT_BAD_INPUT and "\n" not in text
    assert text.startswith(f"synthetic scene: {DEFAULT_FACES} not found in the shared data")
    assert f"looked in {tmp_path / DEFAULT_FACES}" in text
    assert "$TRACKER_SHARED_DIR" in text and "set source.faces_dir" in text
    monkeypatch.delenv(shared_data.ENV)
    with pytest.raises(InputError, match="TRACKER_SHARED_DIR is not set and this is not a source checkout"):
        shared_data.locate("datasets/mine.txt", "train")


def test_a_variable_that_cannot_be_looked_up_is_one_line(monkeypatch, tmp_path):
    """~user of nobody, or a name past the system's limit: tracebacks (RuntimeError, OSError)."""
    from tracker.errors import ModelError

    monkeypatch.setenv(shared_data.ENV, "~no_such_user_here/shared")
    with pytest.raises(InputError, match=r"\$TRACKER_SHARED_DIR '~no_such_user_here/shared': cannot expand ~"):
        shared_data.find("datasets/mine.txt")
    monkeypatch.setenv(shared_data.ENV, str(tmp_path / ("x" * 300)))
    with pytest.raises(InputError, match=r"cannot look it up \(File name too long\)"):
        shared_data.find("datasets/mine.txt")
    with pytest.raises(ModelError, match=r"yunet detector: .*: cannot look it up \(File name too long\)"):
        ModelFile("yunet", "m.onnx", "ab" * 32, "mine", "its home page").find()


def test_a_variable_naming_no_folder_is_one_line_not_skipped(monkeypatch, tmp_path):
    """Skipped, a typo in it went unseen while the checkout's shared/ held the file."""
    monkeypatch.setenv(shared_data.ENV, str(tmp_path / "typo"))
    with pytest.raises(InputError, match=rf"\$TRACKER_SHARED_DIR '{tmp_path / 'typo'}': no such folder; expected the shared-data folder"):
        shared_data.find(DEFAULT_FACES)
    (tmp_path / "a file").write_text("x")
    monkeypatch.setenv(shared_data.ENV, str(tmp_path / "a file"))
    with pytest.raises(InputError, match="no such folder"):
        scene_chips()
