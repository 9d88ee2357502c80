"""Screenshot MLflow's trace view of one evaluation episode, from a real MLflow server, with
headless Chromium (`infra/screenshot_ui.sh`).

    .venv/bin/python infra/screenshot_trace.py --tracking-uri sqlite:///.swerl/mlflow.db \
        --out docs/img/mlflow-trace.png [--label base] [--trace-id tr-...]

It starts `mlflow server` on the tracking store (a free loopback port), picks the traced
evaluation episode with the most turns (the richest view; `--trace-id` names one instead),
opens the experiment's Traces page with that trace selected, takes the picture and stops the
server. The traces are the ones `tasks/traces.py` logged when the evaluation ran.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
# A loopback address that is not 127.0.0.1: MLflow's UI opens its AI assistant panel over the
# page on the first visit from localhost or 127.0.0.1, and a one-shot headless browser is always
# a first visit.
HOST = "127.0.0.2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def turns(trace) -> int:
    return sum(s.name.startswith("turn ") for s in trace.data.spans)


def pick_trace(client: MlflowClient, label: str | None, trace_id: str | None):
    """The named trace, or the evaluation episode with the most turns (then most tool calls)."""
    if trace_id:
        return client.get_trace(trace_id)
    experiments = [e.experiment_id for e in client.search_experiments() if e.name.startswith("swerl-")]
    where = f"tags.`swerl.eval_label` = '{label}'" if label else None
    found = [t for exp in experiments
             for t in client.search_traces(locations=[exp], filter_string=where, max_results=200)]
    if not found:
        sys.exit(f"no evaluation traces in {client.tracking_uri}" + (f" for label {label!r}" if label else ""))
    return max(found, key=lambda t: (turns(t), sum(s.name.startswith("tool: ") for s in t.data.spans),
                                     t.info.trace_id))


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"mlflow server at {url} not healthy after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracking-uri", default="sqlite:///.swerl/mlflow.db")
    p.add_argument("--out", default="docs/img/mlflow-trace.png")
    p.add_argument("--label", help="only traces of this evaluation label (base, rft, dapo, ...)")
    p.add_argument("--trace-id", help="this trace instead of the one with the most turns")
    p.add_argument("--wait-ms", default="20000", help="virtual time the page gets to load its data")
    args = p.parse_args()
    trace = pick_trace(MlflowClient(tracking_uri=args.tracking_uri), args.label, args.trace_id)
    info = trace.info
    print(f"trace {info.trace_id}: {trace.data.spans[0].name}, {turns(trace)} turns", file=sys.stderr)
    port = free_port()
    url = f"http://{HOST}:{port}"
    log = Path(tempfile.mkstemp(suffix=".log", prefix="mlflow-server-")[1])
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", args.tracking_uri,
                                 "--host", HOST, "--port", str(port), "--workers", "1",
                                 "--allowed-hosts", f"{HOST}:{port}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(url, proc, log)
        page = (f"{url}/#/experiments/{info.experiment_id}/traces?selectedEvaluationId={info.trace_id}"
                f"&traceId={info.trace_id}&compareRunsMode=TRACES")
        shot = subprocess.run(["bash", str(ROOT / "infra" / "screenshot_ui.sh"), page, args.out, args.wait_ms])
        return shot.returncode
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
