"""The agent loop: sample an action, run it in the gym, append the observation, repeat.

An `Episode` is a small state machine, so that the rollout engine can interleave many and batch
their generation; `run_episode` drives one alone and is the whole loop on one screen.
`Episode.ids` is always exactly what the model is given next: it grows only by sampled ids and
the ids of the wrapped observation, and the trajectory records both (no re-tokenising).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from environments import prompts
from environments.hints import LINE_HINT, POINTER_HINT
from environments.records import TaskInstance
from environments.sandbox import SandboxError
from training.chat import ChatFormat
from training.inference.base import Completion, InferenceBackend, SamplingParams
from training.rewards import RewardFn, resolved_reward, reward
from training.trajectory import Trajectory, Turn

MIN_NEW_TOKENS = 16  # below this the model cannot write a command: the context is full
GRADE_INFRA_PREFIX = "sandbox:"  # environments.grading marks verdicts lost to the sandbox so


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int
    max_context_tokens: int
    max_new_tokens: int
    episode_timeout_s: float = 3600.0


@dataclass(frozen=True, kw_only=True)
class EpisodeSpec:
    """What one episode is: how the agent is prompted, how long it may go, how it is paid.

    Built once per rollout from the config (`training.run.episode_spec`) and handed down whole.
    `l_thr` is the paper's turn-penalty threshold; None pays 1 for resolved, 0 otherwise.
    """

    limits: AgentLimits
    action_format: str
    window: int = 100  # lines the file viewer shows
    one_shot: bool = False  # the worked example precedes the task
    prompt_style: str = "full"  # must match the env's (SWEEnv prompt_style / show_source)
    show_source: bool = False
    observation_max_chars: int = 4000
    feedback: str = "none"  # "tests": the env checks each change with the failing tests (SWEEnv)
    l_thr: int | None = None

    def messages(self, first_observation: str, task: TaskInstance) -> list[dict[str, str]]:
        level = task.meta.get("hint_level")
        return build_messages(first_observation, self.action_format, self.window, self.one_shot,
                              self.prompt_style, self.show_source, level == LINE_HINT, self.feedback == "tests",
                              level == POINTER_HINT)

    def reward(self, traj: Trajectory) -> float:
        if self.l_thr is None:
            return resolved_reward(traj)
        return reward(traj.status == "resolved", traj.num_turns, self.l_thr, self.limits.max_turns)


def turn_seed(base: int | None, task_id: str, sample_index: int, turn: int) -> int | None:
    """The sampling seed of one turn of one episode.

    Derived from the episode and the turn, never from the row a prompt lands on in a batch: two
    samples of the same task must not share a random stream (identical groups have no
    advantage), and an episode must sample the same tokens alone or batched with others.
    """
    if base is None:
        return None
    digest = hashlib.sha256(f"{base}:{task_id}:{sample_index}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1  # 31 bits: every backend takes it


@dataclass
class Request:
    """One turn's generation: the exact context, its token budget and its seed."""

    ids: list[int]
    max_new_tokens: int
    seed: int | None


@dataclass
class Episode:
    task: TaskInstance
    env: Any  # environments.swe_env.SWEEnv, or anything with reset/step/diff/grade/close/patch
    traj: Trajectory
    ids: list[int]  # everything the model will be given next, exactly
    limits: AgentLimits
    seed: int | None = None  # the run's sampling seed; each turn derives its own (turn_seed)
    started: float = field(default_factory=time.monotonic)
    done: bool = False

    def next_request(self) -> Request | None:
        """The next turn's request, or None when the episode must end (and why is recorded)."""
        if self.done:
            return None
        if time.monotonic() - self.started > self.limits.episode_timeout_s:
            return self._finish("timeout")
        budget = min(self.limits.max_new_tokens, self.limits.max_context_tokens - len(self.ids))
        if budget < MIN_NEW_TOKENS:
            return self._finish("context_full")
        seed = turn_seed(self.seed, self.traj.task_id, self.traj.sample_index, len(self.traj.turns))
        return Request(self.ids, budget, seed)

    def apply(self, completion: Completion, chat: ChatFormat, gen_time_s: float) -> None:
        """Record the sampled turn and run its action.

        The observation's ids are appended only when the model will see them: the turn that ends
        the episode (submit, the last allowed turn, or a context that cannot fit another reply)
        keeps its observation text for the record but adds no ids, so the trajectory holds
        exactly the ids the model was given and sampled, nothing more.
        """
        text = chat.decode(completion.token_ids)
        t0 = time.monotonic()
        step = self.env.step(text)  # infra errors (SandboxError) propagate: the engine retries
        env_time = time.monotonic() - t0
        sampled = list(completion.token_ids)
        turn = Turn(token_ids=sampled, logprobs=list(completion.logprobs), text=text,
                    command=step.command, format_error=step.format_error, observation=step.observation,
                    observation_token_ids=[], env_time_s=env_time, gen_time_s=gen_time_s)
        self.traj.turns.append(turn)
        self.traj.num_turns = len(self.traj.turns)
        self.ids = self.ids + sampled
        if step.done:
            self._finish(step.exit_reason or "submitted")
            return
        if self.traj.num_turns >= self.limits.max_turns:
            self._finish("max_turns")
            return
        obs_ids = chat.observation_ids(step.observation, sampled)
        if len(self.ids) + len(obs_ids) + MIN_NEW_TOKENS > self.limits.max_context_tokens:
            self._finish("context_full")
            return
        turn.observation_token_ids = obs_ids
        self.ids = self.ids + obs_ids

    def _finish(self, reason: str) -> None:
        self.done = True
        self.traj.exit_reason = reason  # type: ignore[assignment]
        return None


def build_messages(first_observation: str, action_format: str, window: int, one_shot: bool,
                   style: str = "full", show_source: bool = False, line_hint: bool = False,
                   feedback: bool = False, pointer: bool = False) -> list[dict[str, str]]:
    """System prompt with the tool docs, the optional worked example (stated like the task:
    `line_hint` for hint-level-4 tasks, `pointer` for level 5; with `feedback`, a wrong try, its
    test output, a right one), then the task."""
    system = prompts.system_prompt(action_format, window, style, feedback, pointer)
    messages = [{"role": "system", "content": system}]
    if one_shot:
        messages += prompts.one_shot_demo(action_format, style, show_source, line_hint, feedback, pointer)
    messages.append({"role": "user", "content": first_observation})
    return messages


def start_episode(task: TaskInstance, sample_index: int, env: Any, chat: ChatFormat, spec: EpisodeSpec,
                  policy_version: str, seed: int | None = None) -> Episode:
    """Reset the env (starts its sandbox) and render the opening messages once, as ids."""
    t0 = time.monotonic()
    first = env.reset()  # the task statement, as the agent sees it, with the cwd footer
    ids = chat.prompt_ids(spec.messages(first, task))
    traj = Trajectory(task_id=task.instance_id, sample_index=sample_index, policy_version=policy_version,
                      prompt_token_ids=list(ids))
    traj.timings["reset_s"] = time.monotonic() - t0
    return Episode(task=task, env=env, traj=traj, ids=list(ids), limits=spec.limits, seed=seed)


def episode_patch(ep: Episode) -> str:
    """The episode's answer: the submitted patch, or else the work tree's diff as it was left.

    Closes the agent's sandbox either way (grading never uses it). A dead sandbox raises
    SandboxError: the answer is lost, so the engine treats the whole episode as an infra error.
    """
    try:
        patch = ep.env.patch if ep.traj.exit_reason in ("submitted", "tests_passed") else None
        return patch if patch is not None else ep.env.diff()
    finally:
        ep.env.close()


def grade_episode(ep: Episode, patch: str, reward_fn: RewardFn, retries: int = 0) -> Trajectory:
    """Grade the patch in a fresh container and set status, reward and timings.

    A verdict lost to the sandbox (grading reports it with a `sandbox:` reason, or raises) is
    tried again up to `retries` times and then recorded as status `error` with its reason; an
    error is never scored, its reward stays 0.0 and the trainers skip it by status.
    """
    traj = ep.traj
    traj.patch = patch
    t0 = time.monotonic()
    for attempt in range(retries + 1):
        try:
            result = ep.env.grade(patch)
        except SandboxError as e:
            traj.status, traj.error_reason = "error", f"{GRADE_INFRA_PREFIX} {type(e).__name__}: {e}"
            continue
        traj.status, traj.error_reason = result.status, result.error_reason
        traj.meta["grade"] = {"tests_status": result.tests_status, "duration_s": result.duration_s,
                              "attempts": attempt + 1}
        if not (result.status == "error" and result.error_reason.startswith(GRADE_INFRA_PREFIX)):
            break
    traj.timings["grade_s"] = time.monotonic() - t0
    traj.timings["episode_s"] = time.monotonic() - ep.started
    traj.reward = reward_fn(traj) if traj.status != "error" else 0.0
    return traj


def finish_episode(ep: Episode, reward_fn: RewardFn = resolved_reward, grade_retries: int = 0) -> Trajectory:
    """Collect the patch, close the sandbox, grade: the end of every episode."""
    return grade_episode(ep, episode_patch(ep), reward_fn, grade_retries)


def run_episode(task: TaskInstance, sample_index: int, env: Any, backend: InferenceBackend, chat: ChatFormat,
                sampling: SamplingParams, limits: AgentLimits, action_format: str, window: int = 100,
                one_shot: bool = False, reward_fn: RewardFn = resolved_reward) -> Trajectory:
    """One episode, start to verdict, with no batching: the agent loop in its plainest form."""
    sampling = chat.sampling(sampling)
    spec = EpisodeSpec(limits=limits, action_format=action_format, window=window, one_shot=one_shot)
    try:
        ep = start_episode(task, sample_index, env, chat, spec, backend.policy_version, seed=sampling.seed)
        while (req := ep.next_request()) is not None:
            t0 = time.monotonic()
            [completion] = backend.generate([req.ids], sampling.with_(max_new_tokens=req.max_new_tokens,
                                                                      seed=req.seed))
            ep.apply(completion, chat, time.monotonic() - t0)
        return finish_episode(ep, reward_fn)
    finally:
        env.close()
