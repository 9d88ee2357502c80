"""The sampler's math, shared by every in-process backend: logits -> the distribution sampled.

Order follows vLLM's: repetition penalty, temperature, then min_p, top_k, top_p. Filtered
tokens get -inf, so the returned log-probs are already renormalised over what survived; the
sampled token's entry is exactly the behaviour logprob the trainer needs.
"""

from __future__ import annotations

import torch

from training.inference.base import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty (as in HF and vLLM): shrink logits of tokens already in the context."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def processed_logprobs(logits: torch.Tensor, sp: SamplingParams,
                       seen: torch.Tensor | None = None) -> torch.Tensor:
    """[B, V] float logits -> [B, V] log-probs of the distribution the next token is drawn from.

    Greedy (temperature 0) keeps the unscaled softmax so its logprobs stay meaningful.
    """
    x = logits.float()
    if sp.repetition_penalty != 1.0:
        if seen is None:
            raise ValueError("repetition_penalty needs the mask of tokens seen so far")
        x = apply_repetition_penalty(x, seen, sp.repetition_penalty)
    if not sp.greedy and sp.temperature != 1.0:
        x = x / sp.temperature
    if sp.greedy:
        return torch.log_softmax(x, dim=-1)
    neg_inf = float("-inf")
    if sp.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        floor = sp.min_p * probs.max(dim=-1, keepdim=True).values
        x = x.masked_fill(probs < floor, neg_inf)
    if sp.top_k_on and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, neg_inf)
    if sp.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        drop_sorted = (cum - torch.softmax(sorted_x, dim=-1)) >= sp.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, neg_inf)
    return torch.log_softmax(x, dim=-1)


def sample(logprobs: torch.Tensor, sp: SamplingParams,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; returns (ids [B], their logprobs [B])."""
    if sp.greedy:
        ids = logprobs.argmax(dim=-1)
    else:
        ids = torch.multinomial(logprobs.exp(), num_samples=1, generator=generator).squeeze(-1)
    return ids, logprobs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def sample_rows(logprobs: torch.Tensor, sp: SamplingParams,
                generators: list[torch.Generator | None],
                fallback: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Like ``sample`` but row r draws from its own generator (seeded requests), so a seeded
    prompt gets the same tokens alone or in any batch; rows without one share ``fallback``."""
    if sp.greedy or all(g is None for g in generators):
        return sample(logprobs, sp, fallback)
    probs = logprobs.exp()
    ids = torch.cat([torch.multinomial(probs[r], 1, generator=g if g is not None else fallback)
                     for r, g in enumerate(generators)])
    return ids, logprobs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
