"""First-reply probe (no Docker, no grading) for `rollout.prompt_style: line`: the hint-level-4
statement quotes the wrong line and the reply is that line, corrected, in a python block (the
function's source is not shown, as in the line style). A reply counts as fixed when its line
equals the gold line (whitespace ignored). The prompt is the rollout engine's (demo and
prompts.LINE_EXAMPLES first). Train projects only (load_task_spec drops eval tasks).
Numbers: docs/DEMO.md.

    python scripts/demo_line_probe.py T SAMPLES PER_PROJECT [MODEL [MODIFIER,...]]

MODEL is a checkpoint directory (default: the default model); MODIFIERS keeps only those kinds.
"Mixed" counts the tasks whose SAMPLES replies are neither all fixed nor all wrong: the groups
that would carry a DAPO gradient.
"""

from __future__ import annotations

import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from demo_probe import LineBug, first_replies, line_bug, load_task_spec  # noqa: E402
from environments import prompts  # noqa: E402
from environments.records import TaskInstance  # noqa: E402
from environments.sandbox import WORKDIR  # noqa: E402
from training.agent import build_messages  # noqa: E402
from training.chat import ChatFormat  # noqa: E402
from training.inference.base import SamplingParams  # noqa: E402
from training.inference.prefix_cache import PrefixCachingHFBackend  # noqa: E402


def line_prompt(chat: ChatFormat, t: TaskInstance, b: LineBug) -> list[int]:
    """The ids the rollout engine builds for a line-style episode (system, demo and examples, the
    task as SWEEnv states it with the function's file open)."""
    first = prompts.instance_prompt(t, "line") + "\n" + prompts.state_footer(f"{WORKDIR}/{b.path}")
    return chat.prompt_ids(build_messages(first, "tools+file", 100, True, "line", True, True))


def norm(line: str) -> str:
    return re.sub(r"\s+", "", line)


def reply_line(text: str) -> str | None:
    """The one line a reply's python block holds, whitespace removed; None for anything else."""
    m = re.search(r"```python\n(.*?)\n```", text, re.S)
    return norm(m.group(1)) if m and "\n" not in m.group(1).strip() else None


def main(temperature: float, samples: int, per_project: int, model: str = "default",
         modifiers: set[str] | None = None) -> None:
    tasks = load_task_spec(str(ROOT / ".swerl/store"), None, 4, per_project, 0, None, None,
                           {"drop_statement", "drop_branch"})
    if modifiers:
        tasks = [t for t in tasks if t.meta.get("modifier") in modifiers]
    backend = PrefixCachingHFBackend(model, seed=0, threads=2, dtype="bfloat16")
    chat = ChatFormat.from_tokenizer(backend.tokenizer)
    rows = [(t, b, line_prompt(chat, t, b)) for t in tasks if (b := line_bug(t)) is not None]
    print(len(rows), "tasks", sum(len(r[2]) for r in rows) // max(len(rows), 1), "prompt tokens", flush=True)
    sp = chat.sampling(SamplingParams(temperature=temperature, max_new_tokens=64, stop_at_block=True))
    t0 = time.time()
    outs = first_replies(backend, [r[2] for r in rows], samples, sp)
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # fixed, unchanged, other line, n
    solved: dict[str, int] = defaultdict(int)
    for i, text in enumerate(outs):
        t, b, _ = rows[i // samples]
        got = reply_line(text)
        row = kinds[t.meta["modifier"]]
        row[0] += got == norm(b.gold_line)
        row[1] += got == norm(b.bug_line)
        row[2] += got is not None and got not in (norm(b.gold_line), norm(b.bug_line))
        row[3] += 1
        solved[t.instance_id] += got == norm(b.gold_line)
    fixed, n = sum(r[0] for r in kinds.values()), max(len(outs), 1)
    mixed = sum(0 < solved[t.instance_id] < samples for t, _, _ in rows)
    print(f"T={temperature}: fixed {fixed}/{len(outs)} = {fixed / n:.3f}; tasks fixed>=1 "
          f"{sum(v > 0 for v in solved.values())}/{len(rows)}; mixed {mixed}/{len(rows)}; "
          f"{time.time() - t0:.0f}s")
    for kind, (f, same, other, total) in sorted(kinds.items()):
        print(f"  {kind:18s} fixed {f}/{total}  unchanged {same}  other one-liners {other}")
    for i in range(0, len(outs), max(1, len(outs) // 8)):
        b = rows[i // samples][1]
        print("---", b.bug_line.strip(), "=>", b.gold_line.strip(), "|", outs[i][:100].replace("\n", "\\n"))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(float(a[0]), int(a[1]), int(a[2]), a[3] if len(a) > 3 else "default",
         set(a[4].split(",")) if len(a) > 4 else None)
