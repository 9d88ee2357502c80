"""Sandboxes: isolated work trees where the agent's commands and the tests run.

Two backends: `docker` (the default; real containers, no network, non-root, limits) and `local`
(a process in a scratch copy, for machines without Docker). Both keep one persistent shell per
sandbox (`shell_session`), so `cd` and `export` persist between commands while the timeout and
output cap apply to each. Layers, bottom up: `interface` (the protocol and errors), `lifecycle`
(tracking and cleanup at exit), `shell_session`, the backends `docker` and `local`, `factory`.
Callers import from here.
"""

from environments.sandbox.factory import cleanup_leaked, open_sandbox
from environments.sandbox.interface import (
    TEST_ENV,
    WORKDIR,
    DiffFailed,
    DiffTooLarge,
    FileRefused,
    Sandbox,
    SandboxDead,
    SandboxError,
    run_env_prefix,
)
from environments.sandbox.lifecycle import install_exit_handlers, owner_label, session_id

__all__ = [
    "TEST_ENV", "WORKDIR", "DiffFailed", "DiffTooLarge", "FileRefused", "Sandbox", "SandboxDead", "SandboxError",
    "cleanup_leaked", "install_exit_handlers", "open_sandbox", "owner_label", "run_env_prefix", "session_id",
]
