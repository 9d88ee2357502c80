"""Pinned datasets: a config names its train and eval sets by content hash, and curation takes
them from the store or from the copies shipped in data/datasets/, never synthesising another set."""

import gzip

import pytest

from environments.curation import curate as curate_mod
from environments.curation.curate import curate_pinned
from environments.curation.dataset import (
    SHIPPED_DIR, DatasetError, ensure_dataset, load_dataset, save_dataset, ship_dataset, shipped_files,
)
from swerl.config import ConfigError, load_config
from swerl.store import Store
from tests.unit.test_splits import diff, task

pytestmark = pytest.mark.unit
FILES_OFF = ["data.tasks_file=null", "data.eval_tasks_file=null"]  # smoke names task files


@pytest.fixture
def two_stores(tmp_path):
    return Store(f"file://{tmp_path}/a"), Store(f"file://{tmp_path}/b")


def tasks(n: int) -> list:
    return [task(f"p__{i}", "p", diff(i + 1, "x", f"y{i}")) for i in range(n)]


def test_a_shipped_dataset_lands_in_an_empty_store_with_its_hash(two_stores, tmp_path):
    made, fresh = two_stores
    ref = save_dataset(made, "demo-train", tasks(3), {"synth": {"seed": 0}})
    path = ship_dataset(made, "demo-train", ref.hash, root=tmp_path / "shipped")
    assert path.read_bytes() == ship_dataset(made, "demo-train", ref.hash, root=tmp_path / "shipped").read_bytes()
    got = ensure_dataset(fresh, "demo-train", ref.hash, root=tmp_path / "shipped")
    assert (got.hash, got.counts["total"]) == (ref.hash, 3)
    assert [t.to_dict() for t in load_dataset(fresh, "demo-train", ref.hash)] == [t.to_dict() for t in tasks(3)]
    assert ensure_dataset(fresh, "demo-train", ref.hash, root=tmp_path / "nowhere") == got  # now in the store


def test_a_changed_or_missing_shipped_dataset_is_a_clear_error(two_stores, tmp_path):
    made, fresh = two_stores
    ref = save_dataset(made, "demo-eval", tasks(2), {})
    path = ship_dataset(made, "demo-eval", ref.hash, root=tmp_path / "shipped")
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data.replace(b"y0", b"y9")))
    with pytest.raises(DatasetError, match="does not match its hash"):
        ensure_dataset(fresh, "demo-eval", ref.hash, root=tmp_path / "shipped")
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(DatasetError, match="not a readable gzip"):
        ensure_dataset(fresh, "demo-eval", ref.hash, root=tmp_path / "shipped")
    with pytest.raises(DatasetError, match="neither in .* nor shipped at"):
        ensure_dataset(fresh, "demo-eval", "0" * 16, root=tmp_path / "shipped")


def test_pinned_curation_synthesises_nothing(two_stores, tmp_path, monkeypatch):
    made, fresh = two_stores
    train, evals = save_dataset(made, "t", tasks(2), {}), save_dataset(made, "e", tasks(1), {})
    monkeypatch.setattr(curate_mod, "ensure_dataset",
                        lambda store, name, digest: ensure_dataset(store, name, digest, root=tmp_path / "shipped"))
    for name, ref in (("t", train), ("e", evals)):
        ship_dataset(made, name, ref.hash, root=tmp_path / "shipped")
    monkeypatch.setattr(curate_mod, "synth_project", lambda *a, **k: pytest.fail("synthesised a pinned set"))
    cfg = load_config("smoke", FILES_OFF + ["data.train_dataset=t", "data.eval_dataset=e",
                                           f"data.train_hash={train.hash}", f"data.eval_hash={evals.hash}"])
    got_train, got_eval, stats = curate_pinned(cfg, fresh, progress=lambda line: None)
    assert (got_train.hash, got_eval.hash, stats["pinned"]) == (train.hash, evals.hash, True)
    assert curate_pinned(load_config("smoke"), fresh) is None


def test_pins_come_in_pairs():
    with pytest.raises(ConfigError, match="set both or neither"):
        load_config("smoke", FILES_OFF + ["data.train_hash=0123456789abcdef"])
    with pytest.raises(ConfigError, match="one or the other"):
        load_config("smoke", ["data.train_hash=0123456789abcdef", "data.eval_hash=0123456789abcdef"])


def test_a_run_uses_the_pinned_dataset_not_the_newest(tmp_path, monkeypatch):
    from training.data import pinned_dataset
    from training.run import RunContext

    store = Store(f"file://{tmp_path}/s")
    pinned = save_dataset(store, "t", tasks(2), {})
    newer = save_dataset(store, "t", tasks(3), {})
    evals = save_dataset(store, "e", tasks(1), {})
    cfg = load_config("smoke", FILES_OFF + ["data.train_dataset=t", "data.eval_dataset=e",
                                           f"data.train_hash={pinned.hash}", f"data.eval_hash={evals.hash}"])
    assert pinned_dataset(RunContext(cfg=cfg, store=store, run_id="r"), "train", "t") == pinned.hash
    other = load_config("smoke", FILES_OFF + ["data.train_dataset=t", "data.eval_dataset=e",
                                             f"data.train_hash={newer.hash}", f"data.eval_hash={evals.hash}"])
    with pytest.raises(RuntimeError, match="start a new run"):
        pinned_dataset(RunContext(cfg=other, store=store, run_id="r"), "train", "t")


def test_the_regrade_hint_names_the_eval_set_the_run_read_not_the_newest(tmp_path):
    """`swerl evaluate` prints a `swerl grade --tasks ...` line: it must point at the run's set."""
    from flows.cli_runs import eval_tasks_location
    from training.data import pinned_dataset
    from training.run import RunContext

    store = Store(f"file://{tmp_path}/s")
    first = save_dataset(store, "e", tasks(1), {})
    cfg = load_config("smoke", FILES_OFF + ["data.eval_dataset=e"])
    ctx = RunContext(cfg=cfg, store=store, run_id="r")
    assert pinned_dataset(ctx, "eval", "e") == first.hash  # the run's evaluation read this one
    newer = save_dataset(store, "e", tasks(2), {})
    assert newer.hash != first.hash
    assert eval_tasks_location(ctx).endswith(f"datasets/e/{first.hash}/tasks.jsonl")
    assert cfg.data.pinned_hash("eval") is None
    with pytest.raises(ValueError, match="no dataset split"):
        cfg.data.pinned_hash("test")


def test_the_cpu_demo_pins_datasets_that_are_shipped_whole(tmp_path):
    """`make demo` on a fresh machine trains and evaluates on the shipped sets: they must be there."""
    cfg = load_config("cpu-demo-1turn")
    d = cfg.data
    assert d.train_hash and d.eval_hash, "cpu-demo-1turn should pin its datasets"
    store = Store(f"file://{tmp_path}/s")
    for name, digest in ((d.train_dataset, d.train_hash), (d.eval_dataset, d.eval_hash)):
        assert shipped_files(name, digest)[0].is_file(), f"{name}@{digest} is not in {SHIPPED_DIR}"
        assert ensure_dataset(store, name, digest).hash == digest
    train = {t.meta["project"] for t in load_dataset(store, d.train_dataset, d.train_hash)}
    evals = {t.meta["project"] for t in load_dataset(store, d.eval_dataset, d.eval_hash)}
    assert train and evals and not train & evals
