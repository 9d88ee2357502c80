"""Imported splits (`data.*_import`): upstream rows through the paper's filters into the store,
reused while the spec is unchanged, a subset by instance id, and the configs that ask for them."""

import json

import pytest

from environments.curation import imported
from environments.curation.curate import CurationError
from environments.curation.dataset import dataset_manifest, load_dataset
from environments.curation.filters import FilterReport
from swerl.config import ConfigError, ImportSpec, load_config
from swerl.store import Store
from tests.unit.test_importers import swebench_record

pytestmark = pytest.mark.unit


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(swebench_record(i)) + "\n" for i in range(4)))
    return path


@pytest.fixture
def filtered(monkeypatch):
    """The filters keep every even-numbered task (the real ones run containers: integration)."""
    calls = []

    def fake(tasks, env_cfg, reruns=1, workers=2, progress=print):
        calls.append([t.instance_id for t in tasks])
        rep = FilterReport()
        for t in tasks:
            rep.kept.append(t) if int(t.instance_id[-1]) % 2 == 0 else rep.drop("validation", t, "gold fails")
        return rep

    monkeypatch.setattr(imported, "filter_tasks", fake)
    return calls


def _cfg(rows, tmp_path, **eval_spec):
    spec = {"source": "swe-bench", "path": str(rows)}
    return load_config("smoke", ["data.tasks_file=null", "data.eval_tasks_file=null",
                                 "data.train_dataset=rebench", "data.eval_dataset=verified",
                                 f"data.train_import={json.dumps(spec)}",
                                 f"data.eval_import={json.dumps({**spec, **eval_spec})}"])


def test_both_splits_are_imported_filtered_stored_and_then_reused(rows, tmp_path, filtered):
    store = Store(f"file://{tmp_path}/store")
    cfg = _cfg(rows, tmp_path)
    train, eval_, stats = imported.curate_imported(cfg, store, progress=lambda line: None)
    assert [t.instance_id for t in load_dataset(store, "rebench", train.hash)] == ["psf__requests-1000", "psf__requests-1002"]
    assert {t.split for t in load_dataset(store, "verified", eval_.hash)} == {"eval"}
    assert dataset_manifest(store, "rebench", train.hash)["config"]["filters"]["validation"] == 2
    assert stats["imported"] and len(filtered) == 2
    again = imported.curate_imported(cfg, store, progress=lambda line: None)
    assert (again[0].hash, again[1].hash) == (train.hash, eval_.hash) and len(filtered) == 2  # no new filtering


def test_a_subset_by_instance_id_and_an_id_the_rows_lack(rows, tmp_path, filtered):
    ids = tmp_path / "ids.txt"
    ids.write_text("# two of them\npsf__requests-1002\npsf__requests-1003  # dropped by the filter\npsf__requests-9999\n")
    report, kept = imported.import_and_filter(ImportSpec(source="swe-bench", path=str(rows), instance_ids_file=str(ids)),
                                              "eval", load_config("smoke").environment, progress=lambda line: None)
    assert filtered == [["psf__requests-1002", "psf__requests-1003"]]
    assert [t.instance_id for t in kept.kept] == ["psf__requests-1002"]
    assert any("psf__requests-9999" in e and "not in" in e for e in report.errors)


def test_an_import_that_keeps_nothing_is_a_curation_error(rows, tmp_path, monkeypatch):
    monkeypatch.setattr(imported, "filter_tasks", lambda tasks, *a, **k: FilterReport())
    with pytest.raises(CurationError, match="kept no task"):
        imported.curate_imported(_cfg(rows, tmp_path), Store(f"file://{tmp_path}/s"), progress=lambda line: None)


def test_imports_come_in_pairs_and_exclude_pins(rows):
    spec = json.dumps({"source": "swe-gym", "path": "x.jsonl"})
    with pytest.raises(ConfigError, match="go together"):
        load_config("smoke", [f"data.train_import={spec}"])
    with pytest.raises(ConfigError, match="exclude each other"):
        load_config("cpu-demo-1turn", [f"data.train_import={spec}", f"data.eval_import={spec}"])
    with pytest.raises(ConfigError):
        load_config("smoke", [f"data.train_import={json.dumps({'source': 'swe-rebench', 'path': 'x', 'colour': 1})}"])


def test_the_gpu_presets_train_on_swe_rebench_and_evaluate_on_verified():
    for name in ("gpu-7b", "paper-72b"):
        d = load_config(name).data
        assert (d.train_import.source, d.eval_import.source) == ("swe-rebench", "swe-bench-verified")
