"""Pieces every trainer shares: model set-up, optimiser, prompt stream, evaluation."""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass

import torch

from rlhfkit.runtime.config import check, option

OVERFLOW_MODES = ("truncate_left", "error")


@dataclass
class ModelArgs:
    model: str = option("smollm2-135m-instruct", "policy: 'smollm2-135m-instruct' (built in) or a local HF model folder")
    dtype: str = option("auto", "compute dtype. bf16: frozen base weights in bf16 and bf16 autocast (4x faster matmuls "
                        "on CPUs with AVX-512 BF16 and on GPUs; 3x slower on CPUs without); trainable weights and "
                        "optimiser state stay fp32. auto: bf16 where it is fast, else fp32", ("auto", "fp32", "bf16"))
    lora: bool = option(True, "train LoRA adapters (the reference is then the adapter-disabled base); false = full fine-tuning")
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA alpha (scale = alpha / r)")
    lora_dropout: float = option(0.0, "LoRA dropout; keep 0 for RL so rollouts and updates see the same policy")
    lora_target_modules: list[str] | None = option(None, "module names to adapt; None chooses attention+MLP projections")
    lora_layers: int | None = option(None, "adapt only the top N transformer layers (None: all). Backward then stops "
                                     "below the lowest adapted layer: a large CPU speed-up for a small loss in capacity")
    chat_template: bool | None = option(None, "format prompts with the tokenizer's chat template. None: when it has "
                                        "one, else the plain 'User: ...\\n\\nAssistant: ' format; true: require it (an "
                                        "error if the tokenizer has none); false: always the plain format")
    system_prompt: str | None = option(None, "optional system message for chat-formatted prompts")

    def validate(self) -> None:
        check(self.lora_r >= 1, f"lora_r ({self.lora_r}) must be >= 1")
        check(self.lora_alpha > 0, f"lora_alpha ({self.lora_alpha}) must be > 0")
        check(0 <= self.lora_dropout < 1, f"lora_dropout ({self.lora_dropout}) must be in [0, 1)")
        check(self.lora_layers is None or self.lora_layers >= 1, f"lora_layers ({self.lora_layers}) must be >= 1")
        check(self.lora_target_modules is None or len(self.lora_target_modules) > 0,
              "lora_target_modules ([]) must name at least one module, or be None to choose them")
    gradient_checkpointing: bool = option(False, "recompute each transformer layer's activations in the backward pass "
                                          "instead of storing them: training activation memory drops from ~all "
                                          "layers to ~one layer, for ~30% more compute (same gradients)")


@dataclass
class SamplingArgs:
    temperature: float = option(1.0, "sampling temperature; log-probs, reference and entropy use the same T")
    top_k: int = option(0, "0 = no top-k truncation (recommended: truncation biases the stored log-probs)")
    top_p: float = option(1.0, "1.0 = no nucleus truncation (recommended)")
    stop_ids: list[int] | None = option(None, "token ids that end a response (default: the tokenizer's eos)")
    max_prompt_length: int | None = option(None, "prompt tokens (after chat formatting) that fit in a rollout (None: "
                                           "the model's context window minus max_new_tokens)")
    prompt_overflow: str = option("truncate_left", "a longer prompt: truncate_left keeps its last max_prompt_length "
                                  "tokens (one warning says how many were cut); error stops before training",
                                  OVERFLOW_MODES)

    def validate(self) -> None:
        check(self.top_k >= 0, f"top_k ({self.top_k}) must be >= 0 (0 = no top-k truncation)")
        check(0 < self.top_p <= 1, f"top_p ({self.top_p}) must be in (0, 1]")
        check(self.stop_ids is None or all(i >= 0 for i in self.stop_ids),
              f"stop_ids ({self.stop_ids}) must be token ids >= 0")
        check(self.max_prompt_length is None or self.max_prompt_length >= 1,
              f"max_prompt_length ({self.max_prompt_length}) must be >= 1")


@dataclass
class ReferenceArgs:
    offload_reference: bool = option(False, "keep the frozen reference copy in CPU memory and move it to the "
                                     "accelerator only for its scoring pass (full fine-tuning or reference_model; "
                                     "with LoRA the reference is the adapter-disabled policy, there is no copy to "
                                     "offload; on a CPU-only machine it changes nothing)")


@dataclass
class GenerationArgs:
    generation_backend: str = option("hf", "who samples rollouts: hf = HF generate on the training policy; vllm = a "
                                     "vLLM engine on this GPU, its weights synced from the policy every iteration "
                                     "(extra `vllm`, CUDA only, untested by the project; falls back to hf with a "
                                     "message when unavailable). Log-probs always come from the trainer",
                                     ("hf", "vllm"))
    vllm_gpu_memory_utilization: float = option(0.3, "vllm: share of GPU memory the engine may take (weights + KV "
                                                 "cache); the rest stays for training")
    vllm_max_model_len: int | None = option(None, "vllm: longest prompt + response (None: the model's maximum)")

    def __post_init__(self) -> None:
        from rlhfkit.runtime.config import check

        check(0 < self.vllm_gpu_memory_utilization <= 1,
              f"vllm_gpu_memory_utilization ({self.vllm_gpu_memory_utilization}) must be in (0, 1]")
        check(self.vllm_max_model_len is None or self.vllm_max_model_len >= 1,
              f"vllm_max_model_len ({self.vllm_max_model_len}) must be >= 1 or None")
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:  # the other mixins' checks (RunArgs)
            parent()


@dataclass
class RunArgs:
    output_dir: str = option("runs", "parent folder of run folders")
    run_name: str | None = option(None, "run folder name (default: COMMAND-DATE-TIME)")
    seed: int = option(0, "seed for initialisation and data order; sampling uses seed + rank * prime + iteration")
    quiet: bool = option(False, "plain one-line logs instead of progress bars (for log files)")
    tensorboard: bool | None = option(None, "log to TensorBoard (None: when installed)")
    wandb: bool = option(False, "log to Weights & Biases (when installed)")
    save_every: int = option(10, "write a checkpoint to RUN/checkpoints every N iterations (sft/rm/dpo: optimiser "
                             "steps) and at the end; 0 = only when stopped by SIGINT/SIGTERM")
    keep_checkpoints: int = option(2, "newest checkpoints kept (older ones are deleted)")
    resume: str | None = option(None, "continue from the newest complete checkpoint of a run folder (on the command "
                                "line: --resume RUN_DIR; its config.yaml is the base, key=value overrides apply), "
                                "or auto: continue output_dir/run_name if it has a checkpoint, else start afresh")
    max_nonfinite_steps: int = option(3, "an optimiser step whose loss or gradient norm is NaN/inf is skipped; stop "
                                      "with a diagnosis after this many in a row")

    def __post_init__(self) -> None:
        # RunArgs is mixed into every trainer's config: checked here so no validate() repeats it.
        from rlhfkit.runtime.config import check

        check(self.save_every >= 0, f"save_every ({self.save_every}) must be >= 0 (0 = only when stopped)")
        check(self.keep_checkpoints >= 1, f"keep_checkpoints ({self.keep_checkpoints}) must be >= 1")
        check(self.max_nonfinite_steps >= 1, f"max_nonfinite_steps ({self.max_nonfinite_steps}) must be >= 1")


def autocast(dtype: str, device: torch.device):
    """bf16 autocast for forward passes; a no-op for fp32."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_policy(args: ModelArgs, trainable: bool = True):
    """(model, tokenizer). With LoRA the frozen base is stored in the compute dtype."""
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.models.loading import resolve_dtype, set_gradient_checkpointing
    from rlhfkit.models.policy import add_lora

    args.dtype = resolve_dtype(args.dtype)
    base_dtype = "bf16" if (args.dtype == "bf16" and args.lora) else "fp32"
    model = load_causal_lm(args.model, dtype=base_dtype, trainable=True)  # first: "not a causal LM" wins
    tok = load_tokenizer(args.model, padding_side="left")
    if args.lora and trainable:
        model = add_lora(model, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_target_modules,
                         args.lora_layers)
    if getattr(args, "gradient_checkpointing", False):
        set_gradient_checkpointing(model)
    return model, tok


def single_process() -> bool:
    """No torch.distributed group and no launcher-set WORLD_SIZE above 1."""
    import os

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size() == 1
    return int(os.environ.get("WORLD_SIZE", "1")) <= 1


def make_optimizer(params, lr: float, warmup_steps: int, weight_decay: float = 0.0, eps: float = 1e-8):
    """AdamW with linear warm-up then constant lr (pitfall 12: warm-up tames early approx-KL spikes).

    Single-process runs use torch's fused AdamW (one kernel per parameter group: on CPU its step over
    135M parameters takes 0.12 s against 0.7 s for the default multi-tensor one; the same update rule).
    Multi-process runs keep the default, which every engine (FSDP, DeepSpeed) accepts."""
    params = [p for p in params if p.requires_grad]
    fused = single_process() and all(p.dtype in (torch.float32, torch.bfloat16, torch.float16) for p in params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps, fused=fused or None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))
    return opt, sched


class PromptStream:
    """Endless, reproducible pass over prompt records: shuffled per epoch with the run seed.

    With `world` processes, `next(n)` draws the next n x world records (the same on every process)
    and returns this process's share [rank::world]: each process gets different records, and
    together they get exactly what one process would get from `next(n x world)`.
    """

    def __init__(self, records: list[dict], seed: int, rank: int = 0, world: int = 1):
        self.records = records
        self.seed = seed
        self.rank, self.world = rank, world
        self.epoch = 0
        self.pos = 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.records)))
        random.Random(self.seed * 1_000 + self.epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[dict]:
        out = []
        while len(out) < n * self.world:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.records[self._order[self.pos]])
            self.pos += 1
        return out[self.rank :: self.world]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()


def check_optimizer(cfg) -> None:
    """Ranges of the AdamW options every trainer has (lr, warmup_steps, weight_decay, adam_eps, max_grad_norm)."""
    check(cfg.lr > 0, f"lr ({cfg.lr}) must be > 0")
    check(cfg.warmup_steps >= 0, f"warmup_steps ({cfg.warmup_steps}) must be >= 0")
    check(cfg.weight_decay >= 0, f"weight_decay ({cfg.weight_decay}) must be >= 0")
    check(cfg.adam_eps > 0, f"adam_eps ({cfg.adam_eps}) must be > 0")
    check(cfg.max_grad_norm > 0, f"max_grad_norm ({cfg.max_grad_norm}) must be > 0")


def format_prompts(tokenizer, prompts: list, args: ModelArgs) -> list[str]:
    """Prompt texts (strings or message lists) as the model sees them; see ModelArgs.chat_template."""
    from rlhfkit.data.chat import format_prompt, plain_format, to_messages, use_chat_template

    if not use_chat_template(tokenizer, args.chat_template):
        return [plain_format(to_messages(p, args.system_prompt)) for p in prompts]
    return [format_prompt(tokenizer, p, system=args.system_prompt) for p in prompts]


def info_lists(records: list[dict]) -> dict[str, list]:
    """Per-sample extra fields (e.g. 'answer') as lists, for reward functions."""
    keys = {k for r in records for k in r if k not in ("prompt", "split", "messages")}
    return {k: [r.get(k) for r in records] for k in sorted(keys)}


def mean_std(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
