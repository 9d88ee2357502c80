"""The rollout engine: many episodes at once, one batched generate call per round.

Environment steps and grading are I/O-bound (docker) and run in a thread pool; generation is
compute-bound and batched across every episode waiting for its next turn. Finished episodes are
written to the store one record each, so a killed job re-run skips them.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from tqdm import tqdm

from environments.records import TaskInstance
from environments.sandbox import SandboxError
from training.agent import AgentLimits, Episode, finish_episode, start_episode
from training.chat import ChatFormat
from training.inference.base import InferenceBackend, SamplingParams
from training.trajectory import Trajectory

log = logging.getLogger(__name__)

EnvFactory = Callable[[TaskInstance], Any]  # -> an unstarted SWEEnv


@dataclass
class RolloutSpec:
    limits: AgentLimits
    sampling: SamplingParams
    action_format: str
    window: int = 100
    one_shot: bool = False
    concurrency: int = 4
    infra_retries: int = 2  # an episode lost to an infra error is started again this many times
    batch_wait_s: float = 0.05  # how long to wait for more episodes before a generate call


@dataclass
class RolloutStats:
    episodes: int = 0
    reused: int = 0
    gen_time_s: float = 0.0
    env_time_s: float = 0.0
    grade_time_s: float = 0.0
    wall_s: float = 0.0
    generated_tokens: int = 0
    generate_calls: int = 0
    infra_retries: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        trajs = self.trajectories
        n = max(len(trajs), 1)
        turns = [t for tr in trajs for t in tr.turns]
        reasons: dict[str, int] = {}
        for tr in trajs:
            reasons[tr.exit_reason] = reasons.get(tr.exit_reason, 0) + 1
        out = {
            "episodes": len(trajs),
            "reused": self.reused,
            "resolved_rate": sum(t.status == "resolved" for t in trajs) / n,
            "error_rate": sum(t.status == "error" for t in trajs) / n,
            "reward_mean": sum(t.reward for t in trajs) / n,
            "format_error_rate": sum(t.format_error for t in turns) / max(len(turns), 1),
            "mean_turns": sum(t.num_turns for t in trajs) / n,
            "tokens_per_s": self.generated_tokens / self.gen_time_s if self.gen_time_s else 0.0,
            "episodes_per_min": 60 * (len(trajs) - self.reused) / self.wall_s if self.wall_s else 0.0,
            "gen_time_s": self.gen_time_s,
            "env_time_s": self.env_time_s,
            "grade_time_s": self.grade_time_s,
            "wall_s": self.wall_s,
        }
        out.update({f"exit.{k}": v for k, v in sorted(reasons.items())})
        return out


class TrajectorySink:
    """Where finished episodes go: one record per episode, keyed so a restart finds it."""

    def __init__(self, store: Any | None, prefix: str):
        self.store, self.prefix = store, prefix.rstrip("/")

    def key(self, task_id: str, sample_index: int) -> str:
        return f"{self.prefix}/{task_id}__{sample_index}.json"

    def done(self) -> dict[str, Trajectory]:
        if self.store is None:
            return {}
        out = {}
        for key in self.store.ls(self.prefix):
            if key.endswith(".json"):
                traj = Trajectory.from_json(self.store.get_text(key))
                out[traj.key] = traj
        return out

    def put(self, traj: Trajectory) -> None:
        if self.store is not None:
            self.store.put_text(self.key(traj.task_id, traj.sample_index), traj.to_json())


def collect(tasks: Iterable[TaskInstance], samples: int, backend: InferenceBackend, env_factory: EnvFactory,
            spec: RolloutSpec, reward_fn: Callable[[Trajectory], float],
            sink: TrajectorySink | None = None, progress: bool = True) -> RolloutStats:
    """Run `samples` episodes of every task; return all trajectories, reused ones included."""
    chat = ChatFormat.from_tokenizer(backend.tokenizer)
    sampling = replace(spec.sampling, stop_token_ids=tuple(sorted(set(spec.sampling.stop_token_ids) | set(chat.eos_ids))))
    sink = sink or TrajectorySink(None, "")
    stats = RolloutStats()
    finished = sink.done()
    todo: list[tuple[TaskInstance, int, int]] = []  # (task, sample index, attempt)
    for task in tasks:
        for i in range(samples):
            k = f"{task.instance_id}__{i}"
            if k in finished:
                stats.trajectories.append(finished[k])
                stats.reused += 1
            else:
                todo.append((task, i, 0))
    bar = tqdm(total=len(todo) + stats.reused, initial=stats.reused, desc="rollout", disable=not progress,
               unit="ep")
    t_start = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=spec.concurrency * 2, thread_name_prefix="env")
    starting: dict[Future, tuple[TaskInstance, int, int]] = {}
    stepping: dict[Future, tuple[Episode, int]] = {}
    grading: dict[Future, tuple[Episode, int]] = {}
    ready: list[tuple[Episode, int]] = []

    def start(item: tuple[TaskInstance, int, int]) -> Episode:
        task, i, _ = item
        env = env_factory(task)
        try:
            return start_episode(task, i, env, chat, spec.limits, backend.policy_version, spec.action_format,
                                 spec.window, spec.one_shot)
        except BaseException:
            env.close()
            raise

    def retry_or_record(item: tuple[TaskInstance, int, int], err: BaseException, ep: Episode | None) -> None:
        task, i, attempt = item
        if ep is not None:
            ep.env.close()
        if attempt < spec.infra_retries:
            stats.infra_retries += 1
            log.warning("episode %s#%d infra error (%s); retrying", task.instance_id, i, err)
            todo.append((task, i, attempt + 1))
            return
        traj = ep.traj if ep else Trajectory(task.instance_id, i, backend.policy_version, [])
        traj.status, traj.error_reason, traj.exit_reason = "error", f"{type(err).__name__}: {err}", "error"
        record(traj)

    def record(traj: Trajectory) -> None:
        sink.put(traj)
        stats.trajectories.append(traj)
        stats.episodes += 1
        bar.update(1)
        bar.set_postfix(resolved=sum(t.status == "resolved" for t in stats.trajectories))

    try:
        while todo or starting or stepping or grading or ready:
            active = len(starting) + len(stepping) + len(ready) + len(grading)
            while todo and active < spec.concurrency:
                item = todo.pop(0)
                starting[pool.submit(start, item)] = item
                active += 1
            # block until env work finishes; if some episodes already wait for the policy, only
            # linger briefly so that more can join the same generate call
            pending = list(starting) + list(stepping) + list(grading)
            if pending and (not ready or stepping):
                wait(pending, timeout=spec.batch_wait_s if ready else None, return_when=FIRST_COMPLETED)
            for fut in [f for f in starting if f.done()]:
                item = starting.pop(fut)
                try:
                    ready.append((fut.result(), item[2]))
                except (SandboxError, OSError) as e:
                    retry_or_record(item, e, None)
            for fut in [f for f in stepping if f.done()]:
                ep, attempt = stepping.pop(fut)
                try:
                    fut.result()
                    ready.append((ep, attempt))
                except (SandboxError, OSError) as e:
                    retry_or_record((ep.task, ep.traj.sample_index, attempt), e, ep)
            for fut in [f for f in grading if f.done()]:
                ep, attempt = grading.pop(fut)
                traj = fut.result()
                stats.grade_time_s += traj.timings.get("grade_s", 0.0)
                record(traj)
            # one batched generation over every episode waiting for its next turn
            batch: list[tuple[Episode, int, list[int], int]] = []
            for ep, attempt in ready:
                req = ep.next_request()
                if req is None:
                    grading[pool.submit(finish_episode, ep, reward_fn)] = (ep, attempt)
                else:
                    batch.append((ep, attempt, *req))
            ready = []
            # episodes near their context limit get their own call with a smaller budget
            for group in _by_budget(batch):
                budget = group[0][3]
                t0 = time.monotonic()
                completions = backend.generate([ids for _, _, ids, _ in group], replace(sampling, max_new_tokens=budget))
                dt = time.monotonic() - t0
                stats.gen_time_s += dt
                stats.generate_calls += 1
                stats.generated_tokens += sum(len(c.token_ids) for c in completions)
                for (ep, attempt, _, _), comp in zip(group, completions):
                    stepping[pool.submit(_step, ep, comp, chat, dt, stats)] = (ep, attempt)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for fut, (ep, _) in list(stepping.items()) + list(grading.items()):
            ep.env.close()
        bar.close()
    stats.wall_s = time.monotonic() - t_start
    return stats


def _by_budget(batch: list[tuple[Episode, int, list[int], int]]) -> list[list[tuple[Episode, int, list[int], int]]]:
    groups: dict[int, list] = {}
    for item in batch:
        groups.setdefault(item[3], []).append(item)
    return [groups[b] for b in sorted(groups, reverse=True)]


def _step(ep: Episode, completion: Any, chat: ChatFormat, gen_time_s: float, stats: RolloutStats) -> None:
    t0 = time.monotonic()
    ep.apply(completion, chat, gen_time_s)
    stats.env_time_s += time.monotonic() - t0
