"""infra/gpu/check.py's dry run: the GPU check's own code path (one process, then a 1-rank FSDP2
group through `accelerate launch`) on CPU with a tiny model, and its one-line refusals."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "gpu" / "check.py"


def test_dry_run_trains_in_one_process_and_as_fsdp(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["fsdp"], r["seq_len"], r["size"]) for r in rows] == [(False, 256, "tiny"), (True, 256, "tiny")]
    assert all(r["tokens_per_s"] > 0 and r["peak_host_rss_gib"] > 0 and r["mfu"] is None for r in rows)
    # same seed, same model, same row: one FSDP rank computes the single process's loss
    assert rows[1]["loss"] == pytest.approx(rows[0]["loss"], abs=1e-5)
    assert "tokens/s" in proc.stdout and "fsdp" in proc.stdout


def test_refusals_are_one_line():
    bad = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "3b"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown size '3b'" in bad.stderr and "Traceback" not in bad.stderr
    if torch.cuda.is_available():
        return  # there the plain command is the full check, not a refusal
    no_gpu = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert no_gpu.returncode == 2 and no_gpu.stderr.strip() == "no CUDA device here: run with --dry-run for the CPU check"
