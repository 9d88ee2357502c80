"""First-reply probe (no Docker, no grading): with the wrong line named (hint level 4), does the
policy write `replace 'OLD' 'NEW'` that turns the buggy line into the gold one? Train projects
only (load_task_spec drops eval tasks). Numbers: docs/DEMO.md.

    python scripts/demo_replace_probe.py T demo|nodemo MAX_LINES SAMPLES
    python scripts/demo_replace_probe.py 0.7 demo 12 4
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from demo_probe import first_replies, line_bug, load_task_spec  # noqa: E402
from environments import prompts  # noqa: E402
from training.chat import ChatFormat  # noqa: E402
from training.inference.base import SamplingParams  # noqa: E402
from training.inference.hf import HFBackend  # noqa: E402

SYSTEM = ("You are an expert Python programmer who fixes bugs. Reply with one command in a ```bash block: "
          "replace 'OLD' 'NEW' replaces the text OLD in the file by NEW.")
INSTRUCTION = "\n\nFix the wrong line with one replace command in a ```bash block."
DEMO_VIEW = prompts.source_block(prompts.DEMO_FILE, "rectangle_area", 4, 5,
                                 "def rectangle_area(width, height):\n    return width * width")
DEMO = [{"role": "user", "content": prompts.DEMO_PREFIX + f"<issue>\n{prompts.DEMO_TASK_LINE.problem_statement}"
         f"\n</issue>\n\n{DEMO_VIEW}{INSTRUCTION}"},
        {"role": "assistant", "content": "```bash\nreplace 'return width * width' 'return width * height'\n```"}]


def replaced(text: str, bug: str) -> tuple[bool, str | None]:
    """(well-formed replace command, the buggy line after it or None)."""
    m = re.search(r"```bash\n(.*?)\n```", text, re.S)
    try:
        words = shlex.split(m.group(1)) if m else []
    except ValueError:
        return False, None
    if len(words) != 3 or words[0] != "replace":
        return False, None
    old, new = words[1].strip(), words[2].strip()
    return True, (bug.replace(old, new, 1) if old and old in bug else None)


def main(temperature: float, with_demo: bool, max_lines: int, samples: int) -> None:
    tasks = load_task_spec(str(ROOT / ".swerl/store"), None, 4, 6, 0, max_lines, None,
                           {"drop_statement", "drop_branch"})
    backend = HFBackend("default", seed=0)
    chat = ChatFormat.from_tokenizer(backend.tokenizer)
    head = [{"role": "system", "content": SYSTEM}] + (DEMO if with_demo else [])
    rows = []
    for t in tasks:
        if (b := line_bug(t)) is None:
            continue
        view = prompts.source_block(b.path, b.function, b.first, b.last, b.shown)
        user = f"<issue>\n{t.problem_statement}\n</issue>\n\n{view}{INSTRUCTION}"
        rows.append((t, (b.gold_line, b.bug_line), chat.prompt_ids(head + [{"role": "user", "content": user}])))
    print(len(rows), "tasks", sum(len(r[2]) for r in rows) / max(len(rows), 1), "prompt tokens", flush=True)
    sp = chat.sampling(SamplingParams(temperature=temperature, max_new_tokens=80, stop_at_block=True))
    t0 = time.time()
    outs = first_replies(backend, [r[2] for r in rows], samples, sp)
    fixed = formed = noop = 0
    per_task: dict[str, int] = {}
    for i, text in enumerate(outs):
        t, (gold_line, bug_line), _ = rows[i // samples]
        ok, after = replaced(text, bug_line)
        good = after == gold_line
        formed += ok
        noop += after == bug_line
        fixed += good
        per_task[t.instance_id] = per_task.get(t.instance_id, 0) + good
    n = max(len(outs), 1)
    print(f"T={temperature} {'demo' if with_demo else 'nodemo'} maxl={max_lines}: fixed {fixed}/{len(outs)} = "
          f"{fixed / n:.3f}; well-formed replace {formed / n:.2f}; no-op {noop / n:.2f}; tasks fixed>=1: "
          f"{sum(v > 0 for v in per_task.values())}/{len(per_task)}; {time.time() - t0:.0f}s")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(float(a[0]), a[1] == "demo", int(a[2]), int(a[3]))
