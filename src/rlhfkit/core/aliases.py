"""The names TRL, transformers and other rlhfkit commands use for rlhfkit's options.

A user who types TRL's ``num_generations=8`` or ``--learning_rate 1e-5`` means rlhfkit's
``group_size`` and ``lr``; `canonical_key` maps such a name to the option of the command at hand
(``data`` is ``prefs`` in `rlhfkit dpo` and ``prompts`` in `rlhfkit grpo`). Names whose meaning
differs too much to map (``gradient_accumulation_steps``, ``report_to``) get a hint naming the
right option instead (`alias_hint`). config.yaml always records rlhfkit's own names.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# name users type -> rlhfkit options it may mean, in order; the first one the command has wins.
# A name that is itself an option of the command is never mapped (DPO's `loss_type` stays DPO's).
ALIASES: dict[str, tuple[str, ...]] = {
    # transformers.TrainingArguments / TRL configs
    "learning_rate": ("lr",),
    "adam_epsilon": ("adam_eps",),
    "model_name_or_path": ("model",),
    "sft_model_path": ("model",),
    "model_id": ("model",),
    "per_device_train_batch_size": ("micro_batch_size",),
    "num_train_epochs": ("epochs",),
    "max_steps": ("iterations",),
    "save_steps": ("save_every",),
    "save_total_limit": ("keep_checkpoints",),
    "resume_from_checkpoint": ("resume",),
    "use_peft": ("lora",),
    "torch_dtype": ("dtype",),
    "max_seq_length": ("max_length",),
    # GRPO / RLOO / PPO in TRL
    "num_generations": ("group_size",),
    "rloo_k": ("group_size",),
    "max_completion_length": ("max_new_tokens", "max_response_length"),
    "response_length": ("max_new_tokens", "max_response_length"),
    "num_iterations": ("update_epochs",),
    "num_ppo_epochs": ("ppo_epochs",),
    "epsilon": ("clip_eps",),
    "cliprange": ("clip_eps",),
    "epsilon_high": ("clip_eps_high",),
    "cliprange_value": ("value_clip_eps",),
    "kl_coef": ("beta",),
    "mask_truncated_completions": ("overlong_filter",),
    "reward_funcs": ("reward", "judge", "rewards"),
    "ref_model": ("reference_model",),
    "reference_model": ("ref_model",),
    # datasets
    "dataset_name": ("prompts", "prefs", "data"),
    "dataset": ("prompts", "prefs", "data"),
    "train_dataset": ("prompts", "prefs", "data"),
    "eval_dataset": ("eval_prompts", "eval_data"),
    "eval_dataset_name": ("eval_prompts", "eval_data"),
    "dataset_test_split": ("eval_split",),
    # one name per concept across rlhfkit's own commands
    "data": ("prefs", "prompts"),
    "prefs": ("data",),
    "eval_prompts": ("eval_data",),
    "eval_data": ("eval_prompts",),
    "reward": ("judge", "rewards", "scorer"),
    "judge": ("reward", "rewards", "scorer"),
    "rewards": ("reward", "judge"),
    "output_dir": ("out_dir",),
    "out_dir": ("output_dir",),
}

# names that have no one-to-one option: what to use instead
HINTS: dict[str, str] = {
    "gradient_accumulation_steps": "this command derives accumulation: mini_batch_size / micro_batch_size per "
                                   "process (GRPO and the offline trainers read TRL's batch names as TRL does)",
    "report_to": "use tensorboard=true (the default when installed) and/or wandb=true",
    "logging_steps": "every iteration / optimiser step is logged",
    "bf16": "use dtype=bf16",
    "fp16": "use dtype=bf16 (fp16 is not offered)",
    "use_vllm": "use generation_backend=vllm",
    "reward_model": "use reward=model:PATH (a folder or Hub id of a sequence-classification model)",
    "reward_model_path": "use reward=model:PATH (a folder or Hub id of a sequence-classification model)",
    "total_episodes": "use iterations x rollout_batch_size",
    "num_mini_batches": "use mini_batch_size (sequences per optimiser step)",
    "loss_type": "GRPO's loss aggregation is loss_agg (token-mean | seq-mean | constant)",
    "num_train_epochs": "use iterations (RL trains on fresh samples each iteration)",
}


def canonical_key(key: str, fields: Iterable[str]) -> str | None:
    """The option of a command (its `fields`) that `key` names: `key` itself, or the first option its
    alias maps to; None when it names none."""
    fields = set(fields)
    if key in fields:
        return key
    return next((name for name in ALIASES.get(key, ()) if name in fields), None)


def aliases_of(name: str, fields: Iterable[str]) -> list[str]:
    """The other names that mean option `name` in a command with these `fields` (for --help)."""
    fields = set(fields)
    return [alias for alias in ALIASES if alias not in fields and canonical_key(alias, fields) == name]


def alias_hint(key: str, fields: Iterable[str]) -> str:
    """What to write instead of an unknown `key`: ``(did you mean 'group_size'? ...)``, a HINTS line, or ""."""
    fields = list(fields)
    if key in HINTS:
        return f" ({HINTS[key]})"
    names = {name: name for name in fields}
    names.update({alias: target for alias in ALIASES if (target := canonical_key(alias, fields))})
    close = difflib.get_close_matches(key, list(names), n=1)
    if not close:
        return ""
    said = close[0]
    target = names[said]
    return f" (did you mean '{target}'?)" if said == target else f" (did you mean '{said}'? rlhfkit calls it '{target}')"
