"""The real PyPI projects tasks are synthesised from, pinned, and split by PROJECT.

Chosen for: an sdist that ships its pytest suite, a pure-Python build, few test dependencies,
and a suite that runs in seconds (synthesis runs the affected tests for every candidate bug).
Train and eval never share a project, so eval measures transfer to unseen code, not memory of
the same functions. Each entry was built and its suite run on this kind of machine
(`docker build --network host`, then the suite with `--network none`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from environments.images import EnvSpec

PYTEST = "pytest==9.2.0"
# -o addopts= drops projects' own options (coverage, doctest-modules, -x) that are not ours to
# keep: doctests would turn library modules into test files, coverage plugins are not installed.
BASE_PYTEST = "python -m pytest -rA -p no:cacheprovider -o addopts="


@dataclass(frozen=True)
class Project:
    name: str  # distribution name on PyPI
    version: str
    split: str  # "train" | "eval"
    test_paths: tuple[str, ...] = ("tests",)
    pip: tuple[str, ...] = ()  # pinned test dependencies (pytest is always added)
    pytest_args: str = ""  # e.g. "-m 'not slow'"
    install: str = "pip install --no-deps -e ."
    env: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def key(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def pytest_cmd(self) -> str:
        """The runner without targets: synthesis appends the tests it selects."""
        return f"{BASE_PYTEST} {self.pytest_args}".strip()

    @property
    def test_cmd(self) -> str:
        """What grading runs: the whole kept suite, with short tracebacks."""
        return f"{self.pytest_cmd} --tb=short " + " ".join(shlex.quote(p) for p in self.test_paths)

    def env_spec(self) -> EnvSpec:
        return EnvSpec(name=self.name, version=self.version, pip=[PYTEST, *self.pip],
                       install=self.install, env=dict(self.env))


DEFAULT_PROJECTS: tuple[Project, ...] = (
    # ---- train
    Project("boltons", "26.2.0", "train"),
    Project("cachetools", "8.0.2", "train"),
    Project("funcy", "2.1", "train", pip=("whatever==0.7",)),
    Project("inflection", "0.5.1", "train", test_paths=("test_inflection.py",)),
    Project("isodate", "0.7.2", "train", env={"SETUPTOOLS_SCM_PRETEND_VERSION": "0.7.2"}),
    Project("parse", "1.22.4", "train"),
    Project("python-slugify", "9.2.0", "train", pip=("text-unidecode==1.3",)),
    Project("schema", "0.7.8", "train", test_paths=("test_schema.py",)),
    Project("semver", "3.1.2", "train", env={"SETUPTOOLS_SCM_PRETEND_VERSION": "3.1.2"}),
    Project("sqlparse", "0.6.1", "train"),
    Project("tabulate", "0.9.0", "train", test_paths=("test",), pip=("wcwidth==0.2.13",),
            env={"SETUPTOOLS_SCM_PRETEND_VERSION": "0.9.0"}),
    Project("toolz", "1.0.0", "train", test_paths=("toolz/tests",)),
    # ---- eval
    Project("glom", "25.12.0", "eval", test_paths=("glom/test",),
            pip=("attrs==24.2.0", "boltons==24.1.0", "face==24.0.0", "pyyaml==6.0.1")),
    Project("itsdangerous", "2.2.0", "eval", pip=("freezegun==1.5.5",)),
    Project("marshmallow", "4.4.0", "eval", pip=("simplejson==4.3.0", "tzdata==2026.6")),
    Project("xmltodict", "1.0.4", "eval"),
)


def by_key(projects: tuple[Project, ...] = DEFAULT_PROJECTS) -> dict[str, Project]:
    return {p.key: p for p in projects}


def resolve(keys: list[str], split: str, known: tuple[Project, ...] = DEFAULT_PROJECTS) -> list[Project]:
    """Projects for "name==version" keys (config `data.projects_train` / `projects_eval`).

    A key that is not in the default list still works with default settings (tests/ + pytest),
    so a user can try a new project without editing this file.
    """
    table = by_key(known)
    out = []
    for key in keys:
        if "==" not in key:
            raise ValueError(f"project {key!r}: expected name==version")
        p = table.get(key)
        if p is None:
            name, version = key.split("==", 1)
            p = Project(name.strip(), version.strip(), split)
        elif p.split != split:
            p = Project(p.name, p.version, split, p.test_paths, p.pip, p.pytest_args, p.install, dict(p.env))
        out.append(p)
    return out


def default_split(split: str) -> list[Project]:
    return [p for p in DEFAULT_PROJECTS if p.split == split]


def check_disjoint(train: list[Project], eval_: list[Project]) -> None:
    """Train and eval must not share a project (at any version)."""
    shared = {p.name.lower() for p in train} & {p.name.lower() for p in eval_}
    if shared:
        raise ValueError(f"projects in both train and eval: {sorted(shared)}")
