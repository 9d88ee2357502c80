"""The hf backend on the real default model: batching, logprobs, stopping, weight swaps."""

import json
import time

import pytest
import torch

from swerl.model_cache import ensure_default_model
from tests.conftest_model import chat_prompt, default_model_dir, hf_backend, versioned_checkpoint  # noqa: F401
from training.inference.base import SamplingParams, check_completion
from training.inference.hf import torch_threads
from training.inference.sampling import processed_logprobs

pytestmark = pytest.mark.integration

QUESTIONS = ["What is 2+2?", "Write a python function that reverses a string.", "hi",
             "List three prime numbers and explain why each one is prime."]


@pytest.fixture(scope="module")
def prompts(hf_backend):
    return [chat_prompt(hf_backend.tokenizer, q) for q in QUESTIONS]


def test_default_model_is_cached_and_marked(default_model_dir):
    t0 = time.perf_counter()
    assert ensure_default_model(progress=lambda m: None) == default_model_dir
    assert time.perf_counter() - t0 < 1.0
    marker = json.loads((default_model_dir / "swerl.json").read_text())
    assert len(marker["gguf_sha256"]) == 64
    assert (default_model_dir / "model.safetensors").is_file()
    assert (default_model_dir / "chat_template.jinja").is_file()


def test_greedy_batch_equals_single(hf_backend, prompts):
    sp = SamplingParams(temperature=0.0, max_new_tokens=24)
    assert len({len(p) for p in prompts}) > 1  # padding is exercised
    batch = hf_backend.generate(prompts, sp)
    for p, b in zip(prompts, batch):
        (single,) = hf_backend.generate([p], sp)
        assert single.token_ids == b.token_ids
        assert single.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(single.logprobs, b.logprobs)) < 5e-4


def teacher_forced(model, prompt, completion, sp):
    """Processed logprobs of ``completion`` recomputed by one full forward pass."""
    ids = torch.tensor([prompt + completion])
    with torch.inference_mode(), torch_threads(1):
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    seen = torch.zeros(logits.shape, dtype=torch.bool)
    for t in range(len(completion)):
        seen[t, prompt + completion[:t]] = True
    lp = processed_logprobs(logits, sp, seen)
    return lp[torch.arange(len(completion)), torch.tensor(completion)]


@pytest.mark.parametrize("sp", [
    SamplingParams(max_new_tokens=20, seed=1),  # the training setting: raw policy logprobs
    SamplingParams(temperature=0.7, top_k=40, top_p=0.95, repetition_penalty=1.2,
                   max_new_tokens=20, seed=2),
], ids=["raw", "filtered"])
def test_logprobs_are_those_of_the_sampling_distribution(hf_backend, prompts, sp):
    outs = hf_backend.generate(prompts[:3], sp)
    for p, c in zip(prompts, outs):
        expected = teacher_forced(hf_backend.model, p, c.token_ids, sp)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=5e-4), (c.logprobs, expected)
    if sp.temperature == 1.0:  # ... and then they are the plain policy logprobs
        p, c = prompts[0], outs[0]
        ids = torch.tensor([p + c.token_ids])
        with torch.inference_mode(), torch_threads(1):
            raw = torch.log_softmax(hf_backend.model(input_ids=ids).logits[0, len(p) - 1:-1], -1)
        assert torch.allclose(torch.tensor(c.logprobs), raw[torch.arange(len(c.token_ids)),
                                                              torch.tensor(c.token_ids)], atol=5e-4)


def test_stops_at_end_of_turn_and_at_length(hf_backend, prompts):
    im_end = hf_backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in hf_backend.stop_ids
    sp = SamplingParams(temperature=0.0, max_new_tokens=64)
    (c,) = hf_backend.generate([prompts[2]], sp)  # "hi" gets a short greeting
    assert c.finish_reason == "stop" and c.token_ids[-1] == im_end
    check_completion(c, sp, hf_backend.stop_ids)
    short = SamplingParams(temperature=0.0, max_new_tokens=5)
    (c,) = hf_backend.generate([prompts[1]], short)
    assert c.finish_reason == "length" and len(c.token_ids) == 5


def test_extra_stop_token_ids(hf_backend, prompts):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    (full,) = hf_backend.generate([prompts[1]], greedy)
    stop_at = full.token_ids[3]
    (c,) = hf_backend.generate([prompts[1]], greedy.with_(stop_token_ids=(stop_at,)))
    assert c.finish_reason == "stop" and c.token_ids == full.token_ids[:full.token_ids.index(stop_at) + 1]


def test_seeded_sampling_is_reproducible_and_batch_independent(hf_backend, prompts):
    sp = SamplingParams(max_new_tokens=16, seed=123)
    a = hf_backend.generate(prompts, sp)
    b = hf_backend.generate(prompts, sp)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    (alone,) = hf_backend.generate(prompts[:1], sp)
    assert alone.token_ids == a[0].token_ids
    twice = hf_backend.generate([prompts[0], prompts[0]], sp)
    assert twice[0].token_ids != twice[1].token_ids  # same prompt, different seeds


def test_load_weights_swaps_version(hf_backend, prompts, versioned_checkpoint, default_model_dir):
    sp = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = hf_backend.generate(prompts[:1], sp)[0].token_ids
    assert hf_backend.policy_version == default_model_dir.name
    hf_backend.load_weights(str(versioned_checkpoint))
    try:
        assert hf_backend.policy_version == "test-v1"
        assert hf_backend.generate(prompts[:1], sp)[0].token_ids == before
    finally:
        hf_backend.load_weights(str(default_model_dir))  # the fixture is shared
    assert hf_backend.policy_version == default_model_dir.name


def test_stop_at_block_ends_the_reply_where_its_first_block_closes(hf_backend, prompts):
    """The stop is not a filter: the reply is the unstopped sample's prefix that first holds a
    closed block (same seeds, same tokens), and a reply without a block is left whole."""
    from environments.actions import closes_block

    ask = chat_prompt(hf_backend.tokenizer, "Write a python function that adds two numbers, in a ```python block.")
    sp = SamplingParams(max_new_tokens=96, seed=7)
    full = hf_backend.generate([ask] * 6 + prompts[:2], sp)
    cut = hf_backend.generate([ask] * 6 + prompts[:2], sp.with_(stop_at_block=True))
    decode = hf_backend.tokenizer.decode
    blocks = 0
    for f, c in zip(full, cut):
        assert f.token_ids[:len(c.token_ids)] == c.token_ids
        assert c.logprobs == pytest.approx(f.logprobs[:len(c.logprobs)], abs=1e-4)
        if c.finish_reason == "block":
            blocks += 1
            assert closes_block(decode(c.token_ids)) and not closes_block(decode(c.token_ids[:-1]))
        else:
            assert c.token_ids == f.token_ids and not closes_block(decode(c.token_ids[:-1]))
        check_completion(c, sp.with_(stop_at_block=True), hf_backend.stop_ids)
    assert blocks >= 2, "the model wrote a python block in most of the 6 asks"
