"""Multi-turn episodes with test feedback in a real Docker sandbox: a wrong line is answered
with the failing test's output and undone, an unchanged line is called so, a right line ends
the episode, and the grader (a fresh container) agrees."""

import pytest

from environments.feedback import PASSED_NOTE, UNDONE_NOTE
from environments.hints import LINE_HINT, with_line_hint
from environments.records import TaskInstance
from environments.swe_env import SWEEnv
from swerl.config import EnvironmentConfig
from tests.sandbox_images import docker_available, make_test_image

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def image():
    if not docker_available():
        pytest.skip("docker is not available")
    return make_test_image()


def _task(image: str, **kw) -> TaskInstance:
    statement = with_line_hint("`add(2, 3)` returns -1 instead of 5.\n\nThe problem seems to be in `add` in `calc.py`.",
                               "return a - b")
    return TaskInstance(instance_id="calc-fb-1", repo="acme/calc", base_commit="HEAD", problem_statement=statement,
                        patch="", test_patch=kw.pop("test_patch", ""), FAIL_TO_PASS=["test_calc.py::test_add"], PASS_TO_PASS=[],
                        image=image, test_cmd="python3 -m pytest -rA -p no:cacheprovider test_calc.py",
                        meta={"hint_level": LINE_HINT, "mutations": [{"path": "calc.py", "function": "add", "line": 2}]},
                        **kw)


def _line(env: SWEEnv, line: str):
    res = env.step(f"```python\n{line}\n```")
    assert not res.format_error, res.observation
    return res


def test_a_wrong_line_gets_the_test_output_and_is_undone_then_the_right_one_ends_it(image):
    cfg = EnvironmentConfig(sandbox="docker", command_timeout_s=30)
    with SWEEnv(_task(image), cfg, "tools+file", prompt_style="line", show_source=True, feedback="tests") as env:
        env.reset()
        wrong = _line(env, "return a * b")
        assert not wrong.done
        assert "The failing tests still fail:" in wrong.observation
        assert "assert 6 == 5" in wrong.observation  # the assertion pytest reported, from the real run
        assert UNDONE_NOTE in wrong.observation
        assert env.diff() == ""  # undone: the next try starts from the file as it was
        again = _line(env, "return a * b")  # a try the tests already failed is not run again
        assert not again.done and "You wrote this line already" in again.observation
        same = _line(env, "return a - b")
        # an unchanged line is answered with the failure of the code as it is
        assert not same.done and "changes nothing" in same.observation and "assert -1 == 5" in same.observation
        assert "You wrote this line already" in _line(env, "return a - b").observation
        right = _line(env, "return a + b")
        assert right.done and right.exit_reason == "tests_passed" and PASSED_NOTE in right.observation
        assert "+    return a + b" in env.patch
        assert env.grade().status == "resolved"


def test_code_that_hangs_is_the_agents_failure_and_the_episode_goes_on(image):
    cfg = EnvironmentConfig(sandbox="docker", command_timeout_s=10)  # pytest starts in well under that
    with SWEEnv(_task(image), cfg, "tools+file", prompt_style="line", show_source=True, feedback="tests") as env:
        env.reset()
        hung = env.step("```bash\nedit 2:2\n    return __import__('time').sleep(60)\nend_of_edit\n```")
        assert not hung.done and "did not finish within 10 s" in hung.observation
        assert env.diff() == ""
        right = _line(env, "return a + b")
        assert right.done, right.observation


def test_a_block_that_cannot_apply_still_shows_the_failing_tests(image):
    cfg = EnvironmentConfig(sandbox="docker", command_timeout_s=30)
    with SWEEnv(_task(image), cfg, "tools+file", prompt_style="line", show_source=True, feedback="tests") as env:
        env.reset()
        res = _line(env, "print('hello world, this is not a line of add at all')")
        assert not res.done and "Nothing to apply" in res.observation and "assert -1 == 5" in res.observation
        assert "still fail" not in env.step("```bash\nopen calc.py\n```").observation  # no python block: no tests


def test_hidden_tests_get_no_feedback(image):
    with pytest.raises(ValueError, match="hidden"):
        SWEEnv(_task(image, test_patch="diff --git a/t.py b/t.py\n"), EnvironmentConfig(),
               feedback="tests")
