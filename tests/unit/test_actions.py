import pytest

from environments.actions import Action, FormatError, interactive_refusal, parse_action

pytestmark = pytest.mark.unit


def _err(text: str, fmt: str = "tools") -> FormatError:
    out = parse_action(text, fmt)
    assert isinstance(out, FormatError), out
    return out


def _act(text: str, fmt: str = "tools") -> Action:
    out = parse_action(text, fmt)
    assert isinstance(out, Action), out
    return out


def test_shell_block_with_reasoning_around_it():
    a = _act("I will list files.\n```bash\nls -la\n```\nThen I'll look.")
    assert a == Action("shell", "ls -la")


@pytest.mark.parametrize("lang", ["", "bash", "sh", "shell", "BASH"])
def test_shell_languages(lang):
    assert _act(f"```{lang}\necho hi\n```").kind == "shell"


def test_multiline_shell_script_is_one_action():
    a = _act("```bash\ncd src\ngrep -n foo *.py\n```")
    assert a.kind == "shell" and a.text == "cd src\ngrep -n foo *.py"


def test_no_block_is_a_format_error_that_restates_the_rule():
    e = _err("I think the bug is in foo.py, let me run ls")
    assert e.reason == "no_block"
    assert "no code block" in e.message and "exactly ONE" in e.message


def test_two_blocks_is_a_format_error():
    e = _err("```bash\nls\n```\nand\n```bash\npwd\n```")
    assert e.reason == "multiple_blocks" and "2 code blocks" in e.message


def test_a_non_action_block_also_counts_as_a_block():
    assert _err("```text\nsome output\n```\n```bash\nls\n```").reason == "multiple_blocks"


def test_unclosed_block():
    e = _err("Let me look.\n```bash\nopen foo.py\n")
    assert e.reason == "unclosed_block" and "not closed" in e.message


def test_closed_block_plus_unclosed_one():
    assert _err("```bash\nls\n```\n```bash\npwd\n").reason == "multiple_blocks"


def test_empty_block():
    assert _err("```bash\n   \n```").reason == "empty_block"


def test_unknown_language_is_refused():
    e = _err("```diff\n-a\n+b\n```")
    assert e.reason == "bad_language" and "```diff" in e.message


def test_python_block_is_an_error_with_tools_only():
    e = _err("```python\ndef f():\n    return 1\n```", "tools")
    assert e.reason == "bad_language" and "python -c" in e.message


def test_python_block_is_a_rewrite_with_tools_plus_file():
    a = _act("Fixed:\n```python\ndef f():\n    return 1\n```", "tools+file")
    assert a.kind == "rewrite" and a.text == "def f():\n    return 1"


def test_tools_plus_file_error_message_mentions_python_blocks():
    assert "```python" in _err("no block here", "tools+file").message
    assert "```python" not in _err("no block here", "tools").message


@pytest.mark.parametrize("text,tool,args", [
    ("open src/a.py", "open", "src/a.py"),
    ("open src/a.py 120", "open", "src/a.py 120"),
    ("goto 40", "goto", "40"),
    ("scroll_down", "scroll_down", ""),
    ("scroll_up", "scroll_up", ""),
    ("search_file 'def foo' a.py", "search_file", "'def foo' a.py"),
    ("submit", "submit", ""),
])
def test_line_tools(text, tool, args):
    a = _act(f"```bash\n{text}\n```")
    assert (a.kind, a.tool, a.args) == ("tool", tool, args)


def test_leading_comment_lines_do_not_hide_the_tool():
    a = _act("```bash\n# look at the file\nopen a.py\n```")
    assert (a.kind, a.tool, a.args) == ("tool", "open", "a.py")


def test_line_tool_with_more_lines_is_a_format_error():
    e = _err("```bash\nopen a.py\nls\n```")
    assert e.reason == "extra_lines" and "`open` must be alone" in e.message


def test_edit_body_until_end_of_edit_keeps_indentation():
    a = _act("```bash\nedit 3:4\n    return a + b\n\n    x = 1\nend_of_edit\n```")
    assert (a.tool, a.args, a.body) == ("edit", "3:4", "    return a + b\n\n    x = 1")


def test_edit_with_file_flag():
    a = _act("```\nedit --file pkg/m.py 1:1\nimport os\nend_of_edit\n```")
    assert (a.args, a.body) == ("--file pkg/m.py 1:1", "import os")


def test_edit_with_empty_body_deletes_and_without_body_is_none():
    assert _act("```bash\nedit 3:4\nend_of_edit\n```").body == ""
    assert _act("```bash\nedit 3:4\n```").body is None


def test_edit_without_end_of_edit_takes_the_rest_of_the_block():
    assert _act("```bash\nedit 2:2\n    pass\n```").body == "    pass"


def test_text_after_end_of_edit_is_a_format_error():
    assert _err("```bash\nedit 2:2\n    pass\nend_of_edit\nsubmit\n```").reason == "extra_lines"


def test_create_with_and_without_body():
    assert _act("```bash\ncreate t.py\n```").body is None
    assert _act("```bash\ncreate t.py\nprint(1)\nend_of_edit\n```").body == "print(1)"


def test_replace_arguments_may_span_lines():
    a = _act("```bash\nreplace 'a = 1\nb = 2' 'a = 2'\n```")
    assert (a.tool, a.args) == ("replace", "'a = 1\nb = 2' 'a = 2'")


@pytest.mark.parametrize("cmd", [
    "vim a.py", "vi a.py", "nano a.py", "emacs a.py", "sudo nano /etc/hosts", "cd src && vim a.py",
    "less log.txt", "more log.txt", "cat x | less", "top", "man git",
    "python", "python3", "ipython", "python -i script.py", "FOO=1 python3", "bash", "sh", "(python)",
    "git add -p", "git rebase -i HEAD~2", "timeout 10 vim a.py", "exit", "exit 1",
])
def test_interactive_commands_are_refused_with_a_hint(cmd):
    e = _err(f"```bash\n{cmd}\n```")
    assert e.reason == "interactive"
    assert "not available" in e.message or "submit" in e.message


@pytest.mark.parametrize("cmd", [
    "python script.py", "python -c 'import os; print(1)'", "python -m pytest -x", "python3 - <<'EOF'\nprint(1)\nEOF",
    "echo 'print(1)' | python", "python < in.py", "bash run.sh", "sh -c 'ls'", "grep -rn vim .", "echo less",
    "git log --oneline -5", "git diff", "cat > notes.txt <<EOF\nvim is an editor\nEOF", "ls; pwd",
])
def test_non_interactive_commands_pass(cmd):
    assert interactive_refusal(cmd) is None
    assert _act(f"```bash\n{cmd}\n```").kind == "shell"


def test_refusal_message_suggests_the_alternative():
    assert "python -c" in interactive_refusal("python3")
    assert "open FILE" in interactive_refusal("vim x.py")
