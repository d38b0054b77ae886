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

import json

import pytest
import torch

from rlhfkit.cli import main as cli_main

from device_guard import HostFactoryGuard

PROMPTS = [f"Write a review of thing number {i}." for i in range(16)]
VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")
GOOD = ["aa ee", "ee aa", "oo aa ee", "aa oo ee", "ee ii", "aa aa"]
BAD = ["th strct grd", "brr sh tkt", "xyz rhythm", "grr psst shh", "crwth trk", "bzz nth dst"]
RL = ["iterations=1", "max_new_tokens=6", "num_eval_prompts=2"]
GROUPS = ["rollout_batch_size=8", "group_size=4", "mini_batch_size=8", "micro_batch_size=4", "share_prompts=true"]
PAIRS = ["epochs=1", "batch_size=4", "micro_batch_size=2", "max_steps=1", "num_eval_prompts=1", "max_new_tokens=4"]

COMMANDS = {  # id: the command line after `rlhfkit`; {model} {prompts} {reward} {prefs} {examples} {sft} filled in
    "ppo-lora-top-trunk": ["ppo", *RL, "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
                           "lora_layers=1", "share_prefix=true", "kl_coef=0.05"],
    "ppo-full-reference": ["ppo", *RL, "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
                           "lora=false", "dtype=bf16"],
    "ppo-critic-model": ["ppo", *RL, "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
                         "critic_model={model}"],
    "trpo": ["trpo", *RL, "rollout_batch_size=4", "vf_mini_batch_size=4", "micro_batch_size=2"],
    "grpo": ["grpo", *RL, *GROUPS, "beta=0.05"],
    "rloo": ["rloo", *RL, *GROUPS],
    "gspo": ["gspo", *RL, *GROUPS],
    "dapo": ["dapo", *RL, *GROUPS, "dynamic_sampling=false"],
    "reinforce_pp": ["reinforce_pp", *RL, "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2"],
    "grpo-one-step-off-policy": ["grpo", *RL, *GROUPS, "one_step_off_policy=true", "iterations=2"],
    "grpo-multi-turn": ["grpo", *RL, *GROUPS, "env=arithmetic-tool", "prompts=builtin:arithmetic", "max_turns=2",
                        "max_total_tokens=96"],
    "dpo": ["dpo", "prefs={prefs}", *PAIRS, "share_prompts=true"],
    "simpo": ["simpo", "prefs={prefs}", *PAIRS],
    "orpo": ["orpo", "prefs={prefs}", *PAIRS],
    "kto": ["kto", "data={examples}", *PAIRS],
    "online-dpo": ["online-dpo", "judge={reward}", "iterations=1", "prompts_per_iteration=2", "micro_batch_size=2",
                   "max_new_tokens=4", "num_eval_prompts=1", "eval_samples_per_prompt=1"],
    "rm": ["rm", "data={prefs}", "epochs=1", "batch_size=4", "micro_batch_size=2", "max_steps=1", "max_eval_pairs=2"],
    "sft": ["sft", "data={sft}", "epochs=1", "batch_size=4", "micro_batch_size=2", "max_steps=1",
            "max_eval_examples=2"],
}
NEEDS_PROMPTS = ("ppo", "trpo", "grpo", "rloo", "gspo", "dapo", "reinforce_pp", "online-dpo")


def write_inputs(tmp_path) -> dict[str, str]:
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS))
    (tmp_path / "vowels.py").write_text(VOWELS)
    pairs = [{"prompt": p, "chosen": GOOD[i % 6], "rejected": BAD[i % 6], "split": "test" if i >= 12 else "train"}
             for i, p in enumerate(PROMPTS)]
    (tmp_path / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    examples = [{"prompt": p, "completion": (GOOD if i % 2 else BAD)[i % 6], "label": bool(i % 2),
                 "split": "test" if i >= 12 else "train"} for i, p in enumerate(PROMPTS)]
    (tmp_path / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in examples))
    sft = [{"prompt": p, "completion": GOOD[i % 6], "split": "test" if i >= 12 else "train"}
           for i, p in enumerate(PROMPTS)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    return {"prompts": str(tmp_path / "prompts.txt"), "reward": f"python:{tmp_path / 'vowels.py'}:reward",
            "prefs": str(tmp_path / "prefs.jsonl"), "examples": str(tmp_path / "kto.jsonl"),
            "sft": str(tmp_path / "sft.jsonl")}


def command_line(name: str, tmp_path, model_dir) -> list[str]:
    values = {**write_inputs(tmp_path), "model": str(model_dir)}
    args = [a.format(**values) for a in COMMANDS[name]]
    extra = [f"model={model_dir}", f"output_dir={tmp_path / 'runs'}", "run_name=t", "quiet=true",
             "tensorboard=false", "save_every=0"]
    if args[0] in NEEDS_PROMPTS and not any(a.startswith("prompts=") for a in args):
        extra.append(f"prompts={values['prompts']}")
    if args[0] in NEEDS_PROMPTS[:-1]:
        extra.append(f"reward={values['reward']}")
    if not any(a.startswith("dtype=") for a in args):
        extra.append("dtype=fp32")
    return [args[0], *extra, *args[1:]]


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
