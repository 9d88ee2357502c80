"""What an agent does inside its sandbox ends as a graded outcome (a verdict, or an observation
it can act on), never as an infrastructure `error`, which is not scored and so would let a
failing policy dodge its 0. Only the machinery failing (here: the container killed from
outside) is an error. Real containers, a real task (the toolz fixture).
"""

from __future__ import annotations

import subprocess

import pytest

from bench.fixture_tasks import load_fixture_tasks
from environments.images import ensure_images
from environments.sandbox import SandboxError
from environments.swe_env import SWEEnv
from swerl.config import EnvironmentConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CFG = EnvironmentConfig(command_timeout_s=20)
TASK_ID = "toolz__get_in-typeerror"
FIX = "sed -i 's/except (KeyError, IndexError):/except (KeyError, IndexError, TypeError):/' toolz/dicttoolz.py"


@pytest.fixture(scope="module")
def task():
    t = next(t for t in load_fixture_tasks() if t.instance_id == TASK_ID)
    t.image = ensure_images([t], progress=lambda line: None)[t.instance_id]
    return t


@pytest.fixture
def env(task):
    with SWEEnv(task, CFG, "tools") as e:
        e.reset()
        yield e


def act(env: SWEEnv, block: str) -> str:
    res = env.step(f"```bash\n{block}\n```")
    assert not res.format_error and not res.done, res.observation
    return res.observation


def submit(env: SWEEnv) -> str:
    res = env.step("```bash\nsubmit\n```")
    return res.observation if not res.done else "SUBMITTED " + res.observation


def test_deleting_git_then_submitting_still_grades_the_fix(env):
    act(env, FIX)
    act(env, "rm -rf .git && git status; echo rc=$?")
    assert submit(env).startswith("SUBMITTED Submitted: 1 file(s) changed")
    assert "+    except (KeyError, IndexError, TypeError):" in env.patch
    assert env.grade().status == "resolved"


def test_deleting_git_without_a_fix_ends_unresolved(env):
    act(env, "rm -rf .git")
    assert env.diff() == ""  # nothing changed, and the diff still works without .git
    act(env, "echo 'garbage' > .git")  # a .git file pointing nowhere: still no changes to send
    assert env.grade().status == "unresolved"


def test_a_corrupted_git_dir_and_unreadable_files_do_not_break_the_diff(env):
    act(env, FIX)
    act(env, "head -c 4096 /dev/urandom > .git/index; rm -rf .git/objects; chmod 000 toolz/dicttoolz.py toolz")
    assert submit(env).startswith("SUBMITTED")
    assert env.grade().status == "resolved"


def test_open_on_a_fifo_or_proc_mem_is_a_tool_error(env):
    act(env, "mkfifo /tmp/pipe")
    assert "is not a regular file" in act(env, "open /tmp/pipe")
    assert "cannot be read" in act(env, "open /proc/self/mem")
    assert "is not a regular file" in act(env, "open /dev/zero")
    act(env, FIX)
    assert submit(env).startswith("SUBMITTED")


def test_a_nul_byte_in_a_command_is_refused_not_cut(env):
    obs = act(env, "echo one\0; rm -rf toolz")
    assert "NUL byte" in obs and "not run" in obs
    assert "dicttoolz.py" in act(env, "ls toolz")  # the rest of the command did not run either


def test_killing_its_own_shell_is_survived(env):
    obs = act(env, "kill -9 $$")
    assert "new one was started" in obs or "sandbox was reset" in obs
    act(env, "kill -9 -1")
    act(env, FIX)
    assert submit(env).startswith("SUBMITTED")
    assert env.grade().status == "resolved"


def test_filling_the_disk_is_told_and_the_episode_still_ends_graded(env):
    obs = act(env, FIX + " && head -c 400M /dev/zero > /tmp/fill; df -h /tmp | tail -1")
    assert "No space left on device" in obs
    told = submit(env)
    assert told.startswith("Not submitted") and "cannot be listed" in told, told
    assert env.diff() == "" and env.diff_problem  # an episode ended here: graded as the empty patch
    assert env.grade().status == "unresolved"
    act(env, "rm /tmp/fill")
    assert submit(env).startswith("SUBMITTED")
    assert env.grade().status == "resolved"


def test_the_container_killed_from_outside_is_an_infra_error(env):
    name = env.sandbox.name  # type: ignore[union-attr]
    subprocess.run(["docker", "kill", name], check=True, capture_output=True)
    with pytest.raises(SandboxError):
        env.step("```bash\necho hi\n```")


def test_a_sandbox_cannot_write_more_than_its_quota_in_total(task):
    """Every place the sandbox user can write is a size-limited tmpfs: filling them all lands at
    most the quota, the agent sees `No space left on device`, and the sandbox stays usable."""
    from environments.sandbox import open_sandbox
    from environments.sandbox.docker import quota_bytes, tree_bytes

    quota = quota_bytes("32m", "64m", tree_bytes(task.image, "/testbed"))  # the repo's own files included
    places = ["/testbed", "/tmp", "/home/swerl", "/var/tmp", "/run/lock", "/dev/shm", "/", "/usr", "/etc", "/opt"]
    with open_sandbox(task.image, CFG, tmp_size="32m", worktree_quota="64m") as sb:
        before = int(sb.exec("du -scb /testbed /home/swerl 2>/dev/null | tail -1 | cut -f1").output)
        fill = "; ".join(f"head -c 200M /dev/zero > {p.rstrip('/')}/fill" for p in places)
        out = sb.exec(f"{fill}; for i in 1 2 3; do head -c 50M /dev/zero > /testbed/more$i; done", timeout=120).output
        total = int(sb.exec(f"du -scb {' '.join(places[:6])} 2>/dev/null | tail -1 | cut -f1").output)
        assert out.count("No space left on device") >= 6 and "Permission denied" in out
        assert sb.exec("echo still here").output == "still here\n"
    print(f"\nwrote 200M to each of {len(places)} places and 3x50M more: {(total - before) / 2**20:.1f} MiB "
          f"landed beside the repo's {before / 2**20:.1f} MiB; {total / 2**20:.1f} MiB in all, "
          f"quota {quota / 2**20:.1f} MiB")
    assert before < total <= quota


def test_a_file_that_is_not_utf8_is_diffed_and_applied_byte_exact(task):
    """No byte is replaced on the way: the patch carries it as a GIT binary patch, and the grader's
    `git apply --binary` in a fresh sandbox reproduces the file exactly."""
    import base64

    from environments.sandbox import open_sandbox

    data = b"# caf\xe9 \xff\xfe\r\nVALUE = 1\n"
    with open_sandbox(task.image, CFG) as sb:
        sb.write_file("toolz/latin1.py", data)
        sb.exec(FIX)
        patch = sb.diff()
    assert "GIT binary patch" in patch and "\ufffd" not in patch
    with open_sandbox(task.image, CFG) as fresh:
        fresh.write_file("/tmp/p.patch", patch)
        res = fresh.run("git apply --binary /tmp/p.patch && base64 -w0 toolz/latin1.py && git diff --stat | tail -1")
    assert res.exit_code == 0, res.output
    assert base64.b64decode(res.output.split()[0]) == data and "1 file changed" in res.output
