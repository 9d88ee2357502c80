"""Promotion and reports after the fact: `swerl promote` and `swerl report RUN_ID`.

`promote` is a Prefect flow (typed parameters for the UI) so a manual decision is recorded like
any other flow run; `report` is a plain function: it only re-reads the store and rewrites files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from tasks import registry_tasks as reg
from tasks.reports import build_run_report, stored_evals
from tasks.run_context import RunRef, open_run


@flow(name="promote", log_prints=True)
def promote(preset: str | None = None, overrides: list[str] = [], run_id: str | None = None,  # noqa: B006
            version: str | None = None, manual: bool = False, note: str = "") -> dict[str, Any]:
    """Promote a registered version to champion if the paired test says it is better.

    `version` defaults to the newest version the run registered. `manual` promotes regardless
    (the comparison is still computed and recorded, and the version is tagged as a manual
    decision); `note` is appended to the recorded reason (who, why). `preset` defaults to the
    run's own (its stored config).
    """
    ref, warning = RunRef.for_run(run_id, preset, overrides)
    if warning:
        get_run_logger().warning(warning)
    t = open_run(ref)
    if version is None:
        version = reg.latest_version(t, ref.run_id)
        if version is None:
            raise ValueError(f"run {ref.run_id} registered no version of "
                             f"{t.ctx.cfg.tracking.registered_model}; pass version=")
    result = reg.promote(ref, str(version), manual=manual, note=note)
    t.tracker.flush(timeout=t.tracker.retry_s)
    return result


def report(run_id: str, preset: str | None = None, overrides: list[str] | None = None) -> tuple[Path, str]:
    """Rebuild run `run_id`'s report (and each evaluation's) from the store with the run's own
    config (another `preset` is refused); returns report.md and a warning for the user (or "")."""
    ref, warning = RunRef.for_run(run_id, preset, overrides)
    t = open_run(ref)
    evals = stored_evals(t)
    if not evals:
        raise FileNotFoundError(f"run {run_id} has no evaluation in {t.ctx.store.url(t.ctx.key('eval'))}")
    path = build_run_report(t, evals)
    t.tracker.flush(timeout=t.tracker.retry_s)
    return path, warning
