"""The names TRL, transformers and other rlhfkit commands use for rlhfkit's options.

A user who types TRL's ``num_generations=8`` or ``--learning_rate 1e-5`` means rlhfkit's
``group_size`` and ``lr``; `canonical_key` maps such a name to the option of the command at hand
(``data`` is ``prefs`` in `rlhfkit dpo` and ``prompts`` in `rlhfkit grpo`). Names whose meaning
differs too much to map (``gradient_accumulation_steps``) get a hint naming the
right option instead (`alias_hint`); names rlhfkit knows but does not offer say why (`UNSUPPORTED`). A
did-you-mean names only an option the typed name misspells (`is_typo`). config.yaml always records
rlhfkit's own names.
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
    # more TRL names whose meaning is rlhfkit's option's
    "importance_sampling_level": ("importance_level",),
    "center_rewards_coefficient": ("center_coef",),
    "eval_steps": ("eval_every",),
}

# names that have no one-to-one option: what to use instead
HINTS: dict[str, str] = {
    "gradient_accumulation_steps": "this command derives accumulation: mini_batch_size / micro_batch_size per "
                                   "process (GRPO and the offline trainers read TRL's batch names as TRL does)",
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


# TRL / transformers names rlhfkit knows but does not offer: why, in one line (`alias_hint` says it
# instead of guessing a look-alike name that means something else)
UNSUPPORTED: dict[str, str] = {
    "use_cpu": "rlhfkit trains on the GPU when there is one; CUDA_VISIBLE_DEVICES= (empty) makes it use the CPU",
    "per_device_eval_batch_size": "evaluation runs in the training micro_batch_size batches (sampling: "
                                  "generation_batch_size prompts per generate call)",
    "dataset_text_field": "name the column in the data spec: data=FILE?columns=text:FIELD (docs/data-formats.md)",
    "repetition_penalty": "not offered: it changes the sampling distribution, so the log-probs the update "
                          "uses would not be the policy's (a biased gradient)",
    "min_p": "not offered: truncated sampling biases the stored log-probs (top_k/top_p exist, off by default)",
    "shuffle_dataset": "the training data is always shuffled, every epoch, from `seed`",
    "iterations": "this command counts optimiser steps: max_steps (or epochs)",
    "eval_steps": "this command evaluates before and after training only (sft and rm take it, as eval_every)",
    "neftune_noise_alpha": "NEFTune embedding noise is not offered",
    "use_liger_kernel": "Liger's fused kernels are not used: rlhfkit runs its own chunked losses on CPU and GPU",
    "adam_beta1": "AdamW's betas are fixed at (0.9, 0.999), TRL's defaults",
    "adam_beta2": "AdamW's betas are fixed at (0.9, 0.999), TRL's defaults",
    "sync_ref_model": "TR-DPO's reference updates are not offered: the reference stays the starting model",
    "padding_free": "rows are padded; packing=true (SFT) removes most padding",
    "deepspeed": "the launch picks DeepSpeed ZeRO-2/3: accelerate launch --config_file configs/accelerate/... "
                 "(docs/scale.md)",
    "fsdp": "the launch picks FSDP2: accelerate launch --config_file configs/accelerate/... (docs/scale.md)",
    "load_best_model_at_end": "final/ is the last step's model; checkpoints/ keeps the earlier ones",
    "metric_for_best_model": "final/ is the last step's model; checkpoints/ keeps the earlier ones",
    "logging_dir": "logs go into the run folder (output_dir/run_name): metrics.jsonl and tensorboard/",
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
    if key in UNSUPPORTED:
        return f" (TRL's {key}: {UNSUPPORTED[key]})"
    names = {name: name for name in fields}
    names.update({alias: target for alias in ALIASES if (target := canonical_key(alias, fields))})
    close = [name for name in difflib.get_close_matches(key, list(names), n=3) if is_typo(key, name)]
    if not close:
        return ""
    said = close[0]
    target = names[said]
    return f" (did you mean '{target}'?)" if said == target else f" (did you mean '{said}'? rlhfkit calls it '{target}')"


def edit_distance(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
    neighbouring characters, each 1 (``clip_esp`` -> ``clip_eps`` is 1)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def is_typo(typed: str, name: str) -> bool:
    """Whether `typed` reads as a misspelling of `name` (so a did-you-mean names the same option),
    not another word: at most 1 edit for names of up to 4 characters, else at most 2
    (``itertions``, ``max_completion_lenght``; not ``eval_steps`` for ``max_steps``)."""
    return edit_distance(typed, name) <= (1 if min(len(typed), len(name)) <= 4 else 2)
