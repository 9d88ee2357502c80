"""Progress where Prefect users look: a progress artifact on the flow run ("3 of 8 DAPO
iterations"), next to the terminal's tqdm bars."""

from __future__ import annotations

from prefect.artifacts import create_progress_artifact, update_progress_artifact


class FlowProgress:
    """`done of total` steps of one flow run, as one Prefect progress artifact."""

    def __init__(self, key: str, what: str, total: int, done: int = 0) -> None:
        self.what, self.total, self.done = what, max(total, 1), done
        self.artifact_id = create_progress_artifact(self._percent(), key=key, description=self._text(""))

    def _percent(self) -> float:
        return round(100.0 * min(self.done, self.total) / self.total, 1)

    def _text(self, last: str) -> str:
        return f"{self.what}: {self.done} of {self.total}" + (f" (last: {last})" if last else "")

    def step(self, last: str = "") -> None:
        self.done += 1
        update_progress_artifact(self.artifact_id, self._percent(), description=self._text(last))
