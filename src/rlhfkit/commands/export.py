"""`rlhfkit export RUN_DIR --out DIR [--merged] [--push-to-hub REPO]`: share a trained policy.

The folder holds what plain `transformers`, `peft` and vLLM load, and nothing they would trip on:

    README.md                 model card (export_card.py): base model, data, method, settings,
                              evaluation before/after, how to load it
    adapter_config.json, adapter_model.safetensors     (LoRA runs without --merged)
    config.json, model.safetensors                     (--merged, or a full fine-tuning run)
    tokenizer files, chat template, generation_config.json
    value_head/               PPO's value head, apart: no loader picks up its weights
    report/report.html        the run's self-contained HTML report (no PNGs)

An adapter's `base_model_name_or_path` names the base as others can get it: a Hub id when the
run's `model` is one (the built-in default: HuggingFaceTB/SmolLM2-135M-Instruct, whose weights
differ slightly from the dequantised GGUF the run trained on; --merged is exact), else the local
folder. The folder is written beside DIR and renamed into place: a failed export leaves nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.commands.export_card import BUILTIN_HUB_IDS, model_card
from rlhfkit.commands.runs import config_defaults, run_method
from rlhfkit.core.argv import OptionsHelpFormatter, parse_command_line
from rlhfkit.diagnostics.report import build_report
from rlhfkit.diagnostics.rundir import load_run
from rlhfkit.errors import UserError

VALUE_HEAD_DIR = "value_head"
STANDARD_DIR = "sequence_classification"  # models/classifier_reward.py: `rlhfkit rm`'s standard copy


@dataclass
class RunInfo:
    """What export needs from a run folder."""

    run_dir: Path
    final: Path
    config: dict
    summary: dict
    method: str
    adapter: bool  # final/ holds a LoRA adapter (else full weights)
    value_head: Path | None  # final/value_head.safetensors when the run has one
    reward_model: bool = False  # `rlhfkit rm`: `final` is its AutoModelForSequenceClassification copy


def read_run(run_dir: Path) -> RunInfo:
    """The run's config, summary and final weights; UserError (one line) when it has none."""
    import yaml

    final = run_dir / "final"
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: not a run folder (no config.yaml)")
    if not final.is_dir():
        raise UserError(f"{run_dir}: no final/ folder (the run has not finished; a stopped run continues with "
                        f"--resume {run_dir})")
    from rlhfkit.models.classifier_reward import is_classifier_folder

    reward_model = (final / "rlhfkit_rm.json").is_file()
    if reward_model and not is_classifier_folder(final):  # runs before 2026-12-06 kept it in final/STANDARD_DIR
        final = final / STANDARD_DIR
        if not final.is_dir():
            raise UserError(f"{run_dir}: a reward model without a {STANDARD_DIR}/ copy in final/ (an encoder "
                            "backbone or mean pooling has no standard form); use it as reward=model:"
                            f"{run_dir}/final")
    adapter = (final / "adapter_config.json").is_file()
    if not adapter and not (final / "config.json").is_file():
        raise UserError(f"{final}: neither a LoRA adapter (adapter_config.json) nor model weights (config.json)")
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    head = final / "value_head.safetensors"
    return RunInfo(run_dir, final, config, summary, "rm" if reward_model else run_method(run_dir, config), adapter,
                   head if head.is_file() else None, reward_model)


def base_model_id(config: dict) -> str | None:
    """The base model as others can get it (a Hub id, without an `@revision`), or None for a local
    folder."""
    from rlhfkit.models.loading import hub_reference

    model = str(config.get("model", ""))
    if model in BUILTIN_HUB_IDS:
        return BUILTIN_HUB_IDS[model]
    hub = hub_reference(model)
    return hub[0] if hub is not None else None


# --------------------------------------------------------------------------- writing


def write_export(info: RunInfo, out: Path, merged: bool) -> None:
    """Weights, tokenizer, generation config, value head, report and model card into `out`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(info.final)
    if info.reward_model:  # already a plain transformers folder
        shutil.copytree(info.final, out, dirs_exist_ok=True,  # not the rlhfkit form beside it
                        ignore=shutil.ignore_patterns("rlhfkit_rm", "rlhfkit_rm.json", STANDARD_DIR))
        card = model_card(info, merged=True, base_id=base_model_id(info.config),
                          has_template=bool(getattr(tok, "chat_template", None)), report=write_report(info, out))
        (out / "README.md").write_text(card, encoding="utf-8")
        return
    if merged or not info.adapter:
        model = load_policy(info, merge=True)
        model.save_pretrained(out)  # config.json, model.safetensors, generation_config.json
        generation = model.generation_config
    else:
        write_adapter(info, out)
        generation = base_generation_config(info)
    tok.save_pretrained(out)
    fix_generation_config(generation, tok, info.config.get("stop_ids"))
    generation.save_pretrained(out)
    if info.value_head is not None:
        (out / VALUE_HEAD_DIR).mkdir()
        shutil.copy2(info.value_head, out / VALUE_HEAD_DIR / info.value_head.name)
    report = write_report(info, out)
    card = model_card(info, merged=merged or not info.adapter, base_id=base_model_id(info.config),
                      has_template=bool(getattr(tok, "chat_template", None)), report=report)
    (out / "README.md").write_text(card, encoding="utf-8")


def load_policy(info: RunInfo, merge: bool):
    """The run's policy as a plain transformers model, fp32: the adapter merged into its base, or
    the full weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.loading import load_causal_lm

    if not info.adapter:
        return AutoModelForCausalLM.from_pretrained(info.final, dtype=torch.float32)
    from peft import PeftModel

    # the base as training loaded it: the built-in default, a folder, or an adapter merged on its own base
    base = load_causal_lm(str(info.config["model"]), "fp32", trainable=False)
    model = PeftModel.from_pretrained(base, info.final)
    return model.merge_and_unload() if merge else model


def write_adapter(info: RunInfo, out: Path) -> None:
    """The adapter files, its base named as others can get it."""
    from rlhfkit.models.loading import resolve_model_path

    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy2(info.final / name, out / name)
    cfg = json.loads((out / "adapter_config.json").read_text())
    from rlhfkit.models.loading import hub_reference

    base = base_model_id(info.config)
    cfg["base_model_name_or_path"] = base or str(resolve_model_path(str(info.config["model"])))
    hub = hub_reference(str(info.config["model"]))
    if hub is not None and hub[1]:  # org/name@revision: peft loads the base at that revision
        cfg["revision"] = hub[1]
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))


def base_generation_config(info: RunInfo):
    from transformers import GenerationConfig

    from rlhfkit.models.loading import resolve_model_path

    base = resolve_model_path(str(info.config["model"]))
    try:
        return GenerationConfig.from_pretrained(base)
    except OSError:  # no generation_config.json: derive it from config.json, if any
        from transformers import AutoConfig

        try:
            return GenerationConfig.from_model_config(AutoConfig.from_pretrained(base))
        except (OSError, ValueError):
            return GenerationConfig()  # stop and pad ids are set from the tokenizer next


def fix_generation_config(gen, tok, stop_ids: list[int] | None) -> None:
    """Stop where the run stopped (the tokenizer's EOS and any stop_ids) and pad with its pad id:
    vLLM and generate() read these from generation_config.json."""
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    ids = list(dict.fromkeys(eos + [int(i) for i in stop_ids or []]))
    if ids:
        gen.eos_token_id = ids[0] if len(ids) == 1 else ids
    if tok.pad_token_id is not None:
        gen.pad_token_id = tok.pad_token_id


def write_report(info: RunInfo, out: Path) -> str | None:
    """report/report.html (self-contained, no PNGs); its path in the folder, or None for a run
    without metrics."""
    if not (info.run_dir / "metrics.jsonl").is_file():
        return None
    path = build_report([load_run(info.run_dir)], out / "report", png=False, config_defaults=config_defaults)
    return str(path.relative_to(out))


# --------------------------------------------------------------------------- the command


def export_run(run_dir: str | Path, out: str | Path, merged: bool = False, force: bool = False) -> Path:
    """Write the export folder (see the module docstring) and return it."""
    info = read_run(Path(run_dir))
    out = Path(out)
    check_out(out, info, force)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_export(info, tmp, merged)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_out(out: Path, info: RunInfo, force: bool) -> None:
    if out.is_file():
        raise UserError(f"--out {out}: is a file; give a folder")
    resolved, final = out.resolve(), info.final.resolve()
    if resolved == info.run_dir.resolve() or resolved == final or final in resolved.parents:
        raise UserError(f"--out {out}: the run folder or inside its final/ folder; choose another folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"--out {out}: exists and is not empty; pass --force to replace it")


def push_to_hub(folder: Path, repo: str, private: bool) -> str:
    """Create `repo` (if needed) and upload `folder` in one commit; returns the commit URL.
    HF_ENDPOINT and HF_TOKEN (or `hf auth login`) apply as for any huggingface_hub call."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo,
                                 commit_message=f"Upload {folder.name} (rlhfkit export)")
    except Exception as e:  # auth, network, permissions: one line, exit 2
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"--push-to-hub {repo}: {first}") from None
    return str(getattr(info, "commit_url", "") or info)


def build_parser() -> argparse.ArgumentParser:
    """The options of `rlhfkit export`."""
    p = argparse.ArgumentParser(formatter_class=OptionsHelpFormatter, prog="rlhfkit export", description="Write a trained run as a folder that plain "
                                "transformers, peft and vLLM load, with a model card; optionally upload it.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished run folder, e.g. runs/ppo-20261122-101500")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--merged", action="store_true", help="merge a LoRA adapter into the base weights (a plain "
                   "transformers/vLLM model, no peft needed); default: the adapter, which needs its base model")
    p.add_argument("--push-to-hub", metavar="REPO", help="upload the folder to this Hub repository (ORG/NAME)")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    return p


def main(argv: list[str]) -> int:
    args = parse_command_line(build_parser(), argv)
    out = export_run(args.run_dir, args.out, merged=args.merged, force=args.force)
    print(f"wrote {out}" + (" (merged weights)" if args.merged else ""))
    if args.push_to_hub:
        print(f"uploaded to {args.push_to_hub}: {push_to_hub(out, args.push_to_hub, args.private)}")
    return 0
