"""Task images in three layers, as in SWE-bench: base -> environment -> instance.

- base (`environments.base_image`): Debian + python + git + pytest + the non-root user `swerl`.
- environment (`swerl-env.<name>:<hash>`): one project at one version under `/testbed` with its
  test dependencies (from PyPI, at build time only; the containers never have a network).
- instance (`swerl-inst.<instance_id>:<hash>`): the repository in the task's starting state,
  with git history reset to ONE commit (fixed author and date), so the agent cannot read the
  fix from `git log`. Where the code comes from: `task.meta["env_spec"]` (see `EnvSpec`).

Tags are content hashes of everything that went in, so asking again is a cache hit (nothing
that exists is rebuilt) and a change anywhere gives a new tag instead of a stale image.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from environments.base_image import (
    DEFAULT_RELEASE, RELEASES, ImageBuildError, Progress, ensure_base_image, image_id, run_build_tool,
)
from environments.env_spec import EnvSpec
from environments.records import TaskInstance
from environments.swebench_specs import prebuilt_images, recipe, swebench_specs
from swerl.paths import swerl_home

PULL_TIMEOUT_S = 120.0  # a registry that answers at all answers well within this
GIT_DATE = "2000-01-01T00:00:00+0000"

# Build-time only (ARG, not ENV): pip trusts the host's CA bundle while the image is built.
BUILD_CA_LINES = [
    "COPY build-ca.crt /etc/swerl-build-ca.crt",
    "ARG PIP_CERT=/etc/swerl-build-ca.crt",
]

# Upstream (SWE-bench-style) environments get their own venv, as SWE-bench's get a conda env:
# their specs pin versions of what Debian installed (pytest, pluggy), which pip cannot replace in
# the system site; and their `test_cmd` calls `pytest`. setuptools stays below 70: old repos
# still import pkg_resources and install with `setup.py develop`. pip stays below 25.3, the last
# that falls back to `setup.py develop` for `pip install -e .` when a repo pins a build backend
# older than PEP 660 (astroid 2.12-2.14 pin setuptools~=62.6), as SWE-bench's envs do.
TESTBED_VENV = [
    "RUN python3 -m venv /opt/testbed && /opt/testbed/bin/pip install -q --upgrade 'pip<25.3' 'setuptools<70' wheel",
    "ENV PATH=/opt/testbed/bin:$PATH VIRTUAL_ENV=/opt/testbed",
]
TESTBED_PYTEST = "RUN python -m pytest --version >/dev/null 2>&1 || pip install -q pytest"

# Build and cache files that must never show up in the agent's diff nor in the base commit.
GIT_EXCLUDE = ("*.egg-info/", "__pycache__/", "*.py[co]", ".pytest_cache/", ".eggs/")

CLEAN_BYTECODE = (
    "find /testbed -name __pycache__ -type d -prune -exec rm -rf {} + "
    "&& find /testbed -name '*.py[co]' -delete"
)

# One commit, fixed identity and date: the hash depends on the tree alone.
RESET_HISTORY = (
    "rm -rf /testbed/.git && git init -q /testbed "
    "&& printf '%s\\n' " + " ".join(shlex.quote(p) for p in GIT_EXCLUDE) + " > /testbed/.git/info/exclude "
    "&& git -C /testbed add -A "
    f"&& GIT_AUTHOR_DATE={GIT_DATE} GIT_COMMITTER_DATE={GIT_DATE} "
    "git -C /testbed -c user.name=swerl -c user.email=swerl@localhost -c commit.gpgsign=false "
    "commit -q --allow-empty -m base"
)


def env_spec_of(task: TaskInstance) -> EnvSpec:
    """The task's environment recipe: `meta.env_spec`, or for a plain SWE-bench row (no
    env_spec) the one the `swebench` package's spec for its repo and version gives."""
    spec = task.meta.get("env_spec")
    if spec is None:
        raise ImageBuildError(f"no meta.env_spec, and swebench has no spec for {task.repo} {task.version or '(no version)'}"
                              "; import the task with `swerl curate import` or give it an env_spec")
    try:
        return EnvSpec.from_dict(spec)
    except (ValueError, TypeError) as e:
        raise ImageBuildError(f"meta.{e}") from None


def _docker_name(text: str) -> str:
    """A valid docker repository component: lowercase alphanumerics and single separators."""

    def sep(m: re.Match[str]) -> str:
        return m.group() if re.fullmatch(r"[._]|__|-+", m.group()) else "-"

    name = re.sub(r"[^a-z0-9]+", sep, text.lower()).strip("._-")
    return name or "x"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:12]


def _require_image(ref: str) -> str:
    iid = image_id(ref)
    if iid is None:
        raise ImageBuildError(f"image {ref} does not exist")
    return iid


def host_ca_bundle() -> Path:
    """The CA bundle the host's own pip trusts (TLS-intercepting proxies need theirs in builds)."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return Path(os.environ[var])
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    if system.is_file():
        return system
    import certifi  # shipped with requests, which the docker SDK needs anyway

    return Path(certifi.where())


def _docker_build(tag: str, dockerfile: str, context: Path, progress: Progress) -> None:
    """`docker build` with PyPI reachable; the host CA bundle goes in the context, not the hash."""
    (context / "Dockerfile").write_text(dockerfile)
    shutil.copyfile(host_ca_bundle(), context / "build-ca.crt")
    cmd = ["docker", "build", "--network", "host", "--force-rm", "--label", "swerl=1",
           "-t", tag, str(context)]
    run_build_tool(cmd, lambda line: progress(f"[{tag}] {line}"))


# ---------------------------------------------------------------- sources, fetched on the host

def fetch_sdist(name: str, version: str, progress: Progress = print) -> Path:
    """The sdist archive of `name==version`, downloaded once into the machine-wide cache."""
    cache = swerl_home() / "sdists" / f"{_docker_name(name)}-{version}"
    found = [p for p in cache.glob("*") if p.suffix in (".gz", ".zip", ".bz2")] if cache.exists() else []
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=swerl_home()) as tmp:
        progress(f"downloading sdist {name}=={version}")
        out = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"{name}=={version}", "-d", tmp],
            capture_output=True, text=True,
        )
        files = list(Path(tmp).iterdir())
        if out.returncode != 0 or len(files) != 1:
            raise ImageBuildError(f"pip download {name}=={version} failed:\n{out.stderr[-2000:]}")
        cache.mkdir(parents=True, exist_ok=True)
        return Path(shutil.move(str(files[0]), cache / files[0].name))


def unpack_sdist(archive: Path, dest: Path) -> None:
    """Unpack an sdist into `dest` without its top-level `name-version/` directory."""
    with tempfile.TemporaryDirectory() as tmp:
        if archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(tmp, filter="data")
        tops = list(Path(tmp).iterdir())
        root = tops[0] if len(tops) == 1 and tops[0].is_dir() else Path(tmp)
        shutil.copytree(root, dest, symlinks=True)


def _clone(spec: EnvSpec, dest: Path, progress: Progress) -> None:
    if spec.kind == "mirror":
        if not spec.repo:
            raise ImageBuildError(f"{spec.key}: a mirror source needs `repo` (owner/name)")
        url = str(Path(spec.source[len("mirror:"):]) / (spec.repo.replace("/", "__") + ".git"))
    else:
        url = spec.source
    progress(f"cloning {url}")
    out = subprocess.run(["git", "clone", "--quiet", url, str(dest)], capture_output=True, text=True)
    if out.returncode != 0:
        raise ImageBuildError(f"git clone {url} failed:\n{out.stderr[-2000:]}")


# ---------------------------------------------------------------- environment layer

def env_dockerfile(spec: EnvSpec, base: str) -> str:
    lines = [
        f"FROM {base}",
        "USER root",
        "ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore",
        *BUILD_CA_LINES,
    ]
    if spec.env:
        lines.append("ENV " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())))
    lines += [
        "RUN command -v python >/dev/null || ln -s /usr/bin/python3 /usr/local/bin/python",
        "COPY src/ /testbed/",
        "WORKDIR /testbed",
    ]
    if spec.kind != "sdist":
        lines += TESTBED_VENV
        lines.append(f"RUN git checkout -q -f {shlex.quote(spec.version)}")
    if spec.pip:
        lines.append("RUN pip install " + " ".join(shlex.quote(r) for r in spec.pip))
    lines.append(f"RUN {spec.install}")
    if spec.kind != "sdist":
        lines.append(TESTBED_PYTEST)
    if spec.kind == "sdist":  # a clean one-commit repo: synthesis works on this image directly
        lines.append(f"RUN {CLEAN_BYTECODE} && {RESET_HISTORY}")
    lines += ["RUN chown -R swerl:swerl /testbed", "USER swerl", ""]
    return "\n".join(lines)


def _spec_id(spec: EnvSpec) -> str:
    """What decides an env image's content. A git source is its repository and commit, not the
    place it was cloned from: the same commit from GitHub or from any mirror directory is the
    same image (a mirror unpacked in a fresh temp dir is still a cache hit)."""
    d = spec.to_dict()
    if spec.kind != "sdist" and spec.repo:
        d["source"] = f"git:{spec.repo}"
    return json.dumps(d, sort_keys=True)


def env_tag(spec: EnvSpec, base: str) -> str:
    digest = _digest(_spec_id(spec), env_dockerfile(spec, base), _require_image(base))
    return f"swerl-env.{_docker_name(spec.name)}:{digest}"


def build_env_image(spec: EnvSpec, base: str, progress: Progress = print) -> str:
    """The environment image of `spec` on top of `base`; a cache hit when its tag exists."""
    tag = env_tag(spec, base)
    if image_id(tag):
        return tag
    progress(f"building {tag} ({spec.key})")
    with tempfile.TemporaryDirectory(dir=swerl_home()) as tmp:
        ctx = Path(tmp)
        if spec.kind == "sdist":
            unpack_sdist(fetch_sdist(spec.name, spec.version, progress), ctx / "src")
        else:
            _clone(spec, ctx / "src", progress)
        _docker_build(tag, env_dockerfile(spec, base), ctx, progress)
    return tag


# ---------------------------------------------------------------- instance layer

def instance_dockerfile(task: TaskInstance, spec: EnvSpec, env_image: str) -> str:
    steps = ["cd /testbed"]
    if spec.kind == "sdist":
        if task.meta.get("bug_patch"):
            steps += ["git apply --whitespace=nowarn /tmp/swerl-bug.patch", "rm /tmp/swerl-bug.patch"]
    else:
        steps += [f"git checkout -q -f {shlex.quote(task.base_commit)}", "git clean -fdq", spec.install]
    steps += [CLEAN_BYTECODE, RESET_HISTORY, "chown -R swerl:swerl /testbed"]
    if spec.kind == "sdist" and re.fullmatch(r"[0-9a-f]{40}", task.base_commit):
        steps.append(
            f'( test "$(git rev-parse HEAD)" = {task.base_commit} '
            f'|| {{ echo "base_commit mismatch: built $(git rev-parse HEAD), task says {task.base_commit}"; exit 1; }} )'
        )
    lines = [f"FROM {env_image}", "USER root", *BUILD_CA_LINES]
    if spec.kind == "sdist" and task.meta.get("bug_patch"):
        lines.append("COPY bug.patch /tmp/swerl-bug.patch")
    lines += ["RUN " + " \\\n && ".join(steps), "USER swerl", "WORKDIR /testbed", ""]
    return "\n".join(lines)


def instance_tag(task: TaskInstance, env_image: str) -> str:
    spec = env_spec_of(task)
    dockerfile = instance_dockerfile(task, spec, env_image)
    digest = _digest(dockerfile, _require_image(env_image), task.meta.get("bug_patch", ""))
    return f"swerl-inst.{_docker_name(task.instance_id)}:{digest}"


def build_instance_image(task: TaskInstance, env_image: str, progress: Progress = print) -> str:
    """The image a task's episodes and grading start from; a cache hit when its tag exists."""
    tag = instance_tag(task, env_image)
    if image_id(tag):
        return tag
    progress(f"building {tag}")
    with tempfile.TemporaryDirectory(dir=swerl_home()) as tmp:
        ctx = Path(tmp)
        if task.meta.get("bug_patch"):
            (ctx / "bug.patch").write_text(task.meta["bug_patch"])
        _docker_build(tag, instance_dockerfile(task, env_spec_of(task), env_image), ctx, progress)
    return tag


def instance_head(tag: str) -> str:
    """The single commit of an instance image: what a synthesised task records as base_commit."""
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--label", "swerl=1", tag,
         "git", "-C", "/testbed", "rev-parse", "HEAD"],
        capture_output=True, text=True,
    )
    if out.returncode != 0:
        raise ImageBuildError(f"cannot read HEAD of {tag}: {out.stderr.strip()}")
    return out.stdout.strip()


# ---------------------------------------------------------------- all of a dataset

def base_for(spec: EnvSpec, progress: Progress = print) -> str:
    """The base image of the spec's Debian release (`spec.python`)."""
    if spec.python not in RELEASES:
        raise ImageBuildError(f"{spec.key}: python={spec.python!r} is not a Debian release ({', '.join(RELEASES)})")
    return ensure_base_image(progress, release=spec.python)


# ---------------------------------------------------------------- prebuilt images

PREBUILT_LAYER = """\
FROM {ref}
USER root
RUN (id -u 1000 >/dev/null 2>&1 || useradd --create-home --uid 1000 --shell /bin/bash swerl) \\
 && git config --system --add safe.directory '*' \\
 && cd /testbed && {clean} && {reset} && chown -R 1000:1000 /testbed
ENV PATH=/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:$PATH HOME=/home/swerl LANG=C.UTF-8
USER 1000
WORKDIR /testbed
"""


@dataclass
class Puller:
    """Pulls a dataset's prebuilt images. After a registry fails once with a network error
    (none reachable, as on offline machines) it tries no more: one log line, no waits per task."""

    enabled: bool = True
    timeout_s: float = PULL_TIMEOUT_S
    unreachable: str = ""

    def get(self, ref: str, progress: Progress) -> str | None:
        """`ref` when it is here or could be pulled, else None (and the reason is logged)."""
        if image_id(ref):
            return ref
        if not self.enabled or self.unreachable:
            return None
        try:
            out = subprocess.run(["docker", "pull", "--quiet", ref], capture_output=True, text=True,
                                 timeout=self.timeout_s)
            why = out.stderr.strip().splitlines()[-1] if out.returncode else ""
        except subprocess.TimeoutExpired:
            why = f"no answer in {self.timeout_s:g} s"
        if not why:
            return ref
        if any(k in why for k in ("dial tcp", "no such host", "no answer", "connection refused", "i/o timeout")):
            self.unreachable = why
            progress(f"prebuilt images: registry not reachable ({why}); building every image offline from its spec")
        else:
            progress(f"prebuilt image {ref} not available ({why}); building offline from its spec")
        return None


def adapt_prebuilt(ref: str, progress: Progress = print) -> str:
    """Our instance layer on a dataset's prebuilt image: the non-root user, one-commit history
    (the agent cannot read the fix from `git log`), its conda env first on PATH."""
    dockerfile = PREBUILT_LAYER.format(ref=ref, clean=CLEAN_BYTECODE, reset=RESET_HISTORY)
    tag = f"swerl-pre.{_docker_name(ref.split('/')[-1].split(':')[0])}:{_digest(dockerfile, _require_image(ref))}"
    if not image_id(tag):
        progress(f"building {tag} on prebuilt {ref}")
        run_build_tool(["docker", "build", "--label", "swerl=1", "-t", tag, "-"], progress, stdin=dockerfile)
    return tag


# ---------------------------------------------------------------- all of a dataset


@dataclass
class ImageSet:
    """What `build_images` made: an image per task that has one, a reason per task that has not,
    and how each image came (`prebuilt <ref>` or `built`)."""

    images: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    routes: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # the failing tool's output tail

    def fail(self, iid: str, e: Exception) -> None:
        self.errors[iid] = f"no image: {_first_line(e)}"
        self.details[iid] = str(e)


def _prebuilt(tasks: list[TaskInstance], puller: Puller, out: ImageSet, progress: Progress) -> None:
    for t in tasks:
        for ref in prebuilt_images(t, t.source or ("swe-bench" if swebench_specs(t.repo, t.version) else "")):
            if puller.get(ref, progress):
                try:
                    out.images[t.instance_id] = adapt_prebuilt(ref, progress)
                    out.routes[t.instance_id] = f"prebuilt {ref}"
                    break
                except ImageBuildError as e:
                    progress(f"{t.instance_id}: prebuilt {ref} unusable ({str(e).splitlines()[0]}); trying the next way")


def _first_line(e: Exception) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()]
    tail = f" ... {lines[-1].strip()}" if len(lines) > 1 else ""
    return f"{lines[0] if lines else type(e).__name__}{tail}"[:600]


def build_images(tasks: list[TaskInstance], progress: Progress = print, workers: int = 1,
                 pull: bool = True) -> ImageSet:
    """An image for every task that can get one, in this order: the dataset's prebuilt image
    (here, or pulled), else an offline build from the task's spec (base -> env -> instance, each
    layer cached by content hash). A task that gets none gets a one-line reason instead, and
    the others still build: one broken record never stops a dataset.

    Env images first (one per project version), then instances, `workers` builds at a time:
    builds are mostly pip and disk, so more than 2 buys little on a 2-core machine.
    """
    out = ImageSet()
    for t in tasks:
        attach_swebench_recipe(t)
    _prebuilt(tasks, Puller(enabled=pull), out, progress)
    specs: dict[str, EnvSpec] = {}
    for t in tasks:
        if t.instance_id in out.images:
            continue
        try:
            specs[t.instance_id] = env_spec_of(t)
        except ImageBuildError as e:
            out.fail(t.instance_id, e)
    unique = {_spec_id(s): s for s in specs.values()}
    bases: dict[str, str | Exception] = {}
    for s in unique.values():
        if s.python not in bases:
            bases[s.python] = _layer(lambda: base_for(s, progress))

    def env(s: EnvSpec) -> str | Exception:
        return _layer(lambda base: build_env_image(s, base, progress), bases[s.python])

    def inst(t: TaskInstance) -> str | Exception:
        return _layer(lambda env_image: build_instance_image(t, env_image, progress),
                      env_tags[_spec_id(specs[t.instance_id])])

    todo = [t for t in tasks if t.instance_id in specs]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        env_tags = dict(zip(unique, pool.map(env, unique.values())))
        for t, got in zip(todo, pool.map(inst, todo)):
            if isinstance(got, Exception):
                out.fail(t.instance_id, got)
            else:
                out.images[t.instance_id], out.routes[t.instance_id] = got, "built"
    return out


def _layer(build: Callable[..., str], *below: str | Exception) -> str | Exception:
    """One image layer built on the layer `below` (if any), or the error that stopped it: a
    failed lower layer passes its error up instead of building."""
    if below and isinstance(below[0], Exception):
        return below[0]
    try:
        return build(*below)
    except ImageBuildError as e:
        return e


def attach_swebench_recipe(task: TaskInstance) -> bool:
    """Give a plain SWE-bench row (no `meta.env_spec`) the recipe swebench's spec for its repo
    and version gives: env_spec, test_cmd, log_parser, and the notes (`env_recipe`, with any
    Python substitution). True when it got one."""
    if "env_spec" in task.meta or not swebench_specs(task.repo, task.version):
        return False
    spec, notes, test_cmd, parser = recipe(task)
    task.test_cmd, task.log_parser = test_cmd, parser
    task.meta = {**task.meta, "project": task.meta.get("project") or task.repo, "env_spec": spec.to_dict(),
                 "env_recipe": notes}
    return True


def ensure_images(
    tasks: list[TaskInstance], progress: Progress = print, workers: int = 1
) -> dict[str, str]:
    """`build_images` for callers that need every image: raises on the first task without one."""
    got = build_images(tasks, progress, workers)
    if got.errors:
        iid = next(iter(got.errors))
        more = f" (and {len(got.errors) - 1} more)" if len(got.errors) > 1 else ""
        raise ImageBuildError(f"{iid}{more}: {got.details[iid]}")
    return got.images
