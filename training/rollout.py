"""The rollout engine: many episodes at once, one batched generate call per round.

Each active episode is in one phase: starting (its sandbox and task are being set up), waiting
for the policy, acting (its sampled action runs in the sandbox) or grading. Env operations are
docker round trips, so they run in threads while generation, which is compute-bound, runs here
in one batched call over every episode waiting for the policy. Finished episodes go to the
store one record each, so a re-run skips them. Infrastructure failures restart an episode up
to `infra_retries` times and are then recorded as status "error", never as a reward.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Iterable

from tqdm import tqdm

from environments.records import TaskInstance
from environments.sandbox import SandboxError, install_exit_handlers
from training.agent import Episode, EpisodeSpec, Request, finish_episode, start_episode
from training.chat import ChatFormat
from training.inference.base import Completion, InferenceBackend, SamplingParams
from training.rewards import RewardFn
from training.trajectory import Trajectory

log = logging.getLogger(__name__)

EnvFactory = Callable[[TaskInstance], Any]  # -> an unstarted SWEEnv
ProgressFn = Callable[[int, int], None]  # (episodes done, episodes in all), reused ones counted as done


class EnvTimeout(SandboxError):
    """An env operation ran past its deadline: the sandbox is presumed hung."""


# An unexpected exception from env code is handled the same way, logged with its traceback.
INFRA_ERRORS = (SandboxError, OSError)  # EnvTimeout is a SandboxError


@dataclass(frozen=True, kw_only=True)
class RolloutSpec(EpisodeSpec):
    """An episode spec plus how the engine runs many of them."""

    sampling: SamplingParams
    concurrency: int = 4  # episodes (hence sandboxes) at once
    infra_retries: int = 2  # an episode lost to an infra error is started again this many times
    # how long a generate call waits for episodes still acting: at least batch_wait_s, or this
    # share of the last generate call's duration (a straggler left out costs a whole call)
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


class Phase(StrEnum):
    """Where an episode is; the values name the phase in error reasons ("step: SandboxDead ...")."""

    STARTING = "start"
    WAITING_FOR_POLICY = "ready"
    ACTING = "step"
    GRADING = "grade"


@dataclass
class _Slot:
    """One active episode: its phase and the env operation it is waiting for."""

    task: TaskInstance
    index: int
    attempt: int
    env: Any = None
    ep: Episode | None = None
    phase: Phase = Phase.STARTING
    fut: Future | None = None
    timeout: float = float("inf")
    deadline: float = float("inf")
    abandoned: bool = False  # set when the engine gave up on it; a late start closes its env


class RolloutEngine:
    """Runs `samples` episodes of every task; see the module docstring for the phases."""

    def __init__(self, backend: InferenceBackend, env_factory: EnvFactory, spec: RolloutSpec,
                 reward_fn: RewardFn, sink: TrajectorySink | None = None, progress: bool = True,
                 on_progress: ProgressFn | None = None):
        self.backend, self.env_factory, self.spec, self.reward_fn = backend, env_factory, spec, reward_fn
        self.sink = sink or TrajectorySink(None, "")
        self.progress = progress
        self.on_progress = on_progress or (lambda done, total: None)
        self.chat = ChatFormat.from_tokenizer(backend.tokenizer)
        self.sampling = self.chat.sampling(spec.sampling)
        self.stats = RolloutStats()
        self.todo: list[tuple[TaskInstance, int, int]] = []  # (task, sample index, attempt)
        self.slots: list[_Slot] = []
        self.closing: list[Future] = []  # closes of abandoned (hung) envs, joined before returning
        self.waiting_since: float | None = None  # when the oldest unserved request became ready
        self.last_gen_s = 0.0

    def run(self, tasks: Iterable[TaskInstance], samples: int) -> RolloutStats:
        install_exit_handlers()  # sandboxes start in worker threads; SIGTERM must still close them
        self._plan(tasks, samples)
        self.bar = tqdm(total=len(self.todo) + self.stats.reused, initial=self.stats.reused, desc="rollout",
                        disable=not self.progress, unit="ep")
        self.on_progress(self.stats.reused, self.bar.total)
        t_start = time.monotonic()
        try:
            while self.todo or self.slots:
                self._start_episodes()
                self._harvest()
                batch = self._requests()
                if not batch:
                    self._wait(self._futures(), self._until_next_deadline())
                elif (left := self._patience_left(batch)) > 0:
                    self._wait(self._futures(Phase.STARTING, Phase.ACTING), left)
                else:
                    self._generate(batch)
        finally:
            self._abandon_all()
            self.bar.close()
        self.stats.wall_s = time.monotonic() - t_start
        return self.stats

    # ---- the loop's steps ------------------------------------------------------------------
    def _plan(self, tasks: Iterable[TaskInstance], samples: int) -> None:
        """Queue every episode the store does not already hold (errors are redone)."""
        finished = self.sink.done()
        for task in tasks:
            for i in range(samples):
                old = finished.get(f"{task.instance_id}__{i}")
                if old is not None and not (self.spec.redo_errors and old.status == "error"):
                    self.stats.trajectories.append(old)
                    self.stats.reused += 1
                else:
                    self.todo.append((task, i, 0))

    def _start_episodes(self) -> None:
        while self.todo and len(self.slots) < self.spec.concurrency:
            task, i, attempt = self.todo.pop(0)
            slot = _Slot(task, i, attempt)
            self.slots.append(slot)
            self._run_op(slot, Phase.STARTING, self.spec.env_timeout_s, self._start, slot)

    def _harvest(self) -> None:
        """Move every slot whose env operation ended (or overran) to its next phase."""
        now = time.monotonic()
        for slot in list(self.slots):
            fut = slot.fut
            if fut is None:
                continue
            if not fut.done():
                if now > slot.deadline:
                    self._infra_error(slot, EnvTimeout(f"{slot.phase} did not finish within {slot.timeout:g} s"),
                                      hung=True)
                continue
            slot.fut = None
            try:
                value, took = fut.result()
            except INFRA_ERRORS as e:
                self._infra_error(slot, e)
                continue
            except Exception as e:  # noqa: BLE001 - a bug of ours in one episode must not end the run
                log.error("episode %s#%d: unexpected %s in %s (a swerl bug: please report it)",
                          slot.task.instance_id, slot.index, type(e).__name__, slot.phase, exc_info=e)
                self._infra_error(slot, e)
                continue
            self._advance(slot, value, took)

    def _advance(self, slot: _Slot, value: Any, took: float) -> None:
        if slot.phase == Phase.GRADING:
            self.slots.remove(slot)
            self.stats.grade_time_s += value.timings.get("grade_s", 0.0)
            self._record(value)
            return
        if slot.phase == Phase.STARTING:
            slot.ep = value
        slot.phase = Phase.WAITING_FOR_POLICY
        self.stats.env_time_s += took

    def _requests(self) -> list[tuple[_Slot, Request]]:
        """Next turns of the episodes waiting for the policy; episodes that are over go to grading."""
        batch = []
        for slot in self.slots:
            if slot.phase != Phase.WAITING_FOR_POLICY:
                continue
            assert slot.ep is not None
            req = slot.ep.next_request()
            if req is None:
                self._run_op(slot, Phase.GRADING, self.spec.grade_timeout_s, finish_episode, slot.ep,
                             self.reward_fn, self.spec.infra_retries)
            else:
                batch.append((slot, req))
        return batch

    def _patience_left(self, batch: list[tuple[_Slot, Request]]) -> float:
        """Seconds to keep waiting for episodes still starting or acting before generating `batch`."""
        self.waiting_since = self.waiting_since or time.monotonic()
        if not self._futures(Phase.STARTING, Phase.ACTING) or len(batch) >= self.spec.concurrency:
            return 0.0
        patience = max(self.spec.batch_wait_s, self.spec.batch_wait_share * self.last_gen_s)
        return self.waiting_since + patience - time.monotonic()

    def _generate(self, batch: list[tuple[_Slot, Request]]) -> None:
        """One call per token budget (episodes near their context limit get their own call)."""
        self.waiting_since = None
        t0 = time.monotonic()
        by_budget: dict[int, list[tuple[_Slot, Request]]] = {}
        for slot, req in batch:
            by_budget.setdefault(req.max_new_tokens, []).append((slot, req))
        for budget in sorted(by_budget, reverse=True):
            group = by_budget[budget]
            t1 = time.monotonic()
            completions = generate(self.backend, [r.ids for _, r in group],
                                   self.sampling.with_(max_new_tokens=budget), [r.seed for _, r in group])
            dt = time.monotonic() - t1
            self._count_generation(group, completions, dt)
            for (slot, _), comp in zip(group, completions):
                assert slot.ep is not None
                self._run_op(slot, Phase.ACTING, self.spec.env_timeout_s, slot.ep.apply, comp, self.chat, dt)
        self.last_gen_s = time.monotonic() - t0

    def _wait(self, futures: list[Future], timeout: float) -> None:
        if futures:
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    # ---- helpers ---------------------------------------------------------------------------
    def _start(self, slot: _Slot) -> Episode:
        slot.env = env = self.env_factory(slot.task)
        try:
            ep = start_episode(slot.task, slot.index, env, self.chat, self.spec, self.backend.policy_version,
                               seed=self.spec.sampling.seed)
        except BaseException:
            _close(env)
            raise
        if slot.abandoned:  # the engine gave up while reset ran: nobody else will close this sandbox
            _close(env)
        return ep

    def _run_op(self, slot: _Slot, phase: Phase, timeout: float, fn: Callable[..., Any], *args: Any) -> None:
        slot.phase, slot.timeout, slot.deadline = phase, timeout, time.monotonic() + timeout
        slot.fut = _spawn(fn, *args)

    def _futures(self, *phases: Phase) -> list[Future]:
        return [s.fut for s in self.slots if s.fut is not None and (not phases or s.phase in phases)]

    def _until_next_deadline(self) -> float:
        deadlines = [s.deadline for s in self.slots if s.fut is not None]
        return max(0.01, min(min(deadlines, default=0.0) - time.monotonic(), 5.0))

    def _count_generation(self, group: list[tuple[_Slot, Request]], completions: list[Completion],
                          seconds: float) -> None:
        st = self.stats
        st.gen_time_s += seconds
        st.generate_calls += 1
        st.batch_sizes.append(len(group))
        st.generated_tokens += sum(len(c.token_ids) for c in completions)
        st.prompt_tokens += sum(len(r.ids) for _, r in group)

    def _record(self, traj: Trajectory) -> None:
        self.sink.put(traj)
        self.stats.trajectories.append(traj)
        self.stats.episodes += 1
        self.bar.update(1)
        self.bar.set_postfix(resolved=sum(t.status == "resolved" for t in self.stats.trajectories))
        self.on_progress(len(self.stats.trajectories), self.bar.total)

    def _infra_error(self, slot: _Slot, err: BaseException, hung: bool = False) -> None:
        """Retry the episode from scratch, or record it as an error once retries are spent."""
        self.slots.remove(slot)
        slot.abandoned = True
        if slot.env is not None:
            if hung:  # its thread is stuck in the env: closing (removing the container) frees it
                self.closing.append(_spawn(_close, slot.env))
            else:
                _close(slot.env)
        reason = f"{type(err).__name__}: {err}"
        if slot.attempt < self.spec.infra_retries:
            self.stats.infra_retries += 1
            log.warning("episode %s#%d: infra error in %s (%s); starting it again", slot.task.instance_id,
                        slot.index, slot.phase, reason)
            self.todo.append((slot.task, slot.index, slot.attempt + 1))
            return
        log.error("episode %s#%d: infra error in %s after %d attempts: %s", slot.task.instance_id, slot.index,
                  slot.phase, slot.attempt + 1, reason)
        traj = slot.ep.traj if slot.ep else Trajectory(slot.task.instance_id, slot.index,
                                                       self.backend.policy_version, [])
        traj.status, traj.error_reason, traj.exit_reason = "error", f"{slot.phase}: {reason}", "error"
        traj.reward = 0.0
        traj.meta["attempts"] = slot.attempt + 1
        self._record(traj)

    def _abandon_all(self) -> None:
        """An exception or Ctrl-C: no sandbox may outlive the call."""
        for slot in self.slots:
            slot.abandoned = True
            if slot.env is not None:
                self.closing.append(_spawn(_close, slot.env))
        if self.closing:
            wait(self.closing, timeout=60)


def collect(tasks: Iterable[TaskInstance], samples: int, backend: InferenceBackend, env_factory: EnvFactory,
            spec: RolloutSpec, reward_fn: RewardFn | None = None, sink: TrajectorySink | None = None,
            progress: bool = True, on_progress: ProgressFn | None = None) -> RolloutStats:
    """Run `samples` episodes of every task; return all trajectories, reused ones included.
    `reward_fn` defaults to the spec's own reward. `progress` draws a tqdm bar; `on_progress`
    hears (done, total) once at the start and after every finished episode, in the engine's
    own thread, so it must be quick (a caller that reports somewhere slow throttles itself)."""
    return RolloutEngine(backend, env_factory, spec, reward_fn or spec.reward, sink, progress,
                         on_progress).run(tasks, samples)
