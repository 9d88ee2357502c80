"""What every policy sampler must provide, whatever runs it (transformers, vLLM, a server).

Token ids go in and come out: the trainer scores exactly the ids the sampler produced, so no
backend may round-trip through text. Logprobs are those of the distribution actually sampled
from (after repetition penalty, temperature and filters); at temperature 1.0 with every filter
off, which training rollouts enforce, that is the raw policy logprob the importance ratio needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, runtime_checkable

from environments.actions import closes_block
from swerl.config import Sampling

FinishReason = Literal["stop", "length", "block"]  # block: Sampling.stop_at_block


@dataclass(frozen=True)
class SamplingParams:
    """``swerl.config.Sampling`` plus what only the caller knows (stop ids, seed).

    temperature 0 means greedy; its logprobs are then those of the unscaled softmax.
    top_k -1 or 0 = off (vLLM and the config both use -1). seed: prompt i of a ``generate``
    call draws from seed + i (so a group of identical prompts still gets distinct samples);
    None = the backend's own random stream.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 512
    stop_at_block: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature={self.temperature} < 0")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p} not in (0, 1]")
        if self.top_k < -1:
            problems.append(f"top_k={self.top_k} < -1")
        if not 0 <= self.min_p <= 1:
            problems.append(f"min_p={self.min_p} not in [0, 1]")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty={self.repetition_penalty} <= 0")
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens={self.max_new_tokens} < 1")
        if problems:
            raise ValueError("invalid sampling params: " + ", ".join(problems))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @classmethod
    def from_config(cls, s: Sampling, **extra: Any) -> "SamplingParams":
        return cls(**s.model_dump(), **extra)

    def with_(self, **changes: Any) -> "SamplingParams":
        return replace(self, **changes)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def top_k_on(self) -> bool:
        return self.top_k > 0


@dataclass
class Completion:
    token_ids: list[int]  # sampled ids, the stop token included when finish_reason == "stop"
    logprobs: list[float]  # one per token id, under the sampling distribution used
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"completion has {len(self.token_ids)} ids but {len(self.logprobs)} logprobs")


def row_seeds(sp: SamplingParams, n: int) -> list[int | None]:
    """The per-prompt seeds a ``generate`` call implies (see ``SamplingParams``)."""
    return [None if sp.seed is None else sp.seed + i for i in range(n)]


@runtime_checkable
class InferenceBackend(Protocol):
    tokenizer: Any
    policy_version: str

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """One completion per prompt, in prompt order."""
        ...

    def generate_rows(self, prompts: list[list[int]], sampling: SamplingParams,
                      seeds: list[int | None]) -> list[Completion]:
        """Like generate, with one seed per prompt (``sampling.seed`` unused); a seeded prompt
        gets the same tokens whatever else is in the batch."""
        ...

    def load_weights(self, checkpoint_dir: str) -> None:
        """Swap in new policy weights (an HF safetensors checkpoint dir) and bump policy_version."""
        ...

    def close(self) -> None: ...


def stop_ids_for(tokenizer: Any, generation_eos: int | list[int] | None = None) -> set[int]:
    """The ids that end an assistant turn: tokenizer EOS, the model's EOS ids and ``<|im_end|>``.

    Chat models often end turns with a token that is not ``tokenizer.eos_token_id``; missing one
    would let the model ramble past its turn into a fake user message.
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(int(i) for i in generation_eos)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[tok] for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>") if tok in vocab)
    return ids


def cut_at_block(c: Completion, sp: SamplingParams, decode: Callable[[list[int]], str]) -> Completion:
    """The completion as a stop at the end of its first fenced block would have left it (when
    `sp.stop_at_block`; otherwise unchanged).

    Tokens are sampled left to right, so dropping what follows the block gives exactly the
    distribution of a sampler that stopped there: a backend that cannot stop on a block itself
    (a remote server, vLLM) samples on and is cut here, at the cost of the tokens it wasted.
    """
    if not sp.stop_at_block or not closes_block(decode(c.token_ids)):
        return c
    for k in range(1, len(c.token_ids) + 1):  # the shortest prefix that holds the block
        if closes_block(decode(c.token_ids[:k])):
            return c if k == len(c.token_ids) else Completion(c.token_ids[:k], c.logprobs[:k], "block")
    return c


def check_completion(c: Completion, sp: SamplingParams, stop_ids: set[int]) -> Completion:
    """Catch a sampler that ignored our limits or stop ids instead of trusting it silently.

    A "stop" must end on one of the ids we asked to stop at (the end-of-turn token is part of
    the trained sequence), and no completion may outrun max_new_tokens.
    """
    if len(c.token_ids) > sp.max_new_tokens:
        raise ValueError(f"sampler returned {len(c.token_ids)} tokens > max_new_tokens={sp.max_new_tokens}")
    if c.finish_reason == "stop" and (not c.token_ids or c.token_ids[-1] not in stop_ids):
        last = c.token_ids[-1] if c.token_ids else None
        raise ValueError(f"sampler stopped on {last!r}, not one of the stop ids {sorted(stop_ids)}")
    if c.finish_reason == "block" and not sp.stop_at_block:
        raise ValueError("finish_reason=block but stop_at_block is off")
    if c.finish_reason == "length" and len(c.token_ids) != sp.max_new_tokens:
        raise ValueError(f"finish_reason=length after {len(c.token_ids)} of {sp.max_new_tokens} tokens")
    return c


def policy_version_of(checkpoint_dir: str) -> str:
    """A checkpoint's version: its ``swerl.json`` "version" if it has one, else its dir name."""
    p = Path(checkpoint_dir)
    marker = p / "swerl.json"
    if marker.is_file():
        meta = json.loads(marker.read_text())
        if meta.get("version"):
            return str(meta["version"])
    return p.name
