"""Docker backend: one container per sandbox, one persistent bash per container.

The container's main process (`sleep infinity` under Docker's init, which reaps zombies) runs as
`nobody`, while every command runs as the image's non-root user `swerl`: the agent can signal
its own processes, so `kill -9 -1` only ends its shell (which is restarted), never the container.
Limits: no network, all capabilities dropped, no-new-privileges, CPU / memory (no swap) / pids
from the config, a per-file size limit (`ulimit -f`) and a total disk quota: every directory the
sandbox user can write (the work tree, /tmp, HOME, ...) is a size-limited tmpfs, since overlay2
on ext4 cannot cap a container's writable layer (see WORKTREE_QUOTA).

The Docker SDK is used over the daemon's socket instead of the CLI: one hijacked exec socket per
sandbox costs no client process, and the persistent shell speaks Docker's multiplexed stream.
"""

from __future__ import annotations

import logging
import os
import posixpath
import select
import socket
import tarfile
import tempfile
import threading
import time
from typing import Any

import docker
import docker.errors
from docker.types import Ulimit

import environments.sandbox.lifecycle as lifecycle
from environments.sandbox.interface import WORKDIR, SandboxError, parse_size
from environments.sandbox.lifecycle import owner_gone, owner_label, process_started_at
from environments.sandbox.shell_session import (
    READ_CHUNK,
    Outcome,
    OutputCap,
    SessionError,
    ShellSandbox,
    ShellSession,
    read_to_eof,
    timeout_argv,
)
from swerl.config import EnvironmentConfig

log = logging.getLogger(__name__)

LABEL = "swerl"
KEEPER_USER = "65534:65534"  # nobody: a different uid, so the agent cannot kill the keeper
TMP_SIZE = "256m"
MAX_FILE_BYTES = 2 << 30  # `ulimit -f` inside: no single file above this
# Disk quota: every place the sandbox user can write is a size-limited tmpfs (overlay2 on ext4
# cannot cap a container's writable layer): the work tree (its files copied in at start), /tmp,
# HOME, /var/tmp, /run/lock and /dev/shm. tmpfs pages count as the container's memory, so the
# memory limit is the config's plus the sum of these: files cannot starve the processes.
WORKTREE_QUOTA = "512m"  # what the agent may add to the work tree, beyond the repo's own size
SMALL_TMPFS = {"/var/tmp": "64m", "/run/lock": "1m"}
HOME_DIR, HOME_SIZE = "/home/swerl", "64m"
SHM_SIZE = "64m"
SANDBOX_UID = 1000  # the images' `swerl` user (environments/base_image.py), owner of work tree and HOME
COPY_IN_TIMEOUT_S = 300.0
HOST_GRACE_S = 15.0  # run(): how long after `timeout` fires the host still waits for the end
PRISTINE_GIT = "/.swerl-git"  # root-owned copy of the work tree's .git: diff() reads it, the agent cannot write it

# Kill every process whose session is $1 (the shell's own session), except $1 unless $2 = all.
# Runs as a separate exec, as the same user as the shell; loops because killed parents' children
# may still be forking. Plain bash + /proc: no procps in the images.
KILL_SESSION_SH = r"""
s=$1; all=$2
for round in 1 2 3 4 5; do
  found=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$s" ] && [ "$all" != all ] && continue
    read -r st < "$d/stat" 2>/dev/null || continue
    st=${st##*) }
    set -- $st
    [ "$4" = "$s" ] && { kill -9 "$p" 2>/dev/null; found=1; }
  done
  [ -z "$found" ] && break
done
"""

_client_lock = threading.Lock()
_client: docker.APIClient | None = None


def api() -> docker.APIClient:
    """One low-level Docker client per process (created lazily, shared by threads). Its connection
    pool is sized for a rollout's concurrent episodes: docker-py's default of 10 made urllib3 drop
    and reopen connections (and warn) at 16 episodes."""
    global _client
    with _client_lock:
        if _client is None:
            try:
                _client = docker.from_env(timeout=120, max_pool_size=64).api
            except docker.errors.DockerException as e:
                raise SandboxError(f"cannot reach the Docker daemon: {e}") from e
        return _client


# ----------------------------------------------------------------------------- transport


def upgrade_leftover(sock_io: Any, raw: socket.socket) -> bytes:
    """The stream's first bytes, when http.client's reader took them with the upgrade's headers.

    Why: exec start is an HTTP upgrade. http.client parses the `101 UPGRADED` headers through a
    buffered reader that reads up to 8 KiB at a time, and docker-py hands back the socket below
    that reader (docker-py #3332). When the client is slow to read the headers (a loaded machine)
    and the command quick, its frames sit in that buffer and reading the socket never sees them:
    the whole output is lost, with exit code 0 (docs/history/environments.md).
    """
    response = getattr(sock_io, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if reader is None or not hasattr(reader, "read1"):
        return b""
    try:
        raw.setblocking(False)  # take what is buffered; never wait on the socket here
        # one call: the buffer holds at most 8 KiB (< READ_CHUNK), and an empty buffer means one
        # non-blocking read of the socket at most; what follows is read by `recv` in order
        return reader.read1(READ_CHUNK) or b""
    except (OSError, ValueError):  # would block (TLS), or the reader is closed: nothing buffered
        return b""
    finally:
        try:
            raw.settimeout(None)
        except OSError:
            pass


class DockerStreamTransport:
    """A hijacked exec socket, unwrapping Docker's multiplexed frames (8-byte headers)."""

    def __init__(self, sock: Any) -> None:
        self._io = sock  # keep the SocketIO alive: it owns the connection
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.buf = bytearray(upgrade_leftover(sock, self.sock))
        self.eof = False

    def send(self, data: bytes, deadline: float) -> None:
        try:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            self.sock.sendall(data)
        except OSError as e:  # includes socket.timeout: the shell stopped reading
            raise SessionError(f"cannot write to the shell: {e}") from None
        finally:
            try:
                self.sock.settimeout(None)
            except OSError:
                pass

    def _frames(self) -> bytes:
        out = bytearray()
        while len(self.buf) >= 8:
            size = int.from_bytes(self.buf[4:8], "big")
            if len(self.buf) < 8 + size:
                break
            out += self.buf[8:8 + size]
            del self.buf[:8 + size]
        return bytes(out)

    def recv(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            data = self._frames()
            if data:
                return data
            if self.eof:
                return None
            left = deadline - time.monotonic()
            readable, _, _ = select.select([self.sock], [], [], max(0.0, left))
            if not readable:
                return b""
            try:
                chunk = self.sock.recv(READ_CHUNK)
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
            self.buf += chunk

    def close(self) -> None:
        for closer in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close, self._io.close):
            try:
                closer()
            except OSError:
                pass


# ----------------------------------------------------------------------------- containers


def quota_bytes(tmp_size: str, worktree_quota: str | None, tree_bytes: int = 0) -> int:
    """The most the sandbox can write in total: the sum of its tmpfs mounts (the work tree's
    holds the repo's `tree_bytes` plus `worktree_quota`)."""
    sizes = [tmp_size, SHM_SIZE, *SMALL_TMPFS.values()]
    if worktree_quota:
        sizes += [worktree_quota, HOME_SIZE]
    return sum(parse_size(x) for x in sizes) + (tree_bytes if worktree_quota else 0)


_TREE_BYTES: dict[tuple[str, str], int] = {}
_TREE_LOCK = threading.Lock()


def tree_bytes(image: str, path: str) -> int:
    """What the image's files under `path` take on a tmpfs (pages, a page per entry), measured
    once per image and path in this process from a container that is never started."""
    with _TREE_LOCK:
        if (image, path) in _TREE_BYTES:
            return _TREE_BYTES[(image, path)]
    page = 4096
    cid = api().create_container(image, command=["true"], labels={LABEL: "1", "swerl.owner": owner_label()})["Id"]
    try:
        stream, _ = api().get_archive(cid, path)
        with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as tar:
            total = sum(page + -(-m.size // page) * page for m in tar)
    except docker.errors.NotFound:
        total = 0
    finally:
        api().remove_container(cid, force=True)
    with _TREE_LOCK:
        _TREE_BYTES[(image, path)] = total
    return total


class _ChunkReader:
    """A file-like `read(n)` over an iterator of byte chunks (a streamed archive)."""

    def __init__(self, chunks: Any) -> None:
        self.chunks, self.buf = iter(chunks), b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buf) < n:
            chunk = next(self.chunks, b"")
            if not chunk:
                break
            self.buf += chunk
        out, self.buf = (self.buf, b"") if n < 0 else (self.buf[:n], self.buf[n:])
        return out


def _tmpfs(workdir: str, tmp_size: str, worktree_quota: str | None, tree: int) -> dict[str, str]:
    opts = "rw,nosuid,nodev"
    mounts = {"/tmp": f"{opts},size={tmp_size},mode=1777"}
    if worktree_quota:
        owned = f"uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755"
        work = parse_size(worktree_quota) + tree
        mounts |= {workdir: f"{opts},size={work},{owned}", HOME_DIR: f"{opts},size={HOME_SIZE},{owned}"}
        mounts |= {path: f"{opts},size={size},mode=1777" for path, size in SMALL_TMPFS.items()}
    return mounts


def _host_config(cfg: EnvironmentConfig, workdir: str, tmp_size: str, max_file_bytes: int,
                 worktree_quota: str | None, tree: int) -> dict[str, Any]:
    memory = parse_size(cfg.memory) + quota_bytes(tmp_size, worktree_quota, tree)
    return api().create_host_config(
        network_mode="none",
        init=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        nano_cpus=int(cfg.cpus * 1e9),
        mem_limit=memory,
        memswap_limit=memory,  # no swap: a memory bomb meets the OOM killer, not the disk
        pids_limit=cfg.pids_limit,
        shm_size=SHM_SIZE,
        tmpfs=_tmpfs(workdir, tmp_size, worktree_quota, tree),
        ulimits=[Ulimit(name="fsize", soft=max_file_bytes, hard=max_file_bytes)],
    )


def _docker_error(what: str, e: Exception) -> SandboxError:
    return SandboxError(f"{what}: {e}")


class DockerSandbox(ShellSandbox):
    """A running container of `image`; see the module docstring for its limits."""

    def __init__(self, image: str, cfg: EnvironmentConfig, *, user: str = "swerl",
                 workdir: str = WORKDIR, session: str | None = None, tmp_size: str = TMP_SIZE,
                 max_file_bytes: int = MAX_FILE_BYTES, snapshot_git: bool = True,
                 worktree_quota: str | None = WORKTREE_QUOTA) -> None:
        """`snapshot_git=False` skips the pristine .git copy: for sandboxes nobody diffs (grading).
        `worktree_quota=None` leaves the work tree and HOME on the image's layer (no disk quota)."""
        self.image, self.user, self.workdir = image, user, workdir
        self.command_timeout_s = cfg.command_timeout_s
        self.test_timeout_s = cfg.test_timeout_s
        self.pids_limit, self.worktree_quota = cfg.pids_limit, worktree_quota
        self.output_cap_bytes = cfg.output_cap_bytes
        super().__init__()
        self.session_label = session or lifecycle.session_id()
        self.name = f"swerl-{self.session_label}-{os.urandom(4).hex()}"
        self.cid = ""
        lifecycle.track(self)  # before create: an interrupt in between still removes it by name
        lifecycle.on_exit(_sweep_own_session)
        try:
            tree = tree_bytes(image, workdir) if worktree_quota else 0
            self.cid = api().create_container(
                image, command=["sleep", "infinity"], name=self.name, user=KEEPER_USER,
                working_dir=workdir,
                host_config=_host_config(cfg, workdir, tmp_size, max_file_bytes, worktree_quota, tree),
                labels={LABEL: "1", "swerl.session": self.session_label, "swerl.owner": owner_label()},
            )["Id"]
            api().start(self.cid)
            if worktree_quota:
                for path in (workdir, HOME_DIR):
                    self._copy_in(path)
            if snapshot_git:
                self._snapshot_git()
            self._start_session()
        except BaseException as e:
            self.close()
            if isinstance(e, docker.errors.DockerException):
                raise _docker_error(f"cannot start a sandbox of {image}", e) from e
            raise

    def _copy_in(self, path: str) -> None:
        """Fill the tmpfs mounted at `path` with the image's files there (the archive API reads
        the image's layer beneath the mount), unpacked by the sandbox user."""
        # spooled to the host first: the daemon holds the container's lock until the archive
        # is read to its end, and the exec that unpacks it needs that lock
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
            try:
                stream, _ = api().get_archive(self.cid, path)
                for chunk in stream:
                    spool.write(chunk)
            except docker.errors.NotFound:
                return  # nothing in the image there: the mount starts empty
            except docker.errors.DockerException as e:
                raise _docker_error(f"cannot read {path} of {self.image}", e) from e
            spool.seek(0)
            exec_id, transport = self._exec_socket(["tar", "-x", "-C", posixpath.dirname(path)], stdin=True)
            cap = OutputCap(4096)
            deadline = time.monotonic() + COPY_IN_TIMEOUT_S
            try:
                while chunk := spool.read(READ_CHUNK):
                    transport.send(chunk, deadline)
                transport.sock.shutdown(socket.SHUT_WR)  # end of stdin: tar finishes
                read_to_eof(transport, cap, deadline)
            finally:
                transport.close()
        if self._exit_code(exec_id) != 0:
            raise SandboxError(f"cannot copy {path} into its tmpfs: {cap.value()[-500:].decode(errors='replace')}")

    def _snapshot_git(self) -> None:
        """Copy the work tree's .git, as root, before the agent's first command (see diff())."""
        src = f"{self.workdir}/.git"
        exec_id, transport = self._exec_socket(
            ["sh", "-c", f'[ ! -d "$1" ] || cp -r -- "$1" {PRISTINE_GIT}', "snapshot", src], stdin=False, user="0")
        try:
            read_to_eof(transport, OutputCap(4096), time.monotonic() + 120)
        finally:
            transport.close()
        if self._exit_code(exec_id) != 0:
            raise SandboxError(f"cannot copy {src} in {self.name}")
        self.pristine_git = PRISTINE_GIT

    # ---------------------------------------------------------------------------- hooks
    def _exec_socket(self, cmd: list[str], stdin: bool, user: str | None = None) -> tuple[str, DockerStreamTransport]:
        try:
            exec_id = api().exec_create(self.cid, cmd, stdin=stdin, stdout=True, stderr=True,
                                        tty=False, user=user or self.user, workdir=self.workdir)["Id"]
            return exec_id, DockerStreamTransport(api().exec_start(exec_id, socket=True))
        except docker.errors.DockerException as e:
            raise _docker_error(f"exec in {self.name} failed", e) from e

    def _exec_wait(self, cmd: list[str], timeout: float) -> None:
        _, transport = self._exec_socket(cmd, stdin=False)
        try:
            read_to_eof(transport, OutputCap(4096), time.monotonic() + timeout)
        finally:
            transport.close()

    def _interrupt(self, pid: int, everything: bool = False) -> None:
        self._exec_wait(["bash", "-c", KILL_SESSION_SH, "kill", str(pid), "all" if everything else ""],
                        timeout=10)

    def _open_session(self, cwd: str) -> ShellSession:
        _, transport = self._exec_socket(["bash", "--noprofile", "--norc"], stdin=True)
        session = ShellSession(transport, self._interrupt)
        try:
            session.start(cwd)
        except BaseException:
            transport.close()
            raise
        return session

    def _kill_session(self, session: ShellSession) -> None:
        if session.pid > 0:
            self._interrupt(session.pid, everything=True)

    def _reset(self) -> str | None:
        """Kill every process of the sandbox user, with room to start the killer (a fork bomb
        may hold every pid); when even that fails, restart the container, which empties its
        tmpfs mounts: the work tree is then copied in afresh, and the caller says so."""
        try:
            self._set_pids_limit(self.pids_limit + 64)
            try:
                self._exec_wait(["bash", "-c", "for _ in 1 2 3 4 5; do kill -9 -1 2>/dev/null; done"], timeout=10)
            finally:
                self._set_pids_limit(self.pids_limit)
            return None
        except (SandboxError, docker.errors.DockerException) as e:
            log.warning("%s: could not kill its processes (%s); restarting it", self.name, e)
        try:
            api().restart(self.cid, timeout=0)
        except docker.errors.DockerException as e:
            raise _docker_error(f"restart of {self.name} failed", e) from e
        if not self.worktree_quota:
            return f"files in {self.workdir} were kept, /tmp was cleared"
        for path in (self.workdir, HOME_DIR):
            self._copy_in(path)
        return f"the container was restarted: {self.workdir} is back to the task's original files, /tmp was cleared"

    def _set_pids_limit(self, limit: int) -> None:
        """`docker update --pids-limit` (docker-py's update_container lacks the field)."""
        if limit > 0:
            client = api()
            res = client._post_json(client._url("/containers/{0}/update", self.cid), data={"PidsLimit": limit})
            client._raise_for_status(res)

    def _run(self, cmd: str, timeout: float, cap_bytes: int) -> Outcome:
        t0 = time.monotonic()
        exec_id, transport = self._exec_socket(timeout_argv(cmd, timeout), stdin=False)
        cap = OutputCap(cap_bytes)
        try:
            finished = read_to_eof(transport, cap, t0 + timeout + HOST_GRACE_S)
        finally:
            transport.close()
        code = self._exit_code(exec_id) if finished else None
        if code in (None, 137) and self._stops_within():  # killed with its container: not a verdict
            raise self._mark_dead("the container died during run()")
        return ShellSession.one_shot(cap, finished, -1 if code is None else code, t0, timeout)

    def _exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code; the stream can end a moment before Docker records it."""
        try:
            for _ in range(200):
                info = api().exec_inspect(exec_id)
                if not info["Running"]:
                    return info["ExitCode"]
                time.sleep(0.01)
        except docker.errors.DockerException as e:
            raise _docker_error("exec inspect failed", e) from e
        return None

    @property
    def alive(self) -> bool:
        if not self.cid or self._closed:
            return False
        try:
            return bool(api().inspect_container(self.cid)["State"]["Running"])
        except docker.errors.NotFound:
            return False
        except docker.errors.DockerException as e:
            raise _docker_error("cannot inspect the container", e) from e

    def _destroy(self, session: ShellSession | None) -> None:
        lifecycle.untrack(self)
        try:
            api().remove_container(self.cid or self.name, force=True)
        except docker.errors.NotFound:
            pass


# ----------------------------------------------------------------------------- cleanup


def _remove(containers: list[dict[str, Any]]) -> list[str]:
    removed = []
    for c in containers:
        try:
            api().remove_container(c["Id"], force=True)
            removed.append(c["Names"][0].lstrip("/") if c.get("Names") else c["Id"][:12])
        except docker.errors.NotFound:
            pass
    return removed


def list_containers(session: str | None = None) -> list[dict[str, Any]]:
    labels = [LABEL] + ([f"swerl.session={session}"] if session else [])
    return api().containers(all=True, filters={"label": labels})


def _sweep_own_session() -> None:
    _remove(list_containers(lifecycle.session_id()))


def remove_leaked_containers(session: str | None = None, older_than_process: bool = False) -> list[str]:
    if session:
        return _remove(list_containers(session))
    started = process_started_at() if older_than_process else None
    leaked = [
        c for c in list_containers()
        if owner_gone(c.get("Labels", {}).get("swerl.owner", ""))
        or (started is not None and c.get("Created", 0) < started)
    ]
    return _remove(leaked)
