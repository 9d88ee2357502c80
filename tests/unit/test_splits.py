import pytest

from environments.curation.dataset import (
    DatasetError,
    dataset_hash,
    dataset_manifest,
    latest_hash,
    list_datasets,
    load_dataset,
    save_dataset,
)
from environments.curation.projects import DEFAULT_PROJECTS, check_disjoint, default_split, resolve
from environments.curation.splits import dedup, make_splits, normalized_diff, shared_projects
from environments.records import TaskInstance
from swerl.store import Store

pytestmark = pytest.mark.unit


def diff(line: int, old: str, new: str, path: str = "pkg/mod.py") -> str:
    return (f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -{line},3 +{line},3 @@ def f():\n     x = 1\n-    {old}\n+    {new}\n     return x\n")


def task(iid: str, project: str, patch: str, modifier: str = "flip_compare", split: str = "train") -> TaskInstance:
    return TaskInstance(instance_id=iid, repo=f"pypi/{project}", base_commit="c" * 40,
                        problem_statement="p", patch=patch, test_patch="", FAIL_TO_PASS=["t.py::a"],
                        PASS_TO_PASS=["t.py::b"], source=f"synth:pypi:{project}==1.0", split=split,
                        meta={"project": project, "modifier": modifier})


def test_normalized_diff_ignores_offsets_and_index_lines():
    assert normalized_diff(diff(10, "a < b", "a >= b")) == normalized_diff(diff(40, "a < b", "a >= b"))
    assert normalized_diff(diff(10, "a < b", "a >= b")) != normalized_diff(diff(10, "a < b", "a > b"))


def test_dedup_same_project_same_change_only():
    a = task("a", "p", diff(10, "a < b", "a >= b"))
    b = task("b", "p", diff(12, "a < b", "a >= b"))  # same edit, other offset
    c = task("c", "q", diff(10, "a < b", "a >= b"))  # same edit, other project: not a duplicate
    d = task("a", "p", diff(10, "x", "y"))  # same id
    kept, dropped = dedup([a, b, c, d])
    assert [t.instance_id for t in kept] == ["a", "c"] and dropped == ["b", "a"]


def test_make_splits_keeps_eval_untouched_and_drops_contaminated_train():
    ev = [task("e1", "glom", diff(1, "x", "y"), split="train"), task("e2", "glom", diff(2, "u", "v"))]
    tr = [task("t1", "toolz", diff(1, "p", "q")),
          task("t2", "glom", diff(5, "m", "n")),  # eval's project
          task("t3", "toolz", diff(9, "u", "v"))]  # eval's exact edit (other project)
    rep = make_splits(tr, ev)
    assert [t.instance_id for t in rep.train] == ["t1"] and rep.contaminated == ["t2", "t3"]
    assert [t.instance_id for t in rep.eval] == ["e1", "e2"] and {t.split for t in rep.eval} == {"eval"}
    assert shared_projects(rep.train, rep.eval) == set()
    assert rep.counts() == {"train": 1, "eval": 2, "duplicates": 0, "contaminated": 2}


def test_default_projects_are_split_by_project():
    train, eval_ = default_split("train"), default_split("eval")
    assert len(train) >= 7 and len(eval_) >= 3 and len(DEFAULT_PROJECTS) >= 10
    check_disjoint(train, eval_)
    assert all("==" in p.key and p.version for p in DEFAULT_PROJECTS)
    with pytest.raises(ValueError):
        check_disjoint(resolve(["toolz==1.0.0"], "train"), resolve(["toolz==0.12.1"], "eval"))
    (custom,) = resolve(["newpkg==2.0"], "eval")
    assert (custom.name, custom.version, custom.split, custom.test_paths) == ("newpkg", "2.0", "eval", ("tests",))
    with pytest.raises(ValueError):
        resolve(["toolz"], "train")


@pytest.fixture
def store(tmp_path):
    return Store(f"file://{tmp_path}/store")


def test_dataset_roundtrip_is_content_addressed(store):
    tasks = [task("b", "p", diff(1, "x", "y"), "swap_args"), task("a", "q", diff(1, "x", "z"))]
    ref = save_dataset(store, "synth-train", tasks, {"seed": 0})
    assert ref.hash == dataset_hash(list(reversed(tasks)))  # order does not matter
    assert ref.uri == store.url(f"datasets/synth-train/{ref.hash}")
    assert ref.counts["total"] == 2 and ref.counts["by_project"] == {"p": 1, "q": 1}
    assert ref.counts["by_modifier"] == {"flip_compare": 1, "swap_args": 1}
    loaded = load_dataset(store, "synth-train", ref.hash)
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in sorted(tasks, key=lambda t: t.instance_id)]
    assert save_dataset(store, "synth-train", tasks, {"seed": 0}) == ref  # idempotent
    assert dataset_manifest(store, "synth-train")["config"] == {"seed": 0}


def test_latest_listing_and_frozen_hash(store):
    first = save_dataset(store, "eval", [task("a", "p", diff(1, "x", "y"))], {})
    second = save_dataset(store, "eval", [task("b", "p", diff(1, "x", "w"))], {})
    other = save_dataset(store, "train", [task("c", "r", diff(1, "x", "w"))], {})
    assert first.hash != second.hash
    assert [r.hash for r in list_datasets(store, "eval")][-1] == second.hash
    assert {r.name for r in list_datasets(store)} == {"eval", "train"} and other in list_datasets(store)
    assert [t.instance_id for t in load_dataset(store, "eval")] == ["b"]  # newest
    assert [t.instance_id for t in load_dataset(store, "eval", first.hash)] == ["a"]
    path = store.local_path(f"datasets/eval/{first.hash}/tasks.jsonl")
    path.write_text(path.read_text().replace('"problem_statement": "p"', '"problem_statement": "q"'))
    with pytest.raises(DatasetError, match="does not match"):
        load_dataset(store, "eval", first.hash)
    with pytest.raises(DatasetError):
        load_dataset(store, "missing")
    with pytest.raises(DatasetError):
        load_dataset(store, "eval", "0" * 16)


def test_latest_is_what_curation_saved_last_even_when_it_existed_before(store):
    # a rebuild that equals an older dataset must become the newest again (a run once loaded a
    # later, broken build that had lost a project, because "newest" meant "created last")
    good = save_dataset(store, "train", [task("a", "p", diff(1, "x", "y")), task("b", "q", diff(1, "x", "w"))], {})
    broken = save_dataset(store, "train", [task("a", "p", diff(1, "x", "y"))], {})
    assert latest_hash(store, "train") == broken.hash
    assert save_dataset(store, "train", [task("b", "q", diff(1, "x", "w")), task("a", "p", diff(1, "x", "y"))],
                        {}) == good
    assert latest_hash(store, "train") == good.hash
    assert [r.hash for r in list_datasets(store, "train")] == [good.hash, broken.hash]  # the listing is unchanged


def test_a_run_keeps_the_dataset_it_started_with(store, caplog):
    from training.data import pinned_dataset
    from training.run import RunContext

    first = save_dataset(store, "train", [task("a", "p", diff(1, "x", "y"))], {})
    ctx = RunContext(cfg=None, store=store, run_id="r1")
    assert pinned_dataset(ctx, "train", "train") == first.hash
    second = save_dataset(store, "train", [task("b", "p", diff(1, "x", "w"))], {})
    assert latest_hash(store, "train") == second.hash
    assert pinned_dataset(ctx, "train", "train") == first.hash  # resumed: still the first
    assert "keeps its train dataset" in caplog.text
    assert pinned_dataset(RunContext(cfg=None, store=store, run_id="r2"), "train", "train") == second.hash
