"""The sandbox base image: a Debian rootfs plus a non-root user `swerl` owning `/testbed`.

Base images cannot be pulled on the machines this runs on, so the rootfs is made offline-ish with
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

ROOTFS_IMAGE = "swerl-rootfs:bookworm"
BASE_REPO = "swerl-base"
ROOTFS_PACKAGES = "python3,python3-pip,python3-venv,git,python3-pytest,ca-certificates"

# Kept deliberately small: everything heavy belongs in the instance images.
DOCKERFILE = f"""\
FROM {ROOTFS_IMAGE}
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


def ensure_rootfs(progress: Progress = print) -> str:
    """Make `swerl-rootfs:bookworm` with mmdebstrap when missing (about 40 s and 290 MB)."""
    if image_id(ROOTFS_IMAGE):
        return ROOTFS_IMAGE
    if not shutil.which("mmdebstrap"):
        raise ImageBuildError(
            f"{ROOTFS_IMAGE} is missing and mmdebstrap is not installed (apt-get install mmdebstrap)"
        )
    progress(f"building {ROOTFS_IMAGE} with mmdebstrap")
    run_build_tool(
        f"set -o pipefail; mmdebstrap --variant=apt --include={ROOTFS_PACKAGES} bookworm - "
        f"| docker import - {ROOTFS_IMAGE}",
        progress, shell=True,
    )
    return ROOTFS_IMAGE


def base_tag() -> str:
    """`swerl-base:<hash of rootfs id + Dockerfile>`; needs the rootfs to exist."""
    rootfs = image_id(ROOTFS_IMAGE)
    if rootfs is None:
        raise ImageBuildError(f"{ROOTFS_IMAGE} does not exist")
    digest = hashlib.sha256(f"{rootfs}\n{DOCKERFILE}".encode()).hexdigest()[:12]
    return f"{BASE_REPO}:{digest}"


def ensure_base_image(progress: Progress = print) -> str:
    """Return the sandbox base image tag, building the rootfs and the user layer when missing."""
    ensure_rootfs(progress)
    tag = base_tag()
    if not image_id(tag):
        progress(f"building {tag}")
        run_build_tool(["docker", "build", "--network", "host", "-t", tag, "-"], progress, stdin=DOCKERFILE)
    if image_id(f"{BASE_REPO}:latest") != image_id(tag):
        subprocess.run(["docker", "tag", tag, f"{BASE_REPO}:latest"], check=True)
    return tag


if __name__ == "__main__":
    print(ensure_base_image())
