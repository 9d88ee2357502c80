"""The house's import graph, read from the source (every import, function-level ones too).

    python -m tests.layers        # prints the graph's summary and every rule it breaks

Rules: no circles between files; a package imports only packages below it (`LAYERS`); inside a
package, a room imports only rooms below or beside it (`ROOMS`); a package with a front door
(`FRONT_DOORS`) is entered through its `__init__` only; no module imports another's private
(`_name`) names; `BASEMENT` modules sit below every room. tests/unit/test_layers.py holds the tree to it, and to `MAX_FUNCTION_LINES`.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("swerl", "environments", "training", "tasks", "bench", "flows", "infra", "scripts")
# lower number = lower layer; equal numbers are siblings, which must not import each other
LAYERS = {"swerl": 1, "environments": 2, "training": 3, "tasks": 4, "bench": 4, "flows": 5, "infra": 6,
          "scripts": 6}
# rooms inside a package, lowest first; a module not listed sits in the package's "" room
ROOMS = {
    "environments": ["environments.sandbox", "", "environments.curation"],
    "training": ["training.inference", ""],
}
FRONT_DOORS = ("environments.sandbox",)
# below every room of their package (they import none of its rooms): any room may use them
BASEMENT = ("training.precision", "environments.records", "environments.hints")
MAX_FUNCTION_LINES = 60
# git-ignored build contexts that hold copies of the source (infra/stack.sh stages one)
SKIP_DIRS = {"build", ".venv", "__pycache__"}
SHORT_FUNCTIONS_IN = ("training", "environments")


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    private: list[tuple[str, str, str]] = field(default_factory=list)  # importer, module, name


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(top: Path) -> list[Path]:
    """The .py files under `top`, minus staged copies of the tree (infra/images/build holds one)."""
    return sorted(p for p in top.rglob("*.py") if not any(part in SKIP_DIRS for part in p.parts))


def scan(root: Path = ROOT) -> Graph:
    g = Graph()
    for pkg in PACKAGES:
        for path in source_files(root / pkg):
            g.modules[module_name(path, root)] = path
    for name, path in g.modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _add(g, name, _resolve(g, alias.name))
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, is_pkg, node.module, node.level)
                for alias in node.names:
                    target = _resolve(g, f"{base}.{alias.name}") if base else None
                    if target == f"{base}.{alias.name}":  # a submodule
                        _add(g, name, target)
                        continue
                    owner = _resolve(g, base)
                    _add(g, name, owner)
                    if owner and alias.name.startswith("_") and not alias.name.startswith("__"):
                        g.private.append((name, owner, alias.name))
    return g


def _absolute(name: str, is_pkg: bool, module: str | None, level: int) -> str:
    if not level:
        return module or ""
    parts = name.split(".") if is_pkg else name.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _resolve(g: Graph, dotted: str) -> str | None:
    """The in-tree module `dotted` names (or its nearest in-tree parent); None outside the tree."""
    parts = dotted.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in g.modules:
            return cand
        parts.pop()
    return None


def _add(g: Graph, src: str, dst: str | None) -> None:
    if dst and dst != src and not src.startswith(dst + "."):  # a package's own __init__ is no arrow
        g.edges[src].add(dst)


def cycles(g: Graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in g.modules:
        if start in index:
            continue
        work = [(start, iter(sorted(g.edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(g.edges[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def room_of(module: str) -> tuple[str, int]:
    pkg = module.split(".")[0]
    rooms = ROOMS.get(pkg, [""])
    best = ""
    for room in rooms:
        if room and (module == room or module.startswith(room + ".")):
            best = room
    return pkg, rooms.index(best)


def layer_violations(g: Graph) -> list[str]:
    bad = []
    for src, dsts in sorted(g.edges.items()):
        s_pkg, s_room = room_of(src)
        for dst in sorted(dsts):
            d_pkg, d_room = room_of(dst)
            if s_pkg != d_pkg:
                if LAYERS[d_pkg] >= LAYERS[s_pkg]:
                    bad.append(f"{src} -> {dst}: {d_pkg} is not below {s_pkg}")
            elif d_room > s_room and dst not in BASEMENT:
                bad.append(f"{src} -> {dst}: runs back up to a higher room of {s_pkg}")
            for door in FRONT_DOORS:
                inside = dst.startswith(door + ".")
                if inside and not (src == door or src.startswith(door + ".")):
                    bad.append(f"{src} -> {dst}: enter {door} through its __init__")
    bad += [f"{src} imports private {name} from {mod}" for src, mod, name in g.private]
    return bad


def long_functions(roots: tuple[str, ...] = SHORT_FUNCTIONS_IN, limit: int = MAX_FUNCTION_LINES,
                   root: Path = ROOT) -> list[tuple[int, str]]:
    rows = []
    for top in roots:
        for path in source_files(root / top):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        rows.append((n, f"{path.relative_to(root)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


def main() -> int:
    g = scan()
    n_edges = sum(len(v) for v in g.edges.values())
    print(f"{len(g.modules)} modules, {n_edges} import arrows (function-level imports included)")
    per_pkg: dict[tuple[str, str], int] = defaultdict(int)
    for src, dsts in g.edges.items():
        for dst in dsts:
            per_pkg[(src.split(".")[0], dst.split(".")[0])] += 1
    for (a, b), n in sorted(per_pkg.items(), key=lambda kv: (LAYERS[kv[0][0]], kv[0])):
        print(f"  {a:>12} -> {b:<12} {n}")
    problems = [f"circle: {' <-> '.join(c)}" for c in cycles(g)] + layer_violations(g)
    longs = long_functions()
    print(f"circles: {len(cycles(g))}; layer violations: {len(layer_violations(g))}; "
          f"functions over {MAX_FUNCTION_LINES} lines in {', '.join(SHORT_FUNCTIONS_IN)}: {len(longs)}")
    for p in problems:
        print("  " + p)
    for n, where in longs:
        print(f"  {n} lines: {where}")
    return 1 if problems or longs else 0


if __name__ == "__main__":
    sys.exit(main())
