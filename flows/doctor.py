"""`swerl doctor`: is this machine ready to run the pipeline, and if not, what to do about it."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from swerl.config import SwerlConfig


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _docker() -> Check:
    try:
        out = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                             capture_output=True, text=True, timeout=15)
    except FileNotFoundError:
        return Check("docker daemon", False, "docker CLI not installed",
                     "apt-get install docker.io (or run `make setup` as root)")
    except subprocess.TimeoutExpired:
        return Check("docker daemon", False, "docker info timed out", "restart dockerd")
    if out.returncode != 0:
        return Check("docker daemon", False, (out.stderr.strip().splitlines() or ["unreachable"])[-1][:90],
                     "start it: sudo dockerd --bridge=none --iptables=false &  (or: sudo systemctl start docker)")
    return Check("docker daemon", True, f"server {out.stdout.strip()}")


def _base_image(cfg: SwerlConfig) -> Check:
    ref = f"{cfg.environment.base_image}:latest"
    try:
        out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref],
                             capture_output=True, text=True, timeout=15)
        ok = out.returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        ok = False
    return Check("base image", ok, ref + (" present" if ok else " missing"), "swerl setup")


def _model() -> Check:
    from swerl.model_cache import default_model_dir

    d = default_model_dir()
    ok = (d / "config.json").exists() and any(d.glob("*.safetensors"))
    return Check("default model", ok, str(d) if ok else f"not cached in {d}", "swerl setup")


def _store(cfg: SwerlConfig) -> Check:
    from swerl.store import open_store

    try:
        store = open_store(cfg.storage)
        key = f"_doctor/{time.time_ns()}"
        store.put_bytes(key, b"ok")
        ok = store.get_bytes(key) == b"ok"
        store.delete(key)
        return Check("object store", ok, f"{cfg.storage.uri} writable")
    except Exception as e:  # noqa: BLE001 - the doctor reports any failure
        return Check("object store", False, f"{cfg.storage.uri}: {type(e).__name__}: {e}"[:120],
                     "check storage.uri / S3 endpoint and credentials")


def _mlflow(cfg: SwerlConfig) -> Check:
    uri = cfg.tracking.uri
    if uri.startswith("http"):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as r:
                return Check("mlflow", r.status == 200, f"server {uri}")
        except Exception as e:  # noqa: BLE001
            return Check("mlflow", False, f"{uri}: {e}"[:120], "make up (starts the stack) or fix tracking.uri")
    try:
        from tasks.mlflow_backend import check_tracking

        check_tracking(cfg)
        return Check("mlflow", True, f"embedded {uri}")
    except Exception as e:  # noqa: BLE001
        return Check("mlflow", False, f"{uri}: {type(e).__name__}: {e}"[:120], "check tracking.uri")


def _prefect(cfg: SwerlConfig) -> Check:
    import os

    url = cfg.orchestration.prefect_api_url or os.environ.get("PREFECT_API_URL")
    if not url:
        try:
            import prefect  # noqa: F401

            return Check("prefect api", True, f"ephemeral (prefect {prefect.__version__}; starts with the first flow run)")
        except ImportError as e:
            return Check("prefect api", False, str(e), "make setup")
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5) as r:
            return Check("prefect api", r.status == 200, f"server {url}")
    except Exception as e:  # noqa: BLE001
        return Check("prefect api", False, f"{url}: {e}"[:120], "make up, or unset PREFECT_API_URL for the ephemeral API")


def _gpu() -> Check:
    try:
        import torch

        if torch.cuda.is_available():
            return Check("gpu/cuda", True, f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}",
                         required=False)
        return Check("gpu/cuda", False, f"none (torch {torch.__version__}); CPU presets only",
                     "gpu presets need CUDA and `pip install .[gpu]`", required=False)
    except Exception as e:  # noqa: BLE001
        return Check("gpu/cuda", False, str(e)[:100], "make setup", required=False)


def _disk() -> Check:
    free_gb = math.floor(shutil.disk_usage(Path.cwd()).free / 2**30 * 10) / 10  # rounded down: 9.96 is not 10
    return Check("free disk", free_gb >= 10, f"{free_gb:.1f} GiB free", "free at least 10 GiB")


def run_checks(cfg: SwerlConfig) -> list[Check]:
    checks: list[Callable[[], Check]] = [
        _docker, lambda: _base_image(cfg), _model, lambda: _store(cfg),
        lambda: _mlflow(cfg), lambda: _prefect(cfg), _gpu, _disk,
    ]
    results = []
    for fn in checks:
        try:
            results.append(fn())
        except Exception as e:  # noqa: BLE001 - a broken check is a failing line, not a crash
            results.append(Check(getattr(fn, "__name__", "check"), False, f"{type(e).__name__}: {e}"[:120]))
    return results


def format_table(results: list[Check]) -> str:
    rows = [("check", "status", "detail", "fix")]
    for c in results:
        status = "ok" if c.ok else ("FAIL" if c.required else "warn")
        rows.append((c.name, status, c.detail, "" if c.ok else c.fix))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + ("  " + r[3] if r[3] else ""))
    return "\n".join(lines)


def doctor(cfg: SwerlConfig) -> int:
    results = run_checks(cfg)
    print(format_table(results))
    failed = [c.name for c in results if c.required and not c.ok]
    if failed:
        print(f"\n{len(failed)} required check(s) failed: {', '.join(failed)}")
        return 1
    print("\nall required checks passed")
    return 0
