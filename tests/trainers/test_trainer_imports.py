"""The trainers share code through harness and helper modules (trainers/offline.py, rl.py, pairs.py,
pair_losses.py, advantages.py, data/prefs.py), never through one another: no module in trainers/
imports another trainer's command module, and the loss names are the loss registry's keys."""

from __future__ import annotations

import ast
from pathlib import Path

import rlhfkit.trainers

COMMAND_MODULES = ("dpo", "kto", "sft", "rm", "online_dpo", "ppo", "trpo", "grpo")
TRAINERS = Path(rlhfkit.trainers.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in `path` names, at any depth (lazy imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "rlhfkit.trainers":  # from rlhfkit.trainers import dpo
                names.update(f"rlhfkit.trainers.{alias.name}" for alias in node.names)
    return names


def test_no_trainer_imports_another_trainers_command_module():
    found = []
    for path in sorted(TRAINERS.glob("*.py")):
        for other in COMMAND_MODULES:
            if other != path.stem and f"rlhfkit.trainers.{other}" in imported_modules(path):
                found.append(f"{path.name} imports trainers/{other}.py")
    assert found == []


def test_loss_choices_are_the_registry_keys():
    from rlhfkit.trainers.dpo_config import LOSS_TYPES, REFERENCE_FREE
    from rlhfkit.trainers.online_dpo_config import LOSS_TYPES as ONLINE_LOSS_TYPES
    from rlhfkit.trainers.pair_losses import PAIR_LOSSES

    assert LOSS_TYPES == tuple(PAIR_LOSSES) == ("sigmoid", "ipo", "cdpo", "hinge", "robust", "simpo", "orpo")
    assert REFERENCE_FREE == ("simpo", "orpo")
    assert ONLINE_LOSS_TYPES == ("sigmoid", "ipo", "cdpo", "hinge", "robust")


def test_evaluate_and_sft_do_not_import_each_other():
    root = TRAINERS.parent
    assert "rlhfkit.trainers.sft" not in imported_modules(root / "commands" / "evaluate.py")
