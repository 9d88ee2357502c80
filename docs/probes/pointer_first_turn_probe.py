"""First-turn probe for hint level 5: does the base policy open the pointed-at line, or write code?

    PYTHONPATH=. .venv/bin/python docs/probes/pointer_first_turn_probe.py LABEL

2 tasks from each train project of the pinned demo-train set, 4 samples at T=0.5, 24 tokens,
transformers bf16; prints how many replies hold the exact `open FILE LINE`. Train tasks only.
"""
import sys, glob, os, re, torch
from collections import Counter
from transformers import AutoTokenizer, AutoModelForCausalLM
from swerl.config import load_config
from environments.records import load_tasks, at_hint_level
from environments import prompts
from environments.prompts import state_footer
from training.agent import build_messages
import gzip, json
variant = sys.argv[1]
rows = [json.loads(l) for l in gzip.open('data/datasets/demo-train/d27be4af7d08e553.jsonl.gz', 'rt')]
from environments.records import TaskInstance
tasks = [at_hint_level(TaskInstance.from_dict(r), 5) for r in rows]
tasks = [t for t in tasks if t.meta.get('hint_level') == 5]
if any(t.split != 'train' for t in tasks):
    raise SystemExit('refused: an eval-split task reached the probe')
by = {}
for t in tasks: by.setdefault(t.meta['project'], []).append(t)
tasks = [t for p in sorted(by) for t in by[p][:2]]
d = glob.glob(os.path.expanduser('~/.cache/swerl/models/SmolLM2*'))[0]
tok = AutoTokenizer.from_pretrained(d); model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16)
torch.manual_seed(0); torch.set_num_threads(2)
c = Counter()
for t in tasks:
    first = prompts.instance_prompt(t, 'line') + '\n' + state_footer(None)
    msgs = build_messages(first, 'tools+file', 10, True, 'line', False, False, True, True)
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors='pt', return_dict=True)
    out = model.generate(**ids, max_new_tokens=24, do_sample=True, temperature=0.5, num_return_sequences=4)
    for o in out:
        txt = tok.decode(o[ids['input_ids'].shape[1]:], skip_special_tokens=True)
        want = 'open %s %d' % tuple(__import__('environments.hints', fromlist=['x']).pointed_line(t.problem_statement))
        c['exact open' if want in txt else 'open' if 'open' in txt[:20] else 'python' if txt.startswith('```python') else 'other'] += 1
print(variant, len(tasks), dict(c))
