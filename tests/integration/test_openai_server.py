"""The openai client against swerl's server, a real process on loopback: the ids that come
over the wire are the ids the model sampled, and match the in-process hf backend."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest_model import chat_prompt, default_model_dir, hf_backend, stop_server, versioned_checkpoint  # noqa: F401
from training.inference.base import Completion, SamplingParams
from training.inference.openai_client import InferenceServerError, OpenAIBackend

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server_url(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "stderr.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.inference.server", "--model", str(default_model_dir),
             "--port", "0", "--host", "127.0.0.1", "--batch-window-ms", "50"],
            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert m, f"server did not start (rc={proc.poll()}): {line!r}\n{log.read_text()[-3000:]}"
        yield m.group(0)
    finally:
        stop_server(proc, grace_s=20)
        proc.stdout.close()


@pytest.fixture(scope="module")
def client(server_url, hf_backend):
    c = OpenAIBackend(server_url, tokenizer=hf_backend.tokenizer)
    yield c
    c.close()


@pytest.fixture(scope="module")
def prompts(hf_backend):
    return [chat_prompt(hf_backend.tokenizer, q) for q in
            ["What is 2+2?", "Name three colors.", "hi", "Write a haiku about the sea."]]


def test_health_and_models(server_url, default_model_dir):
    assert httpx.get(server_url + "/health").json()["status"] == "ok"
    (model,) = httpx.get(server_url + "/v1/models").json()["data"]
    assert model["id"] == str(default_model_dir)
    assert model["policy_version"] == default_model_dir.name


def test_greedy_over_the_wire_equals_in_process(client, hf_backend, prompts):
    sp = SamplingParams(temperature=0.0, max_new_tokens=24)
    remote = client.generate(prompts, sp)
    local = hf_backend.generate(prompts, sp)
    for r, l in zip(remote, local):
        assert isinstance(r, Completion)
        assert r.token_ids == l.token_ids and r.finish_reason == l.finish_reason
        assert max(abs(x - y) for x, y in zip(r.logprobs, l.logprobs)) < 5e-4


def test_seeded_sampling_over_the_wire_equals_in_process(client, hf_backend, prompts):
    sp = SamplingParams(max_new_tokens=16, seed=77)  # the training setting, T=1, no filters
    remote = client.generate(prompts, sp)
    assert [c.token_ids for c in remote] == [c.token_ids for c in hf_backend.generate(prompts, sp)]
    assert [c.token_ids for c in remote] == [c.token_ids for c in client.generate(prompts, sp)]


def test_raw_response_carries_exact_token_ids(server_url, client, prompts):
    body = client.request_body(prompts[0], SamplingParams(max_new_tokens=8, seed=1), seed=1)
    choice = httpx.post(server_url + "/v1/completions", json=body).json()["choices"][0]
    ids = choice["token_ids"]
    assert choice["logprobs"]["tokens"] == [f"token_id:{i}" for i in ids]
    assert len(choice["logprobs"]["token_logprobs"]) == len(ids)
    assert client.tokenizer.decode(ids) == choice["text"]


def test_concurrent_requests_are_batched(server_url, client, prompts):
    before = httpx.get(server_url + "/health").json()
    sp = SamplingParams(temperature=0.0, max_new_tokens=8)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: client.generate([p], sp)[0], prompts))
    after = httpx.get(server_url + "/health").json()
    assert after["requests"] - before["requests"] == 4
    assert after["batches"] - before["batches"] < 4
    assert [o.token_ids for o in outs] == [c.token_ids for c in client.generate(prompts, sp)]


def test_unsupported_settings_are_refused_not_ignored(server_url, client, prompts):
    r = httpx.post(server_url + "/v1/completions", json={"prompt": prompts[0], "n": 2})
    assert r.status_code == 400 and "n=2" in r.json()["error"]["message"]
    r = httpx.post(server_url + "/v1/completions", json={"prompt": prompts[0], "mirostat": 1})
    assert r.status_code == 400 and "mirostat" in r.json()["error"]["message"]
    with pytest.raises(InferenceServerError, match="HTTP 400"):
        client.generate([[10**9]], SamplingParams(max_new_tokens=2))


def test_load_weights_through_the_server(server_url, client, versioned_checkpoint, default_model_dir):
    client.load_weights(str(versioned_checkpoint))
    try:
        assert client.policy_version == "test-v1"
        assert httpx.get(server_url + "/v1/models").json()["data"][0]["policy_version"] == "test-v1"
    finally:
        client.load_weights(str(default_model_dir))
    assert client.policy_version == default_model_dir.name
