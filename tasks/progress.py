"""Progress where Prefect users look: progress artifacts on the flow run ("3 of 8 DAPO
iterations", "episodes of eval-base/0: 40 of 147"), next to the terminal's tqdm bars.

The rollout engine hears of every finished episode; an API call per episode would slow a run
whose episodes take a fraction of a second, so updates are sent at most every
`min_interval_s`, and always when the count reaches its total.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from uuid import UUID

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext, TaskRunContext

log = logging.getLogger(__name__)

EPISODE_UPDATE_S = 5.0  # the least time between two updates of an episode count


class FlowProgress:
    """`done of total` steps of one flow run, as one Prefect progress artifact."""

    def __init__(self, key: str, what: str, total: int, done: int = 0, min_interval_s: float = 0.0) -> None:
        self.what, self.total, self.done = what, max(total, 1), done
        self.min_interval_s, self.sent_at = min_interval_s, time.monotonic()
        self.artifact_id = create_progress_artifact(self._percent(), key=key, description=self._text(""))

    def _percent(self) -> float:
        return round(100.0 * min(self.done, self.total) / self.total, 1)

    def _text(self, last: str) -> str:
        return f"{self.what}: {self.done} of {self.total}" + (f" (last: {last})" if last else "")

    def step(self, last: str = "") -> None:
        self.set(self.done + 1, self.total, last)

    def set(self, done: int, total: int, last: str = "") -> None:
        """Now `done` of `total`; sent unless the last update is younger than `min_interval_s`
        (a count that reaches its total is always sent)."""
        self.done, self.total = done, max(total, 1)
        now = time.monotonic()
        if done < self.total and now - self.sent_at < self.min_interval_s:
            return
        self.sent_at = now
        update_progress_artifact(self.artifact_id, self._percent(), description=self._text(last))


def artifact_key(text: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) naming `text`."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _run_id() -> UUID | None:
    """The Prefect task run (else flow run) this thread works for; None outside Prefect."""
    task_run, flow_run = TaskRunContext.get(), FlowRunContext.get()
    if task_run is not None:
        return task_run.task_run.id
    return flow_run.flow_run.id if flow_run is not None and flow_run.flow_run else None


class EpisodeProgress:
    """A run's `on_episodes` callback: one progress artifact per rollout batch of the Prefect
    task run that collects it. Outside a Prefect run it does nothing; a failing API call is
    logged and costs the run nothing."""

    def __init__(self, run_id: str, min_interval_s: float = EPISODE_UPDATE_S) -> None:
        self.run_id, self.min_interval_s = run_id, min_interval_s
        self.bars: dict[tuple[UUID, str], FlowProgress] = {}
        self.lock = threading.Lock()

    def __call__(self, batch: str, done: int, total: int) -> None:
        owner = _run_id()
        if owner is None:
            return
        try:
            with self.lock:
                bar = self.bars.get((owner, batch))
                if bar is None:
                    self.bars[(owner, batch)] = FlowProgress(
                        artifact_key(f"swerl-episodes-{batch}"), f"episodes of {batch} in run {self.run_id}",
                        total, done, self.min_interval_s)
                else:
                    bar.set(done, total)
        except Exception as e:  # noqa: BLE001 - the UI's view of a run must never stop the run
            log.warning("episode progress of %s not sent to Prefect: %s: %s", batch, type(e).__name__, e)
