"""EnvSpec: how one project's environment image gets its source and installs it.

Its own module so that the recipe makers (`environments.swebench_specs`, curation) and the
image builder (`environments.images`) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from environments.base_image import DEFAULT_RELEASE


@dataclass
class EnvSpec:
    """How to get one project's source and install it with its test dependencies.

    - `source: pypi-sdist` (synthesised tasks, SWE-smith style, and the hand-made fixtures): the
      env image holds the pristine sdist as a one-commit repository; the instance applies
      `task.meta["bug_patch"]` on top (the gold `patch` reverts it) and commits the result.
      `task.base_commit` is the hash of that commit. Author, date and message are fixed, so the
      hash depends only on the tree: the build checks it and fails when the image does not
      reproduce the task (`instance_head(tag)` reads it back from a built image).
    - `source: <git URL>` or `mirror:<dir>` (dir of bare repos `owner__name.git`, for
      SWE-bench-like tasks): the env image holds the clone at `version` (a commit or tag,
      SWE-bench's `environment_setup_commit`) with dependencies installed; the instance checks
      out `task.base_commit`, re-runs `install`, then resets history.
    """

    name: str  # distribution name on PyPI (or a short name for git sources)
    version: str  # sdist version; for git sources the commit/tag of the environment
    source: str = "pypi-sdist"  # "pypi-sdist" | git URL | "mirror:<dir of owner__name.git>"
    repo: str = ""  # "owner/name", needed for mirror sources
    python: str = DEFAULT_RELEASE  # Debian release of the base: bullseye | bookworm | trixie
    pip: list[str] = field(default_factory=list)  # pinned requirements for the tests
    install: str = "pip install --no-deps -e ."
    env: dict[str, str] = field(default_factory=dict)  # build and run time, e.g. SCM versions

    @classmethod
    def from_dict(cls, d: Any) -> "EnvSpec":
        """A spec from its dict; a wrong one raises ValueError naming the key."""
        if not isinstance(d, dict):
            raise ValueError("env_spec: expected an object")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"env_spec: unknown keys {sorted(unknown)}")
        for name in ("name", "version"):
            if not isinstance(d.get(name), str) or not d[name]:
                raise ValueError(f"env_spec.{name}: expected a non-empty string")
        for name in ("source", "repo", "python", "install"):
            if name in d and not isinstance(d[name], str):
                raise ValueError(f"env_spec.{name}: expected a string")
        if not isinstance(d.get("pip", []), list) or not all(isinstance(x, str) for x in d.get("pip", [])):
            raise ValueError("env_spec.pip: expected a list of requirement strings")
        if not isinstance(d.get("env", {}), dict) or not all(isinstance(v, str) for v in d.get("env", {}).values()):
            raise ValueError("env_spec.env: expected an object of strings")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def kind(self) -> str:
        if self.source == "pypi-sdist":
            return "sdist"
        if self.source.startswith("mirror:"):
            return "mirror"
        return "git"

    @property
    def key(self) -> str:
        return f"{self.name}=={self.version}"
