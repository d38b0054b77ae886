"""RUN/final/README.md, the model card a finished run writes in place of peft's blank template:
the base model, the method, the data, the final metrics and the command that reproduces the run.
(`rlhfkit export` writes a fuller card for publishing: commands/export_card.py.)"""

from __future__ import annotations

from typing import Any

DATA_OPTIONS = ("data", "prefs", "prompts", "eval_data", "eval_prompts", "reward", "judge")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def final_card(command: str, run_name: str, config: dict, summary: dict, base: str | None, adapter: bool) -> str:
    """README.md text. `config`: config.yaml's values; `summary`: summary.json's; `base`: what the
    adapter's base_model_name_or_path holds (None for full weights)."""
    metrics = summary.get("eval_after") or summary.get("final_metrics") or {}
    on = {"held-out": "held-out evaluation", "held-back": "evaluation on records held back from training",
          "training": "evaluation on training records (the data has no held-out split)"}
    which = (f"{on.get(str(summary.get('eval_on')), 'evaluation')} after training" if summary.get("eval_after")
             else "the last training step")
    lines = ["---", f"library_name: {'peft' if adapter else 'transformers'}", "tags:", "- rlhfkit", f"- {command}"]
    if adapter:
        lines.append("- lora")
    if base and not base.startswith("/"):
        lines.append(f"base_model: {base}")
    lines += ["---", "", f"# {run_name}", "",
              f"Trained with `rlhfkit {command}` (method: **{command}**) "
              + ("as a LoRA adapter." if adapter else "as full weights."), ""]
    lines += ["| | |", "|---|---|", f"| base model | `{config.get('model')}`"
              + (f" (adapter base: `{base}`)" if base and base != config.get("model") else "") + " |"]
    lines += [f"| {k} | `{_value(config[k])}` |" for k in DATA_OPTIONS if config.get(k)]
    lines += ["", f"## Metrics ({which})", "", "| metric | value |", "|---|---|"]
    lines += [f"| `{k}` | {_value(v)} |" for k, v in metrics.items() if isinstance(v, (int, float))
              and not isinstance(v, bool)] or ["| (none logged) | |"]
    lines += ["", "## Reproduce", "", "The run folder's config.yaml holds every option:", "", "```",
              f"rlhfkit {command} RUN_DIR/config.yaml", "```", ""]
    return "\n".join(lines)
