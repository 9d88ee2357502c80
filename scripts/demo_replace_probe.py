"""First-reply probe (no Docker, no grading): with the wrong line named (hint level 4), does the
policy write `replace 'OLD' 'NEW'` whose NEW is the gold line? Train projects only. Numbers:
docs/DEMO.md.

    python scripts/demo_replace_probe.py T demo|nodemo MAX_LINES SAMPLES
    python scripts/demo_replace_probe.py 0.7 demo 12 4
"""
import sys, json, random, re, shlex, textwrap, time
from pathlib import Path
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / 'scripts'))
from demo_probe import load_task_spec, sdist_file
from environments import prompts
from environments.swe_env import locate, without_docstring, enclosing
from training.chat import ChatFormat
from training.inference.hf import HFBackend
from training.inference.base import SamplingParams

T = float(sys.argv[1]); STYLE = sys.argv[2]; MAXL = int(sys.argv[3]); N = int(sys.argv[4])
tasks = load_task_spec(str(ROOT / '.swerl/store'), None, 4, 6, 0, MAXL, None, {'drop_statement', 'drop_branch'})
SYS = ("You are an expert Python programmer who fixes bugs. Reply with one command in a ```bash block: "
       "replace 'OLD' 'NEW' replaces the text OLD in the file by NEW.")
DEMO_Q = prompts.DEMO_PREFIX + "<issue>\n" + prompts.DEMO_TASK_LINE.problem_statement + "\n</issue>\n\n" + \
    prompts.source_block("shapes.py", "rectangle_area", 4, 5, "def rectangle_area(width, height):\n    return width * width") + \
    "\n\nFix the wrong line with one replace command in a ```bash block."
DEMO_A = "```bash\nreplace 'return width * width' 'return width * height'\n```"
be = HFBackend('default', seed=0)
chat = ChatFormat.from_tokenizer(be.tokenizer)
rows = []
for t in tasks:
    site = t.meta['mutations'][0]
    bp = t.meta['bug_patch']
    gold = [l[1:] for l in bp.splitlines() if l.startswith('-') and not l.startswith('---')][0]
    bug = [l[1:] for l in bp.splitlines() if l.startswith('+') and not l.startswith('+++')][0]
    src = sdist_file(t, site['path'])
    where = locate(src, site['function'])
    lines = src.split('\n')[where[0]-1:where[1]]
    code = textwrap.dedent('\n'.join(lines)).replace(gold.strip(), bug.strip(), 1)
    code = without_docstring(code)[0]
    view = prompts.source_block(site['path'], enclosing(site['function']), where[0], where[1], code)
    q = "<issue>\n" + t.problem_statement + "\n</issue>\n\n" + view + "\n\nFix the wrong line with one replace command in a ```bash block."
    msgs = [{"role": "system", "content": SYS}]
    if STYLE == 'demo':
        msgs += [{"role": "user", "content": DEMO_Q}, {"role": "assistant", "content": DEMO_A}]
    msgs.append({"role": "user", "content": q})
    rows.append((t, gold.strip(), bug.strip(), chat.prompt_ids(msgs)))
print(len(rows), 'tasks', sum(len(r[3]) for r in rows) / len(rows), 'prompt tokens')
sp = chat.sampling(SamplingParams(temperature=T, max_new_tokens=80, stop_at_block=True))
t0 = time.time(); ok = fmt = same = 0; per = {}
prompts_ = [r[3] for r in rows for _ in range(N)]
seeds = list(range(len(prompts_)))
outs = []
for s in range(0, len(prompts_), 16):
    outs += be.generate_rows(prompts_[s:s+16], sp, seeds[s:s+16])
for k, c in enumerate(outs):
    t, gold, bug, _ = rows[k // N]
    text = be.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    m = re.search(r"```bash\n(.*?)\n```", text, re.S)
    good = False
    if m:
        try:
            w = shlex.split(m.group(1))
            if len(w) == 3 and w[0] == 'replace':
                fmt += 1
                new = bug.replace(w[1].strip(), w[2].strip(), 1) if w[1].strip() in bug else None
                same += new == bug
                good = new is not None and new == gold
        except ValueError:
            pass
    ok += good; per[t.instance_id] = per.get(t.instance_id, 0) + good
    if k < 3 * N or good: print(good, t.meta['modifier'], repr(text[:160]))
n = len(outs)
print(f"T={T} {STYLE} maxl={MAXL}: fixed {ok}/{n} = {ok/n:.3f}; well-formed replace {fmt/n:.2f}; no-op {same/n:.2f}; tasks fixed>=1: {sum(v>0 for v in per.values())}/{len(per)}; {time.time()-t0:.0f}s")
