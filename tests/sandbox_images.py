"""Throwaway images and repos for sandbox tests: a tiny git repo in /testbed on `swerl-base`.

`make_test_image()` is content-addressed (tag = hash of base tag + Dockerfile), so every test
session after the first reuses it. `make_test_repo(dir)` writes the same repo on the host for
the local backend.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path

from environments.base_image import ensure_base_image, image_id

TEST_REPO = "swerl-test-sandbox"

FILES = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "README.md": "tiny repo for sandbox tests\n",
}


def _repo_script() -> str:
    """Shell that writes FILES into the current directory and commits them."""
    lines = [f"echo {base64.b64encode(body.encode()).decode()} | base64 -d > {name}"
             for name, body in FILES.items()]
    return " && ".join(
        lines + ["git init -q", "git add -A", "git -c user.name=t -c user.email=t@t commit -qm init"]
    )


def docker_available() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def make_test_image(progress=lambda line: None) -> str:
    base = ensure_base_image(progress)
    dockerfile = f"FROM {base}\nWORKDIR /testbed\nRUN {_repo_script()}\n"
    tag = f"{TEST_REPO}:{hashlib.sha256(dockerfile.encode()).hexdigest()[:12]}"
    if not image_id(tag):
        subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, text=True,
                       check=True)
    return tag


def make_test_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", "-c", _repo_script()], cwd=path, check=True)
    return path
