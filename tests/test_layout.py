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
import sys
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


# An rlhfkit import inside a function has a reason this test can check: at the top of its module it would
# (a) close an import circle: the imported module, importing at its own top level (and its packages'
# __init__ on the way), reaches this module; or (b) make this module import a third-party package that it
# does not import now at its top level, directly or through rlhfkit modules (torch for `rlhfkit --help`, the
# labelling app's FastAPI until its address is bound, an optional extra, yaml for the command registry).
# Any other import belongs at the top, where a reader sees what the module depends on.


def _top_level(body: list) -> list:
    """The statements run when the module is imported: function bodies and `if TYPE_CHECKING:` left out."""
    out = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out += _top_level(node.orelse)
            continue
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            inner = list(node.body) + list(getattr(node, "orelse", [])) + list(getattr(node, "finalbody", []))
            inner += [s for h in getattr(node, "handlers", []) for s in h.body]
            out += _top_level(inner)
            continue
        out.append(node)
    return out


def _targets(module: str, is_package: bool, node, mods: dict) -> tuple[set[str], set[str]]:
    """(rlhfkit modules with their parent packages, third-party top-level names) an import statement loads."""
    own, third = set(), set()
    if isinstance(node, ast.Import):
        for a in node.names:
            (own.add(_known(a.name, mods)) if a.name.startswith("rlhfkit") else third.add(a.name.split(".")[0]))
    elif isinstance(node, ast.ImportFrom):
        base = module.split(".") if is_package else module.split(".")[:-1]
        name = (".".join(base[: len(base) - node.level + 1] + [node.module or ""]).rstrip(".")
                if node.level else node.module or "")
        if name.startswith("rlhfkit"):
            own.add(_known(name, mods))
            own |= {f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in mods}
        elif not node.level:
            third.add(name.split(".")[0])
    with_parents = {".".join(m.split(".")[:i]) for m in own if m for i in range(1, len(m.split(".")) + 1)}
    return with_parents, third - set(sys.stdlib_module_names) - {"__future__"}


def unneeded_inner_imports(src: Path = SRC) -> list[str]:
    """"module:line imports X" for each rlhfkit import inside a function that neither (a) nor (b) above excuses."""
    mods = modules(src)
    top: dict[str, tuple[set[str], set[str]]] = {}
    inner: list[tuple[str, int, set[str]]] = []
    for module, (path, is_package) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        at_top = _top_level(tree.body)
        own, third = set(), set()
        for node in at_top:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                o, t = _targets(module, is_package, node, mods)
                own, third = own | o, third | t
        parts = module.split(".")
        top[module] = (own | {".".join(parts[:i]) for i in range(1, len(parts))}) - {module}, third
        kept = {id(n) for n in at_top}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in kept:
                own_targets = _targets(module, is_package, node, mods)[0]
                if own_targets:
                    inner.append((module, node.lineno, own_targets))

    def reach(module: str) -> set[str]:
        seen, stack = set(), [module]
        while stack:
            m = stack.pop()
            if m not in seen and m in top:
                seen.add(m)
                stack += top[m][0]
        return seen

    def third_party(module: str) -> set[str]:
        return {t for m in reach(module) for t in top[m][1]}

    found = []
    for module, line, targets in inner:
        circular = any(module in reach(t) for t in targets)
        new_packages = set().union(*(third_party(t) for t in targets)) - third_party(module)
        if not circular and not new_packages:
            named = sorted(t for t in targets if not any(u.startswith(t + ".") for u in targets))
            found.append(f"{module}:{line} imports {', '.join(named)}")
    return sorted(found)


def test_imports_inside_functions_have_a_reason():
    found = unneeded_inner_imports()
    assert not found, "imports inside functions that belong at the top of the module:\n" + "\n".join(found)


def test_the_inner_import_rule_tells_the_reasons_apart(tmp_path):
    """The checker itself: a circular import and one that brings a third-party package are excused; an import
    that brings nothing new is not."""
    pkg = tmp_path / "rlhfkit"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "low.py").write_text("def f():\n    from rlhfkit.a.high import g\n    from rlhfkit.a.heavy import h\n"
                                      "    from rlhfkit.a.plain import p\n")
    (pkg / "a" / "high.py").write_text("from rlhfkit.a.low import f\n\ndef g():\n    pass\n")
    (pkg / "a" / "heavy.py").write_text("import torch\n\ndef h():\n    pass\n")
    (pkg / "a" / "plain.py").write_text("import json\n\ndef p():\n    pass\n")
    assert unneeded_inner_imports(tmp_path) == ["rlhfkit.a.low:4 imports rlhfkit.a.plain"]
