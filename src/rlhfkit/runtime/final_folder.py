"""What a finished run writes in RUN/final besides its weights' files: the policy saver the trainers give
`Run.finish` (`actor_saver`), the adapter's base model as any working directory loads it, and the model
card."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhfkit.runtime.model_card import final_card


def actor_saver(run: Any, model, tok) -> Callable:
    """`save(folder, state)` for `run`'s (a runtime/run.py Run) finish: the policy (adapter or full weights, value head) and tokenizer;
    the merged weights in final/merged on request, skipped with a warning when the weights are sharded
    (the adapter in final/ merges with `peft` after training)."""
    from rlhfkit.models.policy import save_actor

    cfg = run.cfg

    def save(folder, state):
        save_actor(model, tok, folder, state_dict=state)
        if cfg.save_merged and cfg.lora and state is None:
            save_actor(model, tok, folder / "merged", merge=True)
        elif cfg.save_merged and cfg.lora:
            run.print("[save] save_merged skipped: the weights are sharded (FSDP/ZeRO-3); the adapter "
                      "in final/ merges with `peft` after training")

    return save


def store_adapter_base(folder: Path, model: str) -> None:
    """folder/adapter_config.json's base_model_name_or_path as what loads from any working directory:
    the Hub id of a Hub model (its revision in `revision`), else the base folder's absolute path (peft
    writes the path the model was loaded from, which may be relative)."""
    import json

    from rlhfkit.models.loading import hub_reference, resolve_model_path

    path = folder / "adapter_config.json"
    if not path.is_file():
        return
    adapter = json.loads(path.read_text())
    hub = hub_reference(str(model))
    if hub is not None:
        adapter["base_model_name_or_path"] = hub[0]
        if hub[1]:
            adapter["revision"] = hub[1]
    else:
        adapter["base_model_name_or_path"] = str(resolve_model_path(str(model)).resolve())
    path.write_text(json.dumps(adapter, indent=2, sort_keys=True))


def write_model_card(final: Path, command: str, run_name: str, config: dict, summary: dict) -> None:
    """final/README.md: rlhfkit's card (runtime/model_card.py) in place of peft's blank template."""
    import json

    adapter = (final / "adapter_config.json").is_file()
    base = json.loads((final / "adapter_config.json").read_text()).get("base_model_name_or_path") if adapter else None
    (final / "README.md").write_text(final_card(command, run_name, config, summary, base, adapter), encoding="utf-8")
