"""`swerl bench {env,rollout,train}` call their benchmarks with arguments those accept (the
benchmarks themselves are too slow for a unit test: each is replaced by a signature check)."""

import inspect

import pytest

from flows import cli, cli_ops

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("what, module, names", [
    ("rollout", "bench.rollout", ["bench_rollout"]),
    ("rollout --backends hf,vllm", "bench.rollout", ["bench_backends"]),
    ("train", "bench.train", ["bench_train"]),
    ("update", "bench.update_shape", ["bench_update"]),
    ("env", None, None),
])
def test_bench_commands_bind_to_the_benchmarks(what, module, names, monkeypatch, capsys):
    import importlib

    targets = {"env": [("bench.env", "bench_exec"), ("bench.grading", "bench_grading")]}
    pairs = targets.get(what) or [(module, n) for n in names]
    called = []
    for mod, name in pairs:
        m = importlib.import_module(mod)
        real = getattr(m, name)

        def fake(*a, _real=real, _name=name, **kw):
            inspect.signature(_real).bind(*a, **kw)  # raises TypeError on a bad call
            called.append(_name)
            return {"ok": True}

        monkeypatch.setattr(m, name, fake)
    monkeypatch.setattr(cli_ops, "tasks_with_images", lambda path: [object()])
    assert cli.main(["bench", *what.split(), "--preset", "smoke"]) == 0
    assert called == [n for _, n in pairs]
