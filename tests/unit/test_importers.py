import json

import pytest

from environments.base_image import release_for_python as debian_release
from environments.curation.importers import ImportSourceError, import_tasks, read_tasks
from environments.env_spec import EnvSpec
from environments.swebench_specs import recipe, swebench_specs
from environments.records import TaskInstance

pytestmark = pytest.mark.unit

TEST_PATCH = (
    "diff --git a/tests/test_requests.py b/tests/test_requests.py\n"
    "--- a/tests/test_requests.py\n+++ b/tests/test_requests.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
)


def swebench_record(i: int, **kw) -> dict:
    """A record in SWE-bench's own format (F2P/P2P as JSON-encoded strings, as on the hub)."""
    rec = {
        "instance_id": f"psf__requests-{1000 + i}",
        "repo": "psf/requests",
        "base_commit": "a" * 40,
        "patch": "diff --git a/requests/api.py b/requests/api.py\n",
        "test_patch": TEST_PATCH,
        "problem_statement": "requests.get fails",
        "hints_text": "",
        "created_at": "2014-01-01T00:00:00Z",
        "version": "2.0",
        "environment_setup_commit": "b" * 40,
        "FAIL_TO_PASS": json.dumps(["tests/test_requests.py::test_y"]),
        "PASS_TO_PASS": json.dumps(["tests/test_requests.py::test_x"]),
    }
    rec.update(kw)
    return rec


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "swe-bench.jsonl"
    lines = [json.dumps(swebench_record(1)), "{not json", json.dumps(swebench_record(2)),
             json.dumps({k: v for k, v in swebench_record(3).items() if k != "base_commit"}),
             json.dumps(swebench_record(4, FAIL_TO_PASS="[1, 2]"))]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_lines_are_reported_by_line_and_field_and_the_rest_loads(jsonl):
    report = import_tasks(str(jsonl), "swe-bench")
    assert [t.instance_id for t in report.tasks] == ["psf__requests-1001", "psf__requests-1002"]
    assert len(report.errors) == 3
    assert report.errors[0].startswith(f"{jsonl}:2: invalid JSON")
    assert report.errors[1] == f"{jsonl}:4: field base_commit: missing"
    assert report.errors[2].startswith(f"{jsonl}:5: field FAIL_TO_PASS")


def test_swebench_repo_gets_the_swebench_install_spec(jsonl):
    task = import_tasks(str(jsonl), "swe-bench-verified").tasks[0]
    spec = EnvSpec.from_dict(task.meta["env_spec"])
    upstream = swebench_specs("psf/requests", "2.0")
    assert upstream is not None
    assert spec.install.endswith(upstream["install"])
    assert spec.source == "https://github.com/psf/requests.git" and spec.repo == "psf/requests"
    assert spec.version == "b" * 40  # the environment_setup_commit
    assert spec.python == debian_release(upstream["python"])
    assert task.test_cmd == f"{upstream['test_cmd']} tests/test_requests.py"
    assert task.log_parser == "swebench"
    assert task.FAIL_TO_PASS == ["tests/test_requests.py::test_y"]
    assert task.source == "swe-bench-verified" and task.split == "eval"
    assert task.meta["env_recipe"]["origin"] == "swebench"


def test_install_config_of_swe_rebench_wins_and_unknown_repos_get_a_flagged_generic_recipe():
    rebench = TaskInstance.from_dict(swebench_record(1, repo="foo/bar", version="0.1", install_config={
        "python": "3.12", "install": "pip install -e .[test]", "test_cmd": "pytest -rA -x",
        "pip_packages": ["hypothesis==6.0"], "pre_install": ["echo hi"]}))
    spec, notes, cmd, parser = recipe(rebench)
    assert (spec.install, spec.pip, spec.python) == ("echo hi && pip install -e .[test]", ["hypothesis==6.0"], "trixie")
    assert cmd == "pytest -rA -x tests/test_requests.py" and parser == "pytest" and notes["origin"] == "install_config"
    generic = TaskInstance.from_dict(swebench_record(1, repo="foo/bar", version="0.1"))
    spec, notes, cmd, parser = recipe(generic, repo_mirror="/mirrors")
    assert notes["generic"] and spec.install == "pip install -e ." and parser == "pytest"
    assert spec.source == "mirror:/mirrors" and spec.name == "foo__bar"


def test_mirror_must_hold_the_repository(tmp_path, jsonl):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    report = import_tasks(str(jsonl), "swe-gym", repo_mirror=str(mirror))
    assert report.tasks == [] and any("not in the mirror" in e for e in report.errors)
    (mirror / "psf__requests.git").mkdir()
    report = import_tasks(str(jsonl), "swe-gym", repo_mirror=str(mirror))
    assert len(report.tasks) == 2 and report.tasks[0].split == "train"
    with pytest.raises(ImportSourceError):
        import_tasks(str(jsonl), "swe-gym", repo_mirror=str(tmp_path / "nope"))


def test_json_and_parquet_files(tmp_path):
    recs = [swebench_record(1), {"instance_id": "x"}]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(recs))
    report = read_tasks(str(path))
    assert len(report.tasks) == 1 and report.errors == [f"{path}:record 2: field repo: missing"]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    ppath = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist([swebench_record(1), swebench_record(2)]), ppath)
    report = import_tasks(str(ppath), "swe-rebench")
    assert [t.instance_id for t in report.tasks] == ["psf__requests-1001", "psf__requests-1002"]


def test_hub_path_through_datasets_on_local_files(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(swebench_record(i)) for i in (1, 2)) + "\n")
    report = import_tasks("json", "swe-bench-lite", data_files=str(path))
    assert [t.instance_id for t in report.tasks] == ["psf__requests-1001", "psf__requests-1002"]
    assert report.tasks[0].meta["env_spec"]["repo"] == "psf/requests"


def test_unknown_inputs_fail_clearly(tmp_path):
    with pytest.raises(ValueError):
        import_tasks("x.jsonl", "swe-banana")
    with pytest.raises(ImportSourceError):
        read_tasks(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "tasks.csv"
    bad.write_text("a,b\n")
    with pytest.raises(ImportSourceError):
        read_tasks(str(bad))


def test_debian_release_for_python_versions():
    from environments.base_image import ImageBuildError

    assert [debian_release(v) for v in ("3.5", "3.6", "3.9", "3.10", "3.11", "3.12", "3.13", "trixie")] == \
        ["bullseye", "bullseye", "bullseye", "bookworm", "bookworm", "trixie", "trixie", "trixie"]
    with pytest.raises(ImageBuildError, match="not a Python version"):
        debian_release("x")


def test_a_spec_for_a_python_no_release_ships_records_the_substitution(tmp_path):
    """swebench's own spec for requests 0.13 asks for Python 3.9 (shipped: no note); one of
    pydicom's asks for 3.6, built on bullseye's 3.9, and the record says so."""
    path = tmp_path / "t.jsonl"
    rows = [swebench_record(1, version="0.13"),
            swebench_record(2, repo="pydicom/pydicom", instance_id="pydicom__pydicom-2", version="1.2")]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    shipped, substituted = import_tasks(str(path), "swe-bench").tasks
    assert swebench_specs("psf/requests", "0.13")["python"] == "3.9" and "python_substitution" not in shipped.meta
    wanted = swebench_specs("pydicom/pydicom", "1.2")["python"]
    assert wanted == "3.6"
    assert substituted.meta["python_substitution"] == {"wanted": "3.6", "built_with": "3.9", "release": "bullseye"}
    assert substituted.meta["env_spec"]["python"] == "bullseye"


def test_unpack_mirror_makes_a_repo_mirror_from_archives_and_refuses_a_directory_without_any(tmp_path):
    import subprocess
    import tarfile

    from environments.curation.importers import unpack_mirror

    bare = tmp_path / "src" / "o__r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    archives = tmp_path / "archives"
    archives.mkdir()
    with tarfile.open(archives / "o__r.git.tar.gz", "w:gz") as tf:
        tf.add(bare, arcname="o__r.git")
    root = unpack_mirror(archives, tmp_path / "mirror")
    assert (root / "o__r.git" / "HEAD").is_file()
    with pytest.raises(ImportSourceError, match="no owner__name.git.tar.gz repository archives"):
        unpack_mirror(tmp_path / "src", tmp_path / "m2")


def test_swebench_specs_get_the_pytest_their_rows_were_validated_on():
    from environments.swebench_specs import era_pytest

    assert era_pytest("pydicom/pydicom", ["numpy", "pytest"]) == (["numpy", "pytest<8"], True)
    assert era_pytest("pallets/flask", ["Werkzeug==2.3.7"]) == (["Werkzeug==2.3.7", "pytest<8"], True)
    assert era_pytest("o/r", ["pytest==7.4.0", "pytest-cov"]) == (["pytest==7.4.0", "pytest-cov"], False)
    assert era_pytest("pytest-dev/pytest", ["py==1.11.0"]) == (["py==1.11.0"], False)
