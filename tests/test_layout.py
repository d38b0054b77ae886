"""The import graph of src/rlhfkit, read from its syntax (module-level and function-level imports
alike, so an import moved into a function still counts): no import circle between modules, none
between packages (rlhfkit.X as one node: a circle of packages is one even when no circle of modules
closes it), and no package imports one of a higher layer. The layers, lowest first:

  core, errors (and rlhfkit's own __init__)   low-level utilities, import no other package
  algos < data < models < rewards < estimate < envs < rollout < diagnostics
  runtime                                     the run harness
  trainers < learn
  commands, label, api                        what a user runs: the commands (and the Python API)
  cli                                         the entry point, dispatching from rlhfkit.commands.COMMANDS

A command's entry module that sits in a lower package (label/cli.py) counts as a command.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = [
    ("<root>", "errors", "core"), ("algos",), ("data",), ("models",), ("rewards",), ("estimate",), ("envs",),
    ("rollout",), ("diagnostics",), ("runtime",), ("trainers",), ("learn",), ("commands", "label", "api"), ("cli",),
]
COMMAND_MODULES = ("rlhfkit.label.cli",)
# Upward imports allowed while they are being removed (none now); each edge here must still exist, so
# the list cannot go stale.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def modules(src: Path) -> dict[str, tuple[Path, bool]]:
    """module name -> (its file, whether it is a package's __init__)."""
    out = {}
    for path in sorted((src / "rlhfkit").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _known(name: str, mods: dict) -> str:
    """`name`, or the innermost module that holds it (a name imported from a module)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def imported(module: str, path: Path, is_package: bool, mods: dict) -> set[tuple[str, int]]:
    """(rlhfkit module, line) of every import in `path`, at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {(_known(a.name, mods), node.lineno) for a in node.names if a.name.startswith("rlhfkit")}
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".") if is_package else module.split(".")[:-1]
            name = (".".join(base[: len(base) - node.level + 1] + [node.module or ""]).rstrip(".")
                    if node.level else node.module or "")
            if name.startswith("rlhfkit"):
                found |= {(_known(f"{name}.{a.name}", mods), node.lineno) for a in node.names}
    return {(m, line) for m, line in found if m and m != module}


def import_graph(src: Path = SRC) -> dict[str, set[tuple[str, int]]]:
    mods = modules(src)
    return {m: imported(m, path, is_package, mods) for m, (path, is_package) in mods.items()}


def layer(module: str) -> int:
    if module in COMMAND_MODULES:
        return next(i for i, names in enumerate(LAYERS) if "commands" in names)
    package = module.split(".")[1] if "." in module else "<root>"
    found = next((i for i, names in enumerate(LAYERS) if package in names), None)
    assert found is not None, f"{module}: {package!r} is in no layer (add it to LAYERS)"
    return found


def upward_imports(graph: dict[str, set[tuple[str, int]]]) -> list[str]:
    return sorted(f"{a}:{line} imports {b} (layer {layer(a)} < {layer(b)})"
                  for a, targets in graph.items() for b, line in targets
                  if layer(a) < layer(b) and (a, b) not in KNOWN_UPWARD)


def cycles(graph: dict[str, set[tuple[str, int]]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    edges = {a: sorted({b for b, _ in targets}) for a, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # the graph has ~200 modules: recursion depth stays small
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def circle_edges(graph: dict[str, set[tuple[str, int]]], component: list[str]) -> list[str]:
    inside = set(component)
    return sorted(f"{a}:{line} -> {b}" for a in component for b, line in graph[a] if b in inside)


def test_every_package_has_a_layer():
    packages = {p.name for p in (SRC / "rlhfkit").iterdir() if (p / "__init__.py").is_file()}
    assert packages <= {name for names in LAYERS for name in names}, "add the new package to LAYERS"


def test_no_package_imports_a_higher_layer():
    graph = import_graph()
    assert not upward_imports(graph), "imports of a higher layer:\n" + "\n".join(upward_imports(graph))
    for a, b in KNOWN_UPWARD:
        assert b in {m for m, _ in graph[a]}, f"{a} no longer imports {b}: remove it from KNOWN_UPWARD"


def test_no_import_circles():
    graph = import_graph()
    found = [circle_edges(graph, c) for c in cycles(graph)
             if not any({a, b} <= set(c) for a, b in KNOWN_UPWARD)]
    assert not found, "import circles:\n" + "\n\n".join("\n".join(edges) for edges in found)


def package(module: str) -> str:
    """rlhfkit.X for a module of the package X; a module at the root (rlhfkit.api, rlhfkit.cli, ...) is its own node."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in PACKAGES) else module


def package_graph(graph: dict[str, set[tuple[str, int]]]) -> dict[str, set[tuple[str, int]]]:
    """The module graph with each module replaced by its package (`package`)."""

    out: dict[str, set[tuple[str, int]]] = {}
    for a, targets in graph.items():
        out.setdefault(package(a), set())
        out[package(a)] |= {(package(b), line) for b, line in targets if package(b) != package(a)}
    return out


PACKAGES = {p.name for p in (SRC / "rlhfkit").iterdir() if (p / "__init__.py").is_file()}


def package_circle_edges(graph: dict[str, set[tuple[str, int]]], component: list[str]) -> list[str]:
    """The module imports that make the package circle `component`: "a:line -> b"."""

    inside = set(component)
    return sorted(f"{a}:{line} -> {b}" for a, targets in graph.items() for b, line in targets
                  if package(a) in inside and package(b) in inside and package(a) != package(b))


def test_no_import_circles_between_packages():
    graph = import_graph()
    found = [package_circle_edges(graph, c) for c in cycles(package_graph(graph))]
    assert not found, "package import circles:\n" + "\n\n".join("\n".join(edges) for edges in found)


def test_a_package_circle_without_a_module_circle_is_found(tmp_path):
    """a.x -> b.y and b.z -> a.w (inside a function): no module circle, one package circle."""
    pkg = tmp_path / "rlhfkit"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from rlhfkit.b import y\n")
    (pkg / "b" / "y.py").write_text("")
    (pkg / "b" / "z.py").write_text("def f():\n    from rlhfkit.a import w\n")
    (pkg / "a" / "w.py").write_text("")
    graph = import_graph(tmp_path)
    assert not cycles(graph)
    global PACKAGES
    saved, PACKAGES = PACKAGES, {"a", "b"}
    try:
        assert cycles(package_graph(graph)) == [["rlhfkit.a", "rlhfkit.b"]]
    finally:
        PACKAGES = saved


def test_the_graph_reads_function_level_and_relative_imports(tmp_path):
    """The reader itself: an import inside a function counts, `from . import x` resolves, and a name
    imported from a module is an edge to that module."""
    pkg = tmp_path / "rlhfkit"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from . import low\n")
    (pkg / "a" / "low.py").write_text("def f():\n    from rlhfkit.a.high import g\n")
    (pkg / "a" / "high.py").write_text("from rlhfkit.a.low import f\n")
    graph = import_graph(tmp_path)
    assert graph["rlhfkit.a"] == {("rlhfkit.a.low", 1)}
    assert graph["rlhfkit.a.low"] == {("rlhfkit.a.high", 2)}
    assert cycles(graph) == [["rlhfkit.a.high", "rlhfkit.a.low"]]
