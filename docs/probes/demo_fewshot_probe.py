"""First-reply probe (no Docker, no grading): a python-block rewrite after K worked examples, one
per bug kind; a reply counts as fixed when its function equals the gold one (AST, docstring
ignored). Train projects only (load_task_spec drops eval tasks). Numbers: docs/DEMO.md.

    python scripts/demo_fewshot_probe.py T K MAX_LINES SAMPLES PER_PROJECT
    python scripts/demo_fewshot_probe.py 0.5 4 8 4 6
"""

from __future__ import annotations

import ast
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from demo_probe import first_replies, line_bug, load_task_spec  # noqa: E402
from environments import prompts  # noqa: E402
from environments.hints import with_line_hint  # noqa: E402
from environments.source_view import without_docstring  # noqa: E402
from training.chat import ChatFormat  # noqa: E402
from training.inference.base import SamplingParams  # noqa: E402
from training.inference.hf import HFBackend  # noqa: E402

# (statement, file, buggy function, fixed function): one per kind of change the bugs need
DEMOS = [(statement, path, source.rstrip("\n"), source.replace(wrong, right).rstrip("\n"))
         for path, _, source, statement, wrong, right in prompts.LINE_EXAMPLES]


def ask(statement: str, path: str, fn: str, code: str, first: int, last: int, wrong: str) -> str:
    """The short-style task prompt at hint level 4 with the function shown."""
    issue = with_line_hint(f"{statement}\n\nThe problem seems to be in `{fn}` in `{path}`.", wrong)
    return (f"<issue>\n{issue}\n</issue>\n\n{prompts.source_block(path, fn, first, last, code)}\n\n"
            f"Write the corrected `{fn.rsplit('.', 1)[-1]}` in one ```python block.")


def body_dump(code: str, name: str) -> str | None:
    """The AST of function `name`'s body in `code`, docstring dropped; None if absent/invalid."""
    try:
        tree = ast.parse(without_docstring(code)[0])
    except SyntaxError:
        return None
    node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == name), None)
    return None if node is None else ast.dump(ast.Module(body=node.body, type_ignores=[]))


def main(temperature: float, k: int, max_lines: int, samples: int, per_project: int) -> None:
    tasks = load_task_spec(str(ROOT / ".swerl/store"), None, 4, per_project, 0, max_lines, None,
                           {"drop_statement", "drop_branch"})
    backend = HFBackend("default", seed=0, threads=2)
    chat = ChatFormat.from_tokenizer(backend.tokenizer)
    head = [{"role": "system", "content": prompts.system_prompt("tools+file", 100, "short")}]
    for statement, path, bug, fixed in DEMOS[:k]:
        fn = bug.split("(")[0].removeprefix("def ")
        wrong = next(a for a, b in zip(bug.splitlines(), fixed.splitlines()) if a != b).strip()
        head += [{"role": "user", "content": ask(statement, path, fn, bug, 1, bug.count("\n") + 1, wrong)},
                 {"role": "assistant", "content": f"```python\n{fixed}\n```"}]
    rows = []
    for t in tasks:
        if (b := line_bug(t)) is None:
            continue
        name = b.function.rsplit(".", 1)[-1]
        statement = t.problem_statement.rsplit("\n\nThe problem seems", 1)[0]
        user = ask(statement, b.path, b.function, b.shown, b.first, b.last, b.bug_line)
        rows.append((t, body_dump(b.gold_code, name), body_dump(b.shown, name), name,
                     chat.prompt_ids(head + [{"role": "user", "content": user}])))
    print(len(rows), "tasks", sum(len(r[4]) for r in rows) // max(len(rows), 1), "prompt tokens", flush=True)
    sp = chat.sampling(SamplingParams(temperature=temperature, max_new_tokens=128, stop_at_block=True))
    t0 = time.time()
    outs = first_replies(backend, [r[4] for r in rows], samples, sp)
    fixed = parsed = unchanged = 0
    per_task: dict[str, int] = {}
    kinds: dict[str, list[int]] = {}
    for i, text in enumerate(outs):
        t, want, bug, name, _ = rows[i // samples]
        m = re.search(r"```python\n(.*?)\n```", text, re.S)
        got = body_dump(m.group(1), name) if m else None
        good = got is not None and got == want
        parsed += got is not None
        unchanged += got is not None and got == bug
        fixed += good
        per_task[t.instance_id] = per_task.get(t.instance_id, 0) + good
        kind = kinds.setdefault(t.meta["modifier"], [0, 0])
        kind[0] += good
        kind[1] += 1
    n = max(len(outs), 1)
    print(f"T={temperature} K={k} maxl={max_lines}: fixed {fixed}/{len(outs)} = {fixed / n:.3f}; parsed def "
          f"{parsed / n:.2f}; unchanged {unchanged / n:.2f}; tasks fixed>=1 "
          f"{sum(v > 0 for v in per_task.values())}/{len(per_task)}; {time.time() - t0:.0f}s")
    print(kinds)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(float(a[0]), int(a[1]), int(a[2]), int(a[3]), int(a[4]))
