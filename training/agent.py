"""The agent loop: sample an action, run it in the gym, append the observation, repeat.

An `Episode` is a small state machine so that the rollout engine can interleave many of them and
batch their generation; `run_episode` drives one alone and reads as the whole loop on one screen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from environments.records import TaskInstance
from environments.sandbox import SandboxError
from training.chat import ChatFormat
from training.inference.base import Completion, InferenceBackend, SamplingParams
from training.trajectory import Trajectory, Turn

MIN_NEW_TOKENS = 16  # below this the model cannot write a command: the context is full


@dataclass
class AgentLimits:
    max_turns: int
    max_context_tokens: int
    max_new_tokens: int
    episode_timeout_s: float = 3600.0


@dataclass
class Episode:
    task: TaskInstance
    env: Any  # environments.swe_env.SWEEnv
    traj: Trajectory
    ids: list[int]  # everything the model has seen so far, exactly
    limits: AgentLimits
    started: float = field(default_factory=time.monotonic)
    done: bool = False

    def next_request(self) -> tuple[list[int], int] | None:
        """The ids to generate from and the token budget, or None when the episode must end."""
        if self.done:
            return None
        if time.monotonic() - self.started > self.limits.episode_timeout_s:
            return self._finish("timeout")
        budget = min(self.limits.max_new_tokens, self.limits.max_context_tokens - len(self.ids))
        if budget < MIN_NEW_TOKENS:
            return self._finish("context_full")
        return self.ids, budget

    def apply(self, completion: Completion, chat: ChatFormat, gen_time_s: float) -> None:
        """Record the sampled turn, run its action, append the observation's ids."""
        text = chat.decode(completion.token_ids)
        t0 = time.monotonic()
        step = self.env.step(text)
        env_time = time.monotonic() - t0
        obs = step.observation  # already truncated by the env (observation_max_chars)
        obs_ids = [] if step.done else chat.observation_ids(obs, completion.token_ids)
        self.traj.turns.append(Turn(
            token_ids=list(completion.token_ids), logprobs=list(completion.logprobs), text=text,
            command=step.command, format_error=step.format_error, observation=obs,
            observation_token_ids=obs_ids, env_time_s=env_time, gen_time_s=gen_time_s,
        ))
        self.ids = self.ids + list(completion.token_ids) + obs_ids
        self.traj.num_turns = len(self.traj.turns)
        if step.done:
            self._finish(step.exit_reason or "submitted")
        elif self.traj.num_turns >= self.limits.max_turns:
            self._finish("max_turns")
        elif len(self.ids) >= self.limits.max_context_tokens:
            self._finish("context_full")

    def _finish(self, reason: str) -> None:
        self.done = True
        self.traj.exit_reason = reason  # type: ignore[assignment]
        return None


def build_messages(first_observation: str, action_format: str, window: int, one_shot: bool) -> list[dict[str, str]]:
    """System prompt with the tool docs, the optional worked example, then the task."""
    from environments import prompts

    messages = [{"role": "system", "content": prompts.system_prompt(action_format, window)}]
    if one_shot:
        messages += prompts.one_shot_demo(action_format)
    messages.append({"role": "user", "content": first_observation})
    return messages


def start_episode(task: TaskInstance, sample_index: int, env: Any, chat: ChatFormat, limits: AgentLimits,
                  policy_version: str, action_format: str, window: int, one_shot: bool) -> Episode:
    first = env.reset()  # the task statement, as the agent sees it, with the cwd footer
    ids = chat.prompt_ids(build_messages(first, action_format, window, one_shot))
    traj = Trajectory(task_id=task.instance_id, sample_index=sample_index, policy_version=policy_version,
                      prompt_token_ids=list(ids))
    return Episode(task=task, env=env, traj=traj, ids=list(ids), limits=limits)


def finish_episode(ep: Episode, reward_fn: Callable[[Trajectory], float]) -> Trajectory:
    """Collect the patch, grade it in a fresh container, compute the reward. Infra errors are
    recorded as status `error` with a reason (the trainer skips them), never as a reward."""
    traj = ep.traj
    t0 = time.monotonic()
    try:
        traj.patch = ep.env.patch if ep.traj.exit_reason == "submitted" else ep.env.diff()
        result = ep.env.grade(traj.patch)
        traj.status = result.status
        traj.error_reason = result.error_reason
        traj.meta["grade"] = {"tests_status": result.tests_status, "duration_s": result.duration_s}
    except SandboxError as e:
        traj.status, traj.error_reason = "error", f"{type(e).__name__}: {e}"
    finally:
        ep.env.close()
    traj.timings["grade_s"] = time.monotonic() - t0
    traj.reward = reward_fn(traj) if traj.status != "error" else 0.0
    return traj


def run_episode(task: TaskInstance, sample_index: int, env: Any, backend: InferenceBackend, chat: ChatFormat,
                sampling: SamplingParams, limits: AgentLimits, action_format: str, window: int = 100,
                one_shot: bool = False, reward_fn: Callable[[Trajectory], float] = lambda t: float(t.status == "resolved"),
                ) -> Trajectory:
    """One episode, start to verdict, with no batching: the agent loop in its plainest form."""
    ep = start_episode(task, sample_index, env, chat, limits, backend.policy_version, action_format, window, one_shot)
    while (req := ep.next_request()) is not None:
        ids, budget = req
        t0 = time.monotonic()
        [completion] = backend.generate([ids], replace(sampling, max_new_tokens=budget))
        ep.apply(completion, chat, time.monotonic() - t0)
    return finish_episode(ep, reward_fn)
