"""The source rule that decides which changes the grader accepts (environments/patch_scope.py)."""

import pytest

from environments.patch_scope import parse_numstat_z, scope_violations, source_roots

pytestmark = pytest.mark.unit

TRACKED = ["pkg/__init__.py", "pkg/core.py", "pkg/tests/test_core.py", "src/other/__init__.py",
           "tests/__init__.py", "tests/test_pkg.py", "testing/__init__.py", "docs/conf.py", "setup.py",
           "solo.py", "conftest.py", "pyproject.toml"]


def check(*paths: str, patch: str = "", test_files: frozenset = frozenset()) -> list[str]:
    return scope_violations(patch, list(paths), TRACKED, set(test_files))


def test_source_roots_are_top_level_packages_minus_tests():
    assert source_roots(TRACKED) == ["pkg", "src/other"]


@pytest.mark.parametrize("path", ["pkg/core.py", "pkg/newmod.py", "pkg/sub/__init__.py", "src/other/x.py",
                                  "pkg/templates/page.html", "solo.py"])
def test_a_fix_to_the_source_is_accepted(path):
    assert check(path) == []


@pytest.mark.parametrize("path", [
    "pytest.py", "_pytest/__init__.py", "pluggy.py", "unittest.py", "os.py", "sitecustomize.py",
    "usercustomize.py", "x.pth", "conftest.py", "pkg/conftest.py", "pkg/sub/conftest.py", "pytest.ini",
    ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml", "setup.cfg", "tox.ini", "pkg/pytest.ini",
    "pkg/tox.ini", "pkg/setup.cfg", "pkg/pyproject.toml", "pkg/.pytest.ini", "tests/test_pkg.py",
    "tests/new_test_file.py", "pkg/tests/test_core.py", "pkg/tests/helper.py", "pkg/test_more.py",
    "pkg/more_test.py", "testing/x.py", "pkg/__pycache__/core.cpython-311.pyc", "pkg/core.pyc",
    "pkg/core.cpython-311-x86_64-linux-gnu.so", "pkg/core.so", "pkg/evil.pth", "setup.py", "docs/conf.py",
    "newpkg/__init__.py", "src/sitecustomize.py", "src/x.pth", "x.egg-info/entry_points.txt",
    "../usr/lib/python3/dist-packages/_pytest/runner.py", "solo_new.py",
])
def test_everything_else_is_refused_with_a_reason(path):
    problems = check(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}: ")


def test_the_task_test_files_are_refused_wherever_they_are():
    assert check("pkg/checks.py", test_files=frozenset({"pkg/checks.py"})) == [
        "pkg/checks.py: a test file or directory"]


def test_symlinks_and_submodules_are_refused():
    patch = "diff --git a/pkg/l.py b/pkg/l.py\nnew file mode 120000\n--- /dev/null\n+++ b/pkg/l.py\n"
    assert check("pkg/l.py", patch=patch) == ["a non-file mode 120000 (symlink or submodule)"]
    assert check("pkg/l.py", patch="diff --git a/pkg/l.py b/pkg/l.py\nold mode 100644\nnew mode 160000\n")
    assert check("pkg/l.py", patch="diff --git a/pkg/l.py b/pkg/l.py\nold mode 100644\nnew mode 100755\n") == []


def test_renames_count_both_sides():
    assert parse_numstat_z("1\t2\tpkg/a.py\0-\t-\tpkg/b.bin\0" "0\t0\t\0pkg/old.py\0tests/new.py\0") == [
        "pkg/a.py", "pkg/b.bin", "pkg/old.py", "tests/new.py"]
    assert check("pkg/old.py", "tests/new.py") == ["tests/new.py: a test file or directory"]


def test_the_source_of_a_rename_or_copy_counts_even_where_numstat_omits_it():
    patch = ("diff --git a/tests/test_x.py b/pkg/moved.py\nsimilarity index 100%\n"
             "rename from tests/test_x.py\nrename to pkg/moved.py\n"
             'diff --git "a/tests/t\\303\\251.py" b/pkg/c.py\ncopy from "tests/t\\303\\251.py"\ncopy to pkg/c.py\n')
    assert scope_violations(patch, ["pkg/moved.py", "pkg/c.py"], TRACKED, set()) == [
        "tests/test_x.py: a test file or directory", "tests/t\u00e9.py: a test file or directory"]


# The files the gold patches of the SWE-bench instances in tests/data/swebench_logs change (from the
# public dataset), and the package each repository's tree has: every gold patch is inside the rule,
# every test_patch outside it.
SWEBENCH_GOLD = {
    "astropy__astropy-12907": ("astropy/__init__.py", ["astropy/modeling/separable.py"]),
    "astropy__astropy-14182": ("astropy/__init__.py", ["astropy/io/ascii/rst.py"]),
    "django__django-11099": ("django/__init__.py", ["django/contrib/auth/validators.py"]),
    "django__django-11133": ("django/__init__.py", ["django/http/response.py"]),
    "pytest-dev__pytest-5227": ("src/_pytest/__init__.py", ["src/_pytest/logging.py"]),
    "psf__requests-2317": ("requests/__init__.py", ["requests/sessions.py", "requests/compat.py"]),
    "sympy__sympy-20590": ("sympy/__init__.py", ["sympy/core/_print_helpers.py"]),
}


def test_swebench_gold_patches_are_inside_the_rule_and_their_test_patches_outside():
    import json
    from pathlib import Path

    from environments.grading import patch_files

    rows = Path(__file__).resolve().parents[1] / "data" / "swebench_logs" / "instances.jsonl"
    for line in rows.read_text().splitlines():
        inst = json.loads(line)
        init, gold = SWEBENCH_GOLD[inst["instance_id"]]
        tests = patch_files(inst["test_patch"])
        tracked = [init, *gold, *tests]
        assert scope_violations("", gold, tracked, set(tests)) == [], inst["instance_id"]
        assert len(scope_violations("", tests, tracked, set())) == len(tests), inst["instance_id"]
