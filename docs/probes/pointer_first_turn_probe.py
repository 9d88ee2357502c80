"""First-turn probe for hint level 5: does the base policy open the pointed-at line, or write code?

    PYTHONPATH=. .venv/bin/python docs/probes/pointer_first_turn_probe.py LABEL

2 tasks from each train project of the pinned demo-train set, 4 samples at T=0.5, 24 tokens,
transformers bf16; prints how many replies hold the exact `open FILE LINE`. Train tasks only.
"""
import glob
import gzip
import json
import os
import sys
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from docs.probes.multiturn_probe import spread
from environments import prompts
from environments.hints import POINTER_HINT, pointed_line
from environments.prompts import state_footer
from environments.records import TaskInstance, at_hint_level
from training.agent import build_messages

label = sys.argv[1]
rows = [json.loads(line) for line in gzip.open("data/datasets/demo-train/d27be4af7d08e553.jsonl.gz", "rt")]
tasks = [at_hint_level(TaskInstance.from_dict(r), POINTER_HINT) for r in rows]
tasks = spread([t for t in tasks if t.meta.get("hint_level") == POINTER_HINT], 2)
if any(t.split != "train" for t in tasks):
    raise SystemExit("refused: an eval-split task reached the probe")
model_dir = glob.glob(os.path.expanduser("~/.cache/swerl/models/SmolLM2*"))[0]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
torch.manual_seed(0)
torch.set_num_threads(2)
counts: Counter[str] = Counter()
for t in tasks:
    first = prompts.instance_prompt(t, "line") + "\n" + state_footer(None)
    msgs = build_messages(first, "tools+file", 10, True, "line", False, False, True, True)
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=24, do_sample=True, temperature=0.5, num_return_sequences=4)
    want = "open %s %d" % pointed_line(t.problem_statement)
    for o in out:
        text = tok.decode(o[ids["input_ids"].shape[1]:], skip_special_tokens=True)
        counts["exact open" if want in text else "open" if "open" in text[:20] else
               "python" if text.startswith("```python") else "other"] += 1
print(label, len(tasks), dict(counts))
