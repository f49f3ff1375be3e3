"""The runtime's import rules (``make lint``; stdlib only, reads the sources, imports nothing):

* no runtime module but ``llm_elastic/__init__.py`` imports ``llm_elastic.session`` (the parts depend on small
  interfaces, never on the facade that wires them);
* no import circle among the runtime's modules, counting imports under ``if TYPE_CHECKING:`` and imports
  inside functions (a circle a checker or a late import hides is still a circle for a reader);
* no module over ``MAX_MODULE_LINES`` lines and no function over ``MAX_FUNCTION_LINES`` (its decorators and
  docstring included): a part a reader takes in at once.

Run: ``python tests/unit/check_runtime_imports.py [runtime/llm_elastic]``: prints each offence, exits 1
if any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "llm_elastic"
FACADE = f"{PACKAGE}.session"
ROOT = Path(__file__).resolve().parents[2] / "runtime" / PACKAGE
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60
WHOLE_MODULES = {
    f"{PACKAGE}.live.membership": "the live membership's whole protocol: register, one view per decision, "
    "agree, arrive, watch (one capability; split, a node loss visited it and its halves back and forth)",
    f"{PACKAGE}.rendezvous.etcd_client": "every etcd call the runtime makes: one typed facade",
    FACADE: "the loop: Elastic runs every generation and asks its mode, which never calls back (split, "
    "the loop's halves would call each other)",
}
"""Modules allowed past ``MAX_MODULE_LINES`` (up to ``MAX_WHOLE_LINES``) because one capability stays in one
module (STYLE habit 24): each names why. docs/runtime-design.md lists them."""
MAX_WHOLE_LINES = 450


def module_name(path: Path, root: Path) -> str:
    """``llm_elastic.live.membership`` for ``<root>/live/membership.py`` (a package: its ``__init__``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def imported(module: str, is_package: bool, tree: ast.AST, known: set[str]) -> set[str]:
    """The runtime modules ``tree`` (the source of ``module``) imports, wherever the import stands."""
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for name in names:
            while name and name not in known:  # ``import a.b.c`` of a package path: the deepest module known
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def graph(root: Path) -> dict[str, set[str]]:
    """Runtime module -> the runtime modules it imports."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(paths)
    return {
        name: imported(name, path.name == "__init__.py", ast.parse(path.read_text(), str(path)), known)
        for name, path in paths.items()
    }


def facade_importers(edges: dict[str, set[str]]) -> list[str]:
    """Modules other than the package's ``__init__`` that import the facade."""
    return sorted(m for m, targets in edges.items() if FACADE in targets and m != PACKAGE)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan), sorted.

    The package's ``__init__`` is left out: it imports its public names' homes lazily, for the user, and a
    part importing ``llm_elastic`` itself is refused by the facade rule's spirit anyway (none does)."""
    nodes = sorted(m for m in edges if m != PACKAGE)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node] - {PACKAGE}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in nodes:
        if node not in index:
            visit(node)
    return sorted(found)


def oversized(root: Path) -> list[str]:
    """Modules and functions over their line limits, one line each."""
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        name = module_name(path, root)
        lines = len(source.splitlines())
        limit = MAX_WHOLE_LINES if name in WHOLE_MODULES else MAX_MODULE_LINES
        if lines > limit:
            out.append(f"{name} has {lines} lines (at most {limit})")
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - first + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{name}: {node.name} has {length} lines (at most {MAX_FUNCTION_LINES})")
    return out


def problems(root: Path) -> list[str]:
    """One line per offence."""
    edges = graph(root)
    out = [f"{m} imports {FACADE} (depend on an interface, not the facade)" for m in facade_importers(edges)]
    for group in cycles(edges):
        inside = {m: sorted(edges[m] & set(group)) for m in group}
        detail = "".join(f"\n    {m} -> {', '.join(t)}" for m, t in inside.items())
        out.append(f"import circle of {len(group)} modules:{detail}")
    return out + oversized(root)


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else ROOT
    found = problems(root)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} runtime import rule(s) broken under {root}", file=sys.stderr)
        return 1
    print(f"runtime imports: no facade import, no circle, no part over its size ({root})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
