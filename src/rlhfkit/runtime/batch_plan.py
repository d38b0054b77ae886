"""`micro_batch_size=auto`: the sequences one forward/backward of the update takes, resolved once where
a run is set up and passed down; never written back into the config (configs are read-only).

On the CPU auto is the trainer's number as it was before auto existed (PPO 8, the GRPO family 16), so
CPU runs are unchanged. On a CUDA GPU it is the largest power of two that divides the optimiser step's
rows, is at least that number, and whose update fits: what the update adds to the loaded models
(`update_bytes`: gradients, AdamW moments, activations, the fused head's logits; estimate/memory.py's
formulas) within GPU_FIT_SHARE of the memory free at set-up. Larger micro-batches mean fewer, fuller
kernel launches on a GPU; on the CPU a micro-batch runs in row chunks anyway (rollout/logprobs.py), so
there is nothing to gain there.

`plan_micro_batch` is the pure function (estimate arguments and free bytes in, (size, reason) out);
`run_micro_batch` builds its arguments from a trainer config and a loaded model, on any device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlhfkit.core.config import check
from rlhfkit.estimate.memory import GIB, GPU_FIT_SHARE, MemoryArgs, estimate
from rlhfkit.estimate.shape import ModelShape

AUTO = "auto"


def check_micro_batch_size(value: int | str) -> None:
    """A config's micro_batch_size: an integer >= 1, or auto."""
    check(value == AUTO or isinstance(value, int), f"micro_batch_size ({value!r}) must be an integer or auto")
    check(value == AUTO or value >= 1, f"micro_batch_size ({value}) must be >= 1")


def power_of_two_divisors(n: int) -> list[int]:
    """1, 2, 4, ... up to the largest power of two that divides n >= 1 (48 -> [1, 2, 4, 8, 16])."""
    out = [1]
    while n % (out[-1] * 2) == 0:
        out.append(out[-1] * 2)
    return out


def update_bytes(est: dict[str, float]) -> float:
    """Bytes the update adds on top of the models already loaded (estimate/memory.py `estimate`): the
    training phase less the policy weights and the reference (gradients, optimiser moments, value
    head, activations, logits; on the CPU also the process and the heap, not used here)."""
    return est["training phase"] - est["policy weights"] - est["reference"]


def plan_micro_batch(args: MemoryArgs, free_bytes: float | None, cpu_default: int,
                     shape: ModelShape | None = None) -> tuple[int, str]:
    """(micro-batch size, one-line reason) for `micro_batch_size=auto`.

    The candidates are the powers of two that divide the rows of one optimiser step (args.mini_batch_size,
    else args.rollout_batch_size), so gradient accumulation stays whole; the floor is the largest of them
    that is at most `cpu_default` (cpu_default itself when it divides the rows). `free_bytes` None (the CPU):
    the floor. Else the largest candidate >= the floor whose `update_bytes` is at most GPU_FIT_SHARE x
    free_bytes; the floor when none is. args.micro_batch_size is ignored.
    """
    rows = args.mini_batch_size or args.rollout_batch_size
    sizes = power_of_two_divisors(rows)
    floor = max(m for m in sizes if m <= cpu_default)
    if free_bytes is None:
        note = "" if floor == cpu_default else f"; {cpu_default} does not divide the {rows} rows of a step"
        return floor, f"auto: the CPU default{note}"
    need = {m: update_bytes(estimate(dataclasses.replace(args, micro_batch_size=m), shape)) for m in sizes if m >= floor}
    fits = [m for m in need if need[m] <= GPU_FIT_SHARE * free_bytes]
    size = max(fits, default=floor)
    per_sequence = (need[size] - update_bytes(estimate(dataclasses.replace(args, micro_batch_size=1), shape))) / (size - 1) \
        if size > 1 else need[size]
    reason = f"auto: {free_bytes / GIB:.3g} GiB free, estimate {per_sequence / GIB:.2g} GiB per sequence"
    return size, reason + ("" if fits else f"; not even {floor} fits {GPU_FIT_SHARE:.0%} of it, kept {floor}")


def estimate_args(cfg, method: str, prompt_length: int, world: int) -> MemoryArgs:
    """The estimate's arguments for a PPO (`method` "ppo") or GRPO-family ("grpo") trainer config `cfg`
    whose longest prompt has `prompt_length` tokens, on `world` GPUs (data parallel)."""
    group = cfg.group_size if method == "grpo" and cfg.share_prompts else 1  # PPO: one sequence per prompt
    return MemoryArgs(model="(loaded)", method=method, lora=cfg.lora, lora_r=cfg.lora_r,
                      lora_layers=cfg.lora_layers, dtype="bf16" if cfg.dtype == "bf16" else "fp32",
                      device="gpu", num_devices=world, gradient_checkpointing=cfg.gradient_checkpointing,
                      lora_dropout=cfg.lora_dropout, prompt_length=max(1, prompt_length),
                      max_new_tokens=cfg.max_new_tokens, prompts_per_generate=cfg.prompts_per_generate,
                      group_size=group, rollout_batch_size=cfg.rollout_batch_size,
                      mini_batch_size=cfg.mini_batch_size)


def cpu_default_micro_batch(cfg) -> int:
    """The number `auto` stands for on the CPU: the config class's default micro_batch_size."""
    field = {f.name: f for f in dataclasses.fields(cfg)}["micro_batch_size"]
    return field.default if isinstance(field.default, int) else 1


def run_micro_batch(cfg, method: str, model_config: dict, prompt_length: int, world: int, device,
                    free_bytes: Callable | None = None) -> tuple[int, str | None]:
    """(micro-batch size, reason) of a run: cfg.micro_batch_size when it is a number (reason None), else
    `plan_micro_batch` with the memory free on `device` when it is a CUDA device (`free_bytes(device)`,
    core/devices.py `free_cuda_bytes` by default), the CPU rule elsewhere. `model_config`: the loaded
    policy's config (a Hugging Face config.json mapping)."""
    if cfg.micro_batch_size != AUTO:
        return int(cfg.micro_batch_size), None
    free = None
    if getattr(device, "type", str(device)) == "cuda":
        from rlhfkit.core.devices import free_cuda_bytes

        free = (free_bytes or free_cuda_bytes)(device)
    args = estimate_args(cfg, method, prompt_length, world)
    return plan_micro_batch(args, free, cpu_default_micro_batch(cfg), ModelShape.from_config(model_config))


def longest_prompt(cfg, tok, records, limit: int | None) -> int:
    """Tokens of the longest chat-formatted prompt of `records`, at most `limit` (None: no limit)."""
    from rlhfkit.data.chat import format_prompts
    from rlhfkit.rollout.prompt_fit import clip_left

    texts = format_prompts(tok, [r["prompt"] for r in records], cfg)
    texts = [clip_left(tok, t, limit) for t in texts] if limit else texts
    longest = max((len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]), default=1)
    return min(longest, limit) if limit else longest


def micro_batch_of_run(cfg, command: str, actor, tok, records, limit: int | None, launch) -> tuple[int, str | None]:
    """(the run's micro-batch size, why: None when set by cfg.micro_batch_size) for RLRun's set-up:
    cfg.micro_batch_size, or with auto the size planned from the memory estimate (the smallest of all
    processes' plans, so every process cuts its mini-batches alike). `launch`: runtime/run.Launch."""
    import torch

    from rlhfkit.runtime.distributed import max_over_processes

    planned = cfg.micro_batch_size == AUTO and torch.device(launch.device).type == "cuda"
    prompt_length = longest_prompt(cfg, tok, records, limit) if planned else 0  # the CPU plan needs none
    size, reason = run_micro_batch(cfg, "ppo" if command == "ppo" else "grpo", actor.policy.config.to_dict(),
                                   prompt_length, launch.world, launch.device)
    if reason is not None and launch.world > 1:
        smallest = int(-max_over_processes(launch.accelerator, -size))
        reason += "" if smallest == size else f"; {smallest}, the smallest plan of {launch.world} processes"
        size = smallest
    return size, reason
