"""`swerl env shell`: play the agent by hand, to see exactly what a model would see.

A person types actions as the model writes them: a line starting with ``` opens a block that a
line ``` closes (needed for `edit` bodies and python rewrites); any other line is taken as a
one-line bash block for convenience. Observations are printed verbatim, format errors included.
`submit` prints the diff and grades it in a fresh container; `:quit` (or end of input) leaves
without grading.
"""

from __future__ import annotations

import json
import sys
from typing import Iterator, TextIO

from environments.actions import ActionFormat
from environments.records import GradeResult, TaskInstance
from environments.swe_env import SandboxFactory, SWEEnv
from swerl.config import EnvironmentConfig

PROMPT = "swerl> "


def read_turns(stdin: TextIO, stdout: TextIO) -> Iterator[str]:
    """Yield one model-style turn per typed action (blocks keep their fences)."""
    block: list[str] | None = None
    stdout.write(PROMPT)
    stdout.flush()
    for raw in stdin:
        line = raw.rstrip("\n")
        if block is not None:
            block.append(line)
            if line.strip() == "```":
                yield "\n".join(block)
                block = None
            else:
                continue
        elif line.lstrip().startswith("```"):
            block = [line]
            continue
        elif line.strip() == ":quit":
            return
        elif line.strip():
            yield f"```bash\n{line}\n```"
        stdout.write(PROMPT)
        stdout.flush()
    if block is not None:  # end of input inside a block: let the parser say it was not closed
        yield "\n".join(block)


def run_shell(task: TaskInstance, env_cfg: EnvironmentConfig, action_format: ActionFormat = "tools+file", *,
              observation_max_chars: int = 4000, sandbox_factory: SandboxFactory | None = None,
              stdin: TextIO | None = None, stdout: TextIO | None = None) -> GradeResult | None:
    """Run one hand-played episode; returns the grade after submit, None when the person quits."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    with SWEEnv(task, env_cfg, action_format, sandbox_factory, observation_max_chars) as env:
        print(env.reset(), file=stdout)
        for turn in read_turns(stdin, stdout):
            res = env.step(turn)
            flag = "\n[format error: this turn would be masked in training]" if res.format_error else ""
            print(res.observation + flag, file=stdout)
            if res.done:
                print(env.patch or "(empty diff)", file=stdout)
                grade = env.grade()
                print(f"grade: status={grade.status} resolved={grade.resolved} patch_applied={grade.patch_applied}"
                      + (f" error={grade.error_reason}" if grade.error_reason else ""), file=stdout)
                print(json.dumps(grade.tests_status, indent=1), file=stdout)
                return grade
    return None
