"""From TrainingSamples to padded micro-batches that fit a token budget.

Agent trajectories vary from a few hundred to tens of thousands of tokens. Padding every
sequence of a minibatch to the longest one wastes most of the compute, so each optimizer step's
rows are sorted by length and cut greedily into micro-batches whose padded size
(rows x longest row) stays under ``micro_batch_tokens``: neighbours in sorted order have similar
lengths, so padding stays small.

Samples that share their prompt share a row. A DAPO group's G samples begin with the same
prompt (1,100 tokens in cpu-demo) and differ in their replies (~15 tokens): as separate rows,
98% of the compute goes into G copies of that prompt. A packed row holds the prompt once, then
each sample's continuation; a 4D attention mask lets a continuation see the prompt and itself
only, and its position ids go on from where the prompt ends, so every logprob (and gradient)
equals the unpacked one up to float rounding. It needs an attention that takes a custom mask
(sdpa, eager); varlen kernels are not needed. A custom mask costs L x L memory and rules out
fused causal kernels, so a row is packed only while it is short (PACK_MAX_ROW_TOKENS) and the
sharing saves a quarter of its tokens or more; long agent trajectories behind a short prompt
stay unpacked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
from torch import Tensor

from training.trajectory import TrainingSample

Span = tuple[int, int, int]  # (row, start, stop) in a micro-batch's target-aligned columns
PACK_MAX_ROW_TOKENS = 8192  # the 4D mask of a row this long is 64 MB of bools


@dataclass
class MicroBatch:
    """Padded tensors for one forward/backward. Per-token fields are aligned with targets,
    i.e. with ``input_ids[:, 1:]``: column t is the prediction of token t+1."""

    index: list[int]  # the caller's sample positions, in the order of ``spans``
    input_ids: Tensor  # [b, L] long
    attention_mask: Tensor  # [b, L] long: 1 on real tokens
    loss_mask: Tensor  # [b, L-1] float
    behaviour_logprobs: Tensor  # [b, L-1] float
    advantages: Tensor  # [b, L-1] float: each token carries its sample's advantage
    extras: dict[str, Tensor]  # per-token [b, L-1] tensors given per sample (old logprobs, ...)
    spans: list[list[Span]] = field(default_factory=list)  # where sample index[k]'s columns are
    position_ids: Tensor | None = None  # [b, L], packed batches only
    # [b, L], packed batches only: 0 = the row's shared prompt, k = its k-th member, -1 = padding
    segments: Tensor | None = None

    @property
    def real_tokens(self) -> int:
        """Tokens the model computes: a shared prompt counts once."""
        return int(self.attention_mask.sum())

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def model_mask(self) -> Tensor:
        """What to pass the model as ``attention_mask``: for packed rows the [b, 1, L, L] mask,
        built here (on the batch's device) so only one micro-batch's mask exists at a time."""
        return self.attention_mask if self.segments is None else prompt_or_own(self.segments)

    def to(self, device: torch.device) -> MicroBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)
        return MicroBatch(self.index, move(self.input_ids), move(self.attention_mask),
                          move(self.loss_mask), move(self.behaviour_logprobs), move(self.advantages),
                          {k: v.to(device) for k, v in self.extras.items()}, self.spans,
                          move(self.position_ids), move(self.segments))


@dataclass
class Row:
    """Samples sharing tokens ``0 .. shared-1``: the row holds tokens ``0 .. shared-2`` once, then
    each member from its token ``shared-1`` on. (The last shared token is repeated per member:
    its logits predict each member's own first reply token.) A lone sample has ``shared=1``."""

    members: list[int]
    shared: int = 1


def prompt_length(s: TrainingSample) -> int:
    """Tokens before the first loss token: the part samples may share without losing a loss."""
    return next((t for t, m in enumerate(s.loss_mask) if m), len(s.loss_mask))


def row_length(samples: list[TrainingSample], row: Row) -> int:
    return row.shared - 1 + sum(len(samples[i].input_ids) - row.shared + 1 for i in row.members)


def _worth_packing(samples: list[TrainingSample], row: Row) -> bool:
    alone = sum(len(samples[i].input_ids) for i in row.members)
    return len(row.members) > 1 and 4 * row_length(samples, row) <= 3 * alone


def pack_rows(samples: list[TrainingSample], index: list[int], micro_batch_tokens: int,
              pack: bool = True) -> list[Row]:
    """One row per sample, or with ``pack`` one row per shared prompt (split at the budget or
    PACK_MAX_ROW_TOKENS); a row whose sharing saves less than a quarter of its tokens is unpacked."""
    if not pack:
        return [Row([i]) for i in index]
    limit = min(micro_batch_tokens, PACK_MAX_ROW_TOKENS)
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in index:
        p = prompt_length(samples[i])
        key = tuple(samples[i].input_ids[:p]) if p >= 2 else (-1 - i,)  # (-1-i,): alone
        by_prompt.setdefault(key, []).append(i)
    rows: list[Row] = []
    for key, members in by_prompt.items():
        row = Row([], len(key))
        for i in members:
            if row.members and row_length(samples, Row(row.members + [i], row.shared)) > limit:
                rows.append(row)
                row = Row([], len(key))
            row.members.append(i)
        rows.append(row)
    return [packed for r in rows
            for packed in ([r] if _worth_packing(samples, r) else [Row([i]) for i in r.members])]


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


def prompt_or_own(seg: Tensor) -> Tensor:
    """[b, 1, L, L] causal mask where a token sees the shared prompt (segment 0) and its own
    segment. Padding (-1) sees the prompt and earlier padding, never nothing: a row with no
    allowed key makes sdpa return NaN."""
    width = seg.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
    same = seg[:, :, None] == seg[:, None, :]
    prompt = (seg == 0)[:, None, :]
    return (causal & (same | prompt))[:, None]


def collate_rows(samples: list[TrainingSample], rows: list[Row], pad_id: int = 0,
                 extras: dict[str, list[Tensor]] | None = None) -> MicroBatch:
    """Right-pad the rows into one micro-batch. ``extras[name][i]`` is a [len_i - 1] tensor."""
    width = max(row_length(samples, r) for r in rows)
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attn = torch.zeros(shape, dtype=torch.long)
    pos = torch.zeros(shape, dtype=torch.long)
    seg = torch.full(shape, -1, dtype=torch.long)
    cols = {name: torch.zeros(len(rows), width - 1) for name in ("loss", "behav", "adv", *(extras or {}))}
    index: list[int] = []
    spans: list[list[Span]] = []
    for r, row in enumerate(rows):
        p = row.shared - 1  # tokens stored once
        ids[r, :p] = torch.as_tensor(samples[row.members[0]].input_ids[:p])
        pos[r, :p] = torch.arange(p)
        seg[r, :p] = 0
        at = p
        for k, i in enumerate(row.members):
            s = samples[i]
            n = len(s.input_ids)
            ids[r, at:at + n - p] = torch.as_tensor(s.input_ids[p:])
            pos[r, at:at + n - p] = torch.arange(p, n)
            seg[r, at:at + n - p] = k + 1
            # Target columns: the sample's first p from the shared prompt, the rest from its own.
            mine = [(r, 0, p), (r, at, at + n - 1 - p)]
            values = {"loss": torch.as_tensor(s.loss_mask[1:], dtype=torch.float32),
                      "behav": torch.as_tensor(s.behaviour_logprobs[1:], dtype=torch.float32),
                      "adv": torch.full((n - 1,), float(s.advantage))}
            values |= {name: vals[i].float() for name, vals in (extras or {}).items()}
            for name, v in values.items():
                cols[name][r, at:at + n - 1 - p] = v[p:]
                if k == 0:
                    cols[name][r, :p] = v[:p]
            index.append(i)
            spans.append([sp for sp in mine if sp[2] > sp[1]])
            at += n - p
        attn[r, :at] = 1
    packed = any(len(r.members) > 1 for r in rows)
    return MicroBatch(index, ids, attn, cols.pop("loss"), cols.pop("behav"), cols.pop("adv"), cols,
                      spans, pos if packed else None, seg if packed else None)


def collate(samples: list[TrainingSample], index: list[int], pad_id: int = 0,
            extras: dict[str, list[Tensor]] | None = None) -> MicroBatch:
    """The selected samples one per row, right-padded."""
    return collate_rows(samples, [Row([i]) for i in index], pad_id, extras)


def micro_batches(samples: list[TrainingSample], index: list[int], micro_batch_tokens: int,
                  pad_id: int = 0, extras: dict[str, list[Tensor]] | None = None,
                  pack: bool = False) -> list[MicroBatch]:
    """The samples ``index`` (one optimizer step's worth) as length-grouped micro-batches,
    with ``pack`` sharing each prompt within a row."""
    rows = pack_rows(samples, index, micro_batch_tokens, pack)
    groups = length_groups([row_length(samples, r) for r in rows], micro_batch_tokens)
    return [collate_rows(samples, [rows[j] for j in g], pad_id, extras) for g in groups]


def minibatches(n: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """A shuffled split of range(n) into optimizer steps of ``batch_size`` (last one may be short)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def padding_share(batches: list[MicroBatch]) -> float:
    padded = sum(b.padded_tokens for b in batches)
    return 1.0 - sum(b.real_tokens for b in batches) / padded if padded else 0.0


def split_rows(values: Tensor, batch: MicroBatch) -> list[Tensor]:
    """Undo padding and packing of a [b, L-1] per-token tensor: one [len_i - 1] tensor per
    sample, in ``batch.index`` order."""
    return [torch.cat([values[r, a:b] for r, a, b in spans]).detach().cpu() if spans
            else values.new_zeros(0).cpu() for spans in batch.spans]  # a 1-token sample has no columns
