"""First-reply probe (no Docker, no grading): a python-block rewrite after K worked examples, one
per bug kind; a reply counts as fixed when its function equals the gold one (AST, docstring
ignored). Train projects only (load_task_spec drops eval tasks). Numbers: docs/DEMO.md.

    python scripts/demo_fewshot_probe.py T K MAX_LINES SAMPLES PER_PROJECT
    python scripts/demo_fewshot_probe.py 0.5 4 8 4 6
"""
import sys, ast, re, textwrap, time
from pathlib import Path
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / 'scripts'))
from demo_probe import load_task_spec, sdist_file
from environments import prompts
from environments.swe_env import locate, without_docstring, enclosing
from training.chat import ChatFormat
from training.inference.hf import HFBackend
from training.inference.base import SamplingParams

T = float(sys.argv[1]); K = int(sys.argv[2]); MAXL = int(sys.argv[3]); N = int(sys.argv[4]); PER = int(sys.argv[5])
DEMOS = [  # (statement, file, buggy code, wrong line, fixed code)
    ("`is_even(4)` returns False, but 4 is even.", "nums.py", "def is_even(n):\n    return n % 2 == 1", "return n % 2 == 1", "def is_even(n):\n    return n % 2 == 0"),
    ("`first_or_default([5], 0)` returns 0 instead of 5.", "seq.py", "def first_or_default(items, default):\n    if not items:\n        return items[0]\n    return default", "if not items:", "def first_or_default(items, default):\n    if items:\n        return items[0]\n    return default"),
    ("`clamp_low(1, 3)` returns 1, but it should be 3.", "bounds.py", "def clamp_low(x, low):\n    if x > low:\n        return low\n    return x", "if x > low:", "def clamp_low(x, low):\n    if x < low:\n        return low\n    return x"),
    ("`power(2, 3)` returns 9 instead of 8.", "maths.py", "def power(base, exp):\n    return pow(exp, base)", "return pow(exp, base)", "def power(base, exp):\n    return pow(base, exp)"),
]
def q(statement, path, fn, code, first, last, line):
    issue = f"{statement}\n\nThe problem seems to be in `{fn}` in `{path}`.\n\nThis line looks wrong: `{line}`"
    return "<issue>\n" + issue + "\n</issue>\n\n" + prompts.source_block(path, fn, first, last, code) + f"\n\nWrite the corrected `{fn.rsplit('.',1)[-1]}` in one ```python block."
tasks = load_task_spec(str(ROOT / '.swerl/store'), None, 4, PER, 0, MAXL, None, {'drop_statement', 'drop_branch'})
be = HFBackend('default', seed=0, threads=2)
chat = ChatFormat.from_tokenizer(be.tokenizer)
msgs0 = [{"role": "system", "content": prompts.system_prompt("tools+file", 100, "short")}]
for st, path, code, line, fixed in DEMOS[:K]:
    fn = code.split("(")[0][4:]
    msgs0 += [{"role": "user", "content": q(st, path, fn, code, 1, code.count("\n") + 1, line)},
              {"role": "assistant", "content": f"```python\n{fixed}\n```"}]
def fdef(code, name):
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError:
        return None
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
            body = n.body[1:] if n.body and isinstance(n.body[0], ast.Expr) and isinstance(getattr(n.body[0], 'value', None), ast.Constant) and isinstance(n.body[0].value.value, str) else n.body
            return ast.dump(ast.Module(body=body, type_ignores=[]))
    return None
rows = []
for t in tasks:
    site = t.meta['mutations'][0]; bp = t.meta['bug_patch']
    gold = [l[1:] for l in bp.splitlines() if l.startswith('-') and not l.startswith('---')][0]
    bug = [l[1:] for l in bp.splitlines() if l.startswith('+') and not l.startswith('+++')][0]
    src = sdist_file(t, site['path']); where = locate(src, site['function'])
    gcode = textwrap.dedent('\n'.join(src.split('\n')[where[0]-1:where[1]]))
    code = without_docstring(gcode.replace(gold.strip(), bug.strip(), 1))[0]
    name = enclosing(site['function']).rsplit('.', 1)[-1]
    prompt = msgs0 + [{"role": "user", "content": q(t.problem_statement.rsplit("\n\nThe problem seems", 1)[0], site['path'], enclosing(site['function']), code, where[0], where[1], bug)}]
    rows.append((t, fdef(gcode, name), fdef(code, name), name, chat.prompt_ids(prompt)))
print(len(rows), 'tasks', sum(len(r[4]) for r in rows) // len(rows), 'prompt tokens', flush=True)
sp = chat.sampling(SamplingParams(temperature=T, max_new_tokens=128, stop_at_block=True))
t0 = time.time(); ok = same = fmt = 0; per = {}; kinds = {}
ps = [r[4] for r in rows for _ in range(N)]
outs = []
for s in range(0, len(ps), 16):
    outs += be.generate_rows(ps[s:s+16], sp, list(range(s, min(s + 16, len(ps)))))
for k, c in enumerate(outs):
    t, g, b, name, _ = rows[k // N]
    text = be.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    m = re.search(r"```python\n(.*?)\n```", text, re.S)
    got = fdef(m.group(1), name) if m else None
    fmt += got is not None; same += got is not None and got == b
    good = got is not None and got == g
    ok += good; per[t.instance_id] = per.get(t.instance_id, 0) + good
    mk = t.meta['modifier']; kinds.setdefault(mk, [0, 0]); kinds[mk][0] += good; kinds[mk][1] += 1
n = len(outs)
print(f"T={T} K={K} maxl={MAXL}: fixed {ok}/{n} = {ok/n:.3f}; parsed def {fmt/n:.2f}; unchanged {same/n:.2f}; tasks fixed>=1 {sum(v>0 for v in per.values())}/{len(per)}; {time.time()-t0:.0f}s")
print(kinds)
