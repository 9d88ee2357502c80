"""Grading: does a candidate patch make the task's tests pass, judged the way SWE-bench judges.

One FRESH sandbox of the instance image per verdict (nothing the agent did survives). The patch
is first held to the source rule (environments/patch_scope.py: only the repository's own source
files, never tests, configs, root modules or anything else Python or pytest would load); one
outside it is `unresolved` with the reasons, and no test runs. Then one script
(`grading_script`): apply the patch, restore the test files and apply `test_patch`, run
`test_cmd` (with TEST_ENV: no user site, no bytecode written); the log is parsed per test and
judged by SWE-bench's own report functions (`get_eval_tests_report` / `get_resolution_status`,
called, not re-implemented): a test
succeeds when PASSED or XFAIL; resolved iff every FAIL_TO_PASS and PASS_TO_PASS test succeeds.
Status `error` (with `error_reason`) is for verdicts we could not reach, never a silent 0 (see
`verdict`); a patch that breaks importing the tests is the patch's fault: `unresolved`.
"""

from __future__ import annotations

import inspect
import logging
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from swebench.harness.constants import (
    APPLY_PATCH_FAIL, FAIL_ONLY_REPOS, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT, EvalType, ResolvedStatus,
)
from swebench.harness.grading import get_eval_tests_report, get_resolution_status

from environments.log_parsers import StatusMap, output_section, parse_log, strip_ansi
from environments.patch_scope import parse_numstat_z, scope_violations
from environments.predictions import read_predictions
from environments.records import GradeResult, TaskInstance
from environments.sandbox import Sandbox, SandboxError, open_sandbox, run_env_prefix
from environments.scope_cache import ScopeCache, rules_digest
from swerl.config import EnvironmentConfig

log = logging.getLogger(__name__)

GRADE_DIR = "/tmp/swerl-grade"
LOG_KEEP_CHARS = 200_000  # of the test log kept in GradeResult.log (head and tail)
SETUP_TIMEOUT_S = 120.0  # applying patches and restoring files, on top of the test timeout
APPLY_FAILED = ">>>>> swerl: patch apply failed"
TEST_APPLY_FAILED = ">>>>> swerl: test patch apply failed"
TEST_EXIT = ">>>>> swerl: test exit code "
LOG_FOLLOWS = ">>>>> swerl: test log follows"
EMPTY_PATCH_LOG = ">>>>> swerl: empty patch: unresolved, no tests run"
SWEBENCH_FAILURES = (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)
OUT_OF_SCOPE = "patch changes files outside the graded source (environments/patch_scope.py)"
_SPLIT = ">>>>> swerl: numstat follows"
_COLLECTION_ERROR = re.compile(
    r"errors? during collection|ImportError while loading conftest|ERROR collecting ", re.I
)


# ---------------------------------------------------------------- what is graded


def patch_files(patch: str) -> list[str]:
    """Paths a git diff touches (both sides of renames; /dev/null excluded)."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith(("--- ", "+++ ")):
            path = line[4:].split("\t")[0].strip()
            if path != "/dev/null" and path[:2] in ("a/", "b/"):
                files.append(path[2:])
    return list(dict.fromkeys(files))


def task_test_files(task: TaskInstance) -> list[str]:
    """The task's own test files: those `test_patch` touches and those FAIL_TO_PASS /
    PASS_TO_PASS name. The grader writes them fresh from the record before the tests run."""
    files = patch_files(task.test_patch)
    for test in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        path = test.split("::", 1)[0]
        if "::" in test and path.endswith(".py"):
            files.append(path)
    return list(dict.fromkeys(files))


def scope_script() -> str:
    """Lists the pristine tree and the paths the model patch touches, as `git apply` reads it."""
    return (f"cd /testbed && git ls-files -z && echo && echo '{_SPLIT}' && "
            f"git apply --numstat -z {GRADE_DIR}/model.patch 2>&1")


def out_of_scope(task: TaskInstance, patch: str, output: str) -> list[str] | None:
    """Reasons the patch is outside the graded source (empty: inside); None when the listing
    did not come back (git could not read the patch: the apply step then says why)."""
    listing, split, numstat = output.partition(f"\n{_SPLIT}\n")
    if not split:
        return None
    touched = parse_numstat_z(numstat)
    if not touched:
        return None
    tracked = [p for p in listing.split("\0") if p]
    return scope_violations(patch, touched, tracked, set(task_test_files(task)))


def grading_script(task: TaskInstance, has_patch: bool, test_timeout_s: float) -> str:
    """Shell run in the fresh sandbox. It prints its stage markers, then the test log: what the
    tests print (an agent's code can print anything) comes after every marker, so it cannot
    fake a stage (SWE-bench's start/end markers are only read in recorded SWE-bench logs).
    `git apply --binary` is plain, with no fuzzy fallback: a diff taken from our own sandbox
    always applies, so a failure means something is wrong upstream. The model patch was
    checked against the source rule first (`out_of_scope`), so it cannot touch the test files,
    which are reset and then patched from the record."""
    files = " ".join(shlex.quote(f) for f in task_test_files(task))
    apply_model = (
        f"git apply --binary -v {GRADE_DIR}/model.patch > {GRADE_DIR}/apply.log 2>&1 "
        f"|| {{ echo '{APPLY_FAILED}'; cat {GRADE_DIR}/apply.log; exit 0; }}"
        if has_patch else ":"
    )
    apply_tests = (
        f"git apply --binary -v {GRADE_DIR}/test.patch > {GRADE_DIR}/apply.log 2>&1 "
        f"|| {{ echo '{TEST_APPLY_FAILED}'; cat {GRADE_DIR}/apply.log; exit 0; }}"
        if task.test_patch.strip() else ":"
    )
    restore = [
        # two git calls whatever the number of files: it runs on every verdict
        "declare -A base",
        f"while IFS= read -r -d '' p; do base[$p]=1; done < <(git ls-tree -r -z --name-only HEAD -- {files})",
        f'for f in {files}; do [ -n "${{base[$f]:-}}" ] || rm -rf -- "$f"; done',
        '[ ${#base[@]} -eq 0 ] || git checkout -q HEAD -- "${!base[@]}"',
    ] if files else []
    return "\n".join([
        "cd /testbed",
        f"mkdir -p {GRADE_DIR}",
        apply_model,
        *restore,
        apply_tests,
        f"{run_env_prefix()} timeout -k 5 {test_timeout_s:g}s bash -c {shlex.quote(task.test_cmd)} > {GRADE_DIR}/test.log 2>&1 < /dev/null",
        f'echo "{TEST_EXIT}$?"',
        f"echo '{LOG_FOLLOWS}'",
        f"cat {GRADE_DIR}/test.log",
    ]) + "\n"


# ---------------------------------------------------------------- from a log to a verdict


def tests_report(task: TaskInstance, status: StatusMap) -> tuple[dict[str, dict[str, list[str]]], bool]:
    """SWE-bench's F2P/P2P success/failure lists and its resolved rule."""
    eval_type = EvalType.FAIL_ONLY if task.repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL
    gold = {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS}
    report = get_eval_tests_report(status, gold, eval_type=eval_type)
    tests_status = {k: report[k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    return tests_status, get_resolution_status(report) == ResolvedStatus.FULL.value


def collection_failed(log: str, status: StatusMap) -> bool:
    """The runner ran but could not import the tests (a file-level ERROR, a broken conftest)."""
    if any(v == "ERROR" and "::" not in k and k.endswith(".py") for k, v in status.items()):
        return True
    return bool(_COLLECTION_ERROR.search(strip_ansi(log)))


def _capped_log(log: str) -> str:
    """The log's head and tail, LOG_KEEP_CHARS in all, saying how much was cut between."""
    if len(log) <= LOG_KEEP_CHARS:
        return log
    half = LOG_KEEP_CHARS // 2
    return f"{log[:half]}\n[... {len(log) - LOG_KEEP_CHARS} characters cut ...]\n{log[-half:]}"


def _error(task: TaskInstance, reason: str, applied: bool, log: str, duration_s: float) -> GradeResult:
    return GradeResult(task.instance_id, "error", False, applied, error_reason=reason,
                       log=_capped_log(log), duration_s=duration_s)


def judge_log(task: TaskInstance, log: str, duration_s: float = 0.0) -> GradeResult:
    """The verdict for the output of a task's test command."""
    status = parse_log(log, task.log_parser, task.repo, task.instance_id)
    expected = task.FAIL_TO_PASS + task.PASS_TO_PASS
    if expected and not any(t in status for t in expected) and not collection_failed(log, status):
        return _error(task, f"none of the task's {len(expected)} tests appear in the test log "
                      "(wrong test_cmd or log_parser?)", True, log, duration_s)
    tests_status, resolved = tests_report(task, status)
    return GradeResult(
        task.instance_id, "resolved" if resolved else "unresolved", resolved, True,
        tests_status=tests_status, test_results=status, log=_capped_log(log), duration_s=duration_s,
    )


def judge_swebench_log(task: TaskInstance, log: str) -> GradeResult:
    """The verdict for a recorded SWE-bench evaluation log (`test_output.txt`): its failure codes
    become errors, and the test output is read between its markers, falling back to the whole
    log when nothing parses there, as SWE-bench's `get_logs_eval` does."""
    bad = [code for code in SWEBENCH_FAILURES if code in log]
    if bad:
        return _error(task, f"the SWE-bench log reports {bad[0]!r}", APPLY_PATCH_FAIL not in bad, log, 0.0)
    section = output_section(log)
    if section != log and not parse_log(section, task.log_parser, task.repo, task.instance_id):
        section = log
    return judge_log(task, section)


def verdict(task: TaskInstance, output: str, duration_s: float = 0.0) -> GradeResult:
    """The GradeResult for the output of `grading_script` (pure: unit-testable on recorded logs).

    `error` when: the patch or the test patch does not apply, the whole test run timed out, the
    sandbox died, or the log holds none of the task's tests and no collection error explains it
    (a wrong test command, a missing runner)."""
    stages, _, log = output.partition(LOG_FOLLOWS + "\n")
    for marker, what in ((APPLY_FAILED, "patch does not apply"),
                         (TEST_APPLY_FAILED, "test_patch does not apply (a dataset bug)")):
        if marker in stages:
            detail = stages.split(marker, 1)[1].strip()[-2000:]
            return _error(task, f"{what}: {detail}", marker != APPLY_FAILED, output, duration_s)
    if TEST_EXIT not in stages or LOG_FOLLOWS not in output:
        return _error(task, "the grading script did not finish (sandbox died?)", True, output, duration_s)
    code = int(stages.rsplit(TEST_EXIT, 1)[1].split()[0])
    if code in (124, 137):
        return _error(task, f"the test run timed out or was killed (exit code {code})", True, log, duration_s)
    result = judge_log(task, log, duration_s)
    if result.status == "error":
        result.error_reason += f" [test exit code {code}]"
    return result


# ---------------------------------------------------------------- in a sandbox


def write_model_patch(sb: Sandbox, patch: str) -> None:
    """The patch where `scope_script` and `grading_script` read it (git wants a final newline)."""
    sb.write_file(f"{GRADE_DIR}/model.patch", patch if patch.endswith("\n") else patch + "\n")


def grade(task: TaskInstance, patch: str | None, env_cfg: EnvironmentConfig,
          image: str | None = None) -> GradeResult:
    """Grade `patch` against `task` in a fresh sandbox of `image` (default: `task.image`)."""
    image = image or task.image
    if not image:
        raise ValueError(f"{task.instance_id}: no image to grade in (task.image is empty)")
    patch = patch or ""
    t0 = time.monotonic()
    try:
        with open_sandbox(image, env_cfg, snapshot_git=False) as sb:
            if patch.strip():
                write_model_patch(sb, patch)
            if task.test_patch.strip():
                sb.write_file(f"{GRADE_DIR}/test.patch", task.test_patch)
            problems = out_of_scope(task, patch, sb.run(scope_script()).output) if patch.strip() else None
            if problems:
                return _outside(task, problems, time.monotonic() - t0)
            res = sb.run(grading_script(task, bool(patch.strip()), env_cfg.test_timeout_s),
                         timeout=env_cfg.test_timeout_s + SETUP_TIMEOUT_S)
    except SandboxError as e:
        return GradeResult(task.instance_id, "error", False, False, error_reason=f"sandbox: {e}",
                           duration_s=time.monotonic() - t0)
    if res.timed_out:
        return GradeResult(task.instance_id, "error", False, False, log=_capped_log(res.output),
                           error_reason="grading timed out before the tests finished",
                           duration_s=time.monotonic() - t0)
    result = verdict(task, res.output, time.monotonic() - t0)
    if not patch.strip():
        result.patch_applied = False  # nothing to apply; the verdict itself stands
    return result


def _outside(task: TaskInstance, problems: list[str], duration_s: float) -> GradeResult:
    """A patch outside the graded source: unresolved, no tests run, the reasons in the grade."""
    reason = f"{OUT_OF_SCOPE}: " + "; ".join(problems[:20]) + (f"; and {len(problems) - 20} more"
                                                               if len(problems) > 20 else "")
    return GradeResult(task.instance_id, "unresolved", False, False, error_reason=reason,
                       log=f">>>>> swerl: {reason}", duration_s=duration_s)


def scope_cache(root: Path) -> ScopeCache:
    """The on-disk cache of gold scope verdicts under `root`, keyed by the rules as they are now."""
    import environments.patch_scope as rules

    sources = [Path(rules.__file__).read_text(), inspect.getsource(out_of_scope),
               inspect.getsource(task_test_files), scope_script()]
    return ScopeCache(root, rules_digest(sources), task_test_files)


def gold_out_of_scope(tasks: list[TaskInstance], env_cfg: EnvironmentConfig,
                      workers: int = 4, cache: ScopeCache | None = None) -> dict[str, list[str]]:
    """The tasks whose own reference patch the grader refuses (`out_of_scope`), with the reasons.

    Why: such a task is unsolvable (the real fix is graded `unresolved`), and a dataset pinned
    before a scope rule existed can hold some (a synthetic bug put in `tools/`, outside the
    package). Curation's validation catches them in new datasets; this catches them in old ones.
    One sandbox per (repo, base commit), whose tracked files decide the scope, `workers` at once
    (a sandbox mostly waits on Docker); a group whose sandbox fails is logged and kept, never
    dropped for an infrastructure error. With `cache`, a task checked before is not checked again.
    """
    known = {t.instance_id: got for t in tasks if cache and (got := cache.get(t)) is not None}
    groups: dict[tuple[str, str], list[TaskInstance]] = {}
    for t in tasks:
        if t.patch.strip() and t.instance_id not in known:
            groups.setdefault((t.repo, t.base_commit), []).append(t)

    def check(group: list[TaskInstance]) -> dict[str, list[str]]:
        refused = {}
        try:
            with open_sandbox(group[0].image, env_cfg, snapshot_git=False) as sb:
                for t in group:
                    write_model_patch(sb, t.patch)
                    problems = out_of_scope(t, t.patch, sb.run(scope_script()).output)
                    if problems is not None and cache:
                        cache.put(t, problems)
                    if problems:
                        refused[t.instance_id] = problems
        except SandboxError as e:
            log.warning("scope check of %s@%s skipped (%d tasks kept unchecked): %s",
                        group[0].repo, group[0].base_commit[:12], len(group), e)
        return refused

    if known:
        log.info("scope check: %d of %d tasks known from earlier runs, %d sandboxes to start",
                 len(known), len(tasks), len(groups))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        fresh = {k: v for part in pool.map(check, groups.values()) for k, v in part.items()}
    return {iid: problems for iid, problems in known.items() if problems} | fresh


def grade_prediction(task: TaskInstance, patch: str | None, env_cfg: EnvironmentConfig,
                     image: str | None = None) -> GradeResult:
    """Grade an agent's patch or a prediction: an empty one is unresolved without a container.

    Why: an empty patch leaves the task's bug in place, and validation (`grade(task, "")`, which
    does run the tests) is what shows that its FAIL_TO_PASS tests then fail; SWE-bench's harness
    does not run empty patches either. A weak policy ends most episodes with no change, and
    each would cost a fresh container and a test run for a verdict known in advance.
    """
    if (patch or "").strip():
        return grade(task, patch, env_cfg, image)
    return GradeResult(task.instance_id, "unresolved", False, False, log=EMPTY_PATCH_LOG)


# ---------------------------------------------------------------- many predictions


def grade_many(
    tasks_by_id: dict[str, TaskInstance],
    predictions: str | Path | Iterable[dict[str, Any]],
    env_cfg: EnvironmentConfig,
    workers: int = 2,
    images: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Grade SWE-bench-format predictions; returns a report in SWE-bench's run-report shape
    plus `instances` (each prediction's GradeResult without its log) and `invalid_predictions`
    (one "line N: reason" per entry that is not a prediction; the others are graded).

    `images` maps instance_id -> image when tasks do not carry `image` themselves.
    """
    read = read_predictions(predictions)
    preds = read.predictions
    known = [p for p in preds if p["instance_id"] in tasks_by_id]
    unknown = [p["instance_id"] for p in preds if p["instance_id"] not in tasks_by_id]

    def one(p: dict[str, Any]) -> GradeResult:
        task = tasks_by_id[p["instance_id"]]
        if not (images or {}).get(task.instance_id) and task.no_image_reason:
            return GradeResult(task.instance_id, "error", False, False, error_reason=task.no_image_reason)
        try:
            return grade_prediction(task, p.get("model_patch"), env_cfg, (images or {}).get(task.instance_id))
        except Exception as e:  # one bad instance must not lose the others' verdicts
            return GradeResult(task.instance_id, "error", False, False, error_reason=f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(one, known))
    for iid in unknown:
        results.append(GradeResult(iid, "error", False, False, error_reason="unknown instance_id"))
    return run_report(tasks_by_id, preds, results) | {"invalid_predictions": read.errors}


def run_report(tasks_by_id: dict[str, TaskInstance], preds: list[dict[str, Any]],
               results: list[GradeResult]) -> dict[str, Any]:
    by_status = {s: sorted(r.instance_id for r in results if r.status == s)
                 for s in ("resolved", "unresolved", "error")}
    submitted = sorted({p["instance_id"] for p in preds})
    empty = sorted(p["instance_id"] for p in preds if not (p.get("model_patch") or "").strip())
    completed = sorted(r.instance_id for r in results if r.status != "error")
    models = sorted({p.get("model_name_or_path", "") for p in preds})
    instances = {}
    for r in results:
        d = r.to_dict()
        d.pop("log")
        instances[r.instance_id] = d
    return {
        "model_name_or_path": models[0] if len(models) == 1 else models,
        "total_instances": len(tasks_by_id),
        "submitted_instances": len(submitted),
        "completed_instances": len(completed),
        "resolved_instances": len(by_status["resolved"]),
        "unresolved_instances": len(by_status["unresolved"]),
        "empty_patch_instances": len(empty),
        "error_instances": len(by_status["error"]),
        "completed_ids": completed,
        "incomplete_ids": sorted(set(tasks_by_id) - set(submitted)),
        "empty_patch_ids": empty,
        "submitted_ids": submitted,
        "resolved_ids": by_status["resolved"],
        "unresolved_ids": by_status["unresolved"],
        "error_ids": by_status["error"],
        "instances": instances,
        "schema_version": 2,
    }
