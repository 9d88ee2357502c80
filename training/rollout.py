"""The rollout engine: many episodes at once, one batched generate call per round.

Each active episode sits in a slot that is either waiting for the policy or running one env
operation (start, step, grade) in a thread: those are docker round trips, I/O-bound, so threads
overlap them with generation. Generation is compute-bound and done here, in one batched call
over every episode waiting for its next turn; when some episodes are still in an env step the
call waits a little for them (`batch_wait_s`, or a share of the last call's duration), because
a batch of 8 costs far less than 8 batches of 1 and a straggler left out costs a whole call.

Finished episodes are written to the store one record each, so a killed job re-run skips them.
Infrastructure failures (SandboxError, OSError, an env operation past its deadline; also an
unexpected exception from the env, logged with its traceback as the bug it is) restart the
episode from scratch up to `infra_retries` times and are then recorded as status "error" with
the reason: never as a reward.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tqdm import tqdm

from environments.records import TaskInstance
from environments.sandbox import SandboxError, install_exit_handlers
from training.agent import (AgentLimits, Episode, Request, RewardFn, episode_patch, grade_episode,
                            start_episode)
from training.chat import ChatFormat
from training.inference.base import Completion, InferenceBackend, SamplingParams
from training.trajectory import Trajectory

log = logging.getLogger(__name__)

EnvFactory = Callable[[TaskInstance], Any]  # -> an unstarted SWEEnv


class EnvTimeout(SandboxError):
    """An env operation ran past its deadline: the sandbox is presumed hung."""


INFRA_ERRORS = (SandboxError, OSError)  # EnvTimeout is a SandboxError


@dataclass
class RolloutSpec:
    limits: AgentLimits
    sampling: SamplingParams
    action_format: str
    window: int = 100
    one_shot: bool = False
    prompt_style: str = "full"  # must match the env's (SWEEnv prompt_style / show_source)
    show_source: bool = False
    concurrency: int = 4  # episodes (hence sandboxes) at once
    infra_retries: int = 2  # an episode lost to an infra error is started again this many times
    # how long a generate call waits for episodes still in an env step: at least batch_wait_s, or
    # this share of the last generate call's duration (a straggler left out costs a whole call)
    batch_wait_s: float = 1.0
    batch_wait_share: float = 0.25
    env_timeout_s: float = 900.0  # a reset or step past this is a hung sandbox: infra error
    grade_timeout_s: float = 1800.0  # the same for patch collection plus grading
    redo_errors: bool = True  # on re-run, episodes recorded as infra errors are run again


@dataclass
class RolloutStats:
    episodes: int = 0  # finished by this call (reused ones not counted)
    reused: int = 0
    gen_time_s: float = 0.0
    env_time_s: float = 0.0  # summed over threads: resets and steps
    grade_time_s: float = 0.0  # summed over threads
    wall_s: float = 0.0
    generated_tokens: int = 0
    prompt_tokens: int = 0  # context ids sent with each generate call (the backend may cache a prefix)
    generate_calls: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    infra_retries: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Rates over this rollout's trajectories (reused included); reward over graded ones."""
        trajs = self.trajectories
        n = max(len(trajs), 1)
        graded = [t for t in trajs if t.status != "error"]
        turns = [t for tr in trajs for t in tr.turns]
        reasons: dict[str, int] = {}
        for tr in trajs:
            reasons[tr.exit_reason] = reasons.get(tr.exit_reason, 0) + 1
        out = {
            "episodes": len(trajs),
            "reused": self.reused,
            "resolved_rate": sum(t.status == "resolved" for t in trajs) / n,
            "error_rate": sum(t.status == "error" for t in trajs) / n,
            "reward_mean": sum(t.reward for t in graded) / max(len(graded), 1),
            "format_error_rate": sum(t.format_error for t in turns) / max(len(turns), 1),
            "mean_turns": sum(t.num_turns for t in trajs) / n,
            "tokens_per_s": self.generated_tokens / self.wall_s if self.wall_s else 0.0,
            "gen_tokens_per_s": self.generated_tokens / self.gen_time_s if self.gen_time_s else 0.0,
            "episodes_per_min": 60 * self.episodes / self.wall_s if self.wall_s else 0.0,
            "mean_batch": sum(self.batch_sizes) / max(len(self.batch_sizes), 1),
            "generated_tokens": self.generated_tokens,
            "prompt_tokens": self.prompt_tokens,
            "generate_calls": self.generate_calls,
            "infra_retries": self.infra_retries,
            "gen_time_s": self.gen_time_s,
            "env_time_s": self.env_time_s,
            "grade_time_s": self.grade_time_s,
            "wall_s": self.wall_s,
        }
        out.update({f"exit.{k}": v for k, v in sorted(reasons.items())})
        return out

    @staticmethod
    def combine(parts: list["RolloutStats"]) -> "RolloutStats":
        """One rollout's stats from several calls (e.g. the draws of one DAPO iteration): counts
        and times add up, lists concatenate."""
        out = RolloutStats()
        for p in parts:
            for f in ("episodes", "reused", "gen_time_s", "env_time_s", "grade_time_s", "wall_s",
                      "generated_tokens", "prompt_tokens", "generate_calls", "infra_retries"):
                setattr(out, f, getattr(out, f) + getattr(p, f))
            out.batch_sizes += p.batch_sizes
            out.trajectories += p.trajectories
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


# ---------------------------------------------------------------------------- generation


_warned_unseeded = False


def generate(backend: InferenceBackend, prompts: list[list[int]], sampling: SamplingParams,
             seeds: list[int | None]) -> list[Completion]:
    """One batched call with one seed per prompt.

    `InferenceBackend.generate` seeds prompt i with `seed + i`, which ties a prompt's randomness
    to its row in the batch; backends with `generate_rows` take a seed per row. A backend
    without it still batches, unseeded (its own random stream), and says so once.
    """
    global _warned_unseeded
    if all(s is None for s in seeds):
        return backend.generate(prompts, sampling.with_(seed=None))
    if len(prompts) == 1:
        return backend.generate(prompts, sampling.with_(seed=seeds[0]))
    rows = getattr(backend, "generate_rows", None)
    if rows is not None:
        return rows(prompts, sampling.with_(seed=None), seeds)
    if not _warned_unseeded:
        _warned_unseeded = True
        log.warning("%s has no generate_rows: batched turns are sampled unseeded (not reproducible)",
                    type(backend).__name__)
    return backend.generate(prompts, sampling.with_(seed=None))


# ---------------------------------------------------------------------------- env operations


def _spawn(fn: Callable[..., Any], *args: Any) -> Future:
    """Run fn in a daemon thread; the future's result is (value, seconds it took).

    Daemon threads rather than a pool: an env operation that hangs is abandoned at its
    deadline, and a hung pool worker would keep the interpreter from exiting.
    """
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def run() -> None:
        t0 = time.monotonic()
        try:
            value = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the engine, which decides
            fut.set_exception(e)
        else:
            fut.set_result((value, time.monotonic() - t0))

    threading.Thread(target=run, daemon=True, name=f"rollout-{getattr(fn, '__name__', 'op')}").start()
    return fut


def _close(env: Any) -> None:
    try:
        env.close()
    except Exception as e:  # noqa: BLE001 - close must not hide the error that got us here
        log.warning("closing an env failed: %s", e)


@dataclass
class _Slot:
    """One active episode: where it is and what it is waiting for."""

    task: TaskInstance
    index: int
    attempt: int
    env: Any = None
    ep: Episode | None = None
    phase: str = "start"  # start -> ready <-> step -> ready ... -> grade
    fut: Future | None = None
    timeout: float = float("inf")
    deadline: float = float("inf")
    abandoned: bool = False  # set when the engine gave up on it; a late start closes its env


def _start(slot: _Slot, env_factory: EnvFactory, chat: ChatFormat, spec: RolloutSpec, policy_version: str
           ) -> Episode:
    slot.env = env = env_factory(slot.task)
    try:
        ep = start_episode(slot.task, slot.index, env, chat, spec.limits, policy_version, spec.action_format,
                           spec.window, spec.one_shot, seed=spec.sampling.seed, style=spec.prompt_style,
                           show_source=spec.show_source)
    except BaseException:
        _close(env)
        raise
    if slot.abandoned:  # the engine gave up while reset ran: nobody else will close this sandbox
        _close(env)
    return ep


def _finish(ep: Episode, reward_fn: RewardFn, grade_retries: int) -> Trajectory:
    return grade_episode(ep, episode_patch(ep), reward_fn, grade_retries)


# ---------------------------------------------------------------------------- the engine


def collect(tasks: Iterable[TaskInstance], samples: int, backend: InferenceBackend, env_factory: EnvFactory,
            spec: RolloutSpec, reward_fn: RewardFn, sink: TrajectorySink | None = None,
            progress: bool = True) -> RolloutStats:
    """Run `samples` episodes of every task; return all trajectories, reused ones included."""
    install_exit_handlers()  # sandboxes start in worker threads; SIGTERM must still close them
    chat = ChatFormat.from_tokenizer(backend.tokenizer)
    sampling = chat.sampling(spec.sampling)
    sink = sink or TrajectorySink(None, "")
    stats = RolloutStats()
    finished = sink.done()
    todo: list[tuple[TaskInstance, int, int]] = []  # (task, sample index, attempt)
    for task in tasks:
        for i in range(samples):
            old = finished.get(f"{task.instance_id}__{i}")
            if old is not None and not (spec.redo_errors and old.status == "error"):
                stats.trajectories.append(old)
                stats.reused += 1
            else:
                todo.append((task, i, 0))
    bar = tqdm(total=len(todo) + stats.reused, initial=stats.reused, desc="rollout", disable=not progress,
               unit="ep")
    t_start = time.monotonic()
    slots: list[_Slot] = []
    closing: list[Future] = []  # closes of abandoned (hung) envs, joined before returning

    def record(traj: Trajectory) -> None:
        sink.put(traj)
        stats.trajectories.append(traj)
        stats.episodes += 1
        bar.update(1)
        bar.set_postfix(resolved=sum(t.status == "resolved" for t in stats.trajectories))

    def infra_error(slot: _Slot, err: BaseException, hung: bool = False) -> None:
        """Retry the episode from scratch, or record it as an error once retries are spent."""
        slots.remove(slot)
        slot.abandoned = True
        if slot.env is not None:
            if hung:  # its thread is stuck in the env: closing (removing the container) frees it
                closing.append(_spawn(_close, slot.env))
            else:
                _close(slot.env)
        reason = f"{type(err).__name__}: {err}"
        if slot.attempt < spec.infra_retries:
            stats.infra_retries += 1
            log.warning("episode %s#%d: infra error in %s (%s); starting it again", slot.task.instance_id,
                        slot.index, slot.phase, reason)
            todo.append((slot.task, slot.index, slot.attempt + 1))
            return
        log.error("episode %s#%d: infra error in %s after %d attempts: %s", slot.task.instance_id, slot.index,
                  slot.phase, slot.attempt + 1, reason)
        traj = slot.ep.traj if slot.ep else Trajectory(slot.task.instance_id, slot.index,
                                                       backend.policy_version, [])
        traj.status, traj.error_reason, traj.exit_reason = "error", f"{slot.phase}: {reason}", "error"
        traj.reward = 0.0
        traj.meta["attempts"] = slot.attempt + 1
        record(traj)

    def run(slot: _Slot, phase: str, timeout: float, fn: Callable[..., Any], *args: Any) -> None:
        slot.phase, slot.timeout, slot.deadline = phase, timeout, time.monotonic() + timeout
        slot.fut = _spawn(fn, *args)

    def harvest() -> None:
        """Move every slot whose env operation ended (or overran) to its next phase."""
        now = time.monotonic()
        for slot in list(slots):
            fut = slot.fut
            if fut is None:
                continue
            if not fut.done():
                if now > slot.deadline:
                    infra_error(slot, EnvTimeout(f"{slot.phase} did not finish within {slot.timeout:g} s"), hung=True)
                continue
            slot.fut = None
            try:
                value, took = fut.result()
            except INFRA_ERRORS as e:
                infra_error(slot, e)
                continue
            except Exception as e:  # noqa: BLE001 - a bug of ours in one episode must not end the run
                log.error("episode %s#%d: unexpected %s in %s (a swerl bug: please report it)",
                          slot.task.instance_id, slot.index, type(e).__name__, slot.phase, exc_info=e)
                infra_error(slot, e)
                continue
            if slot.phase == "start":
                slot.ep, slot.phase = value, "ready"
                stats.env_time_s += took
            elif slot.phase == "step":
                slot.phase = "ready"
                stats.env_time_s += took
            else:  # grade
                slots.remove(slot)
                stats.grade_time_s += value.timings.get("grade_s", 0.0)
                record(value)

    def generate_round(batch: list[tuple[_Slot, Request]]) -> None:
        # a shared token budget per call; episodes near their context limit get their own call
        by_budget: dict[int, list[tuple[_Slot, Request]]] = {}
        for slot, req in batch:
            by_budget.setdefault(req.max_new_tokens, []).append((slot, req))
        for budget in sorted(by_budget, reverse=True):
            group = by_budget[budget]
            t0 = time.monotonic()
            completions = generate(backend, [r.ids for _, r in group], sampling.with_(max_new_tokens=budget),
                                   [r.seed for _, r in group])
            dt = time.monotonic() - t0
            stats.gen_time_s += dt
            stats.generate_calls += 1
            stats.batch_sizes.append(len(group))
            stats.generated_tokens += sum(len(c.token_ids) for c in completions)
            stats.prompt_tokens += sum(len(r.ids) for _, r in group)
            for (slot, _), comp in zip(group, completions):
                assert slot.ep is not None
                run(slot, "step", spec.env_timeout_s, slot.ep.apply, comp, chat, dt)

    waiting_since: float | None = None  # when the oldest unserved request became ready
    last_gen_s = 0.0
    try:
        while todo or slots:
            while todo and len(slots) < spec.concurrency:
                task, i, attempt = todo.pop(0)
                slot = _Slot(task, i, attempt)
                slots.append(slot)
                run(slot, "start", spec.env_timeout_s, _start, slot, env_factory, chat, spec,
                    backend.policy_version)
            harvest()
            batch = []
            for slot in slots:
                if slot.phase != "ready":
                    continue
                assert slot.ep is not None
                req = slot.ep.next_request()
                if req is None:
                    run(slot, "grade", spec.grade_timeout_s, _finish, slot.ep, reward_fn, spec.infra_retries)
                else:
                    batch.append((slot, req))
            coming = [s.fut for s in slots if s.phase in ("start", "step") and s.fut is not None]
            if batch:
                waiting_since = waiting_since or time.monotonic()
                patience = max(spec.batch_wait_s, spec.batch_wait_share * last_gen_s)
                left = waiting_since + patience - time.monotonic()
                if coming and left > 0 and len(batch) < spec.concurrency:
                    wait(coming, timeout=left, return_when=FIRST_COMPLETED)
                    continue
                waiting_since = None
                t0 = time.monotonic()
                generate_round(batch)
                last_gen_s = time.monotonic() - t0
                continue
            pending = [s.fut for s in slots if s.fut is not None]
            if pending:
                next_deadline = min(s.deadline for s in slots if s.fut is not None)
                wait(pending, timeout=max(0.01, min(next_deadline - time.monotonic(), 5.0)),
                     return_when=FIRST_COMPLETED)
    finally:
        for slot in slots:  # an exception or Ctrl-C: no sandbox may outlive the call
            slot.abandoned = True
            if slot.env is not None:
                closing.append(_spawn(_close, slot.env))
        if closing:
            wait(closing, timeout=60)
        bar.close()
    stats.wall_s = time.monotonic() - t_start
    return stats
