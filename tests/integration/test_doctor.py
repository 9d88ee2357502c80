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


def _status(stdout: str) -> dict[str, tuple[str, str]]:
    """check name -> (status, detail), read back from the table."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        for status in (" ok ", " FAIL ", " warn "):
            if status in f"{line} ":
                name, rest = f"{line} ".split(status, 1)
                rows[name.strip()] = (status.strip(), rest.strip())
                break
    return rows


def test_doctor_passes_on_a_set_up_machine(tmp_path):
    """Every check that `make setup` provides is ok. Free disk is the machine's, not setup's: its line
    must agree with the number it prints, and it alone may fail the run (CI once had 9 GiB free)."""
    out = _doctor(tmp_path, {})
    rows = _status(out.stdout)
    for name in ("docker daemon", "base image", "default model", "object store", "mlflow", "prefect api"):
        assert rows.get(name, ("missing",))[0] == "ok", out.stdout + out.stderr
    status, detail = rows["free disk"]
    enough = float(detail.split()[0]) >= 10
    assert status == ("ok" if enough else "FAIL"), detail
    assert out.returncode == (0 if enough else 1), out.stdout + out.stderr


def test_doctor_fails_and_says_how_to_start_docker(tmp_path):
    # an unreachable daemon, exactly as the CLI sees a stopped one, without stopping the shared one
    out = _doctor(tmp_path, {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert out.returncode == 1
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("docker daemon"))
    assert "FAIL" in line and "dockerd" in line
