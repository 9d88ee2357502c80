"""Prompt styles, the short demonstration, SWEEnv's source view and its verdict cache."""

import sys
import types
from pathlib import Path

import pytest

from dir_sandbox import DirSandbox
from environments import prompts
from environments.records import GradeResult, TaskInstance
from environments.source_view import locate, named_function
from environments.swe_env import SWEEnv
from environments.verdicts import VerdictCache
from swerl.config import EnvironmentConfig

pytestmark = pytest.mark.unit

UTIL = '''import functools


def helper(x):
    return x


class Box:
    """A box."""

    @functools.cache
    def size(self, a, b):
        """Area."""
        return a * a

    def outer(self):
        def inner():
            return 1
        return inner
'''
NAMED = ("Box().size(2, 3) is 4, expected 6.\n\nThe problem seems to be in `Box.size` in `pkg/util.py`.")


def task(statement: str = NAMED, function: str = "Box.size", path: str = "pkg/util.py") -> TaskInstance:
    return TaskInstance(instance_id="t-1", repo="acme/util", base_commit="HEAD", problem_statement=statement,
                        patch="", test_patch="", FAIL_TO_PASS=["t::a"], PASS_TO_PASS=[], image="unused",
                        meta={"mutations": [{"path": path, "function": function, "line": 14}]})


def env_for(tmp_path: Path, t: TaskInstance, files: dict[str, str], style: str = "short",
            show_source: bool = True) -> SWEEnv:
    cfg = EnvironmentConfig(sandbox="local", window=10)
    return SWEEnv(t, cfg, "tools+file", sandbox_factory=lambda image, c: DirSandbox(tmp_path / "repo", files),
                  prompt_style=style, show_source=show_source)


# --- styles -------------------------------------------------------------------------------------

def test_short_style_is_a_fraction_of_the_full_one_and_asks_for_one_python_block():
    full = prompts.system_prompt("tools+file", 100)
    short = prompts.system_prompt("tools+file", 100, style="short")
    assert len(short) * 3 < len(full)
    assert "```python" in short and "submit" in short
    assert "```python" not in prompts.system_prompt("tools", 100, style="short")
    t = task()
    assert prompts.instance_prompt(t, "short", "VIEW", "Box.size").endswith(
        "Write the corrected `size` in one ```python block.")
    assert "then submit" in prompts.instance_prompt(t) and "VIEW" not in prompts.instance_prompt(t)


@pytest.mark.parametrize("show_source, line_hint, style", [(False, False, "short"), (True, False, "short"),
                                                           (True, True, "short"), (True, True, "line")])
def test_short_demo_observations_are_what_the_environment_prints(tmp_path, show_source, line_hint, style):
    demo_task = (prompts.DEMO_TASK_LINE if line_hint else prompts.DEMO_TASK_NAMED) if show_source else prompts.DEMO_TASK
    env = env_for(tmp_path, demo_task, {prompts.DEMO_FILE: prompts.DEMO_SOURCE}, show_source=show_source, style=style)
    demo = prompts.one_shot_demo("tools+file", style, show_source, line_hint)[:4]  # line: examples follow
    assert (demo[1]["content"] == "```python\nreturn width * height\n```") == (style == "line")
    assert ("This line looks wrong: `return width * width`" in demo[0]["content"]) == line_hint
    first = env.reset()
    wd = env.sandbox.workdir
    assert demo[0]["content"] == prompts.DEMO_PREFIX + first.replace(wd, "/testbed")
    assert ("return width * width" in first) == show_source
    for i in range(1, len(demo), 2):
        res = env.step(demo[i]["content"])
        assert not res.format_error
        if i + 1 < len(demo):
            assert res.observation.replace(wd, "/testbed") == demo[i + 1]["content"]
    assert res.done and "return width * height" in env.patch
    env.close()


# --- the source view --------------------------------------------------------------------------

def test_the_named_method_is_shown_dedented_and_becomes_the_target_of_a_python_block(tmp_path):
    env = env_for(tmp_path, task(), {"pkg/util.py": UTIL})
    obs = env.reset()
    assert ("`Box.size` in pkg/util.py, lines 11-14 (docstring not shown):\n```python\n@functools.cache\n"
            "def size(self, a, b):\n    return a * a\n```") in obs
    assert "return x" not in obs and "Area." not in obs  # the named function's code only
    assert obs.endswith("current file: " + env.sandbox.workdir + "/pkg/util.py)")
    res = env.step("```python\ndef size(self, a, b):\n    return a * b\n```")
    assert "replaced method Box.size" in res.observation
    assert "-        return a * a\n+        return a * b" in env.diff()
    env.close()


def test_nothing_is_shown_unless_the_issue_names_the_function_and_file(tmp_path):
    vague = task("Box().size(2, 3) is 4, expected 6.")
    assert named_function(vague) is None
    assert named_function(task()) == ("pkg/util.py", "Box.size")
    env = env_for(tmp_path, vague, {"pkg/util.py": UTIL})
    assert "def size" not in env.reset() and env.ws.file is None
    env.close()
    env = env_for(tmp_path, task(), {"pkg/util.py": UTIL}, show_source=False)
    assert "def size" not in env.reset()
    env.close()


def test_a_docstring_is_hidden_unless_it_is_the_whole_body():
    from environments.source_view import without_docstring

    assert without_docstring('def f():\n    """Doc\n    more."""\n    return 1') == ("def f():\n    return 1", True)
    assert without_docstring('def f():\n    """Only doc."""') == ('def f():\n    """Only doc."""', False)
    assert without_docstring("def f(:") == ("def f(:", False)


def test_locate_finds_methods_decorators_and_encloses_nested_functions():
    assert locate(UTIL, "helper") == (4, 5, 0)
    assert locate(UTIL, "Box.size") == (11, 14, 4)
    assert locate(UTIL, "Box.outer.<locals>.inner") == (16, 19, 4)
    assert locate(UTIL, "missing") is None
    assert locate("def broken(:\n", "broken") is None


# --- verdicts -----------------------------------------------------------------------------------

def test_a_patch_is_graded_once_and_errors_are_graded_again(tmp_path, monkeypatch):
    calls = []
    verdicts = iter(["error", "unresolved", "resolved"])

    def fake_grade(t, patch, cfg):
        calls.append(patch)
        status = next(verdicts)
        return GradeResult(t.instance_id, status, status == "resolved", True,
                           tests_status={"FAIL_TO_PASS": {"success": [], "failure": ["t::a"]}})

    monkeypatch.setitem(sys.modules, "environments.grading", types.SimpleNamespace(grade_prediction=fake_grade))
    monkeypatch.setattr("environments.verdicts.VERDICTS", VerdictCache())
    env = env_for(tmp_path, task(), {"pkg/util.py": UTIL})
    env.reset()
    assert env.grade("P").status == "error"
    first = env.grade("P")
    assert first.status == "unresolved"
    first.tests_status["FAIL_TO_PASS"]["failure"].clear()  # a caller's edit must not reach the cache
    again = env.grade("P")
    assert again.status == "unresolved" and again.tests_status["FAIL_TO_PASS"]["failure"] == ["t::a"]
    assert env.grade("Q").status == "resolved"
    assert calls == ["P", "P", "Q"]
    env.close()


def test_concurrent_graders_of_one_patch_wait_for_the_first_and_redo_an_error():
    """A group's samples finish together: the same patch is graded once, not once per sample."""
    import threading
    import time

    cache, calls, gate = VerdictCache(), [], threading.Event()
    verdicts = iter(["error", "unresolved"])

    def slow_grade():
        calls.append(1)
        gate.wait(5)
        time.sleep(0.05)
        return GradeResult("t", next(verdicts), False, True)

    out: list[str] = []
    threads = [threading.Thread(target=lambda: out.append(cache.get_or_grade("k", slow_grade).status))
               for _ in range(4)]
    for th in threads:
        th.start()
    time.sleep(0.2)
    assert len(calls) == 1  # the other three wait on the first
    gate.set()
    for th in threads:
        th.join(5)
    # the first got an error (never cached): one waiter graded again, the last two reused that
    assert sorted(out) == ["error", "unresolved", "unresolved", "unresolved"] and len(calls) == 2


def test_the_cache_is_bounded():
    cache = VerdictCache(size=2)
    for k in "abc":
        cache.put(k, GradeResult("t", "unresolved", False, True))
    assert cache.get("a") is None and cache.get("c") is not None


def test_the_rollout_config_chooses_the_prompt_the_agent_renders():
    """`rollout.prompt_style` / `show_source` / `one_shot_demo` reach the messages (no silent no-op)."""
    from swerl.config import load_config
    from training.agent import build_messages

    cfg = load_config("smoke", ["rollout.prompt_style=short", "rollout.show_source=true"]).rollout
    short = build_messages("TASK", cfg.action_format, 100, True, cfg.prompt_style, cfg.show_source)
    full = build_messages("TASK", cfg.action_format, 100, False)
    assert short[0]["content"] == prompts.system_prompt(cfg.action_format, 100, "short")
    assert short[1:-1] == prompts.one_shot_demo(cfg.action_format, "short", show_source=True)
    assert "rectangle_area" in short[1]["content"] and short[-1]["content"] == "TASK"
    assert len(full) == 2 and full[0]["content"] == prompts.system_prompt(cfg.action_format, 100, "full")


@pytest.mark.parametrize("i", range(len(prompts.LINE_EXAMPLES)))
def test_line_examples_are_stated_as_the_environment_states_them_and_their_line_fixes_the_file(tmp_path, i):
    path, function, source, statement, wrong, right = prompts.LINE_EXAMPLES[i]
    examples = prompts.line_examples()
    assert examples == prompts.one_shot_demo("tools+file", "line", True, True)[4:]
    ask, answer = examples[2 * i], examples[2 * i + 1]
    env = env_for(tmp_path, prompts.line_example_task(path, function, statement, wrong), {path: source}, style="line")
    first = env.reset()
    assert ask["content"] == first.replace(env.sandbox.workdir, "/testbed")
    assert f"This line looks wrong: `{wrong}`" in first and wrong in source
    res = env.step(answer["content"])
    assert not res.format_error and "replaced line" in res.observation
    assert f"-    {wrong}" in env.diff() and f"+    {right}" in env.diff()
    env.close()


# --- hint level 5: the wrong line pointed at by file and number ----------------------------------

def test_a_pointed_at_line_is_stated_by_number_and_opened_before_it_is_fixed(tmp_path):
    from environments.hints import POINTER_HINT, pointed_line, pointer_statement
    from environments.records import at_hint_level

    bug = "--- a/shapes.py\n+++ b/shapes.py\n@@ -5 +5 @@\n-    return width * height\n+    return width * width\n"
    stored = TaskInstance.from_dict({**prompts.DEMO_TASK.to_dict(), "meta": {
        "statements": {"3": prompts.pointer_example_task("shapes.py", "rectangle_area", prompts.DEMO_STATEMENT
                       + "\n\nTo reproduce:\n\n```python\nfrom shapes import rectangle_area\nprint(rectangle_area(2, 3))\n```",
                       5).problem_statement.rsplit("\n\n", 1)[0]}, "bug_patch": bug,
        "mutations": [{"path": "shapes.py", "function": "rectangle_area", "line": 5}]}})
    t = at_hint_level(stored, POINTER_HINT)
    assert t.meta["hint_level"] == POINTER_HINT and pointed_line(t.problem_statement) == ("shapes.py", 5)
    assert "width * width" not in t.problem_statement  # the line's text is what the agent must look up
    assert pointer_statement("s", bug, []) is None and pointed_line("The wrong line is 5.") is None

    demo = prompts.one_shot_demo("tools+file", "line", pointer=True)
    env = env_for(tmp_path, t, {prompts.DEMO_FILE: prompts.DEMO_SOURCE}, style="line", show_source=False)
    first = env.reset()
    wd = env.sandbox.workdir
    assert "return width" not in first and env.ws.file is None
    assert demo[0]["content"] == prompts.DEMO_PREFIX + first.replace(wd, "/testbed")
    assert demo[1]["content"] == "```python\nprint(rectangle_area(2, 3))\n```"  # written before the line was seen
    quoted = env.step(demo[1]["content"])
    assert quoted.observation.replace(wd, "/testbed") == demo[2]["content"] and env.diff() == ""
    assert "This line looks wrong: `return width * width`" in quoted.observation
    fixed = env.step(demo[3]["content"])
    assert not fixed.format_error and "replaced line 5" in fixed.observation
    assert "-    return width * width\n+    return width * height" in env.diff()
    env.close()
    # the other examples follow the same two turns, each quoting its own wrong line
    assert [m["role"] for m in demo] == ["user", "assistant"] * (2 * (1 + len(prompts.LINE_EXAMPLES)))
    for k, (_, _, _, _, wrong, right) in enumerate(prompts.LINE_EXAMPLES, 1):
        assert f"`{wrong}`" in demo[4 * k + 2]["content"] and demo[4 * k + 3]["content"] == f"```python\n{right}\n```"
    assert "open FILE LINE" in prompts.system_prompt("tools+file", 10, "line", pointer=True)


def test_a_line_fix_written_before_the_pointed_line_was_seen_quotes_it_and_changes_nothing(tmp_path):
    from environments.hints import with_line_pointer

    t = TaskInstance.from_dict({**prompts.DEMO_TASK_NAMED.to_dict(), "problem_statement": with_line_pointer(
        prompts.DEMO_TASK_NAMED.problem_statement, "shapes.py", 5), "meta": {"hint_level": 5}})
    env = env_for(tmp_path, t, {prompts.DEMO_FILE: prompts.DEMO_SOURCE}, style="line", show_source=False)
    env.reset()
    blind = env.step("```python\nreturn width + height\n```")
    assert "Nothing was changed: you have not seen line 5 of shapes.py" in blind.observation
    assert "This line looks wrong: `return width * width`" in blind.observation and env.diff() == ""
    assert "return width + height" not in blind.observation  # the blind try is not applied
    fixed = env.step("```python\nreturn width * height\n```")  # now seen: the fix goes in at line 5
    assert "replaced line 5" in fixed.observation and "+    return width * height" in env.diff()
    env.close()


def test_hint_level_5_needs_the_agent_to_open_the_file_itself():
    from swerl.config import ConfigError, load_config

    cfg = load_config("cpu-demo-multiturn")
    assert cfg.data.hint_level == 5 and not cfg.rollout.show_source
    with pytest.raises(ConfigError, match="hint_level 5"):
        load_config("cpu-demo-multiturn", ["rollout.show_source=true"])  # it would open the file


def test_rft_collects_at_its_own_hint_level_and_turns():
    """RFT may collect where the base policy resolves (the line quoted, one turn) while DAPO and
    evaluation point at the line; the collection's settings obey the same rules."""
    from environments.hints import POINTER_HINT, quoted_line
    from swerl.config import ConfigError, load_config
    from training.data import restated
    from training.stages import episode_spec

    level5 = ["data.hint_level=5", "rollout.show_source=false", "rollout.max_turns=3"]
    cfg = load_config("cpu-demo-multiturn", level5 + ["rft.hint_level=4", "rft.show_source=true", "rft.max_turns=1"])
    collecting = cfg.rft_collection()
    assert (collecting.data.hint_level, collecting.rollout.show_source, collecting.rollout.max_turns) == (4, True, 1)
    assert (cfg.data.hint_level, cfg.rollout.max_turns) == (5, 3)  # the run's own settings are untouched
    spec = episode_spec(collecting)
    assert spec.limits.max_turns == 1 and spec.show_source and episode_spec(cfg).limits.max_turns == 3
    assert load_config("cpu-demo-1turn").rft_collection() == load_config("cpu-demo-1turn")  # none set: the run's own
    with pytest.raises(ConfigError, match="RFT collection"):  # level 4 needs the source shown
        load_config("cpu-demo-multiturn", ["rft.show_source=false"])

    bug = "--- a/shapes.py\n+++ b/shapes.py\n@@ -5 +5 @@\n-    return width * height\n+    return width * width\n"
    stored = TaskInstance.from_dict({**prompts.DEMO_TASK.to_dict(), "meta": {
        "statements": {"3": prompts.DEMO_TASK_NAMED.problem_statement}, "bug_patch": bug,
        "mutations": [{"path": "shapes.py", "function": "rectangle_area", "line": 5}]}})
    pointed = restated([stored], POINTER_HINT)
    assert quoted_line(pointed[0].problem_statement) is None
    quoted = restated(pointed, 4)
    assert quoted[0].meta["hint_level"] == 4 and quoted_line(quoted[0].problem_statement) == "return width * width"
    assert restated([prompts.DEMO_TASK], 4) == [] and len(restated([prompts.DEMO_TASK], 4, exact=False)) == 1
