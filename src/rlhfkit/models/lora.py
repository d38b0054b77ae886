"""LoRA adapters (peft): where they go (`add_lora`, target modules checked against the model), and
two speed paths for plain LoRA layers, both equal to peft's own computation up to float rounding
and both off in multi-process runs, where an engine (FSDP, DeepSpeed ZeRO-3) owns the weights and
gathers them in module hooks.

1. `lean_lora_forward`: training and scoring compute y = W x + b + s * B (A x) as one `addmm`
   over (x A^T) and B^T with alpha = s. peft computes B (A x), multiplies by s and adds: two more
   full-size (tokens x out) passes in the forward and one in the backward, for each of up to
   210 adapted layers of a 135M model.
2. `merged_lora`: sampling (CPU and GPU alike) runs each adapted layer as one linear layer with a
   temporary merged weight W + s * B A, and the adapters off: one matmul per layer and decoding
   step instead of three (on a GPU: one kernel launch instead of three, where a decoding step is
   bound by launches, not by arithmetic).

Notation: N tokens, in/out the layer's widths, r the LoRA rank, s = alpha / r.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from rlhfkit.core.devices import free_cuda_bytes
from rlhfkit.errors import UserError
from rlhfkit.models.hf_compat import conv1d_type


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """peft LoRA layers of `model` that have an active adapter."""
    return [m for m in model.modules()
            if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")
            and any(a in getattr(m, "lora_A", {}) for a in m.active_adapters)]


def _active(layer: nn.Module) -> list[str]:
    return [a for a in layer.active_adapters if a in layer.lora_A]


def _vanilla(layer: nn.Module) -> bool:
    """Unmerged plain LoRA on an nn.Linear: no DoRA-like variant, no LoRA bias."""
    return (isinstance(layer.base_layer, nn.Linear) and not getattr(layer, "merged", False)
            and not any(a in getattr(layer, "lora_variant", {}) or getattr(layer, "lora_bias", {}).get(a)
                        for a in _active(layer)))


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _whole_weight(linear: nn.Linear) -> bool:
    """The weight is the whole matrix (not a ZeRO-3 placeholder or an FSDP shard), on any device:
    the merged copy is counted by `rlhfkit estimate-memory` on the CPU and GPUs alike."""
    w = linear.weight
    return (type(w.data) is torch.Tensor and not hasattr(w, "ds_id")
            and tuple(w.shape) == (linear.out_features, linear.in_features))


# ----------------------------------------------------------------------------- training and scoring


def _lean_adapter(layer: nn.Module, x: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
    """The one active adapter when the lean path applies to this call, else None."""
    if args or kwargs or layer.disable_adapters or not _vanilla(layer) or _distributed():
        return None
    active = _active(layer)
    if len(active) != 1 or not isinstance(layer.lora_dropout[active[0]], nn.Identity):
        return None
    a, b = layer.lora_A[active[0]].weight, layer.lora_B[active[0]].weight
    if torch.is_autocast_enabled(x.device.type) or not (x.dtype == a.dtype == b.dtype):
        return None
    return active[0]


def lean_lora_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """y = base(x) + s * (x A^T) B^T with the scale and the sum inside one addmm. x (..., in) -> (..., out)."""
    adapter = _active(layer)[0]
    y = layer.base_layer(x)
    xa = layer.lora_A[adapter](x)  # (..., r)
    out = torch.addmm(y.reshape(-1, y.shape[-1]), xa.reshape(-1, xa.shape[-1]), layer.lora_B[adapter].weight.t(),
                      alpha=layer.scaling[adapter])
    return out.view(y.shape)


def use_lean_forward(model: nn.Module) -> int:
    """Give `model`'s peft LoRA Linear layers the lean forward (a subclass that falls back to
    peft's forward whenever a call is not the plain single-adapter case). Returns how many."""
    from peft.tuners.lora.layer import Linear

    n = 0
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = _lean_class()
            n += 1
    return n


@functools.cache
def _lean_class() -> type:
    """Built on first use: importing peft is slow, and sampling code imports this module."""
    from peft.tuners.lora.layer import Linear

    class LeanLoraLinear(Linear):
        """peft's LoRA Linear with `lean_lora_forward` for plain single-adapter calls."""

        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            if _lean_adapter(self, x, args, kwargs) is None:
                return super().forward(x, *args, **kwargs)
            return lean_lora_forward(self, x)

    LeanLoraLinear.__module__ = __name__
    return LeanLoraLinear


# ----------------------------------------------------------------------------- sampling


def _mergeable(layer: nn.Module) -> bool:
    return _vanilla(layer) and _whole_weight(layer.base_layer)


def _copy_fits(layers: list[nn.Module]) -> bool:
    """On CUDA, free memory holds twice the merged copy (a long run's peak may be the sampling phase
    there: the adapters then run unmerged rather than fail); elsewhere always."""
    weight = layers[0].base_layer.weight
    if weight.device.type != "cuda":
        return True
    copy = sum(layer.base_layer.weight.numel() * layer.base_layer.weight.element_size() for layer in layers)
    return 2 * copy <= free_cuda_bytes(weight.device)


@contextlib.contextmanager
def merged_lora(model: nn.Module):
    """Within the block, `model`'s LoRA layers compute with merged weights and adapters off.

    The base weights are not modified: each adapted layer's weight parameter is swapped for a
    temporary merged copy and swapped back on exit, so the frozen base (the reference policy
    under LoRA) keeps its exact bits. A no-op without LoRA layers, when one cannot be merged
    here, on a GPU without the memory for the copy, in multi-process runs and under gradient
    tracking (inference only).

    Memory: one extra copy of every adapted weight while the block runs (`rlhfkit
    estimate-memory` counts it, "merged LoRA").
    """
    layers = lora_layers(model)
    if (not layers or not hasattr(model, "disable_adapter") or _distributed() or torch.is_grad_enabled()
            or not all(_mergeable(layer) for layer in layers) or not _copy_fits(layers)):
        yield model
        return
    originals = []
    try:
        for layer in layers:
            base = layer.base_layer
            delta = sum(layer.get_delta_weight(a) for a in _active(layer))
            originals.append((base, base.weight))
            base.weight = nn.Parameter(base.weight + delta.to(base.weight.dtype), requires_grad=False)
        with model.disable_adapter():
            yield model
    finally:
        for base, weight in originals:
            base.weight = weight


def _linear_types() -> tuple[type, ...]:
    """Layers LoRA can adapt: nn.Linear, and transformers' Conv1D (GPT-2's projections: a linear
    layer with its weight stored transposed)."""
    return nn.Linear, conv1d_type()


def _linear_names(model: nn.Module) -> set[str]:
    return {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, _linear_types())}


def fan_in_fan_out(model: nn.Module, targets: list[str]) -> bool:
    """The LoRA targets are Conv1D layers (GPT-2), whose weights peft must read transposed."""
    conv1d = conv1d_type()
    return any(isinstance(m, conv1d) and n.rsplit(".", 1)[-1] in targets for n, m in model.named_modules())


def default_lora_targets(model: nn.Module) -> list[str]:
    """Attention and MLP projections for common architectures (Llama, Mistral, Qwen, Phi-3, GPT-2, ...)."""
    names = _linear_names(model)
    for group in (
        ["q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj", "down_proj"],
        ["c_attn", "c_proj", "c_fc"],
        ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
        ["query", "key", "value", "dense"],
    ):
        hit = [g for g in group if g in names]
        if hit:
            return hit
    raise UserError("could not choose LoRA target modules for this architecture; set lora_target_modules "
                    f"(its linear layers: {', '.join(sorted(names)) or 'none'})")


ALL_LINEAR = "all-linear"  # lora_target_modules=all-linear: peft's and TRL's word


def all_linear_targets(model: nn.Module) -> list[str]:
    """The names of every linear layer but the output layer (the LM head), as peft's "all-linear" chooses."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
             if isinstance(m, _linear_types()) and m is not head}
    if not names:
        raise UserError("lora_target_modules=all-linear: the model has no linear layer besides its output layer")
    return sorted(names)


def check_lora_targets(model: nn.Module, targets: list[str] | None) -> list[str]:
    """The LoRA target module names: `targets`, each checked against the model, ``["all-linear"]`` (every
    linear layer but the output layer), or the default choice."""
    if not targets:
        return default_lora_targets(model)
    if [t.lower() for t in targets] == [ALL_LINEAR]:
        return all_linear_targets(model)
    linear = _linear_names(model)
    missing = [t for t in targets if t not in linear]
    if missing:
        raise UserError(f"lora_target_modules: no linear layer named {missing[0]!r} in the model "
                        f"(expected some of: {', '.join(sorted(linear))})")
    return list(targets)


def top_layer_indices(model_config, top: int) -> list[int]:
    """The indices of the top `top` transformer layers of a model with (transformers) `model_config`;
    lora_layers above the model's layer count (or on a model that does not say it) is one line."""
    n = getattr(model_config, "num_hidden_layers", None)
    if not isinstance(n, int) or n <= 0:
        raise UserError("lora_layers: the model's config has no num_hidden_layers; leave lora_layers unset")
    if top > n:
        raise UserError(f"lora_layers ({top}) is more than the model's {n} transformer layers: use 1 .. {n}, "
                        "or leave it unset to adapt all")
    return list(range(n - top, n))


def add_lora(model: nn.Module, r: int, alpha: int, dropout: float, targets: list[str] | None,
             top_layers: int | None = None) -> nn.Module:
    """Wrap `model` with LoRA adapters (peft). `top_layers` adapts only the last N layers."""
    from peft import LoraConfig, get_peft_model

    layers = None if top_layers is None else top_layer_indices(model.config, top_layers)
    targets = check_lora_targets(model, targets)
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        fan_in_fan_out=fan_in_fan_out(model, targets),
        task_type="CAUSAL_LM",
        bias="none",
        layers_to_transform=layers,
    )
    model = get_peft_model(model, cfg)
    use_lean_forward(model)  # same values, fewer full-size passes (models/lora.py)
    return model
