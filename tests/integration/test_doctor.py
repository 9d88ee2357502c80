import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def _doctor(cwd, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    """Run in a scratch directory: the embedded store and MLflow file live under ./.swerl."""
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "flows.cli", "doctor"], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_doctor_passes_on_a_set_up_machine(tmp_path):
    out = _doctor(tmp_path, {})
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("docker daemon", "base image", "default model", "object store", "mlflow", "prefect api"):
        assert name in out.stdout


def test_doctor_fails_and_says_how_to_start_docker(tmp_path):
    # an unreachable daemon, exactly as the CLI sees a stopped one, without stopping the shared one
    out = _doctor(tmp_path, {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert out.returncode == 1
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("docker daemon"))
    assert "FAIL" in line and "dockerd" in line
