"""Run an RFT or DAPO update in this process or as an `accelerate launch` process group.

`train.accelerate_config` null or "single": in this process (a laptop, CI). A file
(infra/accelerate/fsdp.yaml): the pipeline writes the job into a directory, starts

    accelerate launch --config_file FILE [--num_processes N] -m training.launch JOB_DIR

and reads back `metrics.json`, the checkpoint and the training state. The group's devices come
from `gpu` (training/layout.py); without CUDA it runs on CPU over gloo. Every rank runs `main`.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from swerl.config import REPO_DIR, GPUConfig, TrainerConfig, accelerate_file
from training import dapo, rft
from training.layout import trainer_env, trainer_processes
from training.precision import resolve_dtype
from training.trajectory import TrainingSample
from training.update_job import (JOB_FILE, METRICS_FILE, SAMPLES_FILE, UpdateJob, device_type, read_samples,
                                 write_samples)

log = logging.getLogger(__name__)

RUNNERS: dict[str, Callable[[UpdateJob, list[TrainingSample]], dict[str, float]]] = {
    "rft": rft.run_job, "dapo": dapo.run_job}


class UpdateFailed(RuntimeError):
    """The trainer's process group exited with an error; the message ends with its last lines."""


def run_update(job: UpdateJob, samples: list[TrainingSample], train: TrainerConfig,
               gpu: GPUConfig) -> dict[str, float]:
    """The update's metrics, after its checkpoint (and training state) are written."""
    if train.in_process:
        return RUNNERS[job.kind](job, samples)
    return run_group(job, samples, train, gpu)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(train: TrainerConfig, gpu: GPUConfig, job_dir: Path) -> list[str]:
    """`accelerate launch` for the job: the config file, the group size, and bf16 where the
    trainer's dtype resolves to it on this device (FSDP's mixed precision follows train.dtype)."""
    n = trainer_processes(train, gpu)
    bf16 = resolve_dtype(train.dtype, device_type()) == "bfloat16"
    return [sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(accelerate_file(train.accelerate_config)),
            *(["--num_processes", str(n)] if n else []),
            "--mixed_precision", "bf16" if bf16 else "no",
            "--main_process_port", str(free_port()),
            "-m", "training.launch", str(job_dir)]


def launch_env(gpu: GPUConfig) -> dict[str, str]:
    """The group's environment: the repo importable, its devices, and CPU mode without CUDA
    (accelerate would pick nccl; `make_accelerator` then runs FSDP over gloo)."""
    path = os.pathsep.join(p for p in (str(REPO_DIR), os.environ.get("PYTHONPATH", "")) if p)
    env = os.environ | {"PYTHONPATH": path} | trainer_env(gpu)
    if device_type() == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def run_group(job: UpdateJob, samples: list[TrainingSample], train: TrainerConfig,
              gpu: GPUConfig) -> dict[str, float]:
    """Hand the job to an `accelerate launch` group and wait for it; its output is passed on."""
    job_dir = Path(job.out_dir).parent / f".{Path(job.out_dir).name}.job"
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)
    (job_dir / JOB_FILE).write_text(job.to_json())
    write_samples(job_dir / SAMPLES_FILE, samples)
    cmd = launch_command(train, gpu, job_dir)
    log.info("%s update as a process group: %s", job.kind, " ".join(cmd))
    tail: collections.deque[str] = collections.deque(maxlen=30)
    # Own session: a failure or an interrupt takes the whole group down, never leaves ranks behind.
    proc = subprocess.Popen(cmd, cwd=REPO_DIR, env=launch_env(gpu), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            sys.stderr.write(line)
            tail.append(line)
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if rc != 0 or not (job_dir / METRICS_FILE).is_file():
        errors = sorted(job_dir.glob("error-rank*.txt"))
        first = f": {errors[0].stem[6:]}: {errors[0].read_text().strip()}" if errors else ""
        raise UpdateFailed(f"{job.kind} update: `accelerate launch` exited {rc}{first}; last lines:\n" + "".join(tail))
    metrics = json.loads((job_dir / METRICS_FILE).read_text())
    shutil.rmtree(job_dir, ignore_errors=True)
    return metrics


def main(argv: list[str] | None = None) -> None:
    """One rank of the group: run the job, the main rank writes the metrics last."""
    job_dir = Path((argv or sys.argv[1:])[0])
    rank = int(os.environ.get("RANK", "0"))
    try:
        job = UpdateJob.from_json((job_dir / JOB_FILE).read_text())
        metrics = RUNNERS[job.kind](job, read_samples(job_dir / SAMPLES_FILE))
    except Exception as e:  # the launcher's own report names no cause: leave this rank's for run_group
        (job_dir / f"error-rank{rank}.txt").write_text(f"{type(e).__name__}: {e}".splitlines()[0])
        raise
    if rank == 0:
        (job_dir / METRICS_FILE).write_text(json.dumps(metrics))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
