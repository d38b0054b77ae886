"""One short run of every training command on the tiny Llama, as a command line: the matrix that
the device tests (tests/trainers/test_device_factories.py, on the CPU) and the CUDA tests
(tests/test_gpu.py) run. Inputs are written to a test's tmp_path; each run writes `runs/t`."""

from __future__ import annotations

import json

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


def command_line(name: str, tmp_path, model_dir, dtype: str = "fp32") -> list[str]:
    """`rlhfkit NAME ...` as argv, in `dtype` unless the case fixes its own."""
    values = {**write_inputs(tmp_path), "model": str(model_dir)}
    args = [a.format(**values) for a in COMMANDS[name]]
    extra = [f"model={model_dir}", f"output_dir={tmp_path / 'runs'}", "run_name=t", "quiet=true",
             "tensorboard=false", "save_every=0"]
    if args[0] in NEEDS_PROMPTS and not any(a.startswith("prompts=") for a in args):
        extra.append(f"prompts={values['prompts']}")
    if args[0] in NEEDS_PROMPTS[:-1]:
        extra.append(f"reward={values['reward']}")
    if not any(a.startswith("dtype=") for a in args):
        extra.append(f"dtype={dtype}")
    return [args[0], *extra, *args[1:]]
