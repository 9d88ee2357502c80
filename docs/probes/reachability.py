"""How likely is the base policy to write the exact fix? A sampling-free probe for the demo.

For each train task whose hint-level-3 statement names the buggy function, build the agent's
real first prompt (short style, source shown, optional worked example) and score two replies
teacher-forced: the gold function in a python block, and the buggy function copied back.
exp(logp_gold) is the chance that one T=1 sample is exactly the fix (a lower bound on solving
it in one turn); logp_gold - logp_bug says whether the model's prior leans to the fix or to
copying. Grouped by modifier and function length, it says which curriculum a 135M model can
learn from, without sampling thousands of episodes or looking at the eval projects.

No Docker: the project's original file comes from the cached sdist (the gold state), the bug is
applied with `git apply`, and the environment runs on a local sandbox over that one file.

    python scripts/reachability.py --tasks .swerl/store --out /tmp/reach.jsonl [--one-shot]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from demo_probe import load_task_spec, sdist_file  # noqa: E402
from environments.sandbox.local import LocalSandbox  # noqa: E402
from environments.records import TaskInstance  # noqa: E402
from environments.source_view import locate, named_function, without_docstring  # noqa: E402
from environments.swe_env import SWEEnv  # noqa: E402
from swerl.config import EnvironmentConfig  # noqa: E402
from training.agent import build_messages  # noqa: E402
from training.chat import ChatFormat  # noqa: E402
from training.inference.hf import HFBackend  # noqa: E402


def function_reply(source: str, function: str) -> str | None:
    """The reply that rewrites `function` as the short prompt asks: its code in one python block."""
    where = locate(source, function)
    if where is None:
        return None
    code = textwrap.dedent("\n".join(source.split("\n")[where[0] - 1:where[1]]))
    return f"```python\n{without_docstring(code)[0].rstrip()}\n```"


@torch.no_grad()
def reply_logprob(model, prompt: list[int], reply: list[int]) -> float:
    ids = torch.tensor([prompt + reply])
    logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(reply)[:, None]).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--one-shot", action="store_true")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    tasks = [t for t in load_task_spec(args.tasks, None, 3, None) if named_function(t)][: args.limit]
    backend = HFBackend("default", seed=0)
    chat = ChatFormat.from_tokenizer(backend.tokenizer)
    end = backend.tokenizer.encode("<|im_end|>", add_special_tokens=False)
    env_cfg = EnvironmentConfig(sandbox="local", command_timeout_s=20)
    with open(args.out, "w") as out:
        for task in tqdm(tasks, desc="reach"):
            path, function = named_function(task)
            gold_src = sdist_file(task, path)
            if gold_src is None:
                continue
            with tempfile.TemporaryDirectory() as d:
                f = Path(d) / path
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(gold_src)
                (Path(d) / "bug.patch").write_text(task.meta["bug_patch"])
                if subprocess.run(["git", "apply", "--include", path, "bug.patch"], cwd=d,
                                  capture_output=True).returncode != 0:
                    continue
                (Path(d) / "bug.patch").unlink()
                bug_src = f.read_text()
                env = SWEEnv(task, env_cfg, "tools+file", lambda image, cfg: LocalSandbox(d, cfg, isolate=False),
                             prompt_style="short", show_source=True)
                try:
                    first = env.reset()
                finally:
                    env.close()
            gold, bug = function_reply(gold_src, function), function_reply(bug_src, function)
            if not gold or not bug or gold == bug:
                continue
            prompt = chat.prompt_ids(build_messages(first, "tools+file", 100, args.one_shot, "short", True))
            enc = lambda s: backend.tokenizer.encode(s, add_special_tokens=False) + end  # noqa: E731
            lg, lb = reply_logprob(backend.model, prompt, enc(gold)), reply_logprob(backend.model, prompt, enc(bug))
            row = {"task": task.instance_id, "project": task.project, "modifier": task.meta.get("modifier"),
                   "lines": gold.count("\n") - 1, "logp_gold": round(lg, 3), "logp_bug": round(lb, 3),
                   "p_gold": math.exp(lg), "prompt_tokens": len(prompt)}
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
