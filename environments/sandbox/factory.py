"""Open a sandbox with the backend the config names; sweep what dead processes left behind.

The backends are imported when first used, so importing the sandbox package for its types and
errors does not load the Docker SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from environments.sandbox.interface import Sandbox

if TYPE_CHECKING:
    from swerl.config import EnvironmentConfig


def open_sandbox(image: str, cfg: "EnvironmentConfig", **kw: Any) -> Sandbox:
    """Start a sandbox of `image` with the backend `cfg.sandbox` names.

    For `docker`, `image` is an image ref; for `local`, a host directory holding the repo (it is
    copied, never modified). Keyword arguments go to the backend (e.g. `user=`, `workdir=`).
    """
    if cfg.sandbox == "docker":
        from environments.sandbox.docker import DockerSandbox

        return DockerSandbox(image, cfg, **kw)
    if cfg.sandbox == "local":
        from environments.sandbox.local import LocalSandbox

        return LocalSandbox(image, cfg, **kw)
    raise ValueError(f"unknown sandbox backend {cfg.sandbox!r}")


def cleanup_leaked(session: str | None = None, older_than_process: bool = False) -> list[str]:
    """Remove leftovers of sandboxes whose owner is gone; returns what was removed.

    By default: containers labelled `swerl` whose owning process (same host) no longer runs, and
    the scratch directories of dead local sandboxes. `session=` removes that session's containers
    whatever their owner's state. `older_than_process=True` also removes every swerl container
    created before this process started: only safe when nobody else runs swerl on this Docker.
    """
    from environments.sandbox.docker import remove_leaked_containers
    from environments.sandbox.local import remove_leaked_scratch

    return remove_leaked_containers(session, older_than_process) + remove_leaked_scratch()
