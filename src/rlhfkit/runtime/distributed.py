"""Multi-process helpers on top of Accelerate: global loss normalisation with gradient accumulation,
metrics averaged over processes, DeepSpeed set-up, generation and full-weight saving on sharded
weights (FSDP2, ZeRO-3).

Every trainer runs unchanged under `accelerate launch` / `torchrun`: data parallel (DDP), FSDP2
(applied by rlhfkit: runtime/fsdp2.py) or DeepSpeed, chosen by the launch configuration
(configs/accelerate/, docs/scale.md). With one process every helper here is a cheap no-op.
"""

from __future__ import annotations

import contextlib

import torch

from rlhfkit.errors import ConfigError, UserError
from rlhfkit.runtime import fsdp2
from rlhfkit.runtime.fsdp2 import full_weights, is_sharded


def accumulate_backward(accelerator, model, loss: torch.Tensor, sync: bool) -> None:
    """Backward of one micro-batch of a manually accumulated optimiser step.

    `loss` must already be normalised by the GLOBAL counts of the step (tokens, sequences or pairs
    of all its micro-batches on all processes), so that the gradients summed over micro-batches and
    processes are the gradient of the step's loss (docs/pitfalls.md#loss-aggregation). DDP/FSDP average gradients over
    processes and accelerate/DeepSpeed divide by their accumulation steps: both are undone here.
    Gradients are all-reduced (and DeepSpeed steps) only when `sync`, on the step's last micro-batch.
    """
    scale = accelerator.num_processes * getattr(accelerator, "gradient_accumulation_steps", 1)
    local = not sync and accelerator.num_processes > 1
    deepspeed = deepspeed_plugin(accelerator) is not None
    if deepspeed:  # DeepSpeed reads it to find the accumulation boundary (and steps there)
        accelerator.gradient_state._set_sync_gradients(sync)
    try:
        with no_sync(accelerator, model) if local else contextlib.nullcontext():
            accelerator.backward(loss * scale)
    finally:
        if deepspeed:
            accelerator.gradient_state._set_sync_gradients(True)


@contextlib.contextmanager
def no_sync(accelerator, model):
    """Gradients stay local in the block: FSDP2 (sharded by rlhfkit, runtime/fsdp2.py, which
    accelerate may not know about) keeps them unreduced; DDP skips its all-reduce."""
    if not is_sharded(model):
        with accelerator.no_sync(model):
            yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def sum_over_processes(accelerator, values: dict[str, float], keep: tuple[str, ...] = ()) -> dict[str, float]:
    """Sum each value over processes (one all-reduce); keys in `keep` are left as they are.
    Every process must pass the same keys."""
    keys = sorted(k for k in values if k not in keep)
    if accelerator.num_processes == 1 or not keys:
        return dict(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    summed = accelerator.reduce(t, "sum").tolist()
    return {**values, **dict(zip(keys, summed))}


def mean_over_processes(accelerator, values: dict[str, float]) -> dict[str, float]:
    """Each numeric value averaged over processes (metrics of per-process rollouts, e.g. the rollout
    KL that drives the adaptive KL controller, which must then agree on every process)."""
    if accelerator.num_processes == 1:
        return dict(values)
    num = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    summed = sum_over_processes(accelerator, num)
    return {**values, **{k: v / accelerator.num_processes for k, v in summed.items()}}


def max_over_processes(accelerator, value: float) -> float:
    """The largest `value` of all processes (so every process takes the same branch on it)."""
    if accelerator.num_processes == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=accelerator.device)
    return float(accelerator.reduce(t, "max"))


def deepspeed_plugin(accelerator):
    """The active DeepSpeed plugin, or None."""
    return getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)


def configure_deepspeed(accelerator, micro_batch_size: int, max_grad_norm: float) -> None:
    """Fill the DeepSpeed config's 'auto' values that accelerate cannot infer (rlhfkit passes no
    DataLoader to `prepare`): the micro-batch size, gradient clipping, and one accumulation step
    per `backward` boundary (rlhfkit marks the boundary itself, see `accumulate_backward`)."""
    plugin = deepspeed_plugin(accelerator)
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    for key, value in (("train_micro_batch_size_per_gpu", micro_batch_size), ("gradient_clipping", max_grad_norm),
                       ("gradient_accumulation_steps", 1)):
        if ds.get(key, "auto") == "auto":
            ds[key] = value
    if ds.get("train_batch_size", "auto") == "auto":
        ds["train_batch_size"] = micro_batch_size * ds["gradient_accumulation_steps"] * accelerator.num_processes


@contextlib.contextmanager
def generation_weights(accelerator, model, fsdp2=None):
    """Full weights for sampling. Under FSDP2 (`fsdp2`, the plan `model` was sharded by) and DeepSpeed
    ZeRO-3 the weights are partitioned: FSDP2 would not gather them at all for the causal LM that
    sampling calls inside the prepared model, and ZeRO-3 would all-gather every layer at every new
    token. Both gather them once for the whole rollout instead (each process then holds the full
    policy while it samples). Under ZeRO-3 HF generate turns on `synced_gpus`, so processes that
    finish early keep stepping; under FSDP2 sampling then runs no collective at all, so processes
    may stop at different lengths."""
    if fsdp2 is not None and is_sharded(model):
        with full_weights(model, fsdp2):
            yield
        return
    plugin = deepspeed_plugin(accelerator)
    if plugin is None or plugin.zero_stage != 3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        yield


def full_state_dict(accelerator, model) -> dict[str, torch.Tensor] | None:
    """The prepared model's full state dict when its weights are sharded (FSDP2, DeepSpeed ZeRO-3),
    gathered on the main process at least (a collective call: all processes must make it); None
    otherwise, meaning the unwrapped model's own weights are complete and can be saved directly."""
    from accelerate.utils import DistributedType

    if fsdp2.is_sharded(model):
        return fsdp2.full_state_dict(model)
    sharded = accelerator.distributed_type == DistributedType.FSDP or (
        deepspeed_plugin(accelerator) is not None and deepspeed_plugin(accelerator).zero_stage == 3)
    if not sharded:
        return None
    return accelerator.get_state_dict(model)


def global_mean_var(accelerator, x: torch.Tensor, mask: torch.Tensor) -> tuple[float | None, float | None]:
    """Mean and population variance of x over the valid positions of ALL processes (for advantage
    whitening over the global rollout); (None, None) with one process, meaning "use the local ones"."""
    if accelerator.num_processes == 1:
        return None, None
    m = mask.to(torch.float64)
    x = x.to(torch.float64) * m
    t = torch.stack([x.sum(), (x * x).sum(), m.sum()]).to(accelerator.device)
    s1, s2, n = accelerator.reduce(t, "sum").tolist()
    n = max(n, 1.0)
    mean = s1 / n
    return mean, max(s2 / n - mean * mean, 0.0)


def decided_on_main(accelerator, decide):
    """`decide()` run on the main process only (e.g. claiming the run folder), its result shared with
    every process; a UserError it raises is raised on every process alike (none waits for ever)."""
    if accelerator.num_processes == 1:
        return decide()
    from accelerate.utils import broadcast_object_list

    box: list = [None]
    if accelerator.is_main_process:
        try:
            box = [("ok", decide())]
        except UserError as e:
            box = [("error", str(e))]
    broadcast_object_list(box, from_process=0)
    kind, value = box[0]
    if kind == "error":
        raise UserError(value)
    return value


DEEPSPEED_REFUSED = (
    "distributed_type: DEEPSPEED is refused: rlhfkit's DeepSpeed path has never run a test (no checkpoints or resume "
    "under it, no check against one process), and on CPU processes accelerate silently runs plain data parallelism "
    "instead; shard with configs/accelerate/fsdp2.yaml (weights, gradients and optimiser, as ZeRO-3; "
    "fsdp_reshard_after_forward: false is ZeRO-2-like), docs/scale.md 'DeepSpeed'")


def refuse_deepspeed(env=None) -> None:
    """A ConfigError (DEEPSPEED_REFUSED) when the launch asks for DeepSpeed: accelerate's launcher puts
    ACCELERATE_USE_DEEPSPEED=true in the environment for a `distributed_type: DEEPSPEED` config.
    Checked before the Accelerator exists, so nothing is set up or written."""
    import os

    env = os.environ if env is None else env
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").strip().lower() in ("true", "1", "yes"):
        raise ConfigError(DEEPSPEED_REFUSED)


def gathered(accelerator, value) -> list:
    """`value` of every process, in rank order, on every process (a collective call; any picklable
    value, e.g. RNG states or a flag); [value] with one process."""
    if accelerator.num_processes == 1:
        return [value]
    out: list = [None] * accelerator.num_processes
    torch.distributed.all_gather_object(out, value)
    return out


# Written by the main process into its run folder and looked for by every process: which processes
# see that folder (shared storage) and which see a folder of the same name on their own disk.
STORAGE_MARKER = ".storage-check"


def sees_main_folder(accelerator, folder) -> list[bool]:
    """Per process, in rank order: whether it sees the main process's run folder `folder` itself
    (shared storage: a network file system, or the same machine) rather than a folder of that name
    on its machine's own disk (or none). The main process writes a random token into the folder,
    every process reads it back from its `folder`, the main process removes it. A collective call."""
    import secrets
    from pathlib import Path

    if accelerator.num_processes == 1:
        return [True]
    marker = Path(folder) / STORAGE_MARKER

    def write() -> str:
        token = secrets.token_hex(16)
        marker.write_text(token)
        return token

    token = decided_on_main(accelerator, write)
    try:
        seen = marker.read_text() == token
    except OSError:
        seen = False
    everyone = gathered(accelerator, seen)  # every process has looked before the marker goes
    if accelerator.is_main_process:
        marker.unlink(missing_ok=True)
    return everyone


def sharding_name(processes: int, fsdp2: bool, engine: str, zero_stage: int | None = None) -> str:
    """What the launch shards, in one word: "none" (one process, nothing sharded), "ddp" (data
    parallel: every process holds everything), "fsdp2" (rlhfkit's FSDP2, runtime/fsdp2.py), "fsdp"
    (accelerate's own), "deepspeed-zero{stage}". `engine`: accelerate's DistributedType value."""
    if fsdp2:
        return "fsdp2"
    if engine == "DEEPSPEED":
        return f"deepspeed-zero{zero_stage}" if zero_stage is not None else "deepspeed"
    if engine == "FSDP":
        return "fsdp"
    return "ddp" if processes > 1 else "none"


# Set in a process started by torchrun or accelerate launch (whatever number of processes it started).
LAUNCHER_ENV = ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "ACCELERATE_MIXED_PRECISION")


def processes_line(processes: int, machines: int, sharding: str, launched: bool) -> str | None:
    """The line a run prints at start: how many processes run it, on how many machines, sharded how.
    None for one process started without a launcher (nothing to say). One process under a launcher
    says why it may be one (the documented trap: `accelerate launch --cpu` starts one)."""
    if processes == 1 and not launched:
        return None
    where = f" ({machines} machines)" if machines > 1 else ""
    line = f"[processes] {processes}{where}, sharding: {sharding}"
    if processes == 1:
        line += (" (the launcher started one process; `accelerate launch --cpu` starts one whatever "
                 "--num_processes says: use ACCELERATE_USE_CPU=1 with --multi_gpu, docs/scale.md)")
    return line


# Where a process that stops on an error of its own leaves its one line for the others: the launcher's
# key-value store (torchrun and accelerate keep it in the launcher of machine 0, so it outlives the process).
FAILURE_KEY = "rlhfkit/failed/{rank}"


def _store():
    """The default process group's store, or None (no process group)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def report_failure(rank: int, text: str) -> None:
    """Leave `text` (why process `rank` stops) for the other processes; nothing when it cannot."""
    with contextlib.suppress(Exception):  # no store, or the store is gone: the launcher's report remains
        store = _store()
        if store is not None:
            store.set(FAILURE_KEY.format(rank=rank), text)


def reported_failures(processes: int, me: int) -> dict[int, str]:
    """rank -> the line a process other than `me` left with `report_failure` (none: not listed)."""
    out: dict[int, str] = {}
    with contextlib.suppress(Exception):
        store = _store()
        for rank in range(processes) if store is not None else ():
            key = FAILURE_KEY.format(rank=rank)
            if rank != me and store.check([key]):
                out[rank] = store.get(key).decode(errors="replace")
    return out
