"""The worker extension's re-tie (training.inference.vllm_sync) on stand-in modules: the real
engine case (a reload that would leave the CPU output head on the old embeddings) is
tests/integration/test_vllm_engine.py::test_weight_update_in_place."""

from types import SimpleNamespace

import pytest
import torch

from training.inference.vllm_sync import WeightSync, retie_lm_head

pytestmark = pytest.mark.unit


class Head(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
        self.processed = []
        self.quant_method = SimpleNamespace(process_weights_after_loading=self.processed.append)


def model(tied: bool):
    embed = torch.nn.Embedding(5, 3)
    head = Head(torch.zeros(5, 3))
    return SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=tied), lm_head=head,
                           model=SimpleNamespace(embed_tokens=embed))


def test_a_tied_head_is_pointed_at_the_embeddings_and_reprocessed():
    m = model(tied=True)
    assert retie_lm_head(m) is True
    assert m.lm_head.weight is m.model.embed_tokens.weight and m.lm_head.processed == [m.lm_head]


def test_an_untied_head_is_left_alone():
    m = model(tied=False)
    before = m.lm_head.weight
    assert retie_lm_head(m) is False
    assert m.lm_head.weight is before and m.lm_head.processed == []


def test_swerl_reload_reloads_then_reties():
    m = model(tied=True)
    calls = []
    worker = SimpleNamespace(reload_weights=lambda **kw: calls.append(kw),
                             model_runner=SimpleNamespace(get_model=lambda: m))
    out = WeightSync.swerl_reload(worker, "/ckpt/rft-0")
    assert calls == [{"weights_path": "/ckpt/rft-0"}]
    assert out["path"] == "/ckpt/rft-0" and out["tied_head"] is True and isinstance(out["pid"], int)
