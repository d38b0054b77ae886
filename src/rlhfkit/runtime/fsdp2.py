"""FSDP2 applied by rlhfkit itself: torch's `fully_shard`, one unit per decoder layer, then the root.

`accelerate launch --config_file configs/accelerate/fsdp2.yaml` (or fsdp2-lora.yaml) asks for it: the
launcher puts the preset's fsdp_config into the environment (ACCELERATE_USE_FSDP, FSDP_VERSION,
FSDP_RESHARD_AFTER_FORWARD, FSDP_TRANSFORMER_CLS_TO_WRAP, ACCELERATE_MIXED_PRECISION), and `Run`
reads it here. rlhfkit shards the model itself rather than through accelerate's FSDP plugin so that
one path runs everywhere: the plugin refuses CPU processes (with ACCELERATE_USE_CPU=1 the same
launch silently ran plain data parallelism), while `fully_shard` runs on CPU processes over gloo
as on GPUs over NCCL, so CI tests the path users run (tests/scale/test_fsdp2.py). On GPUs accelerate
receives the model already sharded and passes it through.

Sharded weights are DTensors: only a module that FSDP2 wrapped gathers them, in its forward. The
trainers' training and scoring forwards all go through the root's forward (the prepared model).
Sampling calls the causal LM inside the root directly, so it runs under `full_weights`, which
gathers every unit once for the whole generation (as ZeRO-3's `generation_weights`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rlhfkit.errors import ConfigError

UNSUPPORTED = {  # accelerate config key -> (its environment variable, the message when it is true)
    "fsdp_offload_params": ("FSDP_OFFLOAD_PARAMS", "true is not supported by rlhfkit's FSDP2; set it to false"),
    "fsdp_activation_checkpointing": ("FSDP_ACTIVATION_CHECKPOINTING", "true is not supported; set it to false and "
                                      "use rlhfkit's gradient_checkpointing=true"),
    "fsdp_cpu_ram_efficient_loading": ("FSDP_CPU_RAM_EFFICIENT_LOADING", "true is not supported by rlhfkit's FSDP2; "
                                       "set it to false"),
}


@dataclass(frozen=True)
class Fsdp2Plan:
    """How to shard: what the launch's accelerate config asks for."""

    reshard_after_forward: bool  # a layer frees its gathered weights after its forward (full shard)
    layer_classes: tuple[str, ...]  # class names of the units; () = the model's own _no_split_modules
    mixed_precision: str  # "no" or "bf16": the layers' weights gathered and used in bf16


def _flag(env: Mapping[str, str], key: str, default: str = "false") -> bool:
    return env.get(key, default).strip().lower() in ("true", "1", "yes")


def requested_plan(env: Mapping[str, str] | None = None) -> Fsdp2Plan | None:
    """The FSDP2 plan the launch asks for (accelerate's environment), or None without FSDP.
    Options rlhfkit does not run raise a ConfigError naming the accelerate config key."""
    env = os.environ if env is None else env
    if not _flag(env, "ACCELERATE_USE_FSDP"):
        return None
    if env.get("FSDP_VERSION", "1").strip() != "2":
        raise ConfigError(f"fsdp_version: rlhfkit runs FSDP2 only, got {env.get('FSDP_VERSION', '1')!r} "
                          "(set fsdp_version: 2, as configs/accelerate/fsdp2.yaml does)")
    for key, (var, message) in UNSUPPORTED.items():
        if _flag(env, var):
            raise ConfigError(f"{key}: {message}")
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if precision not in ("no", "bf16"):
        raise ConfigError(f"mixed_precision: FSDP2 in rlhfkit takes 'no' or 'bf16', got {precision!r}")
    classes = tuple(c.strip() for c in env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "").split(",") if c.strip())
    return Fsdp2Plan(_flag(env, "FSDP_RESHARD_AFTER_FORWARD", "true"), classes, precision)


def for_compute_dtype(plan: Fsdp2Plan, dtype: str) -> Fsdp2Plan:
    """The plan a run computing in `dtype` ("bf16" or "fp32") shards by. A bf16 run gathers and runs its
    decoder layers in bf16 and reduces their gradients in fp32 (mixed_precision "bf16") whatever the
    preset says: its matmuls take bf16 weights under autocast anyway, so gathering fp32 weights would
    only double the gathered memory (the whole policy while it samples) and the traffic. An fp32 run
    keeps the preset's choice ("no" in fsdp2.yaml: fp32 throughout, as one process computes it)."""
    return dataclasses.replace(plan, mixed_precision="bf16") if dtype == "bf16" else plan


def is_sharded(model: nn.Module | None) -> bool:
    """`model` is an FSDP2 root (its weights are DTensors outside forwards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def layer_units(model: nn.Module, classes: tuple[str, ...]) -> list[nn.Module]:
    """The modules to shard one by one: those of the named classes (default: every `_no_split_modules`
    class of the transformers models inside, their decoder layers). A ConfigError when there are none."""
    if not classes:
        classes = tuple({c for m in model.modules() for c in getattr(m, "_no_split_modules", None) or ()})
    units = [m for m in model.modules() if type(m).__name__ in classes]
    if not units:
        raise ConfigError(f"fsdp_transformer_layer_cls_to_wrap: no module of class {', '.join(classes) or '(none)'} "
                          "in the model; name its decoder layer class (e.g. LlamaDecoderLayer, Qwen2DecoderLayer)")
    return units


def shard(model: nn.Module, optimizer: torch.optim.Optimizer, plan: Fsdp2Plan, device: torch.device) -> nn.Module:
    """Shard `model` in place over all processes (one mesh dimension: gloo on CPU, NCCL on CUDA) and
    point `optimizer` (not stepped yet) at the sharded parameters. Each decoder layer is a unit
    (gathered in its forward, freed after it when `plan.reshard_after_forward`, its gradients
    reduce-scattered after its backward); the root holds the rest (embeddings, final norm, output
    layer, value head) and keeps them gathered from its forward to its backward. With
    mixed_precision bf16 the layers gather and compute in bf16 and reduce gradients in fp32; the
    root keeps its dtypes (the value head stays fp32, as without FSDP)."""
    if any(optimizer.state.values()):
        raise RuntimeError("shard: the optimiser has state already; shard before its first step")
    before = dict(model.named_parameters())
    _shard_units(model, plan, device)
    after = dict(model.named_parameters())
    sharded = {id(p): after[name] for name, p in before.items()}
    for group in optimizer.param_groups:
        group["params"] = [sharded[id(p)] for p in group["params"]]
        if group.get("fused"):  # torch's fused AdamW kernels take plain tensors, not DTensors
            group["fused"] = None
    return model


def shard_frozen(model: nn.Module, plan: Fsdp2Plan, device: torch.device) -> nn.Module:
    """A frozen model (full fine-tuning's reference copy) sharded in place like the policy, so each
    process keeps 1/N of it. Its users run its decoder and output layer themselves, not its
    forward, so they gather the root's own weights around that (models/policy.py `_root_weights`)."""
    _shard_units(model, plan, device)
    return model


def _shard_units(model: nn.Module, plan: Fsdp2Plan, device: torch.device) -> None:
    """fully_shard each decoder layer of `model`, then `model` itself as the root (`shard`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    bf16 = plan.mixed_precision == "bf16"
    layers_mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    for unit in layer_units(model, plan.layer_classes):
        fully_shard(unit, mesh=mesh, reshard_after_forward=plan.reshard_after_forward, mp_policy=layers_mp)
    fully_shard(model, mesh=mesh)  # the root: reshard_after_forward left to torch (False for a root)
    # FSDP2 takes the first unit to run a forward as the root; sampling runs the layers first (not
    # through the root's forward), so the root is settled now, as its first forward would.
    model._get_fsdp_state()._lazy_init()


@contextlib.contextmanager
def full_weights(model: nn.Module, plan: Fsdp2Plan):
    """Every FSDP2 unit of `model` gathered for the block and kept so through its forwards (sampling
    calls the causal LM inside the root directly, and would otherwise gather every layer at every
    new token); resharded after it. Each process briefly holds the whole model, as ZeRO-3 does
    while it samples."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    model.set_reshard_after_forward(False)
    try:
        for unit in units:
            unit.unshard()
        yield
    finally:
        for unit in units:
            if unit is not model:
                unit.set_reshard_after_forward(plan.reshard_after_forward, recurse=False)
            unit.reshard()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of a sharded `model`, gathered into CPU memory on the main process (an empty
    dict on the others); a collective call: every process must make it. A weight tied to another
    (a causal LM's output layer and token embedding) is kept under its first name only, as
    `save_pretrained` writes it from live weights (the gathered copies no longer share memory)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    first = dict(model.named_parameters())
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False) if name not in first}
    return {k: v for k, v in state.items() if k not in tied}


# ----------------------------------------------------------------------------- checkpoints
# A checkpoint keeps the full trainable weights and the optimiser's full state (keyed by parameter
# name), gathered into CPU memory on the main process, so it is the same files as without FSDP2 and
# each process takes its shard back on resume.


def trainable_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of the trainable parameters of sharded `model` on the main process ({} on
    the others); a collective call."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in full_state_dict(model).items() if k in trainable}


def load_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Full weights (some of the model's, by name) into the shards of `model`: each process keeps its own."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))


def optimizer_state(model: nn.Module, optimizer) -> dict:
    """The optimiser's full state, keyed by parameter name, on the main process; a collective call.
    `optimizer` may be accelerate's wrapper."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, getattr(optimizer, "optimizer", optimizer),
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    """`optimizer_state`'s full state into the optimiser of sharded `model` (every process passes it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, getattr(optimizer, "optimizer", optimizer), state,
                             options=StateDictOptions(full_state_dict=True))
