"""Environment recipes for SWE-bench-style tasks, taken from the `swebench` package as it gives
them (4.x ships `MAP_REPO_VERSION_TO_SPECS`: python, packages, pip_packages, pre_install,
install, test_cmd, eval_commands), and the prebuilt images the datasets publish.

A spec names the Python it wants; the base images offer the Pythons Debian releases ship
(`environments.base_image.RELEASES`), so a spec for another one is built on the nearest and the
recipe notes the substitution (`python_substitution` in the task's meta): such a task is only
kept when validation passes on it.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from environments.base_image import RELEASES, release_for_python
from environments.env_spec import EnvSpec
from environments.records import TaskInstance

SWEBENCH_IMAGE = "swebench/sweb.eval.x86_64.{id}:latest"  # the official per-instance images
UPSTREAM_IMAGE_FIELDS = ("docker_image", "image_name")  # SWE-rebench / SWE-Gym rows


def swebench_specs(repo: str, version: str) -> dict[str, Any] | None:
    """SWE-bench's install spec for a repo at a version, or None when it has none."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    return MAP_REPO_VERSION_TO_SPECS.get(repo, {}).get(version)


def test_directives(task: TaskInstance) -> list[str]:
    """Test files the test patch touches: SWE-bench's own rule, so we run what its harness runs."""
    from swebench.harness.test_spec.python import get_test_directives

    return get_test_directives({"repo": task.repo, "test_patch": task.test_patch})


def prebuilt_images(task: TaskInstance, source: str) -> list[str]:
    """The images a dataset publishes for this task, best first: the row's own image field
    (SWE-rebench, SWE-Gym), then SWE-bench's `sweb.eval.x86_64.<id>` (with its `__` -> `_1776_`
    naming rule) for SWE-bench sources."""
    upstream = task.meta.get("upstream", {})
    found = [upstream[k] for k in UPSTREAM_IMAGE_FIELDS if isinstance(upstream.get(k), str) and upstream[k]]
    if source.startswith("swe-bench"):
        found.append(SWEBENCH_IMAGE.format(id=task.instance_id.replace("__", "_1776_").lower()))
    return list(dict.fromkeys(found))


def _pip_list(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def python_substitution(wanted: str) -> dict[str, str] | None:
    """{wanted, built_with, release} when no base image ships the spec's Python, else None."""
    if not wanted:
        return None
    release = release_for_python(wanted)
    if RELEASES[release] == wanted or wanted == release:
        return None
    return {"wanted": wanted, "built_with": RELEASES[release], "release": release}


def upstream_spec(task: TaskInstance) -> tuple[dict[str, Any], str]:
    """(the raw install spec, where it came from): the record's own `install_config` (SWE-rebench
    ships one per task), the `swebench` package's spec for the repo and version, or a generic one."""
    upstream = task.meta.get("upstream", {})
    if isinstance(upstream.get("install_config"), dict):
        return dict(upstream["install_config"]), "install_config"
    spec = swebench_specs(task.repo, task.version)
    if spec:
        return dict(spec), "swebench"
    return {"install": "pip install -e .", "test_cmd": "pytest -rA"}, "generic"


def _install_steps(spec: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(pip requirements, install steps, notes) of a raw spec."""
    pip = _pip_list(spec.get("pip_packages"))
    packages = spec.get("packages", "")
    notes: dict[str, Any] = {}
    if isinstance(packages, str) and packages and packages not in ("requirements.txt", "environment.yml"):
        pip += shlex.split(packages)  # conda package names; most have the same name on PyPI
    elif packages:
        notes["packages"] = packages  # installed from the repository's own file by `install`
    steps = [*(spec.get("pre_install") or []), spec.get("install") or "pip install -e ."]
    if packages == "requirements.txt":
        steps.insert(0, "if [ -f requirements.txt ]; then pip install -r requirements.txt; fi")
    return pip, steps, notes


ERA_PYTEST = "pytest<8"
_NAMES_PYTEST = re.compile(r"pytest\s*([<>=!~\[;]|$)")


def era_pytest(repo: str, pip: list[str]) -> tuple[list[str], bool]:
    """(pip, changed): swebench's specs name pytest bare or not at all, and their rows were
    validated on pytest 7 (SWE-bench was collected in 2023); pytest 8 (2024) removed what those
    suites use (nose-style `setup` methods, `monkeypatch.notset`), so a bare or missing pytest
    becomes `pytest<8`. A pinned pytest stays, and pytest's own repo installs itself."""
    if repo == "pytest-dev/pytest":
        return pip, False
    out = [ERA_PYTEST if p.strip() == "pytest" else p for p in pip]
    if not any(_NAMES_PYTEST.match(p) for p in out):
        out.append(ERA_PYTEST)
    return out, out != pip


def recipe(task: TaskInstance, repo_mirror: str | None = None) -> tuple[EnvSpec, dict[str, Any], str, str]:
    """(EnvSpec, recipe notes, test_cmd, log_parser) for an upstream task. The notes say where
    the spec came from (`origin`: install_config | swebench | generic), the Python it asked for
    and, where no base has that Python, the substitution made."""
    spec, origin = upstream_spec(task)
    pip, steps, notes = _install_steps(spec)
    if origin == "swebench":
        pip, changed = era_pytest(task.repo, pip)
        if changed:
            notes["pytest"] = ERA_PYTEST
    wanted = str(spec.get("python", "") or "")
    notes.update({"origin": origin, "python": wanted, "generic": origin == "generic"})
    sub = python_substitution(wanted)
    if sub:
        notes["python_substitution"] = sub
    test_cmd = spec.get("test_cmd") or "pytest -rA"
    if isinstance(test_cmd, list):
        test_cmd = " && ".join(test_cmd)
    eval_commands = [c for c in (spec.get("eval_commands") or []) if isinstance(c, str)]
    directives = test_directives(task)
    full_cmd = " && ".join([*eval_commands,
                            f"{test_cmd} {' '.join(shlex.quote(d) for d in directives)}".strip()])
    source = f"mirror:{repo_mirror}" if repo_mirror else f"https://github.com/{task.repo}.git"
    env_spec = EnvSpec(
        name=task.repo.replace("/", "__"),
        version=task.environment_setup_commit or task.base_commit,
        source=source,
        repo=task.repo,
        python=release_for_python(wanted) if wanted else "bookworm",
        pip=pip,
        install=" && ".join(steps),
        env={k: str(v) for k, v in (spec.get("env_vars") or {}).items()},
    )
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    parser = "swebench" if task.repo in MAP_REPO_TO_PARSER and origin != "generic" else "pytest"
    return env_spec, notes, full_cmd, parser
