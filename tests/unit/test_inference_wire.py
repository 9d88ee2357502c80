"""The HTTP contract between the openai client and a server, without a model or a socket."""

import json

import httpx
import pytest

from swerl.config import RolloutConfig
from training.inference import make_backend
from training.inference.base import Completion, SamplingParams
from training.inference.openai_client import InferenceServerError, OpenAIBackend, parse_token_ids
from training.inference.server import RequestError, parse_request, render_choice

pytestmark = pytest.mark.unit


class TinyTokenizer:
    """Ids 0..9; 0 is <eos>; id n >= 1 spells as the letter 'a' + n - 1."""

    eos_token_id = 0
    vocab = {"<eos>": 0, **{chr(ord("a") + i - 1): i for i in range(1, 10)}}

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[c] for c in text]

    def decode(self, ids, skip_special_tokens=False):
        inv = {v: k for k, v in self.vocab.items()}
        return "".join(inv[i] for i in ids if not (skip_special_tokens and i == 0))


def test_request_parsing_takes_token_id_prompts():
    req = parse_request({"prompt": [1, 2], "max_tokens": 4, "temperature": 0.5, "top_k": 3,
                         "logprobs": 0, "return_tokens_as_token_ids": True, "seed": 9},
                        "m", vocab_size=10)
    assert req.prompts == [[1, 2]]
    assert (req.sampling.max_new_tokens, req.sampling.temperature, req.sampling.top_k) == (4, 0.5, 3)
    assert req.sampling.seed == 9 and req.want_logprobs and req.ids_as_tokens
    assert parse_request({"prompt": [[1], [2, 3]]}, "m", 10).prompts == [[1], [2, 3]]


@pytest.mark.parametrize("body, match", [
    ({"prompt": [1], "n": 2}, "n=2"),
    ({"prompt": [1], "logprobs": 5}, "logprobs=5"),
    ({"prompt": [1], "stop": ["\n"]}, "stop="),
    ({"prompt": [1], "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"prompt": [1], "typical_p": 0.5}, "unsupported request fields: typical_p"),
    ({"prompt": "hello"}, "list of token ids"),
    ({"prompt": [1, 99]}, "outside"),
    ({"prompt": [1], "top_p": 0}, "top_p"),
])
def test_request_parsing_refuses_what_it_cannot_honour(body, match):
    with pytest.raises(RequestError, match=match):
        parse_request(body, "m", vocab_size=10)


def test_wrong_model_is_404():
    with pytest.raises(RequestError) as err:
        parse_request({"prompt": [1], "model": "other"}, "m", 10)
    assert err.value.status == 404


def test_rendered_choice_round_trips_through_client_parser():
    tok = TinyTokenizer()
    req = parse_request({"prompt": [1], "logprobs": 0, "return_tokens_as_token_ids": True,
                         "return_token_ids": True}, "m", 10)
    choice = render_choice(0, Completion([3, 4, 0], [-0.1, -0.2, -0.3], "stop"), req, tok)
    assert choice["logprobs"]["tokens"] == ["token_id:3", "token_id:4", "token_id:0"]
    assert choice["text"] == "cd"
    assert parse_token_ids(choice, tok) == [3, 4, 0]


def test_token_id_channels_must_agree():
    choice = {"token_ids": [1, 2], "logprobs": {"tokens": ["token_id:1", "token_id:3"]}}
    with pytest.raises(InferenceServerError, match="disagree"):
        parse_token_ids(choice, TinyTokenizer())


def test_plain_token_strings_are_verified_against_text():
    tok = TinyTokenizer()
    good = {"text": "ab", "logprobs": {"tokens": ["a", "b", "<eos>"]}}
    assert parse_token_ids(good, tok) == [1, 2, 0]
    bad = {"text": "zz", "logprobs": {"tokens": ["a", "b"]}}
    with pytest.raises(InferenceServerError, match="decode back"):
        parse_token_ids(bad, tok)


def fake_server(reply):
    """An httpx transport answering /v1/models and /v1/completions with reply(body)."""
    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if request.url.path == "/v1/completions":
            body = json.loads(request.content)
            seen.append(body)
            return httpx.Response(200, json=reply(body))
        return httpx.Response(404, json={"error": "no route"})

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


def choice(ids, reason, lps=None):
    return {"choices": [{"index": 0, "text": "", "finish_reason": reason, "token_ids": ids,
                         "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                      "token_logprobs": lps or [-1.0] * len(ids)}}]}


def test_client_sends_every_sampling_setting_and_reads_ids():
    http, seen = fake_server(lambda body: choice([5, 6, 0], "stop", [-0.5, -0.25, -0.125]))
    be = OpenAIBackend("http://srv/v1", tokenizer=TinyTokenizer(), http=http)
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.05,
                        repetition_penalty=1.1, max_new_tokens=8, seed=3)
    out = be.generate([[1, 2], [3]], sp)
    assert [c.token_ids for c in out] == [[5, 6, 0]] * 2
    assert out[0].logprobs == [-0.5, -0.25, -0.125] and out[0].finish_reason == "stop"
    assert be.policy_version == "m"
    body = seen[0]
    for key, val in {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05,
                     "repetition_penalty": 1.1, "max_tokens": 8, "logprobs": 0,
                     "return_tokens_as_token_ids": True, "model": "m"}.items():
        assert body[key] == val, key
    assert 0 in body["stop_token_ids"]
    assert sorted(b["seed"] for b in seen) == [3, 4]  # repeated prompts must not share a seed


@pytest.mark.parametrize("reply, match", [
    (lambda b: choice([5] * (b["max_tokens"] + 2), "length"), "max_new_tokens"),
    (lambda b: choice([5, 6], "stop"), "stop ids"),
    (lambda b: choice([5, 6], "abort"), "finish_reason"),
    (lambda b: choice([5, 6], "length", [-1.0]), "misaligned"),
])
def test_client_refuses_a_server_that_ignored_settings(reply, match):
    http, _ = fake_server(reply)
    be = OpenAIBackend("http://srv", tokenizer=TinyTokenizer(), http=http)
    with pytest.raises(InferenceServerError, match=match):
        be.generate([[1]], SamplingParams(max_new_tokens=4))


def test_client_reports_http_errors_and_missing_weight_swap():
    def handle(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if request.url.path == "/v1/completions":
            return httpx.Response(400, json={"error": {"message": "top_k unsupported"}})
        return httpx.Response(404)

    be = OpenAIBackend("http://srv", tokenizer=TinyTokenizer(),
                       http=httpx.Client(transport=httpx.MockTransport(handle)))
    with pytest.raises(InferenceServerError, match="HTTP 400.*top_k unsupported"):
        be.generate([[1]], SamplingParams(max_new_tokens=4))
    with pytest.raises(InferenceServerError, match="VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls"):
        be.load_weights("/some/ckpt")


def _vllm_dev_server(calls, rpc_status=200):
    """A mock ``vllm serve`` in dev mode: records each weight-update call it is sent."""
    def handle(request):
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
        if path == "/swerl/load_weights":
            return httpx.Response(404)
        body = json.loads(request.content) if request.content else None
        calls.append((path, dict(request.url.params), body))
        if path == "/collective_rpc" and rpc_status != 200:
            return httpx.Response(rpc_status, text="no method swerl_reload")
        if path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": True})
        return httpx.Response(200, json={})
    return handle


def test_client_updates_vllm_serve_weights_in_order(tmp_path):
    ckpt = tmp_path / "rft-0"
    ckpt.mkdir()
    (ckpt / "swerl.json").write_text(json.dumps({"version": "run-rft-0"}))
    calls = []
    be = OpenAIBackend("http://srv", tokenizer=TinyTokenizer(),
                       http=httpx.Client(transport=httpx.MockTransport(_vllm_dev_server(calls))))
    be.load_weights(str(ckpt))
    assert [c[0] for c in calls] == ["/pause", "/collective_rpc", "/reset_prefix_cache",
                                     "/update_weight_version", "/resume"]
    assert calls[0][1] == {"mode": "wait"}  # the running requests finish on the old weights
    assert calls[1][2] == {"method": "swerl_reload", "args": [str(ckpt)]}
    assert calls[3][2] == {"new_version": "run-rft-0"} and be.policy_version == "run-rft-0"


def test_client_resumes_vllm_serve_when_the_swap_fails(tmp_path):
    calls = []
    be = OpenAIBackend("http://srv", tokenizer=TinyTokenizer(),
                       http=httpx.Client(transport=httpx.MockTransport(_vllm_dev_server(calls, 500))))
    with pytest.raises(InferenceServerError, match="HTTP 500.*swerl_reload"):
        be.load_weights(str(tmp_path))
    assert [c[0] for c in calls] == ["/pause", "/collective_rpc", "/resume"]
    assert be.policy_version == "m"  # unchanged: the old weights still serve


def test_openai_backend_needs_server_url():
    with pytest.raises(ValueError, match="server_url"):
        make_backend(RolloutConfig(backend="openai"))


def test_vllm_backend_falls_back_to_hf_where_vllm_is_missing(monkeypatch, caplog):
    import sys

    from training.inference import prefix_cache, vllm_backend

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError, match="make engine"):
        vllm_backend.import_vllm()
    monkeypatch.setattr(prefix_cache, "PrefixCachingHFBackend", lambda *a, **kw: ("hf", a, kw))
    with caplog.at_level("WARNING"):
        got = make_backend(RolloutConfig(backend="vllm", dtype="bfloat16"))
    assert got[0] == "hf" and got[2]["dtype"] == "bfloat16"
    assert "falling back to rollout.backend=hf" in caplog.text


def test_vllm_engine_knobs_become_engine_arguments():
    from swerl.config import VLLMEngineConfig
    from training.inference.vllm_backend import engine_args

    args = engine_args(VLLMEngineConfig(kv_cache_gib=1.5, max_num_seqs=32, block_size=32))
    assert args["kv_cache_memory_bytes"] == int(1.5 * 2**30) and "max_model_len" not in args  # gpu.max_model_len's
    assert args["max_num_seqs"] == 32 and args["enforce_eager"] is True and args["block_size"] == 32
    assert args["enable_chunked_prefill"] is False and args["enable_prefix_caching"] is True
    assert args["worker_extension_cls"] == "training.inference.vllm_sync.WeightSync"
    defaults = engine_args(VLLMEngineConfig(kv_cache_gib=None))
    assert "kv_cache_memory_bytes" not in defaults and "block_size" not in defaults


class CharTokenizer(TinyTokenizer):
    """One id per character of fenced python; 0 is <eos>."""

    vocab = {"<eos>": 0, **{c: i for i, c in enumerate("`pythonx=1\n hel", start=1)}}


def test_client_cuts_a_reply_at_its_first_closed_block():
    """A server cannot stop on a block; the client drops what follows it, which is exactly what
    a sampler that stopped there would have returned (tokens come left to right)."""
    tok = CharTokenizer()
    text = "```python\nx=1\n```\nhello\n```py\n"
    ids = tok.encode(text)
    http, _ = fake_server(lambda body: choice(ids, "length", [-0.1 * (i + 1) for i in range(len(ids))]))
    be = OpenAIBackend("http://srv", tokenizer=tok, http=http)
    (c,) = be.generate([[1]], SamplingParams(max_new_tokens=len(ids), stop_at_block=True))
    assert tok.decode(c.token_ids) == "```python\nx=1\n```" and c.finish_reason == "block"
    assert c.logprobs == [-0.1 * (i + 1) for i in range(len(c.token_ids))]
    (whole,) = be.generate([[1]], SamplingParams(max_new_tokens=len(ids)))
    assert whole.token_ids == ids and whole.finish_reason == "length"
    open_only = tok.encode("```python\nx=1\n")
    http, _ = fake_server(lambda body: choice(open_only + [0], "stop"))
    be = OpenAIBackend("http://srv", tokenizer=tok, http=http)
    (c,) = be.generate([[1]], SamplingParams(max_new_tokens=32, stop_at_block=True))
    assert c.token_ids == open_only + [0] and c.finish_reason == "stop"  # no block closed: untouched
