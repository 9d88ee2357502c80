"""The rollout engine with a scripted policy and a fake gym: batching, token exactness, seeds,
infra errors (retried, then status error), hung sandboxes, resume from the store, cleanup."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from environments.records import GradeResult, TaskInstance
from environments.sandbox import SandboxDead
from environments.swe_env import StepResult
from swerl.store import Store
from tests.rollout_checks import RecordingBackend, assert_token_exact
from tests.unit.byte_chat import byte_chat_tokenizer
from training.agent import AgentLimits, build_messages, run_episode, turn_seed
from training.chat import ChatFormat
from training.inference.base import Completion, SamplingParams
from training.rollout import RolloutSpec, TrajectorySink, collect

pytestmark = pytest.mark.unit

TOKENIZER = byte_chat_tokenizer()
EOS = TOKENIZER.eos_token_id


class ScriptedBackend:
    """A policy whose reply is a function of the seed: known, reproducible, batch-independent.

    Every 4th seed gives a reply without a code block (a format error); long replies run out of
    tokens (finish_reason length) when the budget is small.
    """

    policy_version = "scripted"
    tokenizer = TOKENIZER

    def __init__(self, fail_on_call: int | None = None, delay_s: float = 0.0):
        self.calls = 0
        self.fail_on_call = fail_on_call
        self.delay_s = delay_s

    def generate_rows(self, prompts, sampling, seeds):
        self.calls += 1
        time.sleep(self.delay_s)
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt
        out = []
        for prompt, seed in zip(prompts, seeds):
            s = seed or 0
            text = "no code block here" if s % 4 == 0 else f"```bash\necho {s % 1000}\n```"
            ids = TOKENIZER.encode(text, add_special_tokens=False)
            if len(ids) < sampling.max_new_tokens:
                ids, reason = ids + [EOS], "stop"
            else:
                ids, reason = ids[: sampling.max_new_tokens], "length"
            out.append(Completion(ids, [-0.01 * (1 + (s + j) % 50) for j in range(len(ids))], reason))
        return out

    def generate(self, prompts, sampling):
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(len(prompts))]
        return self.generate_rows(prompts, sampling, seeds)


@dataclass
class Plan:
    """How one attempt of one episode's env behaves."""

    submit_at: int | None = None  # step number that submits
    die_at_step: int | None = None
    die_at_diff: bool = False
    hang_at_reset: bool = False
    grade_infra_failures: int = 0  # grading answers "sandbox: ..." this many times first
    resolve: bool = True
    step_delay_s: float = 0.0


class FakeEnv:
    def __init__(self, task: TaskInstance, plan: Plan, log: list):
        self.task, self.plan = task, plan
        self.steps = 0
        self.closed = threading.Event()
        self.patch: str | None = None
        self.grades = 0
        log.append(self)

    def reset(self) -> str:
        if self.plan.hang_at_reset:
            self.closed.wait()  # like a docker exec that only returns when its container goes
            raise SandboxDead("container removed while starting")
        return f"Fix {self.task.instance_id}."

    def step(self, text: str) -> StepResult:
        assert not self.closed.is_set(), "step on a closed env"
        self.steps += 1
        time.sleep(self.plan.step_delay_s)
        if self.plan.die_at_step == self.steps:
            raise SandboxDead("container exited (137)")
        if "```" not in text:
            return StepResult("Your reply has no code block.", False, True, None)
        if self.plan.submit_at == self.steps:
            self.patch = "diff --git a/x.py b/x.py\n"
            return StepResult("Submitted.", True, False, "submit", "submitted")
        return StepResult(f"output of step {self.steps}", False, False, text)

    def diff(self) -> str:
        if self.plan.die_at_diff:
            raise SandboxDead("container gone before the diff")
        return "diff --git a/y.py b/y.py\n"

    def grade(self, patch: str) -> GradeResult:
        self.grades += 1
        if self.grades <= self.plan.grade_infra_failures:
            return GradeResult(self.task.instance_id, "error", False, False, error_reason="sandbox: docker died")
        status = "resolved" if self.plan.resolve else "unresolved"
        return GradeResult(self.task.instance_id, status, self.plan.resolve, True)

    def close(self) -> None:
        self.closed.set()


class Gym:
    """An env factory: plan(task, attempt) decides how each attempt behaves; keeps every env."""

    def __init__(self, plan=lambda task, attempt: Plan()):
        self.plan = plan
        self.envs: list[FakeEnv] = []
        self.attempts: dict[str, int] = {}

    def __call__(self, task: TaskInstance) -> FakeEnv:
        n = self.attempts.get(task.instance_id, 0)
        self.attempts[task.instance_id] = n + 1
        return FakeEnv(task, self.plan(task, n), self.envs)

    def all_closed(self) -> bool:
        return all(e.closed.is_set() for e in self.envs)


def tasks(n: int) -> list[TaskInstance]:
    return [TaskInstance(f"t{i}", "acme/x", "HEAD", f"bug {i}", "", "", [], []) for i in range(n)]


def spec(**kw) -> RolloutSpec:
    limits = kw.pop("limits", AgentLimits(max_turns=4, max_context_tokens=4096, max_new_tokens=64))
    return RolloutSpec(limits=limits, sampling=SamplingParams(max_new_tokens=64, seed=7), action_format="tools",
                       window=10, **{"concurrency": 4, "batch_wait_s": 0.2, **kw})


def reward(t) -> float:
    return float(t.status == "resolved")


def test_token_exact_and_batched():
    backend = RecordingBackend(ScriptedBackend())
    gym = Gym()
    stats = collect(tasks(3), 2, backend, gym, spec(concurrency=6), reward, progress=False)
    assert len(stats.trajectories) == 6 and stats.episodes == 6
    turns = assert_token_exact(stats.trajectories, backend.records)
    assert turns == 6 * 4  # nobody submits: every episode runs to max_turns
    assert {t.exit_reason for t in stats.trajectories} == {"max_turns"}
    assert max(backend.batch_sizes) == 6 and stats.generate_calls < turns
    assert any(t.format_error for tr in stats.trajectories for t in tr.turns)  # the mask was exercised
    assert gym.all_closed()
    assert stats.summary()["resolved_rate"] == 1.0


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_slow_step_waits_for_the_batch_when_calls_are_long(share):
    """One episode's steps take 0.3 s and a generate call 1 s: waiting for it (up to a share of
    the call's duration) keeps every call full; not waiting splits most rounds in two."""
    backend = RecordingBackend(ScriptedBackend(delay_s=1.0))
    gym = Gym(lambda task, attempt: Plan(step_delay_s=0.3 if task.instance_id == "t0" else 0.0))
    collect(tasks(3), 1, backend, gym, spec(batch_wait_s=0.1, batch_wait_share=share), reward, progress=False)
    full = sum(n == 3 for n in backend.batch_sizes)
    if share:
        assert backend.batch_sizes == [3] * 4
    else:
        assert full < 4 and len(backend.batch_sizes) > 4


def test_seeds_belong_to_the_episode_not_the_batch():
    """Same episodes alone or batched: same seeds, hence (for this policy) the same tokens; and
    no two turns of the run share a seed (samples of one task must not be copies)."""
    runs = {}
    for conc in (1, 6):
        backend = RecordingBackend(ScriptedBackend())
        stats = collect(tasks(3), 2, backend, Gym(), spec(concurrency=conc), reward, progress=False)
        runs[conc] = {t.key: [turn.token_ids for turn in t.turns] for t in stats.trajectories}
        assert len(set(backend.seeds)) == len(backend.seeds) == 24
    assert runs[1] == runs[6]
    assert runs[1]["t0__0"] != runs[1]["t0__1"]
    assert turn_seed(7, "t0", 0, 0) != turn_seed(7, "t0", 1, 0) != turn_seed(7, "t0", 0, 1)


def test_plain_loop_matches_the_engine():
    sp = spec()
    backend = ScriptedBackend()
    chat = ChatFormat.from_tokenizer(TOKENIZER)
    alone = run_episode(tasks(1)[0], 1, Gym()(tasks(1)[0]), backend, chat, sp.sampling, sp.limits, "tools",
                        window=sp.window)
    engine = collect(tasks(1), 2, backend, Gym(), sp, reward, progress=False).trajectories
    [same] = [t for t in engine if t.sample_index == 1]
    assert [t.token_ids for t in alone.turns] == [t.token_ids for t in same.turns]
    assert alone.prompt_token_ids == same.prompt_token_ids and alone.status == same.status == "resolved"


def test_submit_and_context_full_end_episodes_without_dangling_ids():
    gym = Gym(lambda task, attempt: Plan(submit_at=2 if task.instance_id == "t0" else None))
    backend = RecordingBackend(ScriptedBackend())
    prompt = ChatFormat.from_tokenizer(TOKENIZER).prompt_ids(build_messages("Fix t1.", "tools", 10, False))
    limits = AgentLimits(max_turns=50, max_context_tokens=len(prompt) + 300, max_new_tokens=64)
    stats = collect(tasks(2), 1, backend, gym, spec(limits=limits), reward, progress=False)
    by = {t.task_id: t for t in stats.trajectories}
    assert by["t0"].exit_reason == "submitted" and by["t0"].num_turns == 2
    assert by["t0"].patch == "diff --git a/x.py b/x.py\n"  # the submitted patch, not a later diff
    assert by["t1"].exit_reason == "context_full"
    assert len(by["t1"].prompt_token_ids) + sum(len(t.token_ids) + len(t.observation_token_ids)
                                                for t in by["t1"].turns) <= limits.max_context_tokens
    assert by["t1"].num_turns >= 2
    assert by["t1"].patch == "diff --git a/y.py b/y.py\n"  # not submitted: the work tree's diff
    assert_token_exact(stats.trajectories, backend.records)


def test_sandbox_death_is_retried_then_recorded_as_error():
    def plan(task, attempt):
        if task.instance_id == "t0":
            return Plan(die_at_step=2 if attempt == 0 else None)  # dies once, then fine
        if task.instance_id == "t1":
            return Plan(die_at_step=1)  # dies every time
        return Plan(die_at_diff=True)  # the answer is lost at the end, every time

    gym = Gym(plan)
    stats = collect(tasks(3), 1, ScriptedBackend(), gym, spec(infra_retries=2), reward, progress=False)
    by = {t.task_id: t for t in stats.trajectories}
    assert by["t0"].status == "resolved" and by["t0"].reward == 1.0 and gym.attempts["t0"] == 2
    for tid, phase in (("t1", "step"), ("t2", "grade")):
        t = by[tid]
        assert t.status == "error" and t.exit_reason == "error" and t.reward == 0.0
        assert t.error_reason.startswith(f"{phase}: SandboxDead"), t.error_reason
        assert gym.attempts[tid] == 3 and t.meta["attempts"] == 3
    assert stats.infra_retries == 1 + 2 + 2
    summary = stats.summary()
    assert summary["error_rate"] == pytest.approx(2 / 3) and summary["reward_mean"] == 1.0
    assert gym.all_closed()


def test_an_unexpected_exception_in_a_step_costs_one_episode_not_the_run(monkeypatch):
    """A bug in env code (here a RuntimeError on t1's first attempt, then on every step of t2)
    is retried like an infra error, then recorded as an error; the other episodes finish."""
    def step_with_bug(self, text, _real=FakeEnv.step):
        if self.task.instance_id == "t2" or (self.task.instance_id == "t1" and self.attempt == 0):
            raise RuntimeError("AST constructor recursion depth mismatch")
        return _real(self, text)

    def plan(task, attempt):
        return Plan(submit_at=2)

    monkeypatch.setattr(FakeEnv, "step", step_with_bug)
    gym = Gym(plan)
    orig_call = Gym.__call__

    def call(self, task):
        env = orig_call(self, task)
        env.attempt = self.attempts[task.instance_id] - 1
        return env

    monkeypatch.setattr(Gym, "__call__", call)
    stats = collect(tasks(3), 1, ScriptedBackend(), gym, spec(infra_retries=1), reward, progress=False)
    by = {t.task_id: t for t in stats.trajectories}
    assert by["t0"].status != "error" and by["t1"].status != "error" and gym.attempts["t1"] == 2
    assert by["t2"].status == "error" and by["t2"].error_reason.startswith("step: RuntimeError")
    assert gym.all_closed()


def test_hung_reset_is_abandoned_at_its_deadline():
    gym = Gym(lambda task, attempt: Plan(hang_at_reset=task.instance_id == "t1"))
    t0 = time.monotonic()
    stats = collect(tasks(2), 1, ScriptedBackend(), gym, spec(env_timeout_s=0.5, infra_retries=1), reward,
                    progress=False)
    assert time.monotonic() - t0 < 10
    by = {t.task_id: t for t in stats.trajectories}
    assert by["t0"].status == "resolved"
    assert by["t1"].status == "error" and "EnvTimeout" in by["t1"].error_reason
    assert by["t1"].error_reason.startswith("start:") and gym.attempts["t1"] == 2
    deadline = time.monotonic() + 10  # the abandoned threads return once their env is closed
    while not gym.all_closed() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gym.all_closed()


def test_grading_infra_error_is_retried_without_rerunning_the_episode():
    gym = Gym(lambda task, attempt: Plan(grade_infra_failures=1 if task.instance_id == "t0" else 99))
    stats = collect(tasks(2), 1, ScriptedBackend(), gym, spec(infra_retries=2), reward, progress=False)
    by = {t.task_id: t for t in stats.trajectories}
    assert by["t0"].status == "resolved" and by["t0"].meta["grade"]["attempts"] == 2
    assert by["t1"].status == "error" and by["t1"].error_reason.startswith("sandbox:")
    assert by["t1"].reward == 0.0 and by["t1"].exit_reason == "max_turns"
    assert gym.attempts == {"t0": 1, "t1": 1}  # the episodes themselves were not run again


def test_rerun_reuses_finished_episodes_and_redoes_errors(tmp_path):
    store = Store(f"file://{tmp_path}/store")
    sink = TrajectorySink(store, "runs/r/rollouts/dapo-s1/0")
    gym = Gym(lambda task, attempt: Plan(die_at_step=1 if task.instance_id == "t1" else None))
    heard: list[tuple[int, int]] = []
    first = collect(tasks(2), 2, ScriptedBackend(), gym, spec(infra_retries=0), reward, sink=sink, progress=False,
                    on_progress=lambda done, total: heard.append((done, total)))
    assert first.episodes == 4 and len(store.ls(sink.prefix)) == 4
    assert heard == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)], "once at the start, then per episode, errors too"
    assert sum(t.status == "error" for t in first.trajectories) == 2
    before = {k: store.get_text(k) for k in store.ls(sink.prefix)}

    backend = RecordingBackend(ScriptedBackend())
    heard.clear()
    again = collect(tasks(2), 2, backend, Gym(), spec(), reward, sink=sink, progress=False,
                    on_progress=lambda done, total: heard.append((done, total)))
    assert again.reused == 2 and again.episodes == 2  # the two errors were run again, and only they
    assert heard == [(2, 4), (3, 4), (4, 4)], "reused episodes count as done from the start"
    assert {t.task_id for t in again.trajectories if t.status == "error"} == set()
    assert all(before[k] == store.get_text(k) for k in before if "t0__" in k)  # reused, untouched
    # every generate call of the re-run belongs to a redone t1 episode: nothing finished was redone
    assert_token_exact([t for t in again.trajectories if t.task_id == "t1"], backend.records)

    third = collect(tasks(2), 2, ScriptedBackend(fail_on_call=1), Gym(), spec(), reward, sink=sink, progress=False)
    assert third.reused == 4 and third.episodes == 0 and third.generate_calls == 0


def test_interrupt_closes_every_sandbox():
    gym = Gym(lambda task, attempt: Plan(step_delay_s=0.05))
    with pytest.raises(KeyboardInterrupt):
        collect(tasks(4), 2, ScriptedBackend(fail_on_call=3), gym, spec(concurrency=5), reward, progress=False)
    assert len(gym.envs) >= 5 and gym.all_closed()
