"""`rlhfkit estimate-memory model=... key=value`: the memory per device of an rlhfkit run, component
by component (the arithmetic and its formulas: estimate/memory.py). Options shared with the method's
trainer default to that trainer's defaults (`for_method`).
"""

from __future__ import annotations

import dataclasses

from rlhfkit.commands import COMMANDS, load
from rlhfkit.core.command_line import parse_values
from rlhfkit.core.config import build_config
from rlhfkit.estimate.memory import (
    ESTIMATED_METHODS,
    FIT_METHODS,
    GIB,
    GPU_FIT_SHARE,
    MemoryArgs,
    estimate,
    micro_batch_that_fits,
)

PROG = "rlhfkit estimate-memory"
# The trainer each method describes (rlhfkit.commands.COMMANDS[method].config). Options the estimate
# shares with it (same name, same meaning) take that trainer's defaults where not given (`for_method`,
# the command line's path), so `estimate-memory method=grpo` is the memory of `rlhfkit grpo` as it runs
# by default; prompt_length (the data's) and the device options stay the estimate's own.
TRAINER_OPTIONS = ("lora", "lora_r", "lora_layers", "lora_dropout", "gradient_checkpointing", "cpu_chunk_positions",
                   "micro_batch_size", "max_new_tokens", "prompts_per_generate", "rollout_batch_size",
                   "mini_batch_size", "group_size", "fvp_fraction", "distill_topk")

def render(args: MemoryArgs, est: dict[str, float]) -> str:
    """A Markdown table of the estimate in GiB."""
    head = (f"{args.model}: {est['parameters'] / 1e9:.3g}B parameters, {est['trainable'] / 1e6:.3g}M trainable "
            f"({'LoRA r=' + str(args.lora_r) if args.lora else 'full fine-tuning'}, {args.dtype}, {args.method}, "
            f"{args.num_devices} {args.device} device(s), sharding={args.sharding})")
    rows = [f"| {k} | {est[k] / GIB:.3f} | {est[k] / 1e9:.3f} |"
            for k in ("process baseline", "policy weights", "gradients", "DDP buckets", "optimiser", "reference", "teacher",
                      "value head", "KV cache", "generation gather", "training gather", "merged LoRA", "activations",
                      "logits", "teacher logits", "heap retention", "old logits", "Fisher graphs", "Fisher product",
                      "loading phase", "generation phase", "training phase", "peak")
            if est[k] or k not in ("old logits", "Fisher graphs", "Fisher product", "teacher", "teacher logits",
                                   "training gather", "loading phase", "DDP buckets")]
    return "\n".join([head, "", "| component | GiB per device | GB |", "| --- | ---: | ---: |", *rows])


# The worked table of docs/scale.md (tests/scale/test_memory_estimate.py keeps the two identical).
WORKED = [  # LoRA rows on every layer (lora_layers=null; PPO's own default is the top 12)
    ("135M, LoRA (all layers), fp32, 1 CPU process",
     "model=smollm2-135m device=cpu dtype=fp32 lora_layers=null prompt_length=64 max_new_tokens=48"),
    ("135M, full fine-tuning, fp32, 1 CPU process",
     "model=smollm2-135m device=cpu lora=false dtype=fp32 prompt_length=64 max_new_tokens=48"),
    ("1.7B, LoRA, bf16, 1 GPU", "model=smollm2-1.7b lora_layers=null prompt_length=256 max_new_tokens=256 prompts_per_generate=64"),
    ("8B, LoRA, bf16, 1 GPU, checkpointing", "model=llama-3-8b lora_layers=null micro_batch_size=4 prompt_length=512 max_new_tokens=512 "
     "prompts_per_generate=32 gradient_checkpointing=true"),
    ("7B, LoRA, bf16, 8 GPUs DDP, checkpointing", "model=llama-2-7b lora_layers=null num_devices=8 micro_batch_size=4 prompt_length=512 "
     "max_new_tokens=512 prompts_per_generate=32 gradient_checkpointing=true"),
    ("7B, full, bf16, 8 GPUs DDP", "model=llama-2-7b lora=false num_devices=8 micro_batch_size=4 prompt_length=512 "
     "max_new_tokens=512 prompts_per_generate=32"),
    ("7B, full, bf16, 8 GPUs FSDP2, checkpointing", "model=llama-2-7b lora=false num_devices=8 sharding=fsdp2 "
     "micro_batch_size=4 prompt_length=512 max_new_tokens=512 prompts_per_generate=32 gradient_checkpointing=true"),
    ("... and offload_reference", "model=llama-2-7b lora=false num_devices=8 sharding=fsdp2 micro_batch_size=4 "
     "prompt_length=512 max_new_tokens=512 prompts_per_generate=32 gradient_checkpointing=true offload_reference=true"),
]
WORKED_COLUMNS = ("process baseline", "policy weights", "gradients", "DDP buckets", "optimiser", "reference", "KV cache", "generation gather",
                  "training gather", "merged LoRA", "activations", "logits", "heap retention", "loading phase", "peak")


def worked_table() -> str:
    """The Markdown worked table of docs/scale.md: one PPO run per row, GiB per device, and the
    command that gives each row."""
    lines = ["| PPO run, GiB per device | " + " | ".join(WORKED_COLUMNS) + " |",
             "| --- |" + " ---: |" * len(WORKED_COLUMNS)]
    for i, (label, command) in enumerate(WORKED, 1):
        est = estimate(for_method(parse_values(MemoryArgs, command.split(), PROG)[0]))
        cells = ["0" if est[k] == 0 else f"{est[k] / GIB:.2f}" for k in WORKED_COLUMNS]
        lines.append(f"| {i}. {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{i}. `rlhfkit estimate-memory {command}`" for i, (_, command) in enumerate(WORKED, 1)]
    return "\n".join(lines)


def trainer_defaults(method: str) -> dict:
    """The defaults of `method`'s trainer for the options the estimate shares with it
    (TRAINER_OPTIONS). DPO's max_new_tokens and prompts_per_generate size its judged samples, not
    its training, so they are not shared; its pairs share a prompt (group_size 2), as GRPO's groups
    do, while the trainer's share_prompts is on."""
    fields = dataclasses.fields(load(COMMANDS[method].config))
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    skip = ("max_new_tokens", "prompts_per_generate") if method == "dpo" else ()
    out = {k: defaults[k] for k in TRAINER_OPTIONS if k in defaults and k not in skip}
    if method == "dpo":
        out["group_size"] = 2 if defaults.get("share_prompts") else 1
    elif "group_size" in out and not defaults.get("share_prompts"):
        out["group_size"] = 1
    return out


def for_method(values: dict, sources: dict[str, str] | None = None) -> MemoryArgs:
    """MemoryArgs from the given `values` (as parsed from a command line or YAML), the method's
    trainer defaults (`trainer_defaults`) under them."""
    method = values.get("method", "ppo")
    defaults = trainer_defaults(method) if method in ESTIMATED_METHODS else {}  # else build_config names the choices
    return build_config(MemoryArgs, {**defaults, **values}, sources=sources)


def fit_line(args: MemoryArgs) -> str | None:
    """What `gpu_memory_gib` asks: the micro_batch_size that fits GPU_FIT_SHARE of it (None: not asked, or not a
    GPU run of a method with mini-batches)."""
    if args.gpu_memory_gib is None or args.device != "gpu" or args.method not in FIT_METHODS:
        return None
    budget = GPU_FIT_SHARE * args.gpu_memory_gib * GIB
    m = micro_batch_that_fits(args, budget)
    where = f"{GPU_FIT_SHARE:.0%} of {args.gpu_memory_gib:g} GiB ({budget / GIB:.1f} GiB)"
    if m is None:
        return f"micro_batch_size that fits {where}: none, even one row's peak is larger"
    return (f"micro_batch_size that fits {where}: {m} (the largest divisor of the mini-batch's "
            f"{args.mini_batch_size or args.rollout_batch_size} rows that does)")


def run(args: MemoryArgs) -> dict:
    est = estimate(args)
    print(render(args, est))
    line = fit_line(args)
    if line:
        print("\n" + line)
    return est


def main(argv: list[str]) -> int:
    parsed = parse_values(MemoryArgs, argv, PROG)
    if parsed is not None:
        run(for_method(*parsed))
    return 0
