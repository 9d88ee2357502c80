"""Tiny models and synthetic training data, built without downloads.

Shared by the unit tests and the benchmarks so both exercise the same shapes.
"""

from __future__ import annotations

import random

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from training.trajectory import TrainingSample, Trajectory, Turn


def tiny_llama(vocab: int = 128, hidden: int = 32, layers: int = 2, max_pos: int = 32768,
               tied: bool = False) -> LlamaForCausalLM:
    heads = max(1, hidden // 16)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=max_pos, tie_word_embeddings=tied,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg)


def synthetic_samples(lengths: list[int], vocab: int, seed: int = 0,
                      advantage: float = 1.0) -> list[TrainingSample]:
    """Random-token samples of the given lengths, first quarter prompt (no loss), rest loss.

    vocab=1 gives all-zero ids, enough for counting padding and fast to build.
    """
    rng = random.Random(seed)
    out = []
    for n in lengths:
        ids = [rng.randrange(vocab) for _ in range(n)] if vocab > 1 else [0] * n
        mask = [0] * (n // 4) + [1] * (n - n // 4)
        out.append(TrainingSample(ids, mask, [0.0] * n, [n // 4], advantage=advantage))
    return out


def make_trajectory(turns: list[tuple[list[int], bool, list[int]]], prompt: list[int],
                    status: str = "resolved", reward: float = 1.0, task_id: str = "t",
                    sample_index: int = 0, logprob: float = -1.0) -> Trajectory:
    """A Trajectory from (assistant ids, format_error, observation ids) triples."""
    return Trajectory(
        task_id=task_id, sample_index=sample_index, policy_version="test",
        prompt_token_ids=list(prompt),
        turns=[Turn(token_ids=list(ids), logprobs=[logprob] * len(ids), text="",
                    command=None if bad else "ls", format_error=bad, observation="",
                    observation_token_ids=list(obs)) for ids, bad, obs in turns],
        status=status, reward=reward, num_turns=len(turns))


def tiny_tokenizer(vocab: int = 128):
    """A word-level tokenizer over tokens "t0".."t{vocab-1}", with t0 as padding."""
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", unk_token="t0")
