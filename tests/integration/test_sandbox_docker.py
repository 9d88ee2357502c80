"""The docker backend against a real daemon: protocol, limits, files, diff, lifecycle."""

from __future__ import annotations

import socket
import time

import docker.errors
import pytest

from environments.sandbox import lifecycle
from environments.sandbox import Sandbox, SandboxDead, SandboxError, cleanup_leaked, open_sandbox
from swerl.config import EnvironmentConfig
from tests.sandbox_images import FILES, docker_available, make_test_image

pytestmark = pytest.mark.integration

CFG = EnvironmentConfig(command_timeout_s=5, output_cap_bytes=1000, cpus=0.5, memory="256m",
                        pids_limit=64)


@pytest.fixture(scope="module")
def image() -> str:
    if not docker_available():
        pytest.skip("no Docker daemon")
    return make_test_image()


@pytest.fixture(autouse=True)
def no_container_left_behind():
    yield
    from environments.sandbox.docker import list_containers

    assert list_containers(lifecycle.session_id()) == []


@pytest.fixture
def sb(image):
    with open_sandbox(image, CFG) as box:
        yield box


def test_container_settings(sb):
    from environments.sandbox.docker import TMP_SIZE, WORKTREE_QUOTA, api, quota_bytes, tree_bytes

    info = api().inspect_container(sb.cid)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none" and host["Init"] is True
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    memory = (256 << 20) + quota_bytes(TMP_SIZE, WORKTREE_QUOTA, tree_bytes(sb.image, "/testbed"))  # tmpfs is memory
    assert host["NanoCpus"] == 500_000_000 and host["Memory"] == memory
    assert host["MemorySwap"] == memory and host["PidsLimit"] == 64
    assert set(host["Tmpfs"]) == {"/testbed", "/tmp", "/home/swerl", "/var/tmp", "/run/lock"}
    labels = info["Config"]["Labels"]
    assert "swerl" in labels and labels["swerl.session"] == lifecycle.session_id()
    assert isinstance(sb, Sandbox) and sb.alive


def test_commands_run_as_swerl_without_privileges(sb):
    assert sb.exec("id -un; pwd").output == "swerl\n/testbed\n"
    status = sb.exec("grep -E 'CapEff|NoNewPrivs' /proc/self/status").output.split()
    assert status == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]


def test_session_state_and_protocol(sb):
    sb.exec("cd /tmp && export A=1 && B=2")
    assert sb.exec('echo "$PWD $A $B"').output == "/tmp 1 2\n"
    assert sb.exec("echo err >&2; (exit 5)").exit_code == 5
    assert sb.exec('echo "oops').exit_code == 2
    assert sb.exec("cat; echo done").output == "done\n"
    assert sb.exec("exec >&-").exit_code == 0
    assert sb.exec("printf '%s' \"$PWD\"").output == "/tmp"


def test_exec_is_cheap(sb):
    sb.exec("true")
    t0 = time.perf_counter()
    for _ in range(50):
        sb.exec("true")
    per_call = (time.perf_counter() - t0) / 50
    assert per_call < 0.02  # a raw `docker exec` is ~60 ms; the session ~0.3 ms


def test_timeout_interrupts_and_keeps_the_session(sb):
    sb.exec("export KEEP=1; sleep 100 & echo started")
    r = sb.exec("sleep 100", timeout=1)
    assert r.timed_out and r.exit_code == -1 and "timed out" in r.output
    assert sb.exec("echo $KEEP").output == "1\n"
    # documented: a timeout kills every process the session started, background jobs included
    mine = "for p in /proc/[0-9]*; do [ -O $p ] && cat $p/comm; done 2>/dev/null | grep -c '^sleep$'"
    assert sb.exec(mine).output == "0\n"


def test_exit_and_wedged_shell_are_recovered(sb):
    sb.exec("cd /testbed/.git")
    r = sb.exec("exit")
    assert "new one was started in /testbed/.git" in r.output
    r = sb.exec("while true; do :; done", timeout=1)
    assert r.timed_out
    assert sb.exec("pwd").output == "/testbed/.git\n"


def test_files_are_written_as_swerl_and_bytes_safe(sb):
    blob = bytes(range(256)) * 100
    sb.write_file("data/blob.bin", blob)
    assert sb.read_bytes("/testbed/data/blob.bin") == blob
    assert sb.exec("stat -c %U data/blob.bin").output == "swerl\n"
    with pytest.raises(PermissionError):
        sb.write_file("/etc/passwd", "x")
    with pytest.raises(FileNotFoundError):
        sb.read_file("nope")
    with pytest.raises(PermissionError):
        sb.read_file("/etc/shadow")


def test_diff_against_base_with_new_files(sb):
    assert sb.diff() == ""
    sb.write_file("calc.py", FILES["calc.py"].replace("a - b", "a + b"))
    sb.write_file("extra.bin", b"\x00\x01binary")
    sb.exec("git commit -qam 'agent commit'")
    patch = sb.diff()
    assert "+    return a + b" in patch and "GIT binary patch" in patch
    assert "?? extra.bin" in sb.exec("git status --porcelain").output  # index unchanged
    fresh = sb.run(f"cd /tmp && rm -rf c && git clone -q /testbed c && cd c && git checkout -q "
                   f"{sb.base_commit} && git apply - <<'EOF'\n{patch}EOF\ngit status --short")
    assert fresh.exit_code == 0, fresh.output
    assert "M calc.py" in fresh.output and "extra.bin" in fresh.output


def test_run_is_fresh_and_grading_sized(sb):
    sb.exec("export A=session; cd /")
    r = sb.run('echo "$PWD ${A:-none}"; python3 -m pytest -q 2>&1 | tail -1')
    assert r.output.startswith("/testbed none\n") and "1 failed" in r.output
    assert sb.run("exit 3").exit_code == 3
    r = sb.run("sleep 60", timeout=1)
    assert r.timed_out and r.exit_code == -1 and r.duration_s < 10
    r = sb.run("seq 1 100000")
    assert r.truncated_bytes == 0 and r.output.endswith("100000\n")  # grading keeps the log


def test_quick_output_is_not_lost_when_the_client_reads_the_upgrade_late(sb, monkeypatch):
    """docker-py #3332: frames that arrive with the `101 UPGRADED` headers land in http.client's
    buffer, below which docker-py reads. A loaded client (simulated by a 50 ms pause before the
    headers are read) lost them about half the time: an edited tree's diff came back empty."""
    import http.client

    begin = http.client.HTTPResponse.begin

    def slow_begin(self):
        time.sleep(0.05)
        return begin(self)

    sb.write_file("calc.py", FILES["calc.py"].replace("a - b", "a + b"))
    monkeypatch.setattr(http.client.HTTPResponse, "begin", slow_begin)
    outputs = [sb.run("echo hello").output for _ in range(15)]
    diffs = [sb.diff() for _ in range(5)]
    assert outputs == ["hello\n"] * 15
    assert all("+    return a + b" in d for d in diffs)
    assert sb.exec("echo session").output == "session\n"


def test_a_dead_container_is_an_infra_error(image):
    from environments.sandbox.docker import api

    box = open_sandbox(image, CFG)
    try:
        api().kill(box.cid)
        assert not box.alive
        with pytest.raises(SandboxDead):
            box.exec("echo hi")
        with pytest.raises(SandboxDead):  # and every later call
            box.read_file("calc.py")
    finally:
        box.close()
        box.close()


def test_close_removes_the_container(image):
    from environments.sandbox.docker import api

    box = open_sandbox(image, CFG)
    cid = box.cid
    box.close()
    with pytest.raises(docker.errors.NotFound):
        api().inspect_container(cid)


def test_cleanup_leaked_removes_orphans_and_sessions(image):
    from environments.sandbox.docker import LABEL, api, list_containers

    def orphan(owner: str, session: str) -> str:
        c = api().create_container(image, command=["sleep", "infinity"],
                                   labels={LABEL: "1", "swerl.session": session, "swerl.owner": owner})
        return c["Id"]

    dead = orphan(f"{socket.gethostname()}:999999999:1", "orphan-test")
    foreign = orphan("some-other-host:1:1", "foreign-test")
    try:
        cleanup_leaked()
        ids = {c["Id"] for c in list_containers()}
        assert dead not in ids and foreign in ids  # another host's container is not ours to judge
        cleanup_leaked(session="foreign-test")
        assert foreign not in {c["Id"] for c in list_containers()}
    finally:
        for cid in (dead, foreign):
            try:
                api().remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass


def test_when_no_new_shell_starts_the_container_is_restarted(sb):
    """The last resort before death (e.g. a fork bomb filled the pids limit): kill every
    process, keeping the files; the agent is told. When even that fails, the container is
    restarted and its work tree copied in afresh (its tmpfs is emptied)."""
    sb.exec("cd /testbed && echo kept > kept.txt && echo gone > /tmp/gone.txt")
    real, calls = sb._open_session, []

    def fail_once(cwd):
        calls.append(cwd)
        if len(calls) == 1:
            raise SandboxError("simulated: exec failed")
        return real(cwd)

    sb._open_session = fail_once
    r = sb.exec("exit")
    assert "sandbox was reset: every process was killed, files in /testbed were kept" in r.output
    assert len(calls) == 2 and sb.exec("cat kept.txt /tmp/gone.txt").output == "kept\ngone\n"
    calls.clear()
    sb._set_pids_limit = lambda limit: (_ for _ in ()).throw(SandboxError("simulated: no update"))
    r = sb.exec("exit")
    assert "the container was restarted: /testbed is back to the task's original files" in r.output
    assert sb.exec("ls kept.txt /tmp/gone.txt 2>&1; git status --short").output.count("No such file") == 2


def test_base_image_is_content_addressed_and_cached(image):
    from environments.base_image import BASE_REPO, ensure_base_image, image_id

    t0 = time.monotonic()
    tag = ensure_base_image(progress=lambda line: pytest.fail(f"rebuilt: {line}"))
    assert time.monotonic() - t0 < 5  # a cache hit: no build step printed anything
    assert tag.startswith(f"{BASE_REPO}:") and image_id(tag) == image_id(f"{BASE_REPO}:latest")
    with open_sandbox(tag, CFG) as box:
        assert box.exec("id -u; stat -c %U /testbed; echo $HOME").output == "1000\nswerl\n/home/swerl\n"
        assert box.base_commit == ""  # no repo in the base image
        with pytest.raises(SandboxError, match="not a git repository"):
            box.diff()
