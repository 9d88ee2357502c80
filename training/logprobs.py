"""Per-token log-probabilities without materialising [tokens x vocab] logits.

At 16k tokens and a 49k-152k vocabulary the full logits alone are 3-10 GB in fp32, and
log_softmax plus its backward triples that. We run the model's own forward (so FSDP/ZeRO-3 hooks
gather the weights as usual) but swap its LM head for a function that walks the sequence in
chunks: project a chunk, log_softmax it, gather the target ids, drop the chunk. Each chunk is
wrapped in ``torch.utils.checkpoint`` so the backward recomputes the chunk's logits instead of
keeping them all alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from accelerate.utils import extract_model_from_parallel
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def _chunk_scores(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                  with_entropy: bool, temperature: float = 1.0) -> Tensor:
    """Logprob of each target (and the entropy of each position) for one chunk of positions."""
    logits = F.linear(hidden, weight, bias).float()
    logp = (logits if temperature == 1.0 else logits / temperature).log_softmax(-1)
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return lp
    # Entropy is a metric only: no gradient, so the backward stays one gather per chunk.
    ent = -(logp.detach().exp() * logp.detach()).sum(-1)
    return torch.stack([lp, ent], dim=-1)


def chunked_head(hidden: Tensor, head: nn.Linear, targets: Tensor, chunk: int,
                 with_entropy: bool = False, temperature: float = 1.0) -> Tensor:
    """Apply ``head`` + log_softmax + gather over the sequence dim in chunks of ``chunk``.

    ``temperature``: the policy is softmax(logits / T), the distribution a sampler at T draws
    from; the importance ratio is only unbiased when trainer and sampler use the same T.

    hidden: [B, T, H] states whose position t predicts targets[:, t]; returns [B, T] (or
    [B, T, 2] with entropy in the last slot).
    """
    use_ckpt = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for s in range(0, hidden.shape[1], chunk):
        h, tgt = hidden[:, s:s + chunk], targets[:, s:s + chunk]
        if use_ckpt:
            parts.append(checkpoint(_chunk_scores, h, head.weight, head.bias, tgt, with_entropy, temperature,
                                    use_reentrant=False))
        else:
            parts.append(_chunk_scores(h, head.weight, head.bias, tgt, with_entropy, temperature))
    return torch.cat(parts, dim=1)


@contextmanager
def _head_replaced(head: nn.Module, fn: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """Swap the head's forward for the duration of one model call.

    Going through ``head.__call__`` keeps distributed wrappers' hooks (which gather sharded
    weights) in place; only the computation inside changes.
    """
    head.forward = fn
    try:
        yield
    finally:
        del head.forward


def lm_head_of(model: nn.Module) -> nn.Linear:
    head = extract_model_from_parallel(model).get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise TypeError(f"expected an nn.Linear LM head, got {type(head).__name__}")
    return head


# Attention implementations that take a custom [B, 1, L, L] mask (packed rows, see batching.py).
PACKABLE_ATTENTION = ("sdpa", "eager")


def _as_model_mask(model: nn.Module, mask: Tensor) -> Tensor:
    """sdpa takes a boolean 4D mask as is; eager adds its mask to the scores."""
    if mask.dim() != 4:
        return mask
    impl = extract_model_from_parallel(model).config._attn_implementation
    if impl not in PACKABLE_ATTENTION:
        raise ValueError(f"a 4D attention mask needs one of {PACKABLE_ATTENTION} attention, not {impl}")
    if impl == "eager":
        return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
    return mask


def token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                   chunk: int = 1024, with_entropy: bool = False,
                   temperature: float = 1.0,
                   position_ids: Tensor | None = None,
                   only: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) for every t: shape [B, T-1].

    ``attention_mask`` is [B, T] (1 = real token) or, for packed rows, a [B, 1, T, T] boolean
    mask that comes with ``position_ids``. With ``with_entropy`` also returns the policy entropy
    at each of those positions (no grad). Padding positions get finite garbage; callers mask them.

    ``only`` ([B, T-1] bool): run the LM head at these positions alone, 0.0 elsewhere. An agent
    sample is mostly prompt (1,100 tokens of it for ~15 reply tokens in cpu-demo-1turn), and the head
    (vocab x hidden, a fifth of SmolLM2's weights) with its log_softmax on every prompt position
    was a quarter of a train step's compute spent on values the loss masks out.
    """
    head = lm_head_of(model)
    attention_mask = _as_model_mask(model, attention_mask)
    targets = input_ids[:, 1:]

    def scores(hidden: Tensor) -> Tensor:
        if only is None:
            return chunked_head(hidden[:, :-1], head, targets, chunk, with_entropy, temperature)
        picked = chunked_head(hidden[:, :-1][only][None], head, targets[only][None], chunk, with_entropy,
                              temperature)[0]
        out = picked.new_zeros((*targets.shape, *picked.shape[1:]))
        out[only] = picked
        return out

    with _head_replaced(head, scores):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=False).logits
    if with_entropy:
        return out[..., 0], out[..., 1].detach()
    return out


def naive_token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The reference: full logits, full log_softmax. For tests and the memory benchmark only."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logp = logits[:, :-1].float().log_softmax(-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
