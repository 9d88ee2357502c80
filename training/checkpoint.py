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


# ---- training state: what one update hands the next (DAPO's continuous training) --------
STATE_INFO = "train_state.json"  # written last: a state directory without it is incomplete
STATE_FILE = "optimizer.pt"  # the single-process format; the sharded one is a DCP directory


def _state_format(sharded: bool) -> str:
    return "dcp" if sharded else "torch"


def save_train_state(out_dir: str | Path, model: nn.Module, optimizer: Any, steps_done: int, *,
                     sharded: bool, main: bool = True) -> Path:
    """AdamW's moments and the step count, beside a checkpoint, for the next update to load.

    One process (or DDP, where every rank holds the same state): `torch.save` of the optimizer's
    state keyed by parameter name; the weights are the checkpoint's own fp32 ones. Sharded
    (FSDP2): `torch.distributed.checkpoint` writes each rank's shards of the fp32 master weights
    and of the optimizer state (the checkpoint beside it may be bf16), with no gather anywhere.
    Every rank calls this; ``main`` marks the one that writes the single-process file and the info.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, get_state_dict

    out = Path(out_dir)
    if main:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    # No step yet (an iteration without samples, from no earlier state): nothing to hand on, and
    # the state-dict helpers would take a zero-lr step to create it, leaving AdamW's count at 1.
    empty = not optimizer.state
    if empty:
        pass
    elif sharded:
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(out))
    else:
        state = get_optimizer_state_dict(model, optimizer)
        if main:
            torch.save(state, out / STATE_FILE)
    _barrier()
    if main:
        record = {"steps_done": steps_done, "format": _state_format(sharded), "empty": empty,
                  "completed_at": time.time()}
        (out / STATE_INFO).write_text(json.dumps(record, indent=2))
    return out


def read_state_info(state_dir: str | Path) -> dict[str, Any]:
    path = Path(state_dir) / STATE_INFO
    if not path.is_file():
        raise IncompleteCheckpoint(f"{state_dir} has no {STATE_INFO} (crashed or partial write)")
    return json.loads(path.read_text())


def load_train_state(state_dir: str | Path, model: nn.Module, optimizer: Any, *, sharded: bool) -> int:
    """Load `save_train_state`'s directory into ``model``/``optimizer`` (already prepared, in the
    same layout it was saved from); returns the step count it was saved at."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_state_dict, set_optimizer_state_dict,
                                                         set_state_dict)

    info = read_state_info(state_dir)
    if info["format"] != _state_format(sharded):
        raise ValueError(f"training state {state_dir} was saved {info['format']!r}, this trainer is "
                         f"{_state_format(sharded)!r}: a run keeps one train.accelerate_config")
    if info.get("empty"):
        pass
    elif sharded:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(state_dir))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        saved = torch.load(Path(state_dir) / STATE_FILE, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(model, optimizer, saved)
    return int(info["steps_done"])


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
