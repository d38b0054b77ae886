"""TRL's and transformers' option values, as rlhfkit's options.

core/aliases.py maps a name to a name (``learning_rate`` is ``lr``). Some TRL options need their
value read too: ``report_to=[tensorboard, wandb]`` is two rlhfkit switches, ``dtype=bfloat16`` is
``dtype=bf16``, GRPO's ``loss_type=dr_grpo`` is ``loss_agg=constant``. `translate` rewrites such
keys of a config's values (before they are coerced and validated, core/config.build_config) and
returns a one-line problem for a value that has no rlhfkit meaning. Plain text only: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlhfkit.core.aliases import canonical_key

REPORTERS = ("tensorboard", "wandb")  # report_to's integrations rlhfkit writes to
DTYPE_WORDS = {"bfloat16": "bf16", "torch.bfloat16": "bf16", "float32": "fp32", "torch.float32": "fp32",
               "float": "fp32", "bf16": "bf16", "fp32": "fp32", "auto": "auto"}
FP16_WORDS = ("float16", "torch.float16", "fp16", "half")
# TRL 1.16 GRPOTrainer._compute_loss -> rlhfkit's loss_agg (algos/losses.aggregate_loss; docs/algorithms.md)
GRPO_LOSS_TYPES = {"grpo": "seq-mean", "dapo": "token-mean", "bnpo": "token-mean", "dr_grpo": "constant"}
HUB_KEYS = ("hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_revision")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def _words(raw: Any) -> list[str]:
    """``[a, b]``, ``a,b``, ``"[a, b]"`` (a command line), ``a`` -> ``["a", "b"]`` / ``["a"]``, lower case."""
    items = raw if isinstance(raw, (list, tuple)) else str(raw).strip().strip("[]").split(",")
    return [str(x).strip().strip("'\"").lower() for x in items if str(x).strip().strip("'\"")]


def _flag(raw: Any) -> bool | None:
    """A boolean as YAML or a command line gives it; None when it is not one."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    return True if text in TRUE_WORDS else False if text in FALSE_WORDS else None


def report_to(raw: Any, fields: set[str]) -> tuple[dict[str, Any], list[str]]:
    """transformers' report_to: none / all / tensorboard / wandb, or a list of them."""
    words = _words(raw)
    unknown = [w for w in words if w not in (*REPORTERS, "none", "all")]
    if unknown:
        return {}, [f"report_to={raw!r}: rlhfkit writes to tensorboard and wandb (or none); "
                    f"{', '.join(unknown)} is not offered (metrics.jsonl in the run folder has every metric)"]
    if "all" in words:  # transformers: every integration installed
        values: dict[str, Any] = {"tensorboard": None, "wandb": _installed("wandb")}
    else:
        values = {"tensorboard": "tensorboard" in words, "wandb": "wandb" in words}
    return {k: v for k, v in values.items() if k in fields}, []


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def dtype(raw: Any) -> tuple[dict[str, Any], list[str]]:
    text = str(raw).strip().lower()
    if text in FP16_WORDS:
        return {}, [f"dtype={raw!r}: fp16 is not offered (bf16 or fp32; dtype=auto picks bf16 where it is fast)"]
    return {"dtype": DTYPE_WORDS.get(text, raw)}, []


def eval_strategy(raw: Any, fields: set[str], values: dict) -> tuple[dict[str, Any], list[str]]:
    """no: no evaluation during training (and no judged/before-after samples where a command has them);
    steps: every eval_steps (eval_every); epoch: not offered."""
    text = str(raw).strip().lower()
    if text == "no":
        return {k: 0 for k in ("eval_every", "num_eval_prompts", "max_eval_examples") if k in fields}, []
    if text == "steps":
        if "eval_every" not in fields:
            return {}, ["eval_strategy=steps: this command evaluates before and after training only "
                        "(eval_strategy=no turns that off)"]
        given = any(canonical_key(str(k), fields) == "eval_every" for k in values)
        return {}, [] if given else ["eval_strategy=steps needs eval_steps=N (optimiser steps between evaluations)"]
    return {}, [f"eval_strategy={raw!r}: give no, or steps with eval_steps=N (evaluation by epoch is not offered)"]


def save_strategy(raw: Any, fields: set[str]) -> tuple[dict[str, Any], list[str]]:
    text = str(raw).strip().lower()
    if text == "no":
        return ({"save_every": 0} if "save_every" in fields else {}), []
    if text == "steps":
        return {}, []
    return {}, [f"save_strategy={raw!r}: give no (checkpoints only when stopped) or steps with save_steps=N "
                "(final/ is always written)"]


def push_to_hub(raw: Any) -> tuple[dict[str, Any], list[str]]:
    if _flag(raw) is False:
        return {}, []
    return {}, ["push_to_hub: rlhfkit does not upload while training; afterwards run `rlhfkit export RUN_DIR OUT` "
                "and `hf upload HUB_MODEL_ID OUT` on a machine that reaches the Hub"]


def trust_remote_code(raw: Any) -> tuple[dict[str, Any], list[str]]:
    if _flag(raw) is False:
        return {}, []
    return {}, ["trust_remote_code: not offered: rlhfkit loads the architectures transformers ships, never a "
                "model folder's own Python code"]


def attn_implementation(raw: Any) -> tuple[dict[str, Any], list[str]]:
    if str(raw).strip().lower() in ("sdpa", "none", ""):
        return {}, []
    return {}, [f"attn_implementation={raw!r}: rlhfkit runs transformers' sdpa attention (its own exact wrapper "
                "on the CPU, models/attention.py); sdpa is the one value taken"]


def grpo_loss_type(raw: Any) -> tuple[dict[str, Any], list[str]]:
    text = str(raw).strip().lower()
    if text not in GRPO_LOSS_TYPES:
        return {}, [f"loss_type={raw!r}: rlhfkit offers TRL's {', '.join(GRPO_LOSS_TYPES)} (as loss_agg: "
                    "docs/algorithms.md)"]
    return {"loss_agg": GRPO_LOSS_TYPES[text]}, []


def scale_rewards(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """TRL's group / batch / none; rlhfkit's earlier true / false (group / none)."""
    flag = _flag(raw)
    if flag is not None:
        return {"scale_rewards": "group" if flag else "none"}, []
    return {"scale_rewards": str(raw).strip().lower()}, []


# the TRL options this module reads: `--report_to none` (two words) is taken as report_to=none
VALUE_KEYS = ("report_to", "eval_strategy", "evaluation_strategy", "save_strategy", "push_to_hub", "trust_remote_code",
              "attn_implementation", "loss_type", *HUB_KEYS)


def translate(values: dict[str, Any], fields: Iterable[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """`values` with TRL's value-bearing options as rlhfkit's (a command's own option of the same name
    is left alone), and the problems found as (key given, one line). A translated key is replaced
    by the options it means, which win over the same options given directly."""
    fields = set(fields)
    out: dict[str, Any] = {}
    meant: dict[str, Any] = {}  # what TRL's options mean wins over the keys they set (eval_strategy=no, eval_steps)
    problems: list[tuple[str, str]] = []
    for key, raw in values.items():
        key_text = str(key)
        name = canonical_key(key_text, fields) or key_text
        if key_text in fields and key_text not in ("dtype", "scale_rewards"):
            out[key] = raw
            continue
        if name == "dtype" and "dtype" in fields:
            new, found = dtype(raw)
        elif name == "scale_rewards" and "scale_rewards" in fields:
            new, found = scale_rewards(raw)
        elif key_text == "report_to":
            new, found = report_to(raw, fields)
        elif key_text == "eval_strategy" or key_text == "evaluation_strategy":
            new, found = eval_strategy(raw, fields, values)
        elif key_text == "save_strategy":
            new, found = save_strategy(raw, fields)
        elif key_text == "push_to_hub":
            new, found = push_to_hub(raw)
        elif key_text in HUB_KEYS:  # push_to_hub's problem names what to do; without it TRL ignores them too
            new, found = {}, []
        elif key_text == "trust_remote_code":
            new, found = trust_remote_code(raw)
        elif key_text == "attn_implementation":
            new, found = attn_implementation(raw)
        elif key_text == "loss_type" and "loss_agg" in fields:
            new, found = grpo_loss_type(raw)
        else:
            out[key] = raw
            continue
        meant.update(new)
        problems += [(key_text, line) for line in found]
    return {**out, **meant}, problems
