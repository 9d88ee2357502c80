"""Multi-turn variants measured 2026-12-03 (docs/DEMO.md), as patches over the current tree, then
`multiturn_probe.py` (train tasks only; it refuses eval-split tasks).

    PYTHONPATH=. .venv/bin/python docs/probes/multiturn_variants_probe.py VARIANT \
        --preset cpu-demo-multiturn --per-project 4 --samples 4 --temperature 0.5 --set ...
    PYTHONPATH=. .venv/bin/python docs/probes/multiturn_variants_probe.py VARIANT swerl dapo ...

VARIANT:
  blind      hint level 5 as the tree runs it, but the environment's answer to a fix written before
             the line was seen is the `open FILE LINE` view, not the line quoted the way a
             hint-level-4 statement quotes it ("This line looks wrong: `...`"), in the worked
             examples too. (The quoted form, once the variant `hint-show`, is now the tree's.)
  redraw     a reply that repeats an earlier reply of its episode is sampled again (up to 4
             times) before the environment sees it: what a filtered RFT collector would get;
  requote    test feedback (level 4): every observation that asks for another try quotes the
             issue's line again ("This line looks wrong: `...`") before the request, in the
             worked example too: the statement's own words, nothing the grader knows.
Patches live here, not in the tree: none of them resolved enough to be kept.

"""

from __future__ import annotations

import re
import sys

import environments.prompts as P
import environments.swe_env as S
import training.agent as A
from environments.hints import quoted_line, with_line_hint
from environments.tools import Text, render_window

REDRAWS = 4
BLIND_WINDOW = 1  # cpu-demo-multiturn's environment.window
DEMO_WRONG = "return width * width"  # the rectangle demo's wrong line


def _examples():
    for path, function, source, statement, wrong, right in [
            (P.DEMO_FILE, "rectangle_area", P.DEMO_SOURCE, P.DEMO_STATEMENT, DEMO_WRONG,
             "return width * height"), *P.LINE_EXAMPLES]:
        line = next(k for k, old in enumerate(Text.parse(source).lines, 1) if old.strip() == wrong)
        call = re.search(rf"{function}\([^)]*\)", statement).group(0)
        reported = (f"{statement}\n\nTo reproduce:\n\n```python\nfrom {path.removesuffix('.py')} import {function}\n"
                    f"print({call})\n```")
        yield path, source, line, wrong, right, call, P.instance_prompt(
            P.pointer_example_task(path, function, reported, line), "line")


def _viewed(path: str, line: int, view: str) -> str:
    return f"Nothing was changed: you have not seen line {line} of {path} yet. `open {path} {line}` shows it:\n{view}\n{P.RETRY}"


def blind_demo(window: int) -> list[dict[str, str]]:
    messages = []
    for i, (path, source, line, wrong, right, call, prompt) in enumerate(_examples()):
        view, _ = render_window(f"{P.WORKDIR}/{path}", Text.parse(source), line - window // 2, window)
        shown = f"{_viewed(path, line, view)}\n{P.state_footer(f'{P.WORKDIR}/{path}')}"
        messages += [{"role": "user", "content": (P.DEMO_PREFIX if i == 0 else "") + prompt + "\n" + P._FOOT_NONE},
                     {"role": "assistant", "content": f"```python\nprint({call})\n```"},
                     {"role": "user", "content": shown},
                     {"role": "assistant", "content": f"```python\n{right}\n```"}]
    return messages


def viewed_show(self: S.SWEEnv) -> str:
    """The tree's answer (the line opened, so that a fix lands in its file), shown as the view."""
    path, line = self._pointed
    view = S.run_tool(self.ws, S.Action("tool", f"open {path} {line}", "open", f"{path} {line}"))
    self._note_view()
    return _viewed(path, line, view)


def patch_redraw() -> None:
    next_request, apply = A.Episode.next_request, A.Episode.apply

    def redrawn_request(self):
        req = next_request(self)
        if req is not None and req.seed is not None and getattr(self, "_redraws", 0):
            req.seed = (req.seed * 31 + self._redraws) % 2 ** 31
        return req

    def apply_unless_repeat(self, completion, chat, gen_time_s):
        text = chat.decode(completion.token_ids).strip()
        if getattr(self, "_redraws", 0) < REDRAWS and any(t.text.strip() == text for t in self.traj.turns):
            self._redraws = getattr(self, "_redraws", 0) + 1
            self.traj.meta["redraws"] = self._redraws
            return
        apply(self, completion, chat, gen_time_s)

    A.Episode.next_request, A.Episode.apply = redrawn_request, apply_unless_repeat


def requote(text: str, line: str | None) -> str:
    """`text` with the issue's quoted line restated before its closing retry request."""
    if not line or f"\n{P.RETRY}" not in text:
        return text
    head, tail = text.rsplit(f"\n{P.RETRY}", 1)
    return head + with_line_hint("", line).rstrip() + f"\n{P.RETRY}" + tail


def patch_requote() -> None:
    observe = S.SWEEnv._observe
    S.SWEEnv._observe = lambda self, body: observe(self, requote(body, quoted_line(self.task.problem_statement)))
    P._LINE_TRIED = requote(P._LINE_TRIED, DEMO_WRONG)


def patch(variant: str) -> None:
    if variant == "blind":
        P.pointer_demo = lambda: blind_demo(BLIND_WINDOW)
        S.SWEEnv._show_pointed = viewed_show
    elif variant == "redraw":
        patch_redraw()
    elif variant == "requote":
        patch_requote()
    else:
        raise SystemExit(f"unknown variant {variant!r}: blind, redraw or requote")


if __name__ == "__main__":  # the engine's spawned workers re-import this file, unpatched: they only sample
    patch(sys.argv.pop(1) if len(sys.argv) > 1 else "")
    if sys.argv[1:2] == ["swerl"]:  # a swerl command under the patch, e.g. `swerl dapo ...`
        from flows.cli import main as swerl_main

        raise SystemExit(swerl_main(sys.argv[2:]))
    sys.path.insert(0, "docs/probes")
    import multiturn_probe

    multiturn_probe.main()
