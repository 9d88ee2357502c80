"""One persistent bash per sandbox, driven through its stdin with a per-command end marker.

Why a persistent shell: a fresh `docker exec` costs ~60 ms, a command written to an open shell
~0.2 ms, and SWE-agent-style agents expect `cd` and `export` to persist between actions.
`ShellSession` speaks the protocol (its docstring has it); `ShellSandbox` is what both backends
share: exec through the session with recovery when it is lost, files, diff and close.
`write_file` goes through the session; `read_file`, `diff` and `run` use one-shot commands
outside it, so a background job's output can never end up in a file's content or a test log.
"""

from __future__ import annotations

import base64
import logging
import os
import posixpath
import secrets
import select
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from environments.records import ExecResult
from environments.sandbox.interface import (
    DiffFailed, DiffTooLarge, NotRegularFile, SandboxDead, SandboxError, UnreadableFile, UnwritableFile,
)

log = logging.getLogger(__name__)

CHANNEL_FD = 7
READ_CHUNK = 1 << 16
INTERRUPT_GRACE_S = 3.0  # after the kill, how long the marker may take before the shell is "lost"
START_TIMEOUT_S = 30.0
DEATH_SETTLE_S = 1.0  # how long a sign of death waits for the backend to report its sandbox gone
# After a timeout: wait (boundedly) until the shell has reaped the children the kill left as
# zombies, so that their "Killed" notices are printed now. A subshell, so the agent's variables
# and positional parameters are untouched; $$ in it is still the shell's pid. Builtins only.
SETTLE_CMD = r"""(for _ in {1..200}; do
  z=
  for d in /proc/[0-9]*; do
    read -r st < "$d/stat" 2>/dev/null || continue
    st=${st##*) }; set -- $st
    [ "$1" = Z ] && [ "$2" = $$ ] && { z=1; break; }
  done
  [ -z "$z" ] && break
done)"""
FILE_CAP_BYTES = 256 << 20  # read_file / diff refuse bigger results instead of truncating them
NOT_REGULAR = 19  # read_bytes / write_file: the path is a FIFO, a device, a socket...
GRADING_CAP_BYTES = 32 << 20  # run(): test logs must stay parseable, so a much larger cap


class SessionError(SandboxError):
    """The shell session could not be started or written to."""


# ----------------------------------------------------------------------------- output handling


class OutputCap:
    """Keep the first and last bytes of a stream of unknown length; count what falls between."""

    def __init__(self, cap: int) -> None:
        self.head_max = cap // 2
        self.tail_max = cap - self.head_max
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_max:  # trim in batches: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.tail_max]

    @property
    def cut(self) -> int:
        return max(0, self.total - len(self.head) - self.tail_max)

    def value(self) -> bytes:
        tail = bytes(self.tail[-self.tail_max:]) if self.tail_max else b""
        if not self.cut:
            return bytes(self.head) + tail
        note = f"\n[... swerl: {self.cut} bytes of output cut ...]\n".encode()
        return bytes(self.head) + note + tail


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def bash_quote(text: str | bytes) -> str:
    """Quote as one bash ANSI-C string ($'...'): any byte, newline or quote survives unchanged."""
    raw = text.encode() if isinstance(text, str) else text
    out = ["$'"]
    for b in raw:
        if b == 0x5C:
            out.append("\\\\")
        elif b == 0x27:
            out.append("\\'")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    out.append("'")
    return "".join(out)


# ----------------------------------------------------------------------------- transports


class Transport(Protocol):
    """A byte pipe to the shell: stdin one way, merged stdout/stderr the other."""

    def send(self, data: bytes, deadline: float) -> None: ...

    def recv(self, timeout: float) -> bytes | None:
        """Up to READ_CHUNK bytes; b"" when nothing came within `timeout`; None at end of stream."""

    def close(self) -> None: ...


class PipeTransport:
    """Pipes of a local child process (the local backend, or a CLI client)."""

    def __init__(self, stdin_fd: int | None, stdout_fd: int) -> None:
        self.stdin_fd, self.stdout_fd = stdin_fd, stdout_fd
        if stdin_fd is not None:
            os.set_blocking(stdin_fd, False)  # a wedged shell must not block the host on write

    def send(self, data: bytes, deadline: float) -> None:
        if self.stdin_fd is None:
            raise SessionError("this process has no stdin")
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SessionError("timed out writing to the shell (it stopped reading)")
            _, writable, _ = select.select([], [self.stdin_fd], [], left)
            if writable:
                try:
                    view = view[os.write(self.stdin_fd, view):]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, OSError) as e:
                    raise SessionError(f"shell stdin closed: {e}") from None

    def recv(self, timeout: float) -> bytes | None:
        readable, _, _ = select.select([self.stdout_fd], [], [], max(0.0, timeout))
        if not readable:
            return b""
        data = os.read(self.stdout_fd, READ_CHUNK)
        return data or None

    def close(self) -> None:
        for fd in (self.stdin_fd, self.stdout_fd):
            if fd is None:
                continue
            try:
                os.close(fd)
            except OSError:
                pass


def diff_script(workdir: str, pristine_git: str, base: str, binary: bool) -> str:
    """`git diff --binary` of `workdir` against `base`, using a throwaway git dir whose objects
    come from `pristine_git` (a copy of the repo's .git made before the agent's first command):
    deleting or corrupting `.git` cannot change or break the diff. No user or system git config
    (no external diff, textconv, excludes or fsmonitor the agent set up), no eol or filter
    conversion (the bytes are the work tree's), the image's own excludes (build outputs such as
    `*.egg-info/`); `binary` writes every file as a GIT binary patch
    (for contents that are not UTF-8). Unreadable files the agent made are made readable first."""
    g, w = bash_quote(pristine_git), bash_quote(workdir)
    attributes = "* -text -ident -filter" + (" binary" if binary else "")
    return (
        "set -e; export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null; "
        "t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        "git init -q --bare --template= \"$t/g\"; mkdir -p \"$t/g/info\" \"$t/g/objects/info\"; "
        f"printf '%s\\n' {g}/objects > \"$t/g/objects/info/alternates\"; "
        f"printf '%s\\n' '{attributes}' > \"$t/g/info/attributes\"; "
        f"cp {g}/info/exclude \"$t/g/info/exclude\" 2>/dev/null || true; "
        f"export GIT_DIR=\"$t/g\" GIT_WORK_TREE={w} GIT_INDEX_FILE=\"$t/index\"; "
        f"cp {g}/index \"$t/index\" 2>/dev/null || git read-tree {base}; "
        f"chmod -R u+rX {w} 2>/dev/null || true; cd {w}; git add -A; "
        f"exec git -c core.quotepath={'on' if binary else 'off'} diff --cached --binary --no-ext-diff "
        f"--no-textconv --no-color {base}"
    )


def timeout_argv(cmd: str, timeout: float) -> list[str]:
    """A one-shot `bash -c` under coreutils `timeout`, which kills its whole process group."""
    return ["timeout", "-k", "5", f"{timeout:.3f}s", "bash", "-c", cmd]


def read_to_eof(transport: Transport, cap: OutputCap, deadline: float) -> bool:
    """Drain a one-shot command's output into `cap`; False when the deadline came first."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        data = transport.recv(min(left, 1.0))
        if data is None:
            return True
        cap.add(data)


# ----------------------------------------------------------------------------- the session


@dataclass
class Outcome:
    output: bytes
    exit_code: int  # -1 when unknown (timeout, lost session)
    timed_out: bool
    truncated_bytes: int
    lost: bool  # the shell is gone or wedged; the caller must replace the session
    cwd: str | None  # the shell's directory after the command, when the marker came
    duration_s: float
    note: str = ""  # what recovery did after a lost session, for the observation


class ShellSession:
    """A bash reading commands from `transport`; `interrupt(pid)` kills its children.

    The protocol, for each command:

        builtin eval $'<command, quoted>' </dev/null >&7 2>&1; builtin printf '\\n__SWERL_END_<nonce>__ %s %s\\n' "$?" "$PWD" >&7

    * The command travels as one ANSI-C quoted string, so unbalanced quotes, heredocs or a stray
      `}` can never eat the marker: a syntax error is just exit code 2. (No `{ ...; }` group:
      after a syntax error inside eval, bash 5.2 misparses a reserved word at the start of the
      next line.)
    * fd 7 is the channel back to the host (a copy of the shell's stdout made at start); the
      marker is written to it explicitly, so `exec >&-` cannot silence it. stdin is /dev/null,
      so `cat` or `read` cannot eat later commands.
    * The nonce is fresh per command, so output cannot forge the marker.
    * The host reads incrementally, keeping only a head and a tail of the output (`OutputCap`),
      so 100 MB of output costs the host a bounded amount of memory.
    * On timeout the host asks the backend to SIGKILL every process of the shell's session
      except the shell itself (the interrupt callback): background jobs the agent started die
      too. If the marker still does not come (a builtin loop, `exit`, `exec prog`, `set -e`),
      the session is "lost" and `ShellSandbox` recovers (see `ShellSandbox._recover`).
    """

    def __init__(self, transport: Transport, interrupt: Callable[[int], None]) -> None:
        self.transport = transport
        self.interrupt = interrupt
        self.pid = -1  # the shell's pid as seen inside the sandbox; it leads its own session
        self.head_commit = ""
        self.handle: Any = None  # the backend's own bookkeeping (e.g. the local process)
        self.in_flight = False  # a command's marker is still unread (its caller was interrupted)

    def start(self, cwd: str, setup: str = "") -> None:
        """Handshake: set up the channel, cd, learn the shell's pid and the repo's HEAD."""
        nonce = secrets.token_hex(8)
        script = (
            f"exec {CHANNEL_FD}>&1 2>&1\n"
            "export PAGER=cat GIT_PAGER=cat\n"
            f"{setup}\n"
            f"builtin cd -- {bash_quote(cwd)} || builtin cd /\n"
            f"builtin printf '__SWERL_READY_{nonce}__ %s %s\\n' \"$$\" "
            f"\"$(command -p git rev-parse -q --verify HEAD 2>/dev/null)\" >&{CHANNEL_FD}\n"
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        self.transport.send(script.encode(), deadline)
        prefix = f"__SWERL_READY_{nonce}__ ".encode()
        buf = b""
        while prefix not in buf or not buf.split(prefix, 1)[1].count(b"\n"):
            data = self.transport.recv(max(0.0, deadline - time.monotonic()))
            if data is None or time.monotonic() > deadline:
                raise SessionError(f"shell did not start: {decode(buf[-2000:])!r}")
            buf = (buf + data)[-(1 << 16):]
        fields = buf.split(prefix, 1)[1].split(b"\n", 1)[0].decode().split(" ")
        self.pid = int(fields[0])
        self.head_commit = fields[1] if len(fields) > 1 else ""

    def execute(self, cmd: str, timeout: float, cap_bytes: int) -> Outcome:
        self.in_flight = True  # stays set if KeyboardInterrupt & co. cut this call short
        out = self._execute(cmd, timeout, cap_bytes)
        if out.timed_out and not out.lost:
            out = self._settle(out, cap_bytes)
        self.in_flight = False
        return out

    def _settle(self, out: Outcome, cap_bytes: int) -> Outcome:
        """Take bash's notices of the jobs a timeout killed into that command's own output.

        Why: bash reports a job killed by a signal ("bash: line 7: 17 Killed  sleep 100") when
        it next gets round to it, and a job that died after the timed-out command's marker is
        reported at the start of the following command: the agent's next, unrelated action. An
        empty command run right after the interrupt (every kill is done by then) takes them.
        """
        after = self._execute(SETTLE_CMD, INTERRUPT_GRACE_S, cap_bytes)
        cap = OutputCap(cap_bytes)
        cap.add(out.output)
        cap.add(after.output)
        return Outcome(cap.value(), out.exit_code, True, out.truncated_bytes + cap.cut, after.lost,
                       out.cwd, out.duration_s + after.duration_s)

    def _execute(self, cmd: str, timeout: float, cap_bytes: int) -> Outcome:
        t0 = time.monotonic()
        nonce = secrets.token_hex(8)
        marker = f"\n__SWERL_END_{nonce}__ ".encode()
        script = (
            f"builtin eval {bash_quote(cmd)} </dev/null >&{CHANNEL_FD} 2>&1; "
            f"builtin printf '\\n__SWERL_END_{nonce}__ %s %s\\n' \"$?\" \"$PWD\" >&{CHANNEL_FD}\n"
        )
        cap = OutputCap(cap_bytes)
        deadline = t0 + timeout
        try:
            self.transport.send(script.encode(), deadline)
        except SessionError:
            return Outcome(b"", -1, True, 0, True, None, time.monotonic() - t0)
        pending = b""
        interrupted = False
        while True:
            now = time.monotonic()
            if now >= deadline:
                if interrupted:  # the kill did not bring the marker back: the shell is wedged
                    return self._outcome(cap, -1, True, True, None, t0)
                interrupted = True
                try:
                    self.interrupt(self.pid)
                except SandboxError:
                    return self._outcome(cap, -1, True, True, None, t0)
                deadline = time.monotonic() + INTERRUPT_GRACE_S
                continue
            data = self.transport.recv(min(deadline - now, 1.0))
            if data is None:  # `exit`, `exec prog`, `set -e`, or the sandbox itself died
                cap.add(pending)
                return self._outcome(cap, -1, interrupted, True, None, t0)
            pending += data
            at = pending.find(marker)
            if at < 0:
                keep = len(marker) - 1
                if len(pending) > keep:
                    cap.add(pending[:-keep])
                    pending = pending[-keep:]
                continue
            cap.add(pending[:at])
            rest = pending[at + len(marker):]
            while b"\n" not in rest:  # the rest of the marker line is a few bytes away
                more = self.transport.recv(max(0.0, deadline - time.monotonic()))
                if not more:
                    return self._outcome(cap, -1, interrupted, True, None, t0)
                rest += more
            status, _, cwd = rest.split(b"\n", 1)[0].decode(errors="replace").partition(" ")
            code = -1 if interrupted or not status.isdigit() else int(status)
            return self._outcome(cap, code, interrupted, False, cwd or None, t0)

    @staticmethod
    def one_shot(cap: OutputCap, finished: bool, code: int, t0: float, timeout: float) -> Outcome:
        """The Outcome of a `timeout_argv` command (124/137 after the limit mean it fired)."""
        elapsed = time.monotonic() - t0
        timed_out = not finished or (code in (124, 137) and elapsed >= timeout)
        return Outcome(cap.value(), -1 if timed_out else code, timed_out, cap.cut, False, None, elapsed)

    @staticmethod
    def _outcome(cap: OutputCap, code: int, timed_out: bool, lost: bool, cwd: str | None,
                 t0: float) -> Outcome:
        return Outcome(cap.value(), code, timed_out, cap.cut, lost, cwd, time.monotonic() - t0)

    def close(self) -> None:
        self.transport.close()


# ----------------------------------------------------------------------------- shared sandbox


class ShellSandbox:
    """What both backends share: exec through the session with recovery, files, diff, close.

    A lost session is replaced by a new one in the last known directory, and the observation
    says so; if that fails too, the backend resets the whole sandbox, and if that fails the
    sandbox is dead (`SandboxDead`, an infrastructure error). `write_file` sends base64 through
    the session (bash reads its script a byte at a time, ~0.5 s per MB).

    A backend provides `_open_session(cwd)`, `_kill_session(session)` (the shell and its
    children), `_reset()` (kill every process; returns what happened to the files, None: kept),
    `_run(cmd, timeout, cap)`,
    `alive` and `_destroy(session)`.
    """

    workdir: str
    command_timeout_s: float
    test_timeout_s: float
    output_cap_bytes: int

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._session: ShellSession | None = None
        self._cwd = self.workdir
        self._dead_reason = ""
        self._closed = False
        self.base_commit = ""
        self.pristine_git = ""  # the backend's copy of the repo's .git, out of the agent's reach

    # hooks ---------------------------------------------------------------------------------
    def _open_session(self, cwd: str) -> ShellSession:
        raise NotImplementedError

    def _kill_session(self, session: ShellSession) -> None:
        raise NotImplementedError

    def _reset(self) -> str | None:
        raise NotImplementedError

    def _run(self, cmd: str, timeout: float, cap_bytes: int) -> Outcome:
        """`timeout_argv(cmd)` as the sandbox user in `workdir`, outside the session."""
        raise NotImplementedError

    def _destroy(self, session: ShellSession | None) -> None:
        """Remove the container / scratch copy and whatever still runs in it."""
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    # lifecycle -----------------------------------------------------------------------------
    def _start_session(self) -> None:
        """First session; records HEAD as the base commit for `diff()` before any agent action."""
        self._session = self._open_session(self.workdir)
        self.base_commit = self._session.head_commit

    def _check_usable(self) -> None:
        if self._closed:
            raise SandboxDead("sandbox is closed")
        if self._dead_reason:
            raise SandboxDead(self._dead_reason)

    def _mark_dead(self, reason: str) -> SandboxDead:
        self._dead_reason = reason
        return SandboxDead(reason)

    def _stops_within(self, settle_s: float = DEATH_SETTLE_S) -> bool:
        """True when the sandbox is (or within `settle_s` becomes) not alive. Why wait: Docker
        can still call a killed container running when its exec streams close, and reading that
        as alive would restart a dead sandbox or grade an infra death as failing tests."""
        deadline = time.monotonic() + settle_s
        while self.alive:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _recover(self, cwd: str) -> str:
        """Replace a lost session; returns the note for the observation, or raises SandboxDead."""
        if self._session is not None:
            old, self._session = self._session, None
            old.close()
            try:
                self._kill_session(old)
            except (SandboxError, OSError):
                pass
        if not self.alive:
            raise self._mark_dead("the sandbox died (container or process is gone)")
        try:
            self._session = self._open_session(cwd)
            return (f"\n[swerl: the shell session ended or hung; a new one was started in {cwd}; "
                    "exported variables and shell functions were reset]")
        except (SandboxError, OSError) as e:
            if self._stops_within():  # a failed new session may be the first sign of death
                raise self._mark_dead(f"the sandbox died (container or process is gone): {e}") from e
            log.warning("%s: a new shell session failed (%s); resetting the sandbox", self.workdir, e)
        try:
            files = self._reset() or f"files in {self.workdir} were kept"
            self._session = self._open_session(cwd)
            return f"\n[swerl: the sandbox was reset: every process was killed, {files}; now in {cwd}]"
        except (SandboxError, OSError) as e:
            raise self._mark_dead(f"the sandbox could not be recovered: {e}") from e

    def _call(self, cmd: str, timeout: float, cap_bytes: int) -> Outcome:
        with self._lock:
            self._check_usable()
            if self._session is None or self._session.in_flight:
                self._recover(self._cwd)  # an interrupted call left unread output behind
            assert self._session is not None
            out = self._session.execute(cmd, timeout, cap_bytes)
            if out.cwd:
                self._cwd = out.cwd
            if out.lost:
                out.note = self._recover(self._cwd)
            return out

    # the Sandbox protocol --------------------------------------------------------------------
    @staticmethod
    def _result(out: Outcome, timeout: float) -> ExecResult:
        text = decode(out.output)
        if out.timed_out:
            text += f"\n[swerl: the command timed out after {timeout:g} s and was killed]"
        text += out.note
        return ExecResult(out.exit_code, text, out.timed_out, out.truncated_bytes, out.duration_s)

    def exec(self, cmd: str, timeout: float | None = None) -> ExecResult:
        """Run `cmd` in the session. A NUL byte is refused (bash would cut the command there)."""
        timeout = timeout or self.command_timeout_s
        if "\0" in cmd:
            return ExecResult(2, f"swerl: the command was not run: it contains a NUL byte (\\x00) at "
                              f"character {cmd.index(chr(0))}, which a shell cannot pass. Remove it.", False, 0, 0.0)
        return self._result(self._call(cmd, timeout, self.output_cap_bytes), timeout)

    def run(self, cmd: str, timeout: float | None = None, cap_bytes: int | None = None) -> ExecResult:
        """A fresh `bash -c` in the work dir (no session state), for grading. Not a login
        shell on purpose: Debian's /etc/profile resets PATH and would hide an image's ENV PATH."""
        timeout = timeout or self.test_timeout_s
        with self._lock:
            self._check_usable()
        return self._result(self._run(cmd, timeout, cap_bytes or GRADING_CAP_BYTES), timeout)

    def _abspath(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def read_bytes(self, path: str) -> bytes:
        """Read as the sandbox user, outside the session: a background job the agent started
        writes to the session's channel and would corrupt the content (one exec, ~60 ms)."""
        p = bash_quote(self._abspath(path))
        cmd = (f"if [ ! -e {p} ]; then exit 2; elif [ -d {p} ]; then exit 21; elif [ ! -f {p} ]; then "
               f"exit {NOT_REGULAR}; elif [ ! -r {p} ]; then exit 13; else exec cat -- {p}; fi")
        with self._lock:
            self._check_usable()
        out = self._run(cmd, self.command_timeout_s, FILE_CAP_BYTES)
        errors = {2: FileNotFoundError, 21: IsADirectoryError, 13: PermissionError}
        if out.exit_code in errors:
            raise errors[out.exit_code](path)
        if out.exit_code == NOT_REGULAR:
            raise NotRegularFile(f"{path} is not a regular file (a FIFO, device or socket)")
        if out.exit_code != 0 or out.truncated_bytes or out.timed_out:
            self._raise_if_dead("read_file")
            why = (f"larger than {FILE_CAP_BYTES} bytes" if out.truncated_bytes else "timed out" if out.timed_out
                   else decode(out.output[-300:]).strip() or f"exit code {out.exit_code}")
            raise UnreadableFile(f"{path} cannot be read: {why}")
        return out.output

    def read_file(self, path: str) -> str:
        return decode(self.read_bytes(path))

    def write_file(self, path: str, content: str | bytes) -> None:
        """Write as the sandbox user (permissions apply), creating parent directories."""
        data = content.encode() if isinstance(content, str) else content
        p = self._abspath(path)
        q = bash_quote(p)
        cmd = (f"{{ [ ! -e {q} ] || [ -f {q} ]; }} || exit {NOT_REGULAR}; "
               f"command -p mkdir -p -- {bash_quote(posixpath.dirname(p))} && "
               f"command -p base64 -d >| {q} <<< '{base64.b64encode(data).decode()}'")
        # the shell reads its script a byte at a time (~0.5 us per byte): scale the timeout
        timeout = self.command_timeout_s + len(data) * 2e-6
        out = self._call(cmd, timeout, self.output_cap_bytes)
        if out.exit_code == NOT_REGULAR:
            raise NotRegularFile(f"{path} is not a regular file (a FIFO, device or socket)")
        if out.exit_code != 0:
            message = decode(out.output).strip()
            if "Permission denied" in message or "Read-only file system" in message:
                raise PermissionError(f"{path}: {message}")
            self._raise_if_dead("write_file")  # else the agent's doing: a full disk, a broken tree
            raise UnwritableFile(f"{path} cannot be written (exit code {out.exit_code}): {message[-300:]}")

    def _raise_if_dead(self, what: str) -> None:
        """After a failed file operation: a gone sandbox is infrastructure (SandboxDead); a live
        one means the failure is the agent's doing, and the caller says so."""
        if self._stops_within():
            raise self._mark_dead(f"the sandbox died during {what}")

    def diff(self) -> str:
        """The work tree against the base commit, new files included, byte-exact (`diff_script`):
        text where every changed file is UTF-8, else all of it as GIT binary patches. What the
        agent did to the tree that breaks the diff raises DiffFailed (its doing, not infra)."""
        if not self.base_commit:
            raise SandboxError(f"{self.workdir} is not a git repository with a commit")
        git_dir = self.pristine_git or f"{self.workdir}/.git"
        with self._lock:
            self._check_usable()
        for binary in (False, True):
            out = self._run(diff_script(self.workdir, git_dir, self.base_commit, binary), self.test_timeout_s,
                            FILE_CAP_BYTES)
            if out.truncated_bytes:
                raise DiffTooLarge(f"the diff is larger than {FILE_CAP_BYTES} bytes")
            if out.exit_code != 0 or out.timed_out:
                self._raise_if_dead("diff")
                why = "timed out" if out.timed_out else decode(out.output[-600:]).strip()
                raise DiffFailed(f"the work tree's changes cannot be listed: {why}")
            try:
                return out.output.decode("utf-8")
            except UnicodeDecodeError:
                continue
        raise DiffFailed("the work tree's changes cannot be written as a UTF-8 patch")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            session, self._session = self._session, None
            if session is not None:
                session.close()
        try:
            self._destroy(session)
        except Exception:  # close() never raises; leaks are swept by label at exit
            pass

    def __enter__(self) -> "ShellSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

