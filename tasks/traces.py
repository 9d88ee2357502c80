"""Evaluation episodes as MLflow traces: one trace per episode, one span per turn (the policy's
reply, then the tool call and its observation), then the grade and its tests.

Built after an evaluation from the episode records in the store, so tracing never runs inside
the rollout loop: its cost is the logging at the end (measured in docs/MLFLOW.md). A sample of
episodes is traced (`MAX_TRACES` per evaluation, spread over tasks) and every text is cut to
`MAX_CHARS`, so a long evaluation adds a bounded number of small traces.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from tasks.mlflow_models import fluent_tracking
from tasks.run_context import TrackedRun
from training.run import stored_trajectories
from training.trajectory import Trajectory, Turn

log = logging.getLogger(__name__)

MAX_TRACES = 16  # episodes traced per evaluation (24 took 6.3 s on a shared 2-core machine)
MAX_CHARS = 4000  # per text field (reply, observation, patch, test log)


def cut(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n... [{len(text) - limit} more characters]"


def sample_episodes(episodes: list[Trajectory], k: int = MAX_TRACES, seed: int = 0) -> list[Trajectory]:
    """Up to `k` episodes, round-robin over tasks (each task's first sample first), in a seeded
    order: the same evaluation always traces the same episodes."""
    by_task: dict[str, list[Trajectory]] = {}
    for e in sorted(episodes, key=lambda e: (e.task_id, e.sample_index)):
        by_task.setdefault(e.task_id, []).append(e)
    tasks = sorted(by_task)
    random.Random(seed).shuffle(tasks)
    out: list[Trajectory] = []
    while len(out) < k and any(by_task.values()):
        for task in tasks:
            if by_task[task] and len(out) < k:
                out.append(by_task[task].pop(0))
    return out


class _Clock:
    """Span times laid out from the recorded durations (the records keep durations, not stamps)."""

    def __init__(self, start_ns: int) -> None:
        self.now = start_ns

    def advance(self, seconds: float) -> int:
        self.now += max(int(seconds * 1e9), 1000)
        return self.now


def _turn_spans(client: Any, trace_id: str, parent: str, i: int, turn: Turn, clock: _Clock) -> None:
    start = clock.now
    span = client.start_span(f"turn {i}", trace_id, parent, span_type="CHAIN", start_time_ns=start,
                             attributes={"format_error": turn.format_error, "tokens": len(turn.token_ids)})
    llm = client.start_span("policy", trace_id, span.span_id, span_type="LLM", start_time_ns=start,
                            attributes={"tokens": len(turn.token_ids), "gen_time_s": round(turn.gen_time_s, 3)})
    client.end_span(trace_id, llm.span_id, outputs={"reply": cut(turn.text)}, end_time_ns=clock.advance(turn.gen_time_s))
    if turn.format_error:
        err = client.start_span("format error", trace_id, span.span_id, span_type="PARSER", start_time_ns=clock.now,
                                inputs={"reply": cut(turn.text, 500)})
        client.end_span(trace_id, err.span_id, outputs={"observation": cut(turn.observation)}, status="ERROR",
                        end_time_ns=clock.advance(turn.env_time_s))
    else:
        tool = client.start_span(f"tool: {(turn.command or '').split()[0] if turn.command else 'none'}", trace_id,
                                 span.span_id, span_type="TOOL", start_time_ns=clock.now,
                                 inputs={"command": cut(turn.command or "")},
                                 attributes={"env_time_s": round(turn.env_time_s, 3)})
        client.end_span(trace_id, tool.span_id, outputs={"observation": cut(turn.observation)},
                        end_time_ns=clock.advance(turn.env_time_s))
    client.end_span(trace_id, span.span_id, outputs={"command": cut(turn.command or "", 500)}, end_time_ns=clock.now)


def _grade_span(client: Any, trace_id: str, parent: str, e: Trajectory, clock: _Clock) -> None:
    grade = e.meta.get("grade") or {}
    span = client.start_span("grade", trace_id, parent, span_type="EVALUATOR", start_time_ns=clock.now,
                             inputs={"patch": cut(e.patch)})
    outputs = {"status": e.status, "reward": e.reward, "tests": grade.get("tests_status", {}),
               **({"error": e.error_reason} if e.error_reason else {})}
    client.end_span(trace_id, span.span_id, outputs=outputs, status="ERROR" if e.status == "error" else "OK",
                    end_time_ns=clock.advance(e.timings.get("grade_s", 0.0)))


def log_episode_trace(client: Any, experiment_id: str, run_id: str, label: str, e: Trajectory,
                      tags: dict[str, str]) -> str:
    """One episode as one trace of the evaluation's MLflow run; returns the trace id."""
    clock = _Clock(time.time_ns() - int(e.timings.get("episode_s", 0.0) * 1e9))
    root = client.start_trace(f"{label}: {e.task_id} #{e.sample_index}", span_type="AGENT", experiment_id=experiment_id,
                              run_id=run_id, start_time_ns=clock.now,
                              inputs={"task_id": e.task_id, "sample": e.sample_index, "policy": e.policy_version},
                              tags={**tags, "swerl.task_id": e.task_id, "swerl.status": e.status})
    trace_id = root.trace_id
    clock.advance(e.timings.get("reset_s", 0.0))
    for i, turn in enumerate(e.turns):
        _turn_spans(client, trace_id, root.span_id, i, turn, clock)
    _grade_span(client, trace_id, root.span_id, e, clock)
    client.end_trace(trace_id, outputs={"status": e.status, "reward": e.reward, "exit_reason": e.exit_reason,
                                        "num_turns": e.num_turns, "patch": cut(e.patch, 1000)},
                     status="ERROR" if e.status == "error" else "OK", end_time_ns=clock.now)
    return trace_id


def log_evaluation_traces(t: TrackedRun, label: str, max_traces: int = MAX_TRACES) -> dict[str, float]:
    """Trace a sample of evaluation `label`'s episodes into its MLflow run, once (a resumed run
    finds them there); returns how many and how long it took. A tracing failure is logged and
    never fails the evaluation."""
    t0 = time.monotonic()
    episodes = sample_episodes(stored_trajectories(t.ctx, f"eval-{label}/"), max_traces, t.ctx.cfg.seed)
    run_id = t.child(f"eval-{label}")
    tags = {"swerl.run_id": t.ctx.run_id, "swerl.eval_label": label}
    done = 0
    try:
        with fluent_tracking(t.tracker.tracking_uri, t.tracker.experiment_id):
            if t.tracker.client.search_traces(locations=[t.tracker.experiment_id], run_id=run_id, max_results=1,
                                              include_spans=False):
                log.info("traces of evaluation %s: already logged (a resumed run)", label)
                return {"traces": 0.0, "trace_log_s": time.monotonic() - t0}
            for e in episodes:
                log_episode_trace(t.tracker.client, t.tracker.experiment_id, run_id, label, e,
                                  {**tags, "swerl.policy": e.policy_version})
                done += 1
    except Exception as err:  # noqa: BLE001 - traces are a view; the evaluation's records stand
        log.warning("traces of evaluation %s: %d of %d logged (%s: %s)", label, done, len(episodes),
                    type(err).__name__, err)
    seconds = time.monotonic() - t0
    log.info("traces of evaluation %s: %d episodes in %.2fs", label, done, seconds)
    return {"traces": float(done), "trace_log_s": seconds}
