"""The sandbox base images: a Debian rootfs plus a non-root user `swerl` owning `/testbed`.

One per Debian release, each for the Python that release ships (`RELEASES`): a task's Python
picks its release (`release_for_python`), the nearest one when no release ships it. Base images
cannot be pulled on the machines this runs on, so the rootfs is made offline-ish with
`mmdebstrap` (it only needs a Debian mirror) and imported; the small layer on top is built with
`docker build`. The tag carries a hash of everything that went in (the rootfs image id and the
Dockerfile), so asking again is a cache hit and any change makes a new tag instead of silently
reusing a stale one. Instance images (one per task) are built FROM the returned tag.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from typing import Callable

DEFAULT_RELEASE = "bookworm"
RELEASES = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}  # Debian release -> its python3
ROOTFS_REPO = "swerl-rootfs"
ROOTFS_IMAGE = f"{ROOTFS_REPO}:{DEFAULT_RELEASE}"  # also the FROM of the stack's service images
BASE_REPO = "swerl-base"
ROOTFS_PACKAGES = "python3,python3-pip,python3-venv,git,python3-pytest,ca-certificates,passwd"  # passwd: useradd (trixie)

# Kept deliberately small: everything heavy belongs in the instance images.
DOCKERFILE_TEMPLATE = """\
FROM {rootfs}
RUN useradd --create-home --uid 1000 --shell /bin/bash swerl \\
 && mkdir -p /testbed && chown swerl:swerl /testbed \\
 && git config --system --add safe.directory '*' \\
 && git config --system user.name swerl && git config --system user.email swerl@localhost \\
 && git config --system init.defaultBranch main
ENV HOME=/home/swerl LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /testbed
USER swerl
CMD ["sleep", "infinity"]
"""
DOCKERFILE = DOCKERFILE_TEMPLATE.format(rootfs=ROOTFS_IMAGE)

Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """An image could not be made; the message holds the tail of the failing tool's output."""


def image_id(ref: str) -> str | None:
    """The local image id of `ref`, or None when it does not exist.

    A daemon that does not answer is an error, not a missing image: taking it for one would
    start a needless rebuild that then fails with a confusing message.
    """
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True, text=True,
    )
    if out.returncode != 0 and "Cannot connect to the Docker daemon" in out.stderr:
        raise ImageBuildError(f"Docker daemon not reachable ({out.stderr.strip()}); "
                              "start it: bash infra/ensure_docker.sh")
    return out.stdout.strip() if out.returncode == 0 else None


def run_build_tool(cmd: list[str] | str, progress: Progress, *, shell: bool = False, stdin: str | None = None) -> None:
    """Run a build tool, passing its output lines to `progress`; raise with the tail on failure."""
    proc = subprocess.Popen(
        cmd, shell=shell, executable="/bin/bash" if shell else None,  # pipefail is not in sh
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
    )
    if stdin is not None:
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        progress(line)
        tail = (tail + [line])[-40:]
    if proc.wait() != 0:
        raise ImageBuildError(f"{cmd if isinstance(cmd, str) else ' '.join(cmd)} failed "
                              f"(rc={proc.returncode}):\n" + "\n".join(tail))


def _python_version(text: str) -> tuple[int, int] | None:
    parts = str(text).strip().split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def release_for_python(python: str) -> str:
    """The Debian release whose python3 is nearest to `python` ("3.9" -> bullseye, "3.6" ->
    bullseye, "3.12" -> trixie); on a tie the newer one, since code that needs 3.10 features
    runs on 3.11 but not on 3.9. A release name is returned as is; anything else is an error."""
    if python in RELEASES:
        return python
    want = _python_version(python)
    if want is None:
        raise ImageBuildError(f"python {python!r}: not a Python version nor a Debian release ({', '.join(RELEASES)})")
    have = {rel: _python_version(v) for rel, v in RELEASES.items()}
    return min(have, key=lambda rel: (abs((have[rel][0] - want[0]) * 100 + have[rel][1] - want[1]), -have[rel][1]))


def rootfs_image(release: str = DEFAULT_RELEASE) -> str:
    if release not in RELEASES:
        raise ImageBuildError(f"unknown Debian release {release!r} (known: {', '.join(RELEASES)})")
    return f"{ROOTFS_REPO}:{release}"


def ensure_rootfs(progress: Progress = print, release: str = DEFAULT_RELEASE) -> str:
    """Make `swerl-rootfs:<release>` with mmdebstrap when missing (about 40 s and 290 MB)."""
    ref = rootfs_image(release)
    if image_id(ref):
        return ref
    if not shutil.which("mmdebstrap"):
        raise ImageBuildError(f"{ref} is missing and mmdebstrap is not installed (apt-get install mmdebstrap)")
    progress(f"building {ref} with mmdebstrap (python {RELEASES[release]})")
    run_build_tool(
        f"set -o pipefail; mmdebstrap --variant=apt --include={ROOTFS_PACKAGES} {release} - "
        f"| docker import - {ref}",
        progress, shell=True,
    )
    return ref


def base_tag(release: str = DEFAULT_RELEASE) -> str:
    """`swerl-base:<hash of rootfs id + Dockerfile>`; needs the rootfs to exist. Bookworm's hash
    is the one it always had, so existing images stay cache hits."""
    ref = rootfs_image(release)
    rootfs = image_id(ref)
    if rootfs is None:
        raise ImageBuildError(f"{ref} does not exist")
    digest = hashlib.sha256(f"{rootfs}\n{DOCKERFILE_TEMPLATE.format(rootfs=ref)}".encode()).hexdigest()[:12]
    return f"{BASE_REPO}:{digest}"


def ensure_base_image(progress: Progress = print, release: str = DEFAULT_RELEASE) -> str:
    """Return the sandbox base image tag of `release`, building its rootfs and the user layer
    when missing. The default release is also tagged `swerl-base:latest`, the others
    `swerl-base:<release>`."""
    ref = ensure_rootfs(progress, release)
    tag = base_tag(release)
    if not image_id(tag):
        progress(f"building {tag}")
        run_build_tool(["docker", "build", "--network", "host", "-t", tag, "-"], progress,
                       stdin=DOCKERFILE_TEMPLATE.format(rootfs=ref))
    alias = f"{BASE_REPO}:{'latest' if release == DEFAULT_RELEASE else release}"
    if image_id(alias) != image_id(tag):
        subprocess.run(["docker", "tag", tag, alias], check=True)
    return tag


if __name__ == "__main__":
    import sys

    print(ensure_base_image(release=sys.argv[1] if len(sys.argv) > 1 else DEFAULT_RELEASE))
