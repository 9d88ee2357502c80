"""The tools, SWEEnv and the prompts' demonstration, against a host-directory sandbox."""

import io
import sys
import types
from pathlib import Path

import pytest

from dir_sandbox import DirSandbox
from environments import prompts
from environments.records import GradeResult, TaskInstance
from environments.sandbox import SandboxDead
from environments.swe_env import SWEEnv, truncate_middle
from swerl.config import EnvironmentConfig

pytestmark = pytest.mark.unit

TASK = TaskInstance(instance_id="t-1", repo="acme/calc", base_commit="HEAD", problem_statement="add() subtracts.",
                    patch="", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[], image="unused")
CALC = '''import os


def add(a, b):
    return a - b


class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n -= 1
        return self.n
'''
LONG = "".join(f"line {i}\n" for i in range(1, 26))  # 25 lines


def make_env(tmp_path: Path, files: dict[str, str], fmt: str = "tools+file", max_chars: int = 4000,
             timeout: float = 20.0) -> SWEEnv:
    cfg = EnvironmentConfig(sandbox="local", window=10, command_timeout_s=timeout)
    root = tmp_path / "repo"
    env = SWEEnv(TASK, cfg, fmt, sandbox_factory=lambda image, c: DirSandbox(root, files),
                 observation_max_chars=max_chars)
    env.reset()
    return env


def run(env: SWEEnv, cmd: str, lang: str = "bash") -> str:
    res = env.step(f"Thinking.\n```{lang}\n{cmd}\n```")
    assert not res.format_error, res.observation
    return res.observation


def body(obs: str) -> str:
    """The observation without its footer line."""
    head, _, last = obs.rpartition("\n")
    assert last.startswith("(Current directory: "), obs
    return head


def content(env: SWEEnv, name: str) -> str:
    return (Path(env.sandbox.workdir) / name).read_text()


@pytest.fixture
def env(tmp_path):
    e = make_env(tmp_path, {"calc.py": CALC, "long.txt": LONG, "pkg/util.py": "def helper():\n    return 1\n",
                            "tests/test_calc.py": "def add(a, b):\n    return 0\n"})
    yield e
    e.close()


# --- footer and viewer ------------------------------------------------------------------------

def test_every_observation_ends_with_the_state_footer(env):
    wd = env.sandbox.workdir
    assert env.reset().endswith(f"(Current directory: {wd}, current file: none)")
    assert "add() subtracts." in env.reset()
    assert run(env, "cd pkg").endswith(f"(Current directory: {wd}/pkg, current file: none)")
    assert run(env, "open util.py").endswith(f"(Current directory: {wd}/pkg, current file: {wd}/pkg/util.py)")
    bad = env.step("no block")
    assert bad.format_error and bad.observation.endswith(f"current file: {wd}/pkg/util.py)")


def test_open_shows_a_numbered_window_with_hidden_line_counts(env):
    out = body(run(env, "open long.txt"))
    lines = out.splitlines()
    assert lines[0] == f"[File: {env.sandbox.workdir}/long.txt (25 lines total)]"
    assert lines[1] == "1:line 1" and lines[10] == "10:line 10"
    assert lines[11] == "[15 lines below]" and "above" not in out


def test_a_one_line_window_shows_exactly_the_line_opened(tmp_path):
    env = make_env(tmp_path, {"long.txt": LONG})
    env.env_cfg = env.env_cfg.model_copy(update={"window": 1})  # the narrowest viewer a curriculum may set
    env.reset()
    try:
        lines = body(run(env, "open long.txt 7")).splitlines()
        assert lines[1:] == ["[6 lines above]", "7:line 7", "[18 lines below]"]
        assert body(run(env, "scroll_down")).splitlines()[2] == "8:line 8"
        edited = body(run(env, "edit 12:12\nline twelve\nend_of_edit")).splitlines()
        assert edited[-3:] == ["[11 lines above]", "12:line twelve", "[13 lines below]"]  # the edit, not its context
    finally:
        env.close()


def test_a_small_window_centres_an_edit_in_trimmed_context(tmp_path):
    env = make_env(tmp_path, {"long.txt": LONG})
    env.env_cfg = env.env_cfg.model_copy(update={"window": 5})
    env.reset()
    try:
        run(env, "open long.txt 1")
        edited = body(run(env, "edit 12:12\nline twelve\nend_of_edit")).splitlines()
        assert edited[-6:-1] == ["10:line 10", "11:line 11", "12:line twelve", "13:line 13", "14:line 14"]
    finally:
        env.close()


def test_scroll_and_goto_move_the_window(env):
    run(env, "open long.txt")
    down = body(run(env, "scroll_down"))
    assert "[10 lines above]" in down and "11:line 11" in down and "20:line 20" in down and "[5 lines below]" in down
    end = body(run(env, "scroll_down"))  # clamped: the last window ends at the last line
    assert "[15 lines above]" in end and "16:line 16" in end and "25:line 25" in end and "below" not in end
    up = body(run(env, "scroll_up"))
    assert "6:line 6" in up and "15:line 15" in up and "[5 lines above]" in up
    at = body(run(env, "goto 20"))
    assert "15:line 15" in at.splitlines()[2] and "24:line 24" in at
    first = body(run(env, "open long.txt 3"))
    assert first.splitlines()[1] == "1:line 1"


def test_viewer_mistakes_are_explained(env):
    assert "No file is open" in run(env, "goto 3")
    assert "No file is open" in run(env, "scroll_down")
    assert "not found" in run(env, "open nope.py")
    assert "is a directory" in run(env, "open pkg")
    run(env, "open long.txt")
    assert "outside" in run(env, "goto 99")
    assert "must be a line number" in run(env, "goto ten")
    assert "Usage: open" in run(env, "open")


# --- edit -------------------------------------------------------------------------------------

def test_edit_replaces_lines_and_shows_the_region(env):
    run(env, "open calc.py")
    out = body(run(env, "edit 5:5\n    return a + b\nend_of_edit"))
    assert "return a + b" in content(env, "calc.py") and "a - b" not in content(env, "calc.py")
    assert "5:    return a + b" in out and "4:def add(a, b):" in out
    assert out.startswith(f"[File: {env.sandbox.workdir}/calc.py (14 lines total)]")


def test_edit_that_breaks_python_syntax_is_refused_and_the_file_kept(env):
    run(env, "open calc.py")
    out = run(env, "edit 4:5\ndef add(a, b:\n    return a + b\nend_of_edit")
    assert "NOT applied" in out and "syntax error" in out
    assert "4:def add(a, b:" in out and "4:def add(a, b):" in out  # would-be and original lines
    assert content(env, "calc.py") == CALC


def test_edit_may_touch_an_already_broken_file_and_non_python_files(tmp_path):
    env = make_env(tmp_path, {"bad.py": "def f(:\n    pass\n", "notes.txt": "a\n"})
    run(env, "open bad.py")
    run(env, "edit 2:2\n    return (\nend_of_edit")  # still broken, but the file was broken before
    assert content(env, "bad.py") == "def f(:\n    return (\n"
    run(env, "edit --file notes.txt 1:1\n(((\nend_of_edit")
    assert content(env, "notes.txt") == "(((\n"
    assert env.ws.file.endswith("notes.txt")


def test_edit_insert_delete_and_range_errors(env):
    run(env, "open calc.py")
    run(env, "edit 1:0\n# header\nend_of_edit")  # START:START-1 inserts before START
    assert content(env, "calc.py").startswith("# header\nimport os\n")
    run(env, "edit 1:1\nend_of_edit")  # an empty body deletes
    assert content(env, "calc.py") == CALC
    assert "Invalid range" in run(env, "edit 40:41\nx\nend_of_edit")
    assert "Invalid range" in run(env, "edit 5:3\nx\nend_of_edit")
    assert "no new lines" in run(env, "edit 2:2")
    assert "Usage: edit" in run(env, "edit abc\nx\nend_of_edit")
    assert content(env, "calc.py") == CALC


# --- replace ----------------------------------------------------------------------------------

def test_replace_unique_text(env):
    run(env, "open calc.py")
    out = body(run(env, "replace 'return a - b' 'return a + b'"))
    assert "5:    return a + b" in out and content(env, "calc.py") == CALC.replace("a - b", "a + b")


def test_replace_absent_or_ambiguous_changes_nothing(env):
    run(env, "open calc.py")
    assert "not found" in run(env, "replace 'a * b' 'a + b'")
    out = run(env, "replace 'self.n' 'self.count'")
    assert "occurs 3 times" in out and "lines 10, 13, 14" in out and "--replace-all" in out
    assert content(env, "calc.py") == CALC
    out = run(env, "replace --replace-all 'self.n' 'self.count'")
    assert "Replaced 3 occurrences" in out and content(env, "calc.py").count("self.count") == 3


def test_replace_multiline_and_quoting(env):
    run(env, "open calc.py")
    run(env, "replace \"def add(a, b):\n    return a - b\" \"def add(a, b):\n    return b + a\"")
    assert "return b + a" in content(env, "calc.py")
    assert "Could not parse" in run(env, "replace 'unbalanced x")
    assert "exactly two" in run(env, "replace 'only-one'")


def test_replace_that_breaks_syntax_is_refused(env):
    run(env, "open calc.py")
    assert "NOT applied" in run(env, "replace 'return a - b' 'return (a'")
    assert content(env, "calc.py") == CALC


# --- search_file, create ----------------------------------------------------------------------

def test_search_file(env):
    run(env, "open calc.py")
    out = body(run(env, "search_file self.n"))
    path = f"{env.sandbox.workdir}/calc.py"
    assert out.splitlines() == [f'Found 3 matches for "self.n" in {path}:', "Line 10:        self.n = 0",
                                "Line 13:        self.n -= 1", "Line 14:        return self.n",
                                f'End of matches for "self.n" in {path}']
    assert "Line 2:" in run(env, "search_file 'return 1' pkg/util.py")
    assert "No matches" in run(env, "search_file zebra")


def test_search_file_with_too_many_hits_asks_to_narrow(tmp_path):
    env = make_env(tmp_path, {"big.txt": "x\n" * 80})
    assert "narrow your search" in run(env, "search_file x big.txt")


def test_create(env):
    out = body(run(env, "create new/mod.py"))
    assert (Path(env.sandbox.workdir) / "new/mod.py").read_text() == ""
    assert "(0 lines total)" in out and env.ws.file.endswith("new/mod.py")
    assert "already exists" in run(env, "create calc.py")
    run(env, "create repro.py\nprint(1)\nend_of_edit")
    assert content(env, "repro.py") == "print(1)\n"
    assert "syntax error" in run(env, "create broken.py\ndef (\nend_of_edit")
    assert not (Path(env.sandbox.workdir) / "broken.py").exists()


# --- rewrite (tools+file) ---------------------------------------------------------------------

def test_rewrite_replaces_the_same_named_function_in_the_open_file(env):
    run(env, "open calc.py")
    out = body(run(env, "def add(a, b):\n    return a + b\n\nprint(add(1, 2))", "python"))
    assert content(env, "calc.py") == CALC.replace("a - b", "a + b")
    assert "replaced function add" in out and "Not applied" in out and "print(add(1, 2))" in out
    assert "5:    return a + b" in out


def test_rewrite_finds_the_file_that_defines_the_function_preferring_source_over_tests(env):
    out = run(env, "def add(a, b):\n    return a + b", "python")
    assert "calc.py: replaced function add" in out
    assert content(env, "calc.py") == CALC.replace("a - b", "a + b")
    assert content(env, "tests/test_calc.py") == "def add(a, b):\n    return 0\n"


def test_rewrite_of_a_lone_method(env):
    run(env, "def inc(self):\n    self.n += 1\n    return self.n", "python")
    assert "        self.n += 1\n" in content(env, "calc.py") and "self.n -= 1" not in content(env, "calc.py")


def test_rewrite_whole_file_and_file_comment(env):
    whole = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\nclass Counter:\n    pass\n"
    out = run(env, "# file: calc.py\n" + whole, "python")
    assert "wrote the whole file" in out and content(env, "calc.py") == whole
    run(env, "# file: extra/new.py\nVALUE = 3", "python")
    assert content(env, "extra/new.py") == "VALUE = 3\n"


def test_rewrite_mistakes_change_nothing(tmp_path):
    env = make_env(tmp_path, {"a.py": "def f():\n    return 1\n", "b.py": "def f():\n    return 2\n"})
    assert "Several files define f" in run(env, "def f():\n    return 3", "python")
    assert "No Python file is open" in run(env, "def g():\n    return 3", "python")
    run(env, "open a.py")
    assert "syntax error" in run(env, "def f(:\n    return 3", "python")
    assert "Nothing to apply" in run(env, "print(f())", "python")
    assert content(env, "a.py") == "def f():\n    return 1\n" and content(env, "b.py") == "def f():\n    return 2\n"


def test_rewrite_is_not_offered_with_tools_only(tmp_path):
    env = make_env(tmp_path, {"a.py": "x = 1\n"}, fmt="tools")
    res = env.step("```python\nx = 2\n```")
    assert res.format_error and content(env, "a.py") == "x = 1\n"


# --- SWEEnv -----------------------------------------------------------------------------------

def test_format_errors_and_refusals_keep_the_episode_going(env):
    res = env.step("I will look around.")
    assert res.format_error and not res.done and res.command is None and "no code block" in res.observation
    res = env.step("```bash\nvim calc.py\n```")
    assert res.format_error and "open FILE" in res.observation
    res = env.step("```bash\nls\n```")
    assert not res.format_error and res.command == "ls" and "calc.py" in res.observation


def test_shell_exit_codes_and_empty_output(env):
    assert "did not produce any output" in run(env, "true")
    assert body(run(env, "echo oops; false")) == "oops\n(exit code 1)"
    assert "no output, exit code 3" in run(env, "exit_with() { return 3; }; exit_with")


def test_command_timeout_is_an_observation(tmp_path):
    env = make_env(tmp_path, {"a.py": ""}, timeout=1.0)
    out = run(env, "echo started; sleep 10")
    assert "started" in out and "timed out after 1 s" in out
    assert "did not produce" in run(env, "true")  # the episode goes on


def test_a_dead_sandbox_raises(env):
    env.sandbox.kill()
    with pytest.raises(SandboxDead):
        env.step("```bash\nls\n```")


def test_long_output_is_cut_in_the_middle_and_the_footer_kept(tmp_path):
    env = make_env(tmp_path, {"a.py": ""}, max_chars=300)
    obs = run(env, "seq 1 2000")
    assert obs.startswith("1\n2\n3\n") and "1999\n2000" in obs and "characters cut from the middle" in obs
    assert len(body(obs)) <= 300 and obs.endswith("current file: none)")
    assert truncate_middle("short", 300) == "short"


def test_submit_ends_the_episode_with_the_diff(env, monkeypatch):
    run(env, "open calc.py")
    run(env, "edit 5:5\n    return a + b\nend_of_edit")
    run(env, "create notes.txt")
    res = env.step("Done.\n```bash\nsubmit\n```")
    assert res.done and res.exit_reason == "submitted" and res.command == "submit"
    assert "+    return a + b" in env.patch and "notes.txt" in env.patch
    with pytest.raises(RuntimeError):
        env.step("```bash\nls\n```")
    seen = {}

    def fake_grade(task, patch, cfg):
        seen.update(task=task, patch=patch)
        return GradeResult(task.instance_id, "resolved", True, True)

    monkeypatch.setitem(sys.modules, "environments.grading", types.SimpleNamespace(grade_prediction=fake_grade))
    assert env.grade().resolved and seen == {"task": TASK, "patch": env.patch}
    sb = env.sandbox
    env.close()
    assert sb.closed and env.sandbox is None
    env.close()  # idempotent


def test_a_too_large_diff_does_not_end_the_episode(env, monkeypatch):
    from environments.sandbox import DiffTooLarge

    def too_large():
        raise DiffTooLarge("the diff is larger than 8 bytes")

    monkeypatch.setattr(env.sandbox, "diff", too_large)
    res = env.step("```bash\nsubmit\n```")
    assert not res.done and env.patch is None and "Not submitted" in res.observation and "8 bytes" in res.observation


def test_step_before_reset_raises():
    env = SWEEnv(TASK, EnvironmentConfig(), sandbox_factory=lambda i, c: None)
    with pytest.raises(RuntimeError):
        env.step("```bash\nls\n```")


# --- prompts ----------------------------------------------------------------------------------

def test_system_prompt_documents_the_tools_of_each_format():
    tools = prompts.system_prompt("tools", 37)
    both = prompts.system_prompt("tools+file", 37)
    for text in (tools, both):
        for name in ("open FILE", "goto", "scroll_down", "search_file", "create", "edit", "end_of_edit", "replace",
                     "submit", "37 lines"):
            assert name in text
    assert "```python" in both and "```python" not in tools
    assert "add() subtracts." in prompts.instance_prompt(TASK)


@pytest.mark.parametrize("fmt", ["tools", "tools+file"])
def test_demo_observations_are_what_the_tools_print(tmp_path, fmt):
    """Replay the demonstration: every observation in it must be what the environment says."""
    env = make_env(tmp_path, {prompts.DEMO_FILE: prompts.DEMO_SOURCE}, fmt=fmt)
    env.task = prompts.DEMO_TASK
    wd = env.sandbox.workdir  # the demo says /testbed, where the real sandboxes keep the repo
    demo = prompts.one_shot_demo(fmt)
    assert demo[0]["content"] == prompts.DEMO_PREFIX + env.reset().replace(wd, "/testbed")
    for i in range(1, len(demo), 2):
        res = env.step(demo[i]["content"])
        assert not res.format_error
        if i + 1 < len(demo):
            assert res.observation.replace(wd, "/testbed") == demo[i + 1]["content"]
    assert res.done and "return width * height" in env.patch


def test_env_shell_runs_typed_actions_and_grades_on_submit(tmp_path, monkeypatch):
    from environments import env_shell

    monkeypatch.setitem(sys.modules, "environments.grading", types.SimpleNamespace(
        grade_prediction=lambda task, patch, cfg: GradeResult(task.instance_id, "resolved", True, True,
                                                   tests_status={"FAIL_TO_PASS": {"success": ["t"], "failure": []}})))
    typed = "open calc.py\n```\nedit 5:5\n    return a + b\nend_of_edit\n```\nno fence here?\n\nsubmit\n"
    out = io.StringIO()
    root = tmp_path / "repo"
    grade = env_shell.run_shell(TASK, EnvironmentConfig(window=10), "tools", stdin=io.StringIO(typed), stdout=out,
                                sandbox_factory=lambda image, c: DirSandbox(root, {"calc.py": CALC}))
    text = out.getvalue()
    assert grade is not None and grade.resolved
    assert "4:def add(a, b):" in text and "+    return a + b" in text and "resolved" in text


# --- the merge behind rewrite (pure) ----------------------------------------------------------

def test_merge_adds_imports_after_the_last_import_and_appends_new_functions():
    from environments.rewrite import merge_code

    m = merge_code(CALC, "import re\n\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n")
    assert m.text.startswith("import os\nimport re\n\n\ndef add(a, b):\n    return a + b\n")
    assert m.text.endswith("        return self.n\n\n\ndef sub(a, b):\n    return a - b\n")
    assert m.changes == ["added import re", "replaced function add", "added function sub"]
    assert m.text.splitlines()[m.span[0] - 1] == "def add(a, b):"  # the span shows the function, not the import


def test_merge_of_a_partial_class_keeps_the_other_methods():
    from environments.rewrite import merge_code

    m = merge_code(CALC, "class Counter:\n    def inc(self):\n        self.n += 1\n        return self.n\n\n"
                         "    def reset(self):\n        self.n = 0\n")
    assert "def __init__(self):\n        self.n = 0" in m.text and "self.n += 1" in m.text
    assert m.text.endswith("        return self.n\n\n    def reset(self):\n        self.n = 0\n")
    assert m.changes == ["replaced method Counter.inc", "added method Counter.reset"]


def test_merge_replaces_decorators_and_refuses_ambiguous_methods():
    from environments.rewrite import MergeError, merge_code

    src = "import functools\n\n\n@functools.cache\ndef f(x):\n    return x\n\n\nclass A:\n    def m(self):\n" \
          "        return 1\n\n\nclass B:\n    def m(self):\n        return 2\n"
    m = merge_code(src, "def f(x):\n    return x + 1\n")
    assert "@functools.cache" not in m.text and "return x + 1" in m.text
    with pytest.raises(MergeError, match="several classes"):
        merge_code(src, "def m(self):\n    return 3\n")


def test_merge_whole_file_only_when_the_block_covers_the_file():
    from environments.rewrite import merge_code

    whole = CALC.replace("a - b", "a + b")
    assert merge_code(CALC, whole).changes == ["wrote the whole file"]
    partial = whole.replace("import os\n", "")  # without the import it is not the whole file: keep it
    m = merge_code(CALC, partial)
    assert m.text.startswith("import os\n") and "return a + b" in m.text and "wrote the whole file" not in m.changes


def test_a_one_line_block_replaces_the_line_it_corrects():
    from environments.rewrite import MergeError, merge_code

    src = "def power(base, exp):\n    x = 1\n    return pow(exp, base)\n"
    m = merge_code(src, "return pow(base, exp)")  # the same tokens reordered: the third line, not the def
    assert m.text == "def power(base, exp):\n    x = 1\n    return pow(base, exp)\n"
    assert m.changes == ["replaced line 3"] and m.span == (3, 3)
    assert merge_code(src, "        x = 2").text.splitlines()[1] == "    x = 2"  # the file's indentation is kept
    for block, says in [("return pow(exp, base)", "already reads"), ("return pow(base, exp", "syntax error"),
                        ("print(power(2, 3))", "Nothing to apply")]:  # not close to any line: not a line fix
        with pytest.raises(MergeError, match=says):
            merge_code(src, block)
    with pytest.raises(MergeError, match="matches lines 2, 3 equally well"):
        merge_code("def f(a, b):\n    g(a, b)\n    g(a, b)\n", "g(b, a)")


def test_a_one_line_fix_replaces_the_quoted_line_even_when_it_equals_another_line():
    """Seen in DAPO rollouts on train tasks: the right fix of the quoted `if not self._isdst(dt):`
    equals a line elsewhere in the file, so "the most similar line" was that one, already
    reading so, and the correct answer changed nothing; `if save_order:` tied with seven lines."""
    from environments.rewrite import MergeError, merge_code

    src = "def a(dt):\n    if not dst(dt):\n        return 1\n\n\ndef b(dt):\n    if dst(dt):\n        return 2\n"
    with pytest.raises(MergeError, match="Line 7 already reads"):  # without the issue's line
        merge_code(src, "if dst(dt):")
    m = merge_code(src, "if dst(dt):", quoted="if not dst(dt):")
    assert m.changes == ["replaced line 2"] and m.text.splitlines()[1] == "    if dst(dt):"
    with pytest.raises(MergeError, match="Line 2 already reads"):  # a copy of the quoted line changes nothing
        merge_code(src, "if not dst(dt):", quoted="if not dst(dt):")
    ties = "def f(o):\n    if o:\n        g()\n    if not o:\n        h()\n    if o:\n        k()\n"
    assert merge_code(ties, "if o:", quoted="if not o:").changes == ["replaced line 4"]
    # the quoted line twice in the file, or a block far from it: the most-similar rule decides
    twice = "def f(a, b):\n    g(a, b)\n    g(a, b)\n    z = 1\n"
    with pytest.raises(MergeError, match="equally well"):
        merge_code(twice, "g(b, a)", quoted="g(a, b)")
    assert merge_code(twice, "z = 2", quoted="g(a, b)").changes == ["replaced line 4"]


def test_quoted_line_reads_back_what_the_level_4_hint_appended():
    from environments.hints import quoted_line, with_line_hint

    assert quoted_line(with_line_hint("The parser fails.", "    if not x:  ")) == "if not x:"
    assert quoted_line("The parser fails.\n\nIt looks wrong.") is None


def test_line_style_env_applies_the_corrected_line(tmp_path):
    env = make_env(tmp_path, {"calc.py": CALC})
    run(env, "open calc.py")
    obs = run(env, "return a + b", "python")
    assert obs.startswith(f"Rewrote {env.sandbox.workdir}/calc.py: replaced line 5.")
    assert "-    return a - b\n+    return a + b" in env.diff()


def test_env_points_a_one_line_fix_at_the_line_its_issue_quotes(tmp_path):
    import dataclasses

    from environments.hints import with_line_hint

    files = {"calc.py": "def add(a, b):\n    return a - b\n\n\ndef plus(a, b):\n    return a + b\n"}
    cfg = EnvironmentConfig(sandbox="local", window=10, command_timeout_s=20.0)
    task = dataclasses.replace(TASK, problem_statement=with_line_hint(TASK.problem_statement, "    return a - b"))
    env = SWEEnv(task, cfg, "tools+file", sandbox_factory=lambda image, c: DirSandbox(tmp_path / "repo", files))
    env.reset()
    run(env, "open calc.py")
    assert run(env, "return a + b", "python").startswith(f"Rewrote {env.sandbox.workdir}/calc.py: replaced line 2.")
    assert "-    return a - b\n+    return a + b" in env.diff()


def test_every_module_parses_python_through_the_one_locked_parser():
    """CPython 3.11's AST constructor fails ("AST constructor recursion depth mismatch") when two
    threads parse at once; curation's two project threads hit it and lost a project. Every parse
    in the library goes through environments.rewrite.parse_python, which holds one lock."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = [f"{f.relative_to(root)}:{n}" for d in ("environments", "training", "swerl", "flows", "tasks")
                 for f in sorted((root / d).rglob("*.py")) if f.name != "rewrite.py"
                 for n, line in enumerate(f.read_text().splitlines(), 1) if re.search(r"\bast\.parse\(", line)]
    assert offenders == []
