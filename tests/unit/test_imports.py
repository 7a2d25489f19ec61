"""The import graph, read from the source: one direction between packages and rooms, and no circles.

docs/ARCHITECTURE.md draws the order; this test is what keeps it true. Every import counts, a lazy one
inside a function included (a circle through a lazy import is still a circle a reader has to untangle);
only imports under ``if TYPE_CHECKING:`` are left out, as they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hints", "runtime", "profiler", "rrfp_cli", "rrfp")

# Each room may import the rooms before it in its list (and itself), and every room of the packages before
# its own package; nothing else. Rooms are the subpackages (and the few modules that stand alone at a
# package's top). The order is the one docs/ARCHITECTURE.md draws.
ROOMS: dict[str, tuple[str, ...]] = {
    "hints": ("hints.errors", "hints.outputs", "hints.tasks", "hints.deps", "hints.paths", "hints.priorities", "hints.costs",
              "hints.orders", "hints.validate",
              "hints.files", "hints"),
    "runtime": ("runtime", "runtime.durations", "runtime.sched", "runtime.tune", "runtime.config", "runtime.comm",
                "runtime.workloads", "runtime.exec", "runtime.run"),
    "profiler": ("profiler", "profiler.trace", "profiler.analysis", "profiler.draw", "profiler.bench"),
    "rrfp_cli": ("rrfp_cli.output", "rrfp_cli.options", "rrfp_cli"),
    "rrfp": ("rrfp",),
}
# rrfp (the Python API) re-exports runtime; it sits beside the CLI, above runtime.
PACKAGE_ORDER = ("hints", "runtime", "profiler", "rrfp_cli")
MAY_IMPORT = {"rrfp": ("hints", "runtime"), **{p: PACKAGE_ORDER[:i] for i, p in enumerate(PACKAGE_ORDER)}}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(f): f for p in PACKAGES for f in (REPO / p).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = _imports(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py")
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


GRAPH = _graph()


def _room(module: str) -> tuple[str, int]:
    package = module.split(".")[0]
    rooms = ROOMS[package]
    best = max((r for r in rooms if module == r or module.startswith(r + ".")), key=len, default=None)
    assert best is not None, f"{module} is in no room of {package}: add it to ROOMS (and docs/ARCHITECTURE.md)"
    return package, rooms.index(best)


def test_the_graph_is_read():
    assert len(GRAPH) > 60
    assert "hints.tasks" in GRAPH["hints.deps"]
    assert "runtime.sched.arbiter" in GRAPH["runtime.sched.rules"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_one_way(module):
    package, index = _room(module)
    for target in sorted(GRAPH[module]):
        target_package, target_index = _room(target)
        if target_package == package:
            assert target_index <= index, (
                f"{module} ({ROOMS[package][index]}) imports {target} ({ROOMS[package][target_index]}), "
                f"a room after its own")
        else:
            assert target_package in MAY_IMPORT[package], f"{module} imports {target}: {package} is below it"


def test_no_import_circles():
    """Tarjan's strongly connected components: any component of two or more modules is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            connect(node)
    assert circles == []


def _top_level_imports(module: str) -> set[str]:
    """What importing ``module`` itself imports: its module body, not its functions' bodies."""
    path = REPO / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = REPO / module.replace(".", "/") / "__init__.py"
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_pure_rooms_import_no_torch():
    """Importing hints, or runtime's durations, scheduling, tuning and config, never imports torch, not even
    through another module: the simulator and the CLI's fast commands depend on it (torch_import imports
    torch lazily, only when called)."""
    pure = ("hints", "runtime.durations", "runtime.sched", "runtime.tune", "runtime.config")
    for module in sorted(m for m in GRAPH if m.startswith(pure)):
        seen, todo = set(), [module]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            imported = _top_level_imports(current)
            assert not any(name == "torch" or name.startswith("torch.") for name in imported), (
                f"importing {module} imports torch (through {current})")
            todo.extend(name for name in imported if name in GRAPH)
