"""The shell-session protocol and the local backend (no Docker: bwrap when it works here)."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bench.env import percentiles
from environments.sandbox import DiffTooLarge, Sandbox, SandboxDead, open_sandbox
from environments.sandbox.local import LocalSandbox, bwrap_works, parse_size, remove_leaked_scratch
from environments.sandbox.shell_session import OutputCap, bash_quote
from swerl.config import EnvironmentConfig
from tests.sandbox_images import FILES, make_test_repo

pytestmark = pytest.mark.unit

CFG = EnvironmentConfig(sandbox="local", command_timeout_s=5, output_cap_bytes=1000)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return make_test_repo(tmp_path_factory.mktemp("src") / "repo")


@pytest.fixture
def sb(repo):
    with open_sandbox(str(repo), CFG) as box:
        yield box


# ----------------------------------------------------------------------------- pure helpers


def test_output_cap_keeps_head_and_tail_and_counts_the_cut():
    cap = OutputCap(10)
    for piece in [b"0123", b"456789abcdef", b"ghij", b"KLMNOP"]:
        cap.add(piece)
    assert cap.total == 26 and cap.cut == 16
    value = cap.value()
    assert value.startswith(b"01234") and value.endswith(b"LMNOP")
    assert b"16 bytes of output cut" in value


def test_output_cap_below_the_cap_is_exact():
    cap = OutputCap(100)
    cap.add(b"hello\n")
    cap.add(b"world")
    assert cap.value() == b"hello\nworld" and cap.cut == 0


def test_output_cap_memory_is_bounded():
    cap = OutputCap(1000)
    for _ in range(2000):
        cap.add(b"x" * 4096)
    assert len(cap.head) + len(cap.tail) <= 1000 + 2 * 500 + 4096
    assert cap.cut == 2000 * 4096 - 1000


def test_bash_quote_round_trips_any_bytes():
    rng = random.Random(0)
    samples = [b"it's \\ a $'test' \"q\" `x` $(y)\n\t}", bytes(range(1, 256)),
               bytes(rng.randrange(1, 256) for _ in range(500))]  # bash strings cannot hold NUL
    for raw in samples:
        out = subprocess.run(["bash", "-c", f"printf %s {bash_quote(raw)}"], capture_output=True)
        assert out.stdout == raw


def test_parse_size():
    assert parse_size("1g") == 1 << 30
    assert parse_size("512m") == 512 << 20
    assert parse_size("1.5GB") == 3 << 29
    assert parse_size("1024") == 1024
    with pytest.raises(ValueError):
        parse_size("lots")


def test_percentiles_nearest_rank():
    p = percentiles([float(i) for i in range(1, 101)])
    assert (p["p50"], p["p95"], p["min"], p["max"], p["n"]) == (50.0, 95.0, 1.0, 100.0, 100.0)
    assert percentiles([3.0])["p95"] == 3.0
    with pytest.raises(ValueError):
        percentiles([])


# ----------------------------------------------------------------------------- the session


def test_is_a_sandbox_and_isolated_when_bwrap_works(sb):
    assert isinstance(sb, Sandbox)
    assert sb.isolated == bwrap_works()
    assert sb.base_commit and len(sb.base_commit) == 40


def test_state_persists_between_commands(sb):
    assert sb.exec("cd sub 2>/dev/null || mkdir sub && cd sub; export FOO=bar; x=1").exit_code == 0
    r = sb.exec('echo "$PWD $FOO $x"')
    assert r.output.strip() == f"{sb.workdir}/sub bar 1"


def test_exit_codes_and_stderr_are_captured(sb):
    r = sb.exec("echo out; echo err >&2; exit_code() { return 3; }; exit_code")
    assert r.exit_code == 3 and "out" in r.output and "err" in r.output


def test_awkward_commands_do_not_break_the_protocol(sb):
    assert sb.exec('echo "unbalanced').exit_code == 2  # syntax error, reported, not fatal
    assert sb.exec("echo after-syntax-error").output == "after-syntax-error\n"
    assert sb.exec("cat; read line; echo read=$line").output == "read=\n"  # stdin is /dev/null
    assert sb.exec("cat <<'EOF'\n}\n__SWERL_END_x__ 0 /\nEOF").output == "}\n__SWERL_END_x__ 0 /\n"
    assert sb.exec("exec >&- 2>&-").exit_code == 0  # closing stdout must not hang the host
    assert sb.exec("echo still-here").output == "still-here\n"
    assert sb.exec("printf 'no newline'").output == "no newline"


def test_exit_restarts_the_session_in_the_same_directory(sb):
    sb.exec("mkdir -p d && cd d && export GONE=1")
    r = sb.exec("exit 4")
    assert r.exit_code == -1 and "new one was started" in r.output
    assert sb.exec('echo "$PWD:${GONE:-unset}"').output.strip() == f"{sb.workdir}/d:unset"
    r = sb.exec("exec sleep 0")  # exec replaces the shell: same recovery
    assert "new one was started" in r.output
    assert sb.exec("echo ok").output == "ok\n"


def test_timeout_kills_the_command_and_keeps_the_shell(sb):
    sb.exec("export KEEP=yes")
    t0 = time.monotonic()
    r = sb.exec("sleep 30", timeout=1)
    assert r.timed_out and r.exit_code == -1 and "timed out after 1 s" in r.output
    assert time.monotonic() - t0 < 5
    assert sb.exec("echo $KEEP").output == "yes\n"  # same shell: the variable survived


def test_a_builtin_loop_wedges_the_shell_and_it_is_replaced(sb):
    r = sb.exec("while :; do :; done", timeout=1)
    assert r.timed_out and ("new one was started" in r.output or "sandbox was reset" in r.output)
    assert sb.exec("echo ok").output == "ok\n"


def test_output_is_capped_with_a_note(sb):
    r = sb.exec("seq 1 100000")
    assert r.truncated_bytes > 0 and "bytes of output cut" in r.output
    assert r.output.startswith("1\n2\n") and r.output.endswith("99999\n100000\n")
    assert len(r.output.encode()) < CFG.output_cap_bytes + 100


# ----------------------------------------------------------------------------- files and diff


def test_files_round_trip_bytes_and_permissions(sb):
    blob = bytes(range(256)) * 3 + "héllo 'quote' $x".encode()
    sb.write_file("deep/new/blob.bin", blob)
    assert sb.read_bytes("deep/new/blob.bin") == blob
    assert sb.read_bytes(f"{sb.workdir}/deep/new/blob.bin") == blob
    sb.write_file("calc.py", "changed\n")
    assert sb.read_file("calc.py") == "changed\n"
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing.txt")
    with pytest.raises(IsADirectoryError):
        sb.read_file("deep")
    if sb.isolated:
        with pytest.raises(PermissionError):
            sb.write_file("/usr/swerl-should-not-exist", "x")


def test_diff_shows_edits_and_new_files_and_keeps_the_index(sb):
    assert sb.diff() == ""
    sb.write_file("calc.py", FILES["calc.py"].replace("a - b", "a + b"))
    sb.write_file("notes/new.txt", "new file\n")
    sb.exec("git add calc.py && git commit -qm 'agent commit'")  # diff is against the base
    before = sb.exec("git status --porcelain").output
    patch = sb.diff()
    assert "+    return a + b" in patch and "new file mode" in patch and "notes/new.txt" in patch
    assert sb.exec("git status --porcelain").output == before  # the real index is untouched
    assert "?? notes/" in before


def test_diff_too_large_is_not_an_infra_error(sb, monkeypatch):
    import environments.sandbox.shell_session as ss

    monkeypatch.setattr(ss, "FILE_CAP_BYTES", 512)
    sb.write_file("big.txt", "line\n" * 1000)
    with pytest.raises(DiffTooLarge):
        sb.diff()


def test_run_is_a_fresh_shell_with_its_own_timeout(sb):
    sb.exec("cd /; export FOO=session")
    r = sb.run('echo "$PWD ${FOO:-none}"')
    assert r.exit_code == 0 and r.output.strip() == f"{sb.workdir} none"
    assert sb.run("exit 7").exit_code == 7
    r = sb.run("sleep 30", timeout=1)
    assert r.timed_out and r.exit_code == -1 and r.duration_s < 10
    r = sb.run("seq 1 200000", cap_bytes=1000)
    assert r.truncated_bytes > 0


def test_run_does_not_see_host_secrets(sb, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak")
    assert "leak" not in sb.run("env").output + sb.exec("env").output


# ----------------------------------------------------------------------------- isolation


@pytest.mark.skipif(not bwrap_works(), reason="bwrap cannot create namespaces here")
def test_bwrap_isolation(sb):
    r = sb.exec("python3 -c 'import socket; print(socket.if_nameindex())'")
    assert r.output.strip() == "[(1, 'lo')]"  # no interface but loopback: no network
    assert "Read-only file system" in sb.exec("touch /usr/x").output
    sb.exec("kill -9 -1")  # only reaches the sandbox's own pid namespace
    assert sb.exec("echo survived").output == "survived\n"
    assert sb.exec("grep CapEff /proc/self/status").output.split()[-1] == "0000000000000000"


def test_unisolated_fallback_warns_and_works(repo):
    with pytest.warns(RuntimeWarning, match="without bwrap"):
        box = LocalSandbox(str(repo), CFG, isolate=False)
    with box:
        assert box.exec("echo hi; cd /tmp").output == "hi\n"
        assert box.exec("pwd").output == "/tmp\n"
        assert box.exec("sleep 30", timeout=1).timed_out
        assert box.exec("echo ok").output == "ok\n"


# ----------------------------------------------------------------------------- lifecycle


def test_close_is_idempotent_and_removes_the_copy(repo):
    box = open_sandbox(str(repo), CFG)
    scratch = box.scratch
    assert scratch.is_dir()
    box.close()
    box.close()
    assert not scratch.exists() and not box.alive
    with pytest.raises(SandboxDead):
        box.exec("true")
    assert (repo / "calc.py").read_text() == FILES["calc.py"]  # the source is never touched


def test_leaked_scratch_of_a_dead_owner_is_removed(tmp_path):
    import socket
    import tempfile

    dead = Path(tempfile.mkdtemp(prefix=f"swerl-local-{socket.gethostname()}_999999999_1-"))
    ours = Path(tempfile.mkdtemp(prefix="swerl-local-otherhost_1_1-"))
    try:
        removed = remove_leaked_scratch()
        assert str(dead) in removed and not dead.exists()
        assert ours.exists()  # another host's: not ours to judge
    finally:
        shutil.rmtree(ours, ignore_errors=True)



def test_background_output_does_not_corrupt_file_reads(sb):
    sb.exec("(while :; do echo noise; sleep 0.01; done) & echo started")
    sb.write_file("exact.txt", "exact content\n")
    for _ in range(5):
        assert sb.read_file("exact.txt") == "exact content\n"
    assert "noise" in sb.exec("sleep 0.1").output  # the agent still sees its job's output


def _session_members(sid: int) -> list[tuple[int, str]]:
    """(pid, cmdline) of the live processes of session `sid`, the shell itself left out."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == sid:
            continue
        try:
            state, _, _, session = (d / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            cmdline = (d / "cmdline").read_text()
        except OSError:
            continue
        if int(session) == sid and state != "Z":
            found.append((int(d.name), cmdline))
    return found


def test_a_job_the_timeout_killed_is_reported_in_that_commands_output_not_the_next():
    """CI saw `bash: line 8: 17 Killed sleep 100` open the output of the command after a
    timeout: bash reports a killed job when it next gets round to it, and the background job
    here dies after the timed-out command's marker (the kill takes the foreground first)."""
    import os
    import signal

    from environments.sandbox.shell_session import PipeTransport, ShellSession

    proc = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def interrupt(pid: int) -> None:
        for member, _ in sorted(_session_members(pid), key=lambda m: "30" not in m[1]):
            os.kill(member, signal.SIGKILL)
            time.sleep(0.3)  # bash prints the marker for the foreground before the next dies

    assert proc.stdin is not None and proc.stdout is not None
    session = ShellSession(PipeTransport(os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno())),
                           interrupt)
    try:
        session.start("/tmp")
        session.execute("export KEEP=1; sleep 100 & echo started", 5, 1000)
        out = session.execute("sleep 30", 1, 1000)
        assert out.timed_out and not out.lost
        assert b"Killed" in out.output and b"sleep 100" in out.output and b"sleep 30" in out.output
        assert session.execute("echo $KEEP $#", 5, 1000).output == b"1 0\n"
    finally:
        proc.kill()
        proc.wait()
        session.close()
