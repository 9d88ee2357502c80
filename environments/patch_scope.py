"""Which changes of a patch the grader accepts: the repository's own source, nothing else.

Why an allowlist: the tests run in the same interpreter as the code under test, and pytest and
Python read many files on the way there (root modules first on `sys.path`, conftest files in any
ancestor of a test, seven pytest config files, `.pth`, `sitecustomize`, extension modules that
win over a `.py` of the same name, cached bytecode). A denylist of those cannot be complete; a
list of what a fix may touch can be.

The rule (ARCHITECTURE.md, grading): a patch may add, modify, delete or rename only
- files inside the repository's *source roots*: the top-level package directories of the
  pristine tree (`pkg/`, `src/pkg/`, `lib/pkg/`: a directory whose `__init__.py` is tracked),
  new modules and subpackages included;
- the tracked top-level modules of a single-module project (`xmltodict.py`), modified only;
and never, even there: a test directory (`tests/`, `test/`, a top-level `testing/`) or test file
(`test_*.py`, `*_test.py`, the task's own test files), a `conftest.py`, a pytest config file, a
file Python would import that is not `.py` source (extension modules, bytecode, `.pth`,
`__pycache__/`), or anything that is not a plain file (a symlink, a submodule).
Anything else makes the whole patch `unresolved`, with these reasons in the grade.
"""

from __future__ import annotations

import codecs
import importlib.machinery
import posixpath
import re

SOURCE_PARENTS = ("", "src", "lib")  # where a top-level package directory may sit
TEST_DIRS = ("tests", "test")  # test directories at any depth; `testing` only at the top
CONFIG_FILES = frozenset({"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml",
                          "setup.cfg", "tox.ini", "conftest.py"})
# what the import system loads besides .py source (extension modules, bytecode) and site's .pth
IMPORTED_SUFFIXES = tuple(s for s in importlib.machinery.all_suffixes() if s != ".py") + (".pth",)
PLAIN_MODES = frozenset({"100644", "100755"})
_MODE_LINE = re.compile(r"^(?:new file mode|new mode) (\d+)$", re.M)
# extended header lines (hunk lines start with +, - or space; base85 lines hold no space)
_SOURCE_LINE = re.compile(r"^(?:rename|copy) from (.+)$", re.M)


def source_roots(tracked: list[str]) -> list[str]:
    """The pristine tree's top-level package directories (see the module docstring)."""
    roots = set()
    for path in tracked:
        parts = path.split("/")
        if parts[-1] != "__init__.py" or len(parts) < 2:
            continue
        parent, pkg = "/".join(parts[:-2]), parts[-2]
        if parent in SOURCE_PARENTS and not is_test_path(f"{parent}/{pkg}".lstrip("/") + "/x.py"):
            roots.add(f"{parent}/{pkg}".lstrip("/"))
    return sorted(roots)


def is_test_path(path: str) -> bool:
    """A test directory or test file by name."""
    parts = path.split("/")
    name = parts[-1]
    if any(p in TEST_DIRS for p in parts[:-1]) or parts[0] == "testing" and len(parts) > 1:
        return True
    return name.startswith("test_") and name.endswith(".py") or name.endswith("_test.py")


def why_outside(path: str, roots: list[str], tracked: set[str], test_files: set[str]) -> str | None:
    """Why the patch may not touch `path`, or None when it may."""
    name = posixpath.basename(path)
    if path in test_files or is_test_path(path):
        return "a test file or directory"
    if name in CONFIG_FILES:
        return "a pytest config or conftest file"
    if "__pycache__" in path.split("/") or name.endswith(IMPORTED_SUFFIXES):
        return "a file Python imports that is not .py source"
    if any(path.startswith(root + "/") for root in roots):
        return None
    if "/" not in path and name.endswith(".py") and path in tracked and name != "setup.py":
        return None  # a single-module project's own module, as tracked (not a new root module)
    return "outside the source directories " + (", ".join(f"{r}/" for r in roots) or "(none found)")


def scope_violations(patch: str, touched: list[str], tracked: list[str], test_files: set[str]) -> list[str]:
    """One reason per offending path of `patch`; `touched` is every path it changes (both sides of
    renames, as `git apply --numstat` lists them); `tracked` the pristine tree's files."""
    problems = [f"a non-file mode {mode} (symlink or submodule)" for mode in _MODE_LINE.findall(patch)
                if mode not in PLAIN_MODES]
    roots, known = source_roots(tracked), set(tracked)
    sources = [unquote(p) for p in _SOURCE_LINE.findall(patch)]  # `git apply --numstat` lists only the target
    for path in dict.fromkeys(touched + sources):
        why = why_outside(path, roots, known, test_files)
        if why:
            problems.append(f"{path}: {why}")
    return problems


def unquote(path: str) -> str:
    """A path as git writes it in a header: C-quoted ("a\\303\\251.py") when unusual."""
    if not (len(path) >= 2 and path[0] == path[-1] == '"'):
        return path
    raw = codecs.escape_decode(path[1:-1].encode("latin-1", "backslashreplace"))[0]
    return raw.decode("utf-8", errors="replace")  # type: ignore[union-attr]


def parse_numstat_z(out: str) -> list[str]:
    """Paths from `git apply --numstat -z`: `added\\tdeleted\\tpath\\0`, or for a rename or copy
    `added\\tdeleted\\t\\0from\\0to\\0`."""
    fields = out.split("\0")
    paths, i = [], 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if not entry.strip():
            continue
        stats = entry.split("\t", 2)
        if len(stats) < 3:
            continue
        if stats[2]:
            paths.append(stats[2])
        else:
            paths += [p for p in fields[i:i + 2] if p]
            i += 2
    return paths
