"""A real rollout (SmolLM2, docker sandboxes, fixture tasks): every turn of every trajectory is
exactly what the model was given and sampled, and training trains on exactly the sampled ids."""

from __future__ import annotations

import subprocess

import pytest

from environments.sandbox import session_id
from environments.swe_env import SWEEnv
from swerl.config import EnvironmentConfig
from tests.conftest_model import default_model_dir  # noqa: F401 - fixture
from tests.rollout_checks import RecordingBackend, assert_token_exact
from training.agent import AgentLimits, resolved_reward
from training.inference.base import SamplingParams
from training.rollout import RolloutSpec, collect

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENV = EnvironmentConfig(sandbox="docker", command_timeout_s=30, test_timeout_s=180)


def docker_ok() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def fixture_tasks(n: int) -> list:
    """The first n hand-made fixture tasks, with their images built (a cache hit once built)."""
    from bench.fixture_tasks import load_fixture_tasks
    from environments.images import ensure_images

    tasks = load_fixture_tasks()[:n]
    images = ensure_images(tasks, progress=lambda line: None)
    for t in tasks:
        t.image = images[t.instance_id]
    return tasks


def session_containers(*sessions: str) -> list[str]:
    out = []
    for s in sessions:
        res = subprocess.run(["docker", "ps", "-aq", "--filter", "label=swerl", "--filter",
                              f"label=swerl.session={s}"], capture_output=True, text=True, check=True)
        out += res.stdout.split()
    return out


@pytest.fixture(scope="module")
def tasks():
    if not docker_ok():
        pytest.skip("docker is not available")
    return fixture_tasks(2)


def test_real_rollout_is_token_exact(tasks, default_model_dir):  # noqa: F811 - fixture
    """Through the prefix-caching backend, the one rollouts should use on CPU: its reuse of
    keys/values must not show in what the trajectories record."""
    from training.inference.prefix_cache import PrefixCachingHFBackend

    cached = PrefixCachingHFBackend(str(default_model_dir), seed=0)
    backend = RecordingBackend(cached)
    spec = RolloutSpec(limits=AgentLimits(max_turns=3, max_context_tokens=4096, max_new_tokens=96),
                       sampling=SamplingParams(temperature=1.0, max_new_tokens=96, seed=0),
                       action_format="tools+file", concurrency=4)
    stats = collect(tasks, 2, backend, lambda t: SWEEnv(t, ENV, "tools+file", observation_max_chars=2000),
                    spec, resolved_reward, progress=False)

    trajs = stats.trajectories
    assert len(trajs) == 4 and stats.episodes == 4
    assert [t.error_reason for t in trajs if t.status == "error"] == []
    assert all("grade" in t.meta for t in trajs)  # every episode reached a verdict
    checked = assert_token_exact(trajs, backend.records)
    assert checked == sum(t.num_turns for t in trajs) == len(backend.records) >= 4
    assert max(backend.batch_sizes) > 1, "episodes were never batched together"
    assert session_containers(session_id()) == []
    assert cached.reused_tokens > cached.prefill_tokens  # later turns did reuse earlier ones
    print("\nrollout summary:", {k: round(v, 3) for k, v in stats.summary().items()})
    print("exit reasons:", [t.exit_reason for t in trajs], "turns:", [t.num_turns for t in trajs],
          "format errors:", sum(tr.format_error for t in trajs for tr in t.turns), "batches:", backend.batch_sizes)
