"""The send queue behind `Tracker`: metrics, params, tags and run ends wait here and go to
MLflow in batches, so a tracking outage neither blocks a training run nor loses data quietly.

A failed send keeps the queue and is retried on later calls (with backoff, so a dead server does
not slow every call). Once the backend has been down for the retry window, what is still queued
is dropped, logged loudly with counts per kind, and counted in `dropped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from mlflow.entities import Metric, Param, RunTag
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

from tasks.mlflow_backend import is_transient

log = logging.getLogger(__name__)

BATCH_LIMITS = {"metrics": MAX_METRICS_PER_BATCH, "params": MAX_PARAMS_TAGS_PER_BATCH,
                "tags": MAX_PARAMS_TAGS_PER_BATCH, "status": 1}
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class RunEnd:
    """A queued `set_terminated`: a stage that ends during an outage is marked ended later."""

    key: str  # the status, named `key` like the other queued records for error messages
    end_time: int


Record = Metric | Param | RunTag | RunEnd
SendBatch = Callable[[str, str, list[Record]], None]  # (run_id, kind, records): one request


class RecordBuffer:
    """Records in the order they were logged, sent one (run, kind) batch at a time."""

    def __init__(self, send: SendBatch, retry_s: float, uri: str, dropped: Counter[str]) -> None:
        self.send = send
        self.retry_s = retry_s
        self.uri = uri  # for the log lines only
        self.dropped = dropped  # shared with the tracker, which counts its own drops there too
        self._pending: list[tuple[str, str, Record]] = []  # (run_id, kind, record)
        self._lock = threading.RLock()
        self._outage_since: float | None = None
        self._next_try = 0.0
        self._backoff = 0.5

    def add(self, run_id: str, kind: str, items: list[Record]) -> None:
        """Queue `items`, and send the queue unless a failed send's backoff is still running."""
        with self._lock:
            self._pending.extend((run_id, kind, x) for x in items)
        if time.monotonic() >= self._next_try:
            self.flush()

    @property
    def pending(self) -> Counter[str]:
        """What is queued right now, per kind."""
        with self._lock:
            return Counter(kind for _, kind, _ in self._pending)

    def flush(self, timeout: float = 0.0) -> bool:
        """Send the queue, retrying for up to `timeout` s; True once it is empty.

        When the backend has been down for longer than the retry window, the queue is dropped
        (loudly) instead, and False is returned.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                try:
                    self._send_pending()
                except Exception as e:
                    if not is_transient(e):
                        raise
                    if not self._note_failure(e):
                        return False
                    now = time.monotonic()
                    if now >= deadline:
                        return False
                    time.sleep(max(0.0, min(self._next_try, deadline) - now))
                    continue
                if self._outage_since is not None:
                    log.warning("tracking: backend reachable again after %.0fs, buffer flushed",
                                time.monotonic() - self._outage_since)
                self._outage_since, self._next_try, self._backoff = None, 0.0, 0.5
                return True

    def _note_failure(self, err: BaseException) -> bool:
        """Record a failed send; False when the outage outlasted the window (queue dropped)."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
            log.warning("tracking: backend unreachable (%s: %s); buffering %s",
                        type(err).__name__, err, dict(self.pending))
        if now - self._outage_since >= self.retry_s:
            lost = self.pending
            self._pending.clear()
            self.dropped.update(lost)
            log.error("TRACKING DATA LOST: backend %s unreachable for %.0fs; dropped %s "
                      "(total dropped so far: %s); last error: %s", self.uri,
                      now - self._outage_since, dict(lost), dict(self.dropped), err)
            return False
        self._next_try = now + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        return True

    def _send_pending(self) -> None:
        """Send queued records one (run, kind) batch at a time, removing each once accepted."""
        while self._pending:
            run_id, kind, _ = self._pending[0]
            picked = [i for i, (r, k, _) in enumerate(self._pending) if r == run_id and k == kind]
            picked = picked[: BATCH_LIMITS[kind]]
            self._send_batch(run_id, kind, [self._pending[i][2] for i in picked])
            taken = set(picked)
            self._pending = [x for i, x in enumerate(self._pending) if i not in taken]

    def _send_batch(self, run_id: str, kind: str, items: list[Record]) -> None:
        """One batch; a permanent rejection is narrowed down to the record(s) MLflow refuses."""
        try:
            self.send(run_id, kind, items)
            return
        except Exception as e:
            if is_transient(e):
                raise
            if len(items) == 1:  # e.g. a param changed value, a metric name MLflow rejects
                self.dropped[kind] += 1
                log.error("TRACKING DATA LOST: %s rejected for run %s: %s: %s",
                          kind, run_id, items[0].key, e)
                return
        for item in items:  # isolate the rejected record(s); keep the rest
            self._send_batch(run_id, kind, [item])
