"""From TrainingSamples to padded micro-batches that fit a token budget.

Rows are sorted by length and cut greedily into micro-batches whose padded size stays under
``micro_batch_tokens``. Samples that share a prompt share a row: a packed row holds the prompts
as a trie, then each sample's continuation, with a 4D attention mask and position ids that give
every logprob (and gradient) of the unpacked rows. Only short rows whose sharing saves a
quarter of their tokens are packed (the mask is L x L). docs/history/training.md has the why.
"""

from __future__ import annotations

import os
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
    # packed batches only: each token's node of its row's trie ([b, L], -1 = padding) and, per
    # row, which nodes are ancestors-or-self of which ([b, N, N] bool: [n, m] = m above n)
    segments: Tensor | None = None
    ancestors: Tensor | None = None

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
        return self.attention_mask if self.segments is None else tree_mask(self.segments, self.ancestors)

    def to(self, device: torch.device) -> MicroBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)
        return MicroBatch(self.index, move(self.input_ids), move(self.attention_mask),
                          move(self.loss_mask), move(self.behaviour_logprobs), move(self.advantages),
                          {k: v.to(device) for k, v in self.extras.items()}, self.spans,
                          move(self.position_ids), move(self.segments), move(self.ancestors))


@dataclass
class Row:
    """Samples that go in one row of a micro-batch; their shared prompt prefixes are laid out as
    a trie (`row_layout`). A lone sample is a row of its own."""

    members: list[int]


@dataclass
class Node:
    """A run of tokens ``start .. stop-1`` common to every sample below it (``sample``: any one
    of them, whose ids and per-token values the run's columns take). A branch starts one token
    before its samples part ways, repeating the token whose logits predict each branch's own
    next token, so that every column of a row predicts the row's next token."""

    sample: int
    start: int
    stop: int
    parent: int  # index in the row's node list, -1 at the top
    leaf: bool  # a sample's own tail: its last token's column predicts nothing


def prompt_length(s: TrainingSample) -> int:
    """Tokens before the first loss token: the part samples may share without losing a loss."""
    try:
        return s.loss_mask.index(1)  # list.index runs in C: packing asks this for every layout
    except ValueError:
        return len(s.loss_mask)


def _common(seqs: list[list[int]], cap: int) -> int:
    """Length of the common prefix of ``seqs``, at most ``cap``."""
    return len(os.path.commonprefix([q[:cap] for q in seqs]))


def row_layout(samples: list[TrainingSample], members: list[int]) -> list[Node]:
    """The row's nodes in the order they are laid out (depth first: a node right before its
    first child). Shared runs stop at the shortest prompt among the samples below them."""
    nodes: list[Node] = []

    def place(group: list[int], start: int, parent: int) -> None:
        if len(group) == 1:
            i = group[0]
            nodes.append(Node(i, start, len(samples[i].input_ids), parent, True))
            return
        seqs = [samples[i].input_ids for i in group]
        c = _common(seqs, min(prompt_length(samples[i]) for i in group))
        if c - 1 > start:  # tokens start .. c-2 are stored once; the branches repeat c-1
            nodes.append(Node(group[0], start, c - 1, parent, False))
            parent, start = len(nodes) - 1, c - 1
        branches: dict[int, list[int]] = {}
        for i in group:
            ids = samples[i].input_ids
            # a sample whose prompt ends here shares no further: a branch of its own
            key = ids[c] if prompt_length(samples[i]) > c and len(ids) > c else -1 - i
            branches.setdefault(key, []).append(i)
        for branch in branches.values():
            place(branch, start, parent)

    place(list(members), 0, -1)
    return nodes


def row_length(samples: list[TrainingSample], row: Row) -> int:
    return sum(n.stop - n.start for n in row_layout(samples, row.members))


def _worth_packing(samples: list[TrainingSample], row: Row) -> bool:
    alone = sum(len(samples[i].input_ids) for i in row.members)
    return len(row.members) > 1 and 4 * row_length(samples, row) <= 3 * alone


def pack_rows(samples: list[TrainingSample], index: list[int], micro_batch_tokens: int,
              pack: bool = True) -> list[Row]:
    """One row per sample, or with ``pack`` rows of samples in prompt order (so that shared
    prefixes sit together), each cut at the budget or PACK_MAX_ROW_TOKENS; a row whose sharing
    saves less than a quarter of its tokens is unpacked."""
    if not pack:
        return [Row([i]) for i in index]
    limit = min(micro_batch_tokens, PACK_MAX_ROW_TOKENS)
    order = sorted(index, key=lambda i: (samples[i].input_ids[:prompt_length(samples[i])], i))
    rows: list[Row] = []
    row = Row([])
    for i in order:
        if row.members and row_length(samples, Row(row.members + [i])) > limit:
            rows.append(row)
            row = Row([])
        row.members.append(i)
    rows.append(row)
    return [packed for r in rows if r.members
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


def tree_mask(nodes: Tensor, ancestors: Tensor) -> Tensor:
    """[b, 1, L, L] mask: a token sees the earlier tokens of its own node and every token of the
    nodes above it. Padding (-1) is a node of its own that sees only itself, never nothing: a
    row with no allowed key makes sdpa return NaN."""
    b, width = nodes.shape
    n = ancestors.shape[-1]
    anc = torch.zeros((b, n + 1, n + 1), dtype=torch.bool, device=nodes.device)
    anc[:, :n, :n] = ancestors
    anc[:, n, n] = True
    idx = torch.where(nodes < 0, n, nodes)
    rows = torch.arange(b, device=nodes.device)[:, None, None]
    allowed = anc[rows, idx[:, :, None], idx[:, None, :]]
    causal = torch.ones(width, width, dtype=torch.bool, device=nodes.device).tril()
    return (causal & allowed)[:, None]


def collate_rows(samples: list[TrainingSample], rows: list[Row], pad_id: int = 0,
                 extras: dict[str, list[Tensor]] | None = None) -> MicroBatch:
    """Right-pad the rows into one micro-batch. ``extras[name][i]`` is a [len_i - 1] tensor."""
    layouts = [row_layout(samples, r.members) for r in rows]
    width = max(sum(n.stop - n.start for n in nodes) for nodes in layouts)
    most = max(len(nodes) for nodes in layouts)
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attn = torch.zeros(shape, dtype=torch.long)
    pos = torch.zeros(shape, dtype=torch.long)
    seg = torch.full(shape, -1, dtype=torch.long)
    anc = torch.zeros((len(rows), most, most), dtype=torch.bool)
    cols = {name: torch.zeros(len(rows), width - 1) for name in ("loss", "behav", "adv", *(extras or {}))}
    spans_of: dict[int, list[Span]] = {}
    for r, nodes in enumerate(layouts):
        at = 0
        node_cols: list[Span] = []  # each node's target columns in this row
        for k, node in enumerate(nodes):
            s = samples[node.sample]
            n = node.stop - node.start
            ids[r, at:at + n] = torch.as_tensor(s.input_ids[node.start:node.stop])
            pos[r, at:at + n] = torch.arange(node.start, node.stop)
            seg[r, at:at + n] = k
            anc[r, k, k] = True
            if node.parent >= 0:
                anc[r, k] |= anc[r, node.parent]
            # column j (token node.start + j) predicts the next token of the branch; a leaf's
            # last token predicts nothing
            m = n - 1 if node.leaf else n
            cols["loss"][r, at:at + m] = torch.as_tensor(s.loss_mask[node.start + 1:node.start + 1 + m])
            cols["behav"][r, at:at + m] = torch.as_tensor(s.behaviour_logprobs[node.start + 1:node.start + 1 + m])
            cols["adv"][r, at:at + m] = float(s.advantage)
            for name, vals in (extras or {}).items():
                cols[name][r, at:at + m] = vals[node.sample][node.start:node.start + m].float()
            node_cols.append((r, at, at + m))
            if node.leaf:
                path, up = [], k
                while up >= 0:
                    path.append(node_cols[up])
                    up = nodes[up].parent
                spans_of[node.sample] = [sp for sp in reversed(path) if sp[2] > sp[1]]
            at += n
        attn[r, :at] = 1
    index = [i for r in rows for i in r.members]
    packed = any(len(r.members) > 1 for r in rows)
    return MicroBatch(index, ids, attn, cols.pop("loss"), cols.pop("behav"), cols.pop("adv"), cols,
                      [spans_of[i] for i in index], pos if packed else None, seg if packed else None,
                      anc if packed else None)


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
