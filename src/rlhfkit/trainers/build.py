"""Models from a trainer's config: the policy (with LoRA), the actor-critic, the reference."""

from __future__ import annotations

import dataclasses

import torch

from rlhfkit.models import load_causal_lm, load_tokenizer
from rlhfkit.models.loading import resolve_dtype, set_chat_template, set_gradient_checkpointing
from rlhfkit.models.lora import add_lora
from rlhfkit.models.policy import ActorCritic, Reference, ValueHead, output_width
from rlhfkit.trainers.options import ModelArgs


def build_policy(args: ModelArgs, trainable: bool = True):
    """(model, tokenizer). With LoRA the frozen base is stored in the compute dtype."""
    base_dtype = "bf16" if (resolve_dtype(args.dtype) == "bf16" and args.lora) else "fp32"
    model = load_causal_lm(args.model, dtype=base_dtype, trainable=True)  # first: "not a causal LM" wins
    tok = set_chat_template(load_tokenizer(args.model, padding_side="left"), args.chat_template_path)
    if args.lora and trainable:
        model = add_lora(model, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_target_modules,
                         top_lora_layers(args, model.config))
    if args.gradient_checkpointing:
        set_gradient_checkpointing(model)
    return model, tok


def top_lora_layers(args: ModelArgs, model_config) -> int | None:
    """`lora_layers`, where a command's own default (PPO's 12, tuned for SmolLM2's 30 layers) means all
    layers of a smaller model; a value given above the model's layer count is refused (models/lora.py)."""
    default = next(f.default for f in dataclasses.fields(args) if f.name == "lora_layers")
    layers = getattr(model_config, "num_hidden_layers", None)
    if args.lora_layers is not None and args.lora_layers == default and isinstance(layers, int):
        return min(args.lora_layers, layers)
    return args.lora_layers


def make_reference(actor, cfg, model: torch.nn.Module | None = None):
    """The frozen reference: the adapter-disabled policy with LoRA, else a frozen copy of the
    starting policy (or `model`, a separate reference model)."""
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else None
    return Reference(actor, use_adapter_off=cfg.lora, dtype=dtype, model=model, offload=cfg.offload_reference)


def build_actor_critic(cfg):
    """PPO: (ActorCritic with a value head, Reference | None (kl_coef = 0), tokenizer)."""
    policy, tok = build_policy(cfg)
    hidden = output_width(policy)
    critic = None
    if cfg.critic_model:
        critic = load_causal_lm(cfg.critic_model, dtype="fp32", trainable=True)
        hidden = output_width(critic)
        if cfg.gradient_checkpointing:
            set_gradient_checkpointing(critic)
    actor = ActorCritic(policy, ValueHead(hidden), critic,
                        share_prefix=cfg.share_prefix and not cfg.gradient_checkpointing, value_head_lr=cfg.value_head_lr)
    reference = make_reference(actor, cfg) if cfg.kl_coef > 0 else None
    return actor, reference, tok


def build_actor(cfg, with_reference: bool, reference_model: str | None = None):
    """GRPO, RLOO, DPO: (ActorCritic without a value head, Reference | None, tokenizer). A prompt
    shared by several rows runs once, and so does the header all prompts of a micro-batch share
    (`share_prompts`; off under gradient checkpointing)."""
    policy, tok = build_policy(cfg)
    share = cfg.share_prompts and not cfg.gradient_checkpointing
    actor = ActorCritic(policy, value_head=None, share_prompts=share, share_prefix=share)
    if not with_reference:
        return actor, None, tok
    other = load_causal_lm(reference_model, dtype="fp32", trainable=False) if reference_model else None
    return actor, make_reference(actor, cfg, other), tok
