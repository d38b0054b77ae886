"""Rules of the source tree, read from its syntax (no model runs): transformers' internals are
named in models/hf_compat.py only, and no module-level name of rlhfkit (nor of a module it imports)
is assigned after import time."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rlhfkit"
COMPAT = SRC / "models" / "hf_compat.py"

# transformers' names that change between releases: the KV cache's keyword and classes, the
# attention registry and its grouped-heads decision, the checkpointing methods and properties.
INTERNALS = {
    "past_key_values", "DynamicCache", "StaticCache", "StaticLayer", "cache_utils", "ALL_ATTENTION_FUNCTIONS",
    "AttentionInterface", "sdpa_attention", "sdpa_attention_forward", "use_gqa_in_sdpa",
    "gradient_checkpointing_enable", "gradient_checkpointing_disable", "activation_checkpointing_enable",
    "activation_checkpointing_disable", "is_gradient_checkpointing", "is_activation_checkpointing",
}

# Assignments to process-wide state that must be, each with its reason.
PROCESS_WIDE = {
    # glibc's malloc settings belong to the process; this records that they were applied once
    ("core/allocator.py", "global _applied"),
    # importing a user's file registers it by name, as every import does (dataclasses and pickle look it up)
    ("core/imports.py", "sys.modules[mod_name]"),
    # transformers' grouped-heads decision has no per-model hook (hf_compat.py's docstring)
    ("models/hf_compat.py", "hf_sdpa.use_gqa_in_sdpa"),
}


def sources() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(SRC)), ast.parse(p.read_text(), str(p))) for p in sorted(SRC.rglob("*.py"))]


def docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (prose may name anything)."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def names_used(tree: ast.Module) -> set[str]:
    """Every identifier, attribute, keyword, imported name and non-docstring string of `tree`."""
    skip, found = docstrings(tree), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {part for a in node.names for part in a.name.split(".")}
            found |= set((getattr(node, "module", None) or "").split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.add(node.value)
    return found


def late_assignments(tree: ast.Module) -> list[str]:
    """`global` statements, and assignments (=, +=, setattr, del) to an attribute or item of a name
    the file imports: each changes a module's state after import time, for the whole process."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {a.asname or a.name for a in node.names}

    def root(target) -> str | None:
        while isinstance(target, (ast.Attribute, ast.Subscript)):
            target = target.value
        return target.id if isinstance(target, ast.Name) else None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [f"global {name}" for name in node.names]
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        found += [ast.unparse(t) for t in targets
                  if isinstance(t, (ast.Attribute, ast.Subscript)) and root(t) in imported]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and node.args and root(node.args[0]) in imported):
            found.append(ast.unparse(node))
    return found


def test_only_the_compat_module_names_transformers_internals():
    offenders = {path: sorted(names_used(tree) & INTERNALS) for path, tree in sources()
                 if path != str(COMPAT.relative_to(SRC))}
    assert {path: names for path, names in offenders.items() if names} == {}
    assert names_used(ast.parse(COMPAT.read_text())) & INTERNALS  # the rule reads what it should


def test_the_rules_catch_what_they_forbid():
    code = ("import transformers\nfrom rlhfkit.rollout import logprobs as lp\n"
            "def f(model, c):\n    global BUDGET\n    lp.CHUNK = 3\n    setattr(transformers, 'x', 1)\n"
            "    return model(past_key_values=c).past_key_values\n")
    tree = ast.parse(code)
    assert late_assignments(tree) == ["global BUDGET", "lp.CHUNK", "setattr(transformers, 'x', 1)"]
    assert names_used(tree) & INTERNALS == {"past_key_values"}
    assert not names_used(ast.parse('def f():\n    """past_key_values in prose."""\n')) & INTERNALS


def test_no_module_level_name_is_assigned_after_import_time():
    found = {(path, what) for path, tree in sources() for what in late_assignments(tree)}
    assert found - PROCESS_WIDE == set()
    assert PROCESS_WIDE - found == set()  # every exception still exists, so the list stays short
