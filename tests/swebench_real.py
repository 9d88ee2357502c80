"""The shipped real SWE-bench instances (tests/data/swebench_real), loaded as a run would load
them: each repository's bare git archive unpacked into a mirror, then the rows imported with
swebench's spec for their repo and version (tests/integration/test_real_swebench.py,
tests/integration/test_reward_hacks.py)."""

from __future__ import annotations

from pathlib import Path

from environments.curation.importers import import_tasks
from environments.curation.importers import unpack_mirror as _unpack
from environments.records import TaskInstance

DATA = Path(__file__).resolve().parent / "data" / "swebench_real"
MARSHMALLOW_ID = "marshmallow-code__marshmallow-1343"


def unpack_mirror(root: Path) -> Path:
    """Every shipped repository archive unpacked under `root`: the mirror the import clones from."""
    return _unpack(DATA, root)


def import_real(mirror: Path) -> dict[str, TaskInstance]:
    """The shipped rows by instance id, imported from `mirror`; any import error fails loudly."""
    report = import_tasks(str(DATA / "instances.jsonl"), "swe-bench-verified", repo_mirror=str(mirror))
    assert report.errors == [], report.errors
    return {t.instance_id: t for t in report.tasks}
