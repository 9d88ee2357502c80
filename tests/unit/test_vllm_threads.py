"""rollout.infer_threads on the vLLM CPU engine: the OpenMP binding its processes start with."""

import os

import pytest

from training.inference import vllm_backend
from training.inference.vllm_backend import cpu_bind, cpu_threads

pytestmark = pytest.mark.unit
KEY = "VLLM_CPU_OMP_THREADS_BIND"


def test_the_binding_takes_the_first_allowed_cores():
    assert cpu_bind(2, {5, 3, 9}) == "3,5"
    assert cpu_bind(1, {0, 1}) == "0"


def test_more_threads_than_cores_uses_the_cores_there_are(caplog):
    assert cpu_bind(4, {0, 1}) == "0,1"
    assert "infer_threads=4" in caplog.text


def test_the_binding_holds_while_the_engine_starts_then_goes(monkeypatch):
    monkeypatch.delenv(KEY, raising=False)
    monkeypatch.setattr(vllm_backend, "engine_device", lambda: "cpu")
    with cpu_threads(1):
        assert os.environ[KEY] == str(min(os.sched_getaffinity(0)))
    assert KEY not in os.environ


@pytest.mark.parametrize("threads, device, preset", [(None, "cpu", None), (2, "cuda", None), (2, "cpu", "0-7")])
def test_no_threads_a_gpu_or_the_users_own_binding_leave_vllm_alone(monkeypatch, threads, device, preset):
    if preset is None:
        monkeypatch.delenv(KEY, raising=False)
    else:
        monkeypatch.setenv(KEY, preset)
    monkeypatch.setattr(vllm_backend, "engine_device", lambda: device)
    with cpu_threads(threads):
        assert os.environ.get(KEY) == preset
    assert os.environ.get(KEY) == preset
