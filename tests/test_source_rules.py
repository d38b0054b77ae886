"""Rules of the source tree, read from its syntax (no model runs), each checked as stated here:

1. transformers' internals live in models/hf_compat.py: no other file names one of INTERNALS (an
   identifier, attribute, keyword, imported name or string outside a docstring) nor imports from a
   transformers submodule (`from transformers.x import ...`, `import transformers.x`); only
   transformers' top-level names are used elsewhere. Not covered: reading a decoder's layer list and
   embedding by attribute (models/trunk.py does, for the model types in its SPLITTABLE list).
2. torch's private names (TORCH_PRIVATE) appear only where TORCH_PRIVATE_USERS says, with the reason.
3. Process-wide state changes only where PROCESS_WIDE says, each with its reason: a `global`
   statement; an assignment (=, +=, setattr, del) to an attribute or item of an imported name; a call
   of PROCESS_CALLS (the environment, the global RNGs, torch's thread count and defaults, warning
   filters) or of `.register` on an imported name (a library's registry); a module-level
   `threading.local()` (state per thread, but shared by all code of the process).
"""

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

# torch's private names, and the one file allowed each.
TORCH_PRIVATE = {"_get_fsdp_state", "_lazy_init"}
TORCH_PRIVATE_USERS = {
    # FSDP2's lazy set-up must run before the first forward of a model whose sharded submodules are
    # called directly (sampling calls the causal LM inside the wrapper); torch has no public call for it
    ("runtime/fsdp2.py", "_get_fsdp_state"), ("runtime/fsdp2.py", "_lazy_init"),
}

# Calls that change state of the whole process.
PROCESS_CALLS = {
    "os.environ.setdefault", "os.environ.update", "os.environ.pop", "os.putenv", "os.unsetenv",
    "torch.manual_seed", "torch.set_num_threads", "torch.set_default_dtype", "torch.set_default_device",
    "torch.use_deterministic_algorithms", "random.seed", "np.random.seed", "numpy.random.seed",
    "warnings.filterwarnings", "warnings.simplefilter",
}

# HF generate, and the lean and episode loops built like it, draw from torch's global RNG and take no
# generator: each draw seeds it, so a sample is a function of its seed alone.
SAMPLING_SEED = "torch.manual_seed"

# Process-wide state changes that must be, each with its reason (one entry per file and kind).
PROCESS_WIDE = {
    # glibc's malloc settings belong to the process; this records that they were applied once
    ("core/allocator.py", "global _applied"),
    # importing a user's file registers it by name, as every import does (dataclasses and pickle look it up)
    ("core/imports.py", "sys.modules[mod_name]"),
    # transformers' grouped-heads decision has no per-model hook (hf_compat.py's docstring)
    ("models/hf_compat.py", "hf_sdpa.use_gqa_in_sdpa"),
    # transformers' attention registry is process-wide: a new name is added, no existing one changes
    ("models/hf_compat.py", "AttentionInterface.register"), ("models/hf_compat.py", "AttentionMaskInterface.register"),
    # the command line, before transformers is imported, quiets its advisories (the user's settings win)
    ("cli.py", "os.environ.setdefault"), ("cli.py", "warnings.filterwarnings"),
    # inside warnings.catch_warnings(): the filters are restored when the block ends
    ("rollout/multiturn.py", "warnings.simplefilter"),
    # vLLM reads this when its engine is built: the engine in-process, so its weights can be loaded
    ("rollout/backends.py", "os.environ.setdefault"),
    # a run seeds every RNG once at its start (core/seeding.py); the worked examples and tiny models of
    # `rlhfkit learn`/selfcheck are seeded where they are built
    ("core/seeding.py", "random.seed"), ("core/seeding.py", "np.random.seed"), ("core/seeding.py", SAMPLING_SEED),
    ("learn/worked.py", SAMPLING_SEED), ("learn/breaks.py", SAMPLING_SEED), ("learn/tiny.py", SAMPLING_SEED),
    ("learn/minimal_ppo.py", SAMPLING_SEED),
    # the minimal PPO script runs as its own process (`python -m rlhfkit.learn.minimal_ppo`): one thread
    ("learn/minimal_ppo.py", "torch.set_num_threads"),
    # the ablation script too (`python -m rlhfkit.learn.ablations`), in its main() only
    ("learn/ablations.py", "torch.set_num_threads"),
    # the sampling draws (SAMPLING_SEED's reason)
    ("rollout/texts.py", SAMPLING_SEED), ("rollout/multiturn.py", SAMPLING_SEED), ("rollout/backends.py", SAMPLING_SEED),
    ("commands/tpo.py", SAMPLING_SEED),
    # the reward model's fresh score head is initialised from the run's seed (nn.Linear takes no generator)
    ("trainers/rm.py", SAMPLING_SEED),
    # the sampler thread sets its intra-op thread count to the main thread's (the same value: same numerics)
    ("trainers/offpolicy.py", "torch.set_num_threads"),
    # per-thread state: the sampling generator of a thread (one_step_off_policy), the attention flags of
    # rlhfkit's sdpa, the fused head's workspace; each read and written by its own thread only
    ("rollout/sampling.py", "threading.local()"), ("models/attention.py", "threading.local()"),
    ("algos/head.py", "threading.local()"),
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


def process_wide(tree: ast.Module) -> list[str]:
    """Rule 3's changes of process-wide state in `tree`: `global NAME`; the target of an assignment
    (=, +=, setattr, del) to an attribute or item of an imported name; the function of a PROCESS_CALLS
    call or of a `.register` call on an imported name; `threading.local()` assigned at module level."""
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
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if (isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                    and node.args and root(node.args[0]) in imported):
                found.append(ast.unparse(node))
            elif func in PROCESS_CALLS or (isinstance(node.func, ast.Attribute) and node.func.attr == "register"
                                           and root(node.func.value) in imported):
                found.append(func)
    found += ["threading.local()" for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
              and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "threading.local"]
    return found


def transformers_submodule_imports(tree: ast.Module) -> list[str]:
    """Rule 1's imports from a transformers submodule in `tree` (at any depth)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformers."):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("transformers.")]
    return found


def test_only_the_compat_module_names_transformers_internals():
    compat = str(COMPAT.relative_to(SRC))
    names = {path: sorted(names_used(tree) & INTERNALS) for path, tree in sources() if path != compat}
    assert {path: found for path, found in names.items() if found} == {}
    imports = {path: transformers_submodule_imports(tree) for path, tree in sources() if path != compat}
    assert {path: found for path, found in imports.items() if found} == {}
    compat_tree = ast.parse(COMPAT.read_text())
    assert names_used(compat_tree) & INTERNALS and transformers_submodule_imports(compat_tree)  # the rule reads


def test_torch_private_names_only_where_listed():
    found = {(path, name) for path, tree in sources() for name in names_used(tree) & TORCH_PRIVATE}
    assert found == TORCH_PRIVATE_USERS


def test_the_rules_catch_what_they_forbid():
    code = ("import os, threading, torch, transformers\nfrom rlhfkit.rollout import logprobs as lp\n"
            "from transformers.cache_utils import X\nSTATE = threading.local()\n"
            "def f(model, c):\n    global BUDGET\n    lp.CHUNK = 3\n    setattr(transformers, 'x', 1)\n"
            "    os.environ.setdefault('A', '1')\n    torch.manual_seed(0)\n    transformers.Registry.register('n', f)\n"
            "    local = threading.local()\n"
            "    return model(past_key_values=c).past_key_values\n")
    tree = ast.parse(code)
    assert process_wide(tree) == ["global BUDGET", "lp.CHUNK", "setattr(transformers, 'x', 1)",
                                  "os.environ.setdefault", "torch.manual_seed", "transformers.Registry.register",
                                  "threading.local()"]
    assert names_used(tree) & INTERNALS == {"past_key_values", "cache_utils"}
    assert transformers_submodule_imports(tree) == ["from transformers.cache_utils import ..."]
    assert not names_used(ast.parse('def f():\n    """past_key_values in prose."""\n')) & INTERNALS


def test_process_wide_state_changes_only_where_listed():
    found = {(path, what) for path, tree in sources() for what in process_wide(tree)}
    assert found - PROCESS_WIDE == set()
    assert PROCESS_WIDE - found == set()  # every exception still exists, so the list stays short
