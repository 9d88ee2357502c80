"""Checkpoints are complete or absent, round-trip exactly, and the latest complete one wins."""

import json

import pytest
import torch

from training.checkpoint import (COMPLETE, IncompleteCheckpoint, latest_complete, load_checkpoint,
                                 save_checkpoint)
from bench.synthetic import tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.unit

INFO = {"stage": "dapo", "iteration": 3, "dataset_hash": "abc", "metrics": {"loss": 0.5},
        "parent": "rft-0"}


def test_round_trip(tmp_path):
    torch.manual_seed(0)
    model, tok = tiny_llama(), tiny_tokenizer()
    out = save_checkpoint(model, tok, tmp_path / "dapo-3", INFO)
    assert (out / COMPLETE).is_file() and (out / "model.safetensors").is_file()
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    loaded, ltok, info = load_checkpoint(out)
    assert {k: info[k] for k in INFO} == INFO and "completed_at" in info
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert ltok("t5 t7").input_ids == [5, 7]
    assert [p.name for p in tmp_path.iterdir()] == ["dapo-3"]  # no temp dir left


def test_missing_info_keys_are_written_as_null(tmp_path):
    out = save_checkpoint(tiny_llama(), None, tmp_path / "c", {"stage": "rft"})
    info = json.loads((out / "swerl.json").read_text())
    assert info["stage"] == "rft" and info["iteration"] is None and info["parent"] is None


def test_refuses_to_overwrite_complete(tmp_path):
    save_checkpoint(tiny_llama(), None, tmp_path / "c", INFO)
    with pytest.raises(FileExistsError):
        save_checkpoint(tiny_llama(), None, tmp_path / "c", INFO)


def test_crash_mid_write_leaves_nothing(tmp_path):
    class Broken:
        def save_pretrained(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tiny_llama(), Broken(), tmp_path / "c", INFO)
    assert list(tmp_path.iterdir()) == []


def test_incomplete_dir_is_refused_and_replaced(tmp_path):
    partial = tmp_path / "c"
    partial.mkdir()
    (partial / "config.json").write_text("{}")  # e.g. an interrupted download
    with pytest.raises(IncompleteCheckpoint):
        load_checkpoint(partial)
    save_checkpoint(tiny_llama(), None, partial, INFO)
    assert (partial / COMPLETE).is_file()


def test_latest_complete(tmp_path):
    a = save_checkpoint(tiny_llama(), None, tmp_path / "b-first", INFO | {"iteration": 1})
    b = save_checkpoint(tiny_llama(), None, tmp_path / "a-second", INFO | {"iteration": 2})
    partial = tmp_path / "z-partial"
    partial.mkdir()
    # by recorded completion time, not by name or by the incomplete dir
    assert latest_complete([a, partial, b]) == b
    assert latest_complete([a, partial]) == a
    assert latest_complete([partial]) is None
