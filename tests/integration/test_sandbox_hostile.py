"""Hostile commands, each in a real container: the sandbox stays usable (or is reported dead,
never rewarded), the host is unharmed, and no container is left behind."""

from __future__ import annotations

import resource
import threading
import time

import pytest

from environments.sandbox import lifecycle
from environments.sandbox import SandboxDead, open_sandbox
from swerl.config import EnvironmentConfig
from tests.sandbox_images import docker_available, make_test_image

pytestmark = pytest.mark.integration

CFG = EnvironmentConfig(command_timeout_s=10, output_cap_bytes=4000, memory="256m", pids_limit=64)


@pytest.fixture(scope="module")
def image() -> str:
    if not docker_available():
        pytest.skip("no Docker daemon")
    return make_test_image()


@pytest.fixture
def sb(image):
    from environments.sandbox.docker import list_containers

    box = open_sandbox(image, CFG, tmp_size="32m", max_file_bytes=64 << 20)
    yield box
    box.close()
    assert list_containers(lifecycle.session_id()) == []


def usable_or_dead(sb) -> bool:
    """After an attack: True when usable; False when reported dead (an infra error)."""
    try:
        return sb.exec("echo ok").output == "ok\n"
    except SandboxDead:
        return False


def test_endless_loops_time_out(sb):
    r = sb.exec("python3 -c 'while True: pass'", timeout=2)
    assert r.timed_out and r.exit_code == -1
    r = sb.exec("while :; do :; done", timeout=2)  # a builtin loop wedges the shell itself
    assert r.timed_out
    assert usable_or_dead(sb)


def test_fork_bomb_hits_the_pids_limit(sb):
    r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 60", timeout=5)
    assert r.timed_out
    assert "Resource temporarily unavailable" in r.output or "retry" in r.output
    assert usable_or_dead(sb)
    count = "ls -d /proc/[0-9]* | wc -l"
    assert int(sb.exec(count).output) < 10  # the bomb is gone, not just paused


def test_memory_bomb_is_oom_killed_inside(sb):
    r = sb.exec("python3 -c 'a = []\nwhile True: a.append(bytearray(10**7) + b\"x\")'", timeout=60)
    assert r.exit_code == 137 and not r.timed_out  # SIGKILL from the container's OOM killer
    assert sb.alive and usable_or_dead(sb)


def test_100mb_of_output_is_capped_with_bounded_host_memory(sb):
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    r = sb.exec("head -c 100000000 /dev/zero | tr '\\0' a; echo; echo END", timeout=120)
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert not r.timed_out and r.exit_code == 0
    assert r.truncated_bytes > 99_000_000 and r.output.endswith("END\n")
    assert len(r.output) < CFG.output_cap_bytes + 200
    assert growth_mib < 20, f"host peak memory grew {growth_mib:.0f} MiB for 100 MB of output"


def test_disk_filling_is_bounded(sb):
    r = sb.exec("head -c 100M /dev/zero > /tmp/fill; stat -c %s /tmp/fill")
    assert "No space left on device" in r.output and int(r.output.split()[-1]) <= 32 << 20
    r = sb.exec("head -c 100M /dev/zero > /testbed/fill; stat -c %s /testbed/fill")
    assert "File size limit exceeded" in r.output and int(r.output.split()[-1]) == 64 << 20
    assert sb.exec("rm /tmp/fill /testbed/fill && echo cleaned").output == "cleaned\n"


def test_no_network(sb):
    r = sb.exec("python3 -c 'import socket; print(socket.if_nameindex())'")
    assert r.output == "[(1, 'lo')]\n"
    # 203.0.113.0/24 is reserved for documentation: nothing would answer even if a packet left
    r = sb.exec("python3 -c 'import socket; socket.create_connection((\"203.0.113.1\", 80), 3)'")
    assert r.exit_code != 0 and "Network is unreachable" in r.output
    r = sb.exec("pip download --no-deps -d /tmp/dl six 2>&1 | tail -1", timeout=60)
    assert "Successfully" not in r.output


def test_killing_everything_is_survived_or_reported(sb):
    r = sb.exec("kill -9 1; echo rc=$?")
    assert "Operation not permitted" in r.output and "rc=1" in r.output  # PID 1 is not ours
    sb.exec("kill -9 -1")
    assert sb.alive and usable_or_dead(sb)
    sb.exec("kill -9 $$")  # the shell itself
    assert usable_or_dead(sb)


def test_writing_outside_the_work_tree_is_denied(sb):
    r = sb.exec("touch /usr/x /etc/x /x /root/x; echo hi >> /etc/passwd")
    assert r.output.count("Permission denied") == 5 and r.exit_code != 0
    with pytest.raises(PermissionError):
        sb.write_file("/usr/bin/python3", "#!/bin/sh\necho pwned\n")
    assert sb.exec("python3 -c 'print(1)'").output == "1\n"
    assert sb.exec("sudo true 2>&1; su -c true 2>&1 </dev/null").exit_code != 0


@pytest.fixture
def stale_alive(sb, monkeypatch) -> None:
    """The sandbox's first look at its container sees it running, as Docker can report a killed
    container for a moment after its exec streams close (CI hit this)."""
    cls, real = type(sb), type(sb).alive
    first = iter([True])
    monkeypatch.setattr(cls, "alive", property(lambda self: next(first, None) or real.fget(self)))


def kill_when_running(sb, needle: str) -> None:
    """Kill the container once `needle` shows in its process list (not after a fixed delay)."""
    from environments.sandbox.docker import api

    def watch() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(needle in " ".join(p) for p in api().top(sb.cid)["Processes"]):
                break
            time.sleep(0.1)
        api().kill(sb.cid)

    threading.Thread(target=watch, daemon=True).start()


def test_death_mid_command_is_an_infra_error(sb):
    kill_when_running(sb, "sleep 30")  # a fixed delay raced a loaded machine
    with pytest.raises(SandboxDead):
        sb.exec("sleep 30")
    with pytest.raises(SandboxDead):
        sb.exec("echo again")


def test_a_killed_container_reported_running_is_not_restarted(sb, stale_alive):
    """The failed new session must be read as death, not as a wedged shell to restart."""
    from environments.sandbox.docker import api

    api().kill(sb.cid)
    api().wait(sb.cid, timeout=20)
    with pytest.raises(SandboxDead, match="died"):
        sb.exec("echo after")
    assert not api().inspect_container(sb.cid)["State"]["Running"]  # not brought back


def test_a_run_killed_with_its_container_is_no_verdict(sb, stale_alive):
    """A 137 from a dying container is an infra error, never a test run that failed."""
    kill_when_running(sb, "sleep 31")
    with pytest.raises(SandboxDead, match="died during run"):
        sb.run("sleep 31", timeout=60)
