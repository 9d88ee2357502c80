"""Turn a model's reply into exactly one action, or a format error that says what went wrong.

The paper's agent acts through exactly one fenced block per turn. Everything outside the block
is free-form reasoning. A reply with no block, two blocks, an unclosed block or an empty block
is a *format error*: the episode continues with an observation that explains the rule, and the
turn is flagged so that training can mask it. Interactive programs (editors, pagers, REPLs) would
hang a non-interactive shell until the timeout (and `exit` would end the shell session), so
they are refused up front with a hint instead; the turn counts as a format error.

With ``action_format == "tools+file"`` a ```python block is also an action: the "rewrite" action
(see environments/tools.py), offered because a small model writes corrected code far more
reliably than it writes ``sed`` or ``edit`` commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

ActionFormat = Literal["tools", "tools+file"]
ActionKind = Literal["shell", "tool", "rewrite"]

SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
PYTHON_LANGS = {"python", "py", "python3"}
# Tools whose whole action is their first line; `edit`/`create` take a body, `replace` takes
# shell-quoted arguments that may span lines.
LINE_TOOLS = {"open", "goto", "scroll_up", "scroll_down", "search_file", "submit"}
BODY_TOOLS = {"edit", "create"}
TOOLS = LINE_TOOLS | BODY_TOOLS | {"replace"}
END_OF_EDIT = "end_of_edit"

# An opening fence at the start of a line, its language tag, its body, and a closing fence alone
# on its line. Closing fences may be indented as far as the opening one.
FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
_FENCE_START = re.compile(r"^[ \t]*```", re.M)


def closes_block(text: str) -> bool:
    """Whether `text` holds a complete fenced block: the action a reply exists to give (a
    sampler with `stop_at_block` ends the reply there)."""
    return FENCE.search(text) is not None


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    text: str  # the block's body as written: what Turn.command records
    tool: str = ""  # for kind "tool": the tool's name
    args: str = ""  # for kind "tool": everything after the name on the first line (replace: all)
    body: str | None = None  # edit/create: the lines after the first one, up to end_of_edit


@dataclass(frozen=True)
class FormatError:
    reason: Literal["no_block", "multiple_blocks", "unclosed_block", "empty_block",
                    "bad_language", "extra_lines", "interactive"]
    message: str  # the observation shown to the agent


def expected_form(action_format: ActionFormat) -> str:
    """One sentence restating the rule; every format-error message ends with it."""
    if action_format == "tools+file":
        return ("Reply with your reasoning and then exactly ONE fenced block: either ```bash with one "
                "command or tool call, or ```python with corrected code for the file.")
    return "Reply with your reasoning and then exactly ONE ```bash fenced block with one command or tool call."


def parse_action(text: str, action_format: ActionFormat = "tools") -> Action | FormatError:
    blocks = [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(text)]
    fences = len(_FENCE_START.findall(text))
    rule = expected_form(action_format)
    if fences > 2 * len(blocks):  # an opening fence without a closing one
        if not blocks:
            return FormatError("unclosed_block", f"Your code block was not closed with ```. {rule}")
        return FormatError("multiple_blocks", f"Your reply has more than one code block (one is not closed). {rule}")
    if not blocks:
        return FormatError("no_block", f"Your reply has no code block, so nothing was run. {rule}")
    if len(blocks) > 1:
        return FormatError("multiple_blocks",
                           f"Your reply has {len(blocks)} code blocks; only one action per turn is allowed. {rule}")
    lang, body = blocks[0]
    body = body.rstrip("\n")
    if not body.strip():
        return FormatError("empty_block", f"Your code block is empty. {rule}")
    if lang in PYTHON_LANGS:
        if action_format == "tools+file":
            return Action("rewrite", body)
        return FormatError("bad_language", "A ```python block is not an action here. Run Python with "
                           "`python -c '...'` or a script file, and change files with edit/replace. " + rule)
    if lang not in SHELL_LANGS:
        return FormatError("bad_language", f"A ```{lang} block is not an action. {rule}")
    return _shell_or_tool(body.strip("\n"), action_format)


def _shell_or_tool(body: str, action_format: ActionFormat) -> Action | FormatError:
    lines = body.split("\n")
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("#")):
        lines = lines[1:]  # leading comments say what the tool call is for; they are not the call
    name, _, args = (lines[0].strip() if lines else "").partition(" ")
    args, rest = args.strip(), lines[1:]
    if name not in TOOLS:
        hint = interactive_refusal(body)
        return FormatError("interactive", hint) if hint else Action("shell", body)
    if name in LINE_TOOLS:
        if any(ln.strip() for ln in rest):
            return FormatError("extra_lines", f"`{name}` must be alone in its block (one action per turn); "
                               f"the other lines were not run. {expected_form(action_format)}")
        return Action("tool", body, name, args)
    if name == "replace":  # its quoted arguments may span lines
        return Action("tool", body, name, "\n".join([args, *rest]).strip())
    stripped = [ln.strip() for ln in rest]
    if END_OF_EDIT in stripped:
        cut = stripped.index(END_OF_EDIT)
        if any(stripped[cut + 1:]):
            return FormatError("extra_lines", f"Nothing may follow `{END_OF_EDIT}` in the block (one action "
                               f"per turn). {expected_form(action_format)}")
        return Action("tool", body, name, args, "\n".join(rest[:cut]))
    # A missing end_of_edit is forgiven when the block ends the body; no body at all is None.
    return Action("tool", body, name, args, "\n".join(rest) if rest else None)


# --- interactive programs ---------------------------------------------------------------------

_EDITORS = {"vim", "vi", "nvim", "nano", "emacs", "pico", "ed", "joe", "mcedit"}
_PAGERS = {"less", "more", "most", "man", "top", "htop", "watch", "tmux", "screen"}
_REPLS = {"python", "python3", "python2", "ipython", "ipython3", "node", "irb", "bash", "sh", "zsh", "gdb", "pdb"}
_PREFIXES = {"sudo", "env", "time", "nohup", "exec", "command", "timeout"}
_GIT_INTERACTIVE = {"-i", "-p", "--interactive", "--patch"}
_PUNCT = "();<>|&\n"
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


def interactive_refusal(cmd: str) -> str | None:
    """A hint when `cmd` would start an interactive program, else None.

    Only command positions are checked, so `grep vim notes.txt` or `echo less` pass. A REPL is
    refused only when it is given nothing to run (no script, no -c/-m, no piped or redirected
    input), which is exactly when it would wait for keyboard input until the timeout.
    """
    for words, fed in _simple_commands(_strip_heredocs(cmd)):
        while words and ("=" in words[0] and not words[0].startswith("-")):  # VAR=value prefixes
            words = words[1:]
        while words and words[0] in _PREFIXES:  # `timeout 10 vim`: skip the prefix and its options
            words = words[1:]
            while words and (words[0].startswith("-") or words[0][:1].isdigit()):
                words = words[1:]
        if not words:
            continue
        prog = words[0].rsplit("/", 1)[-1]
        if prog in {"exit", "logout"}:
            return "Do not exit the shell: it is needed for the rest of the task. When you are done, run `submit`."
        if prog in _EDITORS:
            return (f"`{prog}` is an interactive editor and is not available. Use `open FILE` to view a file "
                    "and `edit`/`replace` (or `create`) to change it.")
        if prog in _PAGERS:
            return (f"`{prog}` is interactive and is not available. Use `open FILE`, `cat FILE`, "
                    "`head`/`tail`, or `grep -n` instead.")
        if prog == "git" and _GIT_INTERACTIVE & set(words[2:]):
            return "Interactive git modes (-i/-p) are not available; run git commands without them."
        if prog in _REPLS:
            args = [w for w in words[1:] if w not in {"-u", "-q", "-B", "-E", "-s", "-S", "--"}]
            if "-i" in args or (not args and not fed):
                if "python" in prog or prog == "pdb":
                    return (f"`{' '.join(words)}` would start an interactive Python session, which is not "
                            "available. Run code with `python -c '...'` or `python script.py`.")
                return (f"`{' '.join(words)}` would start an interactive session, which is not available. "
                        "Run the commands directly, or a script file.")
    return None


def _strip_heredocs(cmd: str) -> str:
    """Drop heredoc bodies: their lines are data, not commands (`cat <<EOF` ... `EOF`)."""
    out, delim = [], None
    for line in cmd.split("\n"):
        if delim is not None:
            if line.strip() == delim:
                delim = None
            continue
        out.append(line)
        m = _HEREDOC.search(line)
        if m:
            delim = m.group(2)
    return "\n".join(out)


def _simple_commands(cmd: str) -> list[tuple[list[str], bool]]:
    """Split a shell line into simple commands: (words, stdin comes from a pipe or redirect)."""
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=_PUNCT)
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:  # unbalanced quotes: the shell will say so itself
        return []
    commands: list[tuple[list[str], bool]] = []
    words: list[str] = []
    fed = skip = False
    for tok in tokens:
        if skip:
            skip = False
            continue
        if tok and all(c in _PUNCT for c in tok):
            if "<" in tok or ">" in tok:  # a redirect; its target is the next word
                fed = fed or "<" in tok
                skip = True
                continue
            commands.append((words, fed))
            words, fed = [], tok.strip() == "|"
            continue
        words.append(tok)
    commands.append((words, fed))
    return commands
