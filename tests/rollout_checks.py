"""Checks shared by the rollout engine's unit and integration tests.

`RecordingBackend` sits between the engine and a real (or fake) backend and keeps every prompt it
was given and every completion it returned; `assert_token_exact` then proves, turn by turn, that
a trajectory holds exactly those ids, and that its training sample trains on exactly the sampled
ones.
"""

from __future__ import annotations

import threading
from typing import Any

from training.inference.base import Completion, SamplingParams
from training.trajectory import Trajectory, training_sample


class RecordingBackend:
    def __init__(self, inner: Any):
        self.inner = inner
        self.records: list[tuple[list[int], Completion]] = []  # (prompt given, completion returned)
        self.batch_sizes: list[int] = []
        self.seeds: list[int | None] = []
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    @property
    def policy_version(self) -> str:
        return self.inner.policy_version

    def _keep(self, prompts: list[list[int]], comps: list[Completion], seeds: list[int | None]) -> list[Completion]:
        with self._lock:
            self.records += [(list(p), c) for p, c in zip(prompts, comps)]
            self.batch_sizes.append(len(prompts))
            self.seeds += seeds
        return comps

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(len(prompts))]
        return self._keep(prompts, self.inner.generate([list(p) for p in prompts], sampling), seeds)

    def generate_rows(self, prompts: list[list[int]], sampling: SamplingParams,
                      seeds: list[int | None]) -> list[Completion]:
        return self._keep(prompts, self.inner.generate_rows([list(p) for p in prompts], sampling, seeds), seeds)

    def load_weights(self, checkpoint_dir: str) -> None:
        self.inner.load_weights(checkpoint_dir)

    def close(self) -> None:
        self.inner.close()


def assert_token_exact(trajs: list[Trajectory], records: list[tuple[list[int], Completion]],
                       all_records_used: bool = True) -> int:
    """Every turn k of every trajectory was generated from prompt + turns<k (sampled ids and
    observation ids) and sampled exactly its recorded ids; the training sample is the last
    context plus the last reply, with loss on sampled tokens of well-formed turns only.
    Returns how many turns were checked."""
    unused: dict[tuple[int, ...], list[Completion]] = {}
    for prompt, comp in records:
        unused.setdefault(tuple(prompt), []).append(comp)
    checked = 0
    for traj in trajs:
        given = list(traj.prompt_token_ids)
        mask: list[int] = [0] * len(given)
        for k, turn in enumerate(traj.turns):
            candidates = unused.get(tuple(given), [])
            match = next((c for c in candidates if c.token_ids == turn.token_ids), None)
            assert match is not None, (f"{traj.key} turn {k}: no generate call was given this context "
                                       f"({len(given)} ids) and returned these {len(turn.token_ids)} ids")
            candidates.remove(match)
            assert turn.logprobs == match.logprobs, f"{traj.key} turn {k}: logprobs differ from the sampler's"
            given += turn.token_ids + turn.observation_token_ids
            mask += [0 if turn.format_error else 1] * len(turn.token_ids) + [0] * len(turn.observation_token_ids)
            checked += 1
        if traj.turns:
            assert traj.turns[-1].observation_token_ids == [], f"{traj.key}: ids after the last turn were never given"
        sample = training_sample(traj)
        assert sample.input_ids == given, f"{traj.key}: training ids differ from what the model was given"
        assert sample.loss_mask == mask, f"{traj.key}: loss mask is not exactly the sampled, well-formed tokens"
    if all_records_used:
        left = sum(len(v) for v in unused.values())
        assert left == 0, f"{left} generate results belong to no trajectory turn"
    return checked
