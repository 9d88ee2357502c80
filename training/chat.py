"""Incremental chat tokenisation that keeps trajectories token-exact.

Re-rendering the whole conversation with the chat template each turn and re-tokenising it is
wrong twice over: sampled tokens are not always the tokenizer's canonical split of their text,
and some templates rewrite history (drop earlier reasoning, trim whitespace), so the ids the
model saw would differ from the ids it is trained on. Instead we render the template once on a
probe conversation, cut out the text that wraps a user turn *between* two assistant turns, and
from then on only append: sampled ids as sampled, then wrapper + observation ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training.inference.base import SamplingParams

_A = "\x00ASSISTANT_PROBE\x00"
_U = "\x00OBSERVATION_PROBE\x00"


@dataclass
class ChatFormat:
    tokenizer: Any = field(repr=False)
    obs_prefix: str  # text after the assistant's content, before the observation
    obs_suffix: str  # text after the observation, up to where the next assistant turn begins
    eos_ids: list[int]  # ids that end an assistant turn when sampled

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "ChatFormat":
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": _A}, {"role": "user", "content": _U}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if _A not in text or _U not in text or text.index(_A) > text.index(_U):
            raise ValueError("the chat template does not render assistant and user turns in order; "
                             "incremental tokenisation needs one that does")
        a_end = text.index(_A) + len(_A)
        u_start = text.index(_U)
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        # the template's end-of-turn marker (e.g. <|im_end|>, <|eot_id|>) also ends a turn
        between = text[a_end:u_start]
        for tok in tokenizer.all_special_tokens:
            if tok and between.startswith(tok):
                eos.add(tokenizer.convert_tokens_to_ids(tok))
        return cls(tokenizer, between, text[u_start + len(_U):], sorted(eos))

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of the opening messages, ending where the first assistant turn begins."""
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def observation_ids(self, observation: str, sampled: list[int]) -> list[int]:
        """Ids appended after a sampled turn: close the turn (unless the model did), wrap the
        observation as a user message, and open the next assistant turn."""
        prefix = self.obs_prefix
        if sampled and sampled[-1] in self.eos_ids:
            eos_text = self.tokenizer.convert_ids_to_tokens(sampled[-1])
            if prefix.startswith(eos_text):
                prefix = prefix[len(eos_text):]
        text = prefix + observation + self.obs_suffix
        return self.tokenizer.encode(text, add_special_tokens=False)

    def sampling(self, sampling: SamplingParams) -> SamplingParams:
        """`sampling` that also stops at this template's end-of-turn ids."""
        return sampling.with_(stop_token_ids=tuple(sorted(set(sampling.stop_token_ids) | set(self.eos_ids))))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
