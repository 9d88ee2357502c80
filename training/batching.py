"""From TrainingSamples to padded micro-batches that fit a token budget.

Agent trajectories vary from a few hundred to tens of thousands of tokens. Padding every
sequence of a minibatch to the longest one wastes most of the compute, so each optimizer step's
samples are sorted by length and cut greedily into micro-batches whose padded size
(rows x longest row) stays under ``micro_batch_tokens``: neighbours in sorted order have similar
lengths, so padding stays small. This works with every attention backend (true packing needs
varlen attention kernels that CPUs do not have).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from training.trajectory import TrainingSample


@dataclass
class MicroBatch:
    """Padded tensors for one forward/backward. Per-token fields are aligned with targets,
    i.e. with ``input_ids[:, 1:]``: column t is the prediction of token t+1."""

    index: list[int]  # positions of these rows in the caller's sample list
    input_ids: Tensor  # [b, L] long
    attention_mask: Tensor  # [b, L] long
    loss_mask: Tensor  # [b, L-1] float
    behaviour_logprobs: Tensor  # [b, L-1] float
    advantages: Tensor  # [b] float
    extras: dict[str, Tensor]  # per-token [b, L-1] tensors given per sample (old logprobs, ...)

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


def length_groups(lengths: list[int], micro_batch_tokens: int) -> list[list[int]]:
    """Indices grouped so that len(group) * max(length in group) <= micro_batch_tokens.

    A sequence longer than the budget gets a micro-batch of its own (it has to run somewhere).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    for i in order:
        # Sorted descending: the group's first member is its longest.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= micro_batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _pad(rows: list[list], width: int, value, dtype: torch.dtype) -> Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for r, row in enumerate(rows):
        out[r, :len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def collate(samples: list[TrainingSample], index: list[int], pad_id: int = 0,
            extras: dict[str, list[Tensor]] | None = None) -> MicroBatch:
    """Right-pad the selected samples. ``extras[name][i]`` is a [len_i - 1] tensor for sample i."""
    chosen = [samples[i] for i in index]
    width = max(len(s.input_ids) for s in chosen)
    ids = _pad([s.input_ids for s in chosen], width, pad_id, torch.long)
    attn = _pad([[1] * len(s.input_ids) for s in chosen], width, 0, torch.long)
    mask = _pad([s.loss_mask[1:] for s in chosen], width - 1, 0, torch.float32)
    behav = _pad([s.behaviour_logprobs[1:] for s in chosen], width - 1, 0.0, torch.float32)
    adv = torch.tensor([s.advantage for s in chosen], dtype=torch.float32)
    ext = {name: _pad([vals[i].tolist() for i in index], width - 1, 0.0, torch.float32)
           for name, vals in (extras or {}).items()}
    return MicroBatch(list(index), ids, attn, mask, behav, adv, ext)


def micro_batches(samples: list[TrainingSample], index: list[int], micro_batch_tokens: int,
                  pad_id: int = 0, extras: dict[str, list[Tensor]] | None = None) -> list[MicroBatch]:
    """The samples ``index`` (one optimizer step's worth) as length-grouped micro-batches."""
    groups = length_groups([len(samples[i].input_ids) for i in index], micro_batch_tokens)
    return [collate(samples, [index[j] for j in g], pad_id, extras) for g in groups]


def minibatches(n: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """A shuffled split of range(n) into optimizer steps of ``batch_size`` (last one may be short)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def padding_share(batches: list[MicroBatch]) -> float:
    padded = sum(b.padded_tokens for b in batches)
    return 1.0 - sum(b.real_tokens for b in batches) / padded if padded else 0.0


def split_rows(values: Tensor, batch: MicroBatch) -> list[Tensor]:
    """Undo the padding of a [b, L-1] per-token tensor: one [len_i - 1] tensor per row."""
    lengths = batch.attention_mask.sum(1).tolist()
    return [values[r, :n - 1].detach().cpu() for r, n in enumerate(lengths)]
