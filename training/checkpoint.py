"""Checkpoints: a Hugging Face directory plus ``swerl.json``, complete or absent.

A crash mid-write must never leave something that looks like a checkpoint: everything is
written into a temporary sibling directory, ``_COMPLETE`` last, then renamed into place in one
step. Readers (and the uploader, which copies file by file) trust only directories that carry
the marker.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

COMPLETE = "_CHECKPOINT_COMPLETE"  # not "_COMPLETE": that name seals store directories
INFO = "swerl.json"
INFO_KEYS = ("stage", "iteration", "dataset_hash", "metrics", "parent")


class IncompleteCheckpoint(FileNotFoundError):
    """A directory without the completion marker: a crashed or still-running write."""


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE).is_file()


def save_checkpoint(model: nn.Module, tokenizer: Any, out_dir: str | Path, info: dict[str, Any],
                    state_dict: dict | None = None) -> Path:
    """Write ``out_dir`` atomically. ``state_dict`` overrides the model's (gathered FSDP weights).

    ``info`` should carry stage, iteration, dataset_hash, metrics and parent; missing ones are
    written as null so every swerl.json has the same keys.
    """
    out = Path(out_dir)
    if is_complete(out):
        raise FileExistsError(f"checkpoint already complete: {out}")
    record = {k: info.get(k) for k in INFO_KEYS} | dict(info)
    record["completed_at"] = time.time()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / INFO).write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        (tmp / COMPLETE).write_text(f"{record['completed_at']}\n")
        if out.exists():  # leftovers of a non-atomic copy: never complete (checked above)
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_info(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not is_complete(path):
        raise IncompleteCheckpoint(f"{path} has no {COMPLETE} marker (crashed or partial write)")
    return json.loads((path / INFO).read_text())


def load_checkpoint(path: str | Path, dtype: Any = None) -> tuple[nn.Module, Any, dict[str, Any]]:
    """(model, tokenizer, info) from a complete checkpoint directory."""
    info = read_info(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto")
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer, info


def latest_complete(dirs: list[str | Path]) -> Path | None:
    """The most recently completed of ``dirs`` (by the time recorded in swerl.json).

    Recorded time rather than mtime: uploads and downloads rewrite mtimes.
    """
    done = [Path(d) for d in dirs if is_complete(d)]
    if not done:
        return None
    return max(done, key=lambda d: read_info(d)["completed_at"])
