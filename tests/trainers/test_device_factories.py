"""No tensor is made on the default device where the input's device is meant.

On a GPU such a tensor crashes the first forward (`torch.arange` in shared prompts did, for GRPO,
DPO and every path that shares prompts); on a CPU it passes unseen. Each command below runs one
short step on the tiny Llama under tests/device_guard.py's `HostFactoryGuard`, which records every
tensor factory rlhfkit calls without `device=`: together they cover sampling (plain and shared
prompts), the log-prob pass, the shared prefix and trunk, the value head, the frozen reference and
the adapter-off one, multi-turn episodes, one-step-off-policy sampling, the offline pair and example
passes, evaluation and generation.
"""

from __future__ import annotations

import pytest
import torch

from rlhfkit.cli import main as cli_main

from command_matrix import COMMANDS, command_line, write_inputs
from device_guard import HostFactoryGuard


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_factory_in_a_training_step_names_its_device(tmp_path, tiny_model_dir, name):
    argv = command_line(name, tmp_path, tiny_model_dir)
    with HostFactoryGuard() as guard:
        assert cli_main(argv) == 0
    assert (tmp_path / "runs" / "t" / "final").is_dir()
    assert sorted(guard.sites) == [], f"tensor factories without device= during `rlhfkit {' '.join(argv[:1])}`"


def test_generate_eval_tpo_and_prefs_name_their_devices(tmp_path, tiny_model_dir):
    values = write_inputs(tmp_path)
    with HostFactoryGuard() as guard:
        assert cli_main(["prefs", "make", f"model={tiny_model_dir}", f"prompts={values['prompts']}", "num_prompts=2",
                         "k=2", f"scorer={values['reward']}", "max_new_tokens=4", "dtype=fp32",
                         f"out={tmp_path / 'made.jsonl'}"]) == 0
        assert cli_main(["tpo", f"model={tiny_model_dir}", f"prompts={values['prompts']}", "num_prompts=2",
                         f"reward={values['reward']}", "num_candidates=2", "rounds=1", "max_new_tokens=4",
                         "feedback_max_new_tokens=4", "dtype=fp32", f"out_dir={tmp_path / 'tpo'}"]) == 0
        assert cli_main(["generate", "--model", str(tiny_model_dir), "--prompt", "Say hi.", "--num-samples", "2",
                         "--max-new-tokens", "4"]) == 0
        assert cli_main(["eval", f"model={tiny_model_dir}", f"prompts={values['prompts']}",
                         f"rewards=[{values['reward']}]", "num_prompts=2", "max_new_tokens=4", "dtype=fp32",
                         f"out_dir={tmp_path / 'eval'}"]) == 0
    assert sorted(guard.sites) == []


def test_the_guard_sees_a_factory_without_device_in_library_code():
    """The guard is not blind: shared prompts' row numbering made its `arange` on the default device
    (the GPU crash at GRPO's and DPO's first forward); `device="cpu"` is accepted, torch's own calls ignored."""
    from rlhfkit.models.shared_prompts import distinct_prompts

    ids = torch.tensor([[5, 6], [5, 6], [7, 8]], device="cpu")
    with HostFactoryGuard() as guard:
        distinct_prompts(ids, torch.ones_like(ids))
        torch.nn.functional.pad(ids, (1, 0))
        torch.zeros(2, device="cpu")
    assert all(site.startswith("models/shared_prompts.py:") for site in guard.sites)
    with HostFactoryGuard() as guard:
        exec(compile("import torch\ntorch.arange(3)\n", "elsewhere.py", "exec"), {})
    assert guard.sites == set()


def test_no_factory_in_the_source_omits_its_device():
    """The same rule over every line of src/rlhfkit, run or not (vLLM, DeepSpeed and GPU-only branches
    included): each `torch.<factory>(...)` and `torch.Generator(...)` passes `device=` (or `**kwargs`)."""
    import ast
    from pathlib import Path

    from device_guard import FACTORIES, PACKAGE_DIR

    names = {f.__name__ for f in FACTORIES} | {"Generator"}
    missing = []
    for path in sorted(Path(PACKAGE_DIR).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                    and not any(k.arg in ("device", None) for k in node.keywords)):
                missing.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} torch.{node.func.attr}")
    assert missing == []
