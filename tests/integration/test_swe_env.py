"""A short scripted episode in a real Docker sandbox: tools, rewrite, shell, timeout, submit, grade."""

import hashlib
import shutil
import subprocess

import pytest

from environments.records import TaskInstance
from environments.swe_env import SWEEnv
from swerl.config import EnvironmentConfig

pytestmark = pytest.mark.integration

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
OLD_TEST = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
TEST_PATCH = """diff --git a/test_add.py b/test_add.py
new file mode 100644
--- /dev/null
+++ b/test_add.py
@@ -0,0 +1,5 @@
+from calc import add
+
+
+def test_add():
+    assert add(2, 3) == 5
"""


def _docker_ok() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def _swerl_containers() -> list[str]:
    """This process's sandbox containers (other test runs may share the Docker daemon)."""
    from environments.sandbox import session_id

    mine = ["--filter", "label=swerl", "--filter", f"label=swerl.session={session_id()}"]
    out = subprocess.run(["docker", "ps", "-aq", *mine], capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    if not _docker_ok():
        pytest.skip("docker is not available")
    pytest.importorskip("environments.sandbox.docker", reason="the docker sandbox backend has not landed yet")
    from environments.base_image import ensure_base_image

    base = ensure_base_image(progress=lambda line: None)
    ctx = tmp_path_factory.mktemp("calc-repo")
    (ctx / "calc.py").write_text(CALC)
    (ctx / "test_calc.py").write_text(OLD_TEST)
    dockerfile = (f"FROM {base}\nCOPY --chown=swerl:swerl calc.py test_calc.py /testbed/\n"
                  "RUN cd /testbed && git init -q && git add -A && git commit -qm base\n")
    (ctx / "Dockerfile").write_text(dockerfile)
    tag = "swerl-test-swe-env:" + hashlib.sha256((dockerfile + CALC + OLD_TEST).encode()).hexdigest()[:12]
    subprocess.run(["docker", "build", "-q", "--label", "swerl=1", "-t", tag, str(ctx)], check=True,
                   capture_output=True)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def _task(image: str) -> TaskInstance:
    return TaskInstance(instance_id="calc-1", repo="acme/calc", base_commit="HEAD",
                        problem_statement="add(2, 3) returns -1 instead of 5.", patch="", test_patch=TEST_PATCH,
                        FAIL_TO_PASS=["test_add.py::test_add"], PASS_TO_PASS=["test_calc.py::test_mul"], image=image,
                        test_cmd="python3 -m pytest -rA -p no:cacheprovider")


def _step(env: SWEEnv, block: str, lang: str = "bash") -> str:
    res = env.step(f"```{lang}\n{block}\n```")
    assert not res.format_error, res.observation
    return res.observation


def test_scripted_episode_in_docker(image):
    cfg = EnvironmentConfig(sandbox="docker", window=10, command_timeout_s=20)
    with SWEEnv(_task(image), cfg, "tools+file") as env:
        obs = env.reset()
        assert "add(2, 3) returns -1" in obs and obs.endswith("(Current directory: /testbed, current file: none)")
        assert "2:    return a - b" in _step(env, "open calc.py")
        assert "Found 1 matches" in _step(env, "search_file 'a - b'")
        refused = env.step("```bash\nedit 1:2\ndef add(a, b:\n    return a + b\nend_of_edit\n```").observation
        assert "NOT applied" in refused
        out = _step(env, "def add(a, b):\n    return a + b", "python")
        assert "replaced function add" in out
        assert "return a + b" in _step(env, "cat calc.py")
        assert "1 passed" in _step(env, "python3 -m pytest -q -p no:cacheprovider test_calc.py")
        footer = "(Current directory: /testbed/sub, current file: /testbed/calc.py)"
        assert _step(env, "mkdir -p sub && cd sub").endswith(footer)
        _step(env, "cd /testbed")
        res = env.step("```bash\nsubmit\n```")
        assert res.done and res.exit_reason == "submitted"
        assert "-    return a - b\n+    return a + b" in env.patch
        try:
            import environments.grading  # noqa: F401
        except ImportError:
            grade = None
        else:
            grade = env.grade()
    assert not _swerl_containers()
    if grade is not None:
        assert grade.status == "resolved" and grade.resolved, grade.log[-2000:]
        assert not _swerl_containers()


def test_timeout_is_an_observation_and_the_episode_goes_on(image):
    cfg = EnvironmentConfig(sandbox="docker", window=10, command_timeout_s=2)
    with SWEEnv(_task(image), cfg, "tools") as env:
        env.reset()
        obs = _step(env, "echo before; sleep 30")
        assert "timed out after 2 s" in obs
        assert _step(env, "echo after").startswith("after")
    assert not _swerl_containers()
