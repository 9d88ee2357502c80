"""Trajectory records: an episode exactly as the policy sampled it.

Token ids and logprobs are stored as sampled, so training inputs are derived from the record and
never re-tokenised from text (re-tokenising changes ids and silently biases the ratio).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ExitReason = Literal["submitted", "tests_passed", "max_turns", "context_full", "timeout", "error"]


@dataclass
class Turn:
    token_ids: list[int]  # assistant tokens exactly as sampled (incl. end-of-turn token)
    logprobs: list[float]  # behaviour logprobs of those tokens from the sampler
    text: str
    command: str | None  # the parsed action, None on a format error
    format_error: bool
    observation: str
    observation_token_ids: list[int]  # template tokens + observation, fed before the next turn
    env_time_s: float = 0.0
    gen_time_s: float = 0.0


@dataclass
class Trajectory:
    task_id: str
    sample_index: int
    policy_version: str
    prompt_token_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    patch: str = ""
    status: Literal["resolved", "unresolved", "error"] = "unresolved"
    error_reason: str = ""
    reward: float = 0.0
    num_turns: int = 0
    exit_reason: ExitReason = "max_turns"
    timings: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.task_id}__{self.sample_index}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        return cls(**d)

    @classmethod
    def from_json(cls, s: str) -> "Trajectory":
        return cls.from_dict(json.loads(s))


@dataclass
class TrainingSample:
    """Tensors-to-be for the trainer, derived from a Trajectory without re-tokenising."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on sampled assistant tokens of well-formed turns
    behaviour_logprobs: list[float]  # aligned with input_ids; 0.0 where loss_mask == 0
    turn_starts: list[int]  # index in input_ids where each assistant turn starts
    advantage: float = 0.0


def training_sample(traj: Trajectory, mask_format_errors: bool = True) -> TrainingSample:
    """Concatenate prompt, assistant turns and observations exactly as the model saw them.

    Format-error turns stay in the context (the model did see them); with `mask_format_errors`
    they get no loss, as in the paper's RFT recipe. Observation and prompt tokens never get loss.
    """
    ids = list(traj.prompt_token_ids)
    mask = [0] * len(ids)
    lps = [0.0] * len(ids)
    starts = []
    for turn in traj.turns:
        starts.append(len(ids))
        on = 0 if (mask_format_errors and turn.format_error) else 1
        ids.extend(turn.token_ids)
        mask.extend([on] * len(turn.token_ids))
        lps.extend(turn.logprobs if len(turn.logprobs) == len(turn.token_ids) else [0.0] * len(turn.token_ids))
        ids.extend(turn.observation_token_ids)
        mask.extend([0] * len(turn.observation_token_ids))
        lps.extend([0.0] * len(turn.observation_token_ids))
    return TrainingSample(ids, mask, lps, starts, traj.reward)
