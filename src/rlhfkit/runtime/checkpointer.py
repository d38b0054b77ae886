"""When a training loop checkpoints and how it resumes: every `save_every` steps, at the end, and
on SIGINT/SIGTERM/SIGHUP (with the one message of a stopped run, `interrupted`); the checkpoint
files themselves are runtime/checkpoint.py's."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import torch

from rlhfkit.core.run_files import (
    CHECKPOINTS,
    CONFIG,
    STATE,
    WEIGHTS,
    checkpoint_step,
    latest_checkpoint,
    state_problem,
)
from rlhfkit.errors import UserError, one_line
from rlhfkit.runtime import fsdp2
from rlhfkit.runtime.checkpoint import (
    clean_leftovers,
    get_state,
    load_rng,
    load_state,
    load_trainable,
    read_trainable,
    rng_file,
    set_state,
    truncate_logs,
    write_checkpoint,
)
from rlhfkit.runtime.distributed import decided_on_main, gathered
from rlhfkit.runtime.faults import Interrupted, NonFiniteError, StopSignals, non_finite_tensors


def read_file(path: Path, read):
    """`read()` of a checkpoint file; a file that cannot be read is a one-line UserError naming it
    (a resume has checked every file already: core/run_files.py checkpoint_problem)."""
    try:
        return read()
    except UserError:
        raise
    except Exception as e:  # safetensors, pickle, zip errors of a damaged file
        raise UserError(f"resume: cannot read {path} ({type(e).__name__}: {one_line(e)[:160]}); delete that "
                        "checkpoint folder to resume from the one before") from None


def read_checked(path: Path) -> tuple[dict, dict]:
    """A checkpoint's (trainable weights, state), after checking that the step in state.pt is the
    checkpoint's own (files of two checkpoints mixed are refused)."""
    saved = read_file(path / WEIGHTS, lambda: read_trainable(path))
    state = read_file(path / STATE, lambda: load_state(path))
    step = checkpoint_step(path)
    if isinstance(state, dict) and state.get("step") != step:
        raise UserError(f"resume: {path / STATE} is from step {state.get('step')}, but the checkpoint is "
                        f"step-{step}: its files come from different checkpoints")
    problem = state_problem(state, step)
    if problem:
        raise UserError(f"resume: {path / STATE} {problem}; delete that checkpoint folder to resume from the one "
                        "before")
    return saved, state


def read_for_processes(accelerator, path: Path, shared: list[bool] | None) -> tuple[dict, dict, dict | None]:
    """(trainable weights, state, this process's RNG state or None) of checkpoint `path`. Where
    every process sees the run folder (`shared`: per process, runtime/distributed.py
    `sees_main_folder`; None: all) each reads the files itself; otherwise the main process reads
    them and sends them to every process (a collective call; a UserError is raised on all alike)."""
    rank = accelerator.process_index
    if shared is None or all(shared):
        saved, state = read_checked(path)
        return saved, state, read_file(path / rng_file(rank), lambda: load_rng(path, rank))

    def read_all() -> tuple[dict, dict, list]:
        saved, state = read_checked(path)
        rngs = [read_file(path / rng_file(r), lambda r=r: load_rng(path, r)) for r in range(accelerator.num_processes)]
        return saved, state, rngs

    saved, state, rngs = decided_on_main(accelerator, read_all)
    return saved, state, rngs[rank]


def _restore(path: Path, restore) -> None:
    """`restore()` of optimiser, schedule and objects from a checkpoint's state; state that does not
    fit this run's (another optimiser, number of parameter groups, ...) is one line naming the file."""
    try:
        restore()
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as e:
        raise UserError(f"resume: {path / STATE} does not fit this run ({type(e).__name__}: {one_line(e)[:160]}): "
                        "was it saved with another model, optimiser or lora setting?") from None


# Optimiser settings that come from the configuration, not from training: a resumed run takes them
# from its (possibly overridden) config, not from the checkpoint's optimiser state.
SETTINGS = ("initial_lr", "weight_decay", "eps")


def _schedule(scheduler):
    return getattr(scheduler, "scheduler", scheduler)  # accelerate wraps it


def optimizer_settings(optimizer, scheduler) -> tuple[list[dict], list[float]]:
    """(per parameter group: initial_lr, weight_decay, eps; the schedule's base lrs) as configured."""
    groups = [{k: g[k] for k in SETTINGS if k in g} for g in optimizer.param_groups]
    return groups, list(_schedule(scheduler).base_lrs)


def regroup(saved: dict, optimizer) -> dict:
    """An optimiser state dict saved with one parameter group, split into `optimizer`'s groups when
    they hold the same parameters in the same order (a checkpoint from before the run's config gave
    part of the model its own lr, e.g. PPO's value_head_lr); any other state is returned unchanged
    for torch to load or refuse. Each new group takes the saved group's settings; this run's own are
    put back afterwards (`apply_optimizer_settings`)."""
    groups = saved.get("param_groups", [])
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if len(groups) != 1 or len(sizes) == 1 or len(groups[0]["params"]) != sum(sizes):
        return saved
    ids, split, start = groups[0]["params"], [], 0
    for size in sizes:
        split.append({**groups[0], "params": ids[start:start + size]})
        start += size
    return {**saved, "param_groups": split}


def apply_optimizer_settings(optimizer, scheduler, settings: tuple[list[dict], list[float]]) -> None:
    """Put configured settings back after a checkpoint's optimiser and schedule state were loaded
    (`rlhfkit sft --resume RUN lr=1e-5` trains at 1e-5). A changed base lr also changes the lr in
    force now: base lr x the schedule's factor at its step (LambdaLR: warm-up and decay schedules),
    so params/lr shows it at once. Unchanged settings leave everything bit-exact."""
    groups, base_lrs = settings
    for group, configured in zip(optimizer.param_groups, groups):
        group.update(configured)
    schedule = _schedule(scheduler)
    if list(schedule.base_lrs) == base_lrs:
        return
    schedule.base_lrs = base_lrs
    factors = getattr(schedule, "lr_lambdas", None)
    if factors is None:  # another schedule: its next step applies the new base
        return
    for group, base, factor in zip(optimizer.param_groups, base_lrs, factors):
        group["lr"] = base * factor(schedule.last_epoch)
    schedule._last_lr = [group["lr"] for group in optimizer.param_groups]


def _sharded(accelerator, model) -> bool:
    """FSDP or DeepSpeed: weights or optimiser state are partitioned over processes. This module's
    files (whole tensors, one optimiser state dict) cover FSDP2 by gathering them (runtime/fsdp2.py),
    not DeepSpeed or accelerate's own FSDP."""
    from accelerate.utils import DistributedType

    engine = getattr(accelerator, "distributed_type", None)
    return fsdp2.is_sharded(model) or engine in (DistributedType.FSDP, DistributedType.DEEPSPEED)


class Checkpointer:
    """Checkpoints of one training loop (every `save_every` steps, at the end, on SIGINT/SIGTERM/SIGHUP)
    and the resume from one. The loop calls `resume` once before training, runs its steps from
    `start`, calls `end_step(step)` after logging each one and `finish(steps)` after the last.

    `objects` names the loop's other state (see get_state): data stream, generators, KL
    controller, the summary dict holding the before-training evaluation. `guard` (a
    NonFiniteGuard) is saved too, and checked at the end of every step. `total`: the steps this
    run is set to (a checkpoint beyond it is an error).
    """

    def __init__(self, cfg, run_dir: Path, command: str, accelerator, tracker, *, model, optimizer, scheduler,
                 objects: dict[str, Any] | None = None, guard=None, unit: str = "iteration", total: int | None = None,
                 signals=None, shared: list[bool] | None = None):
        self.cfg, self.run_dir, self.command = cfg, Path(run_dir), command
        self.accelerator, self.tracker = accelerator, tracker
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.objects = dict(objects or {})
        self.guard = guard
        if guard is not None:
            self.objects["nonfinite"] = guard
        self.unit, self.total = unit, total
        self.shared = shared  # per process: whether it sees the main process's run folder (None: all do)
        self.every, self.keep = cfg.save_every, cfg.keep_checkpoints
        self.start = 0
        self.saved_step: int | None = None
        self.signals = signals if signals is not None else StopSignals(self.remaining_checkpoint)  # the run's
        self.on_fsdp2 = fsdp2.is_sharded(model)  # checkpoints gather the shards (optimizer_format "fsdp2")
        self.sharded = _sharded(accelerator, model) and not self.on_fsdp2  # DeepSpeed: no checkpoints
        if self.sharded and self.every:
            tracker.print("[checkpoint] not written under DeepSpeed (sharded weights and optimiser state "
                          "are not supported yet): save_every is ignored")

    # ---- resume ---------------------------------------------------------------------------
    def resume(self, path: Path | None, **objects: Any) -> int:
        """Register more `objects`, then load everything from checkpoint `path` (None: a fresh run)
        and cut the run's logs back to it. Returns the first step to run."""
        from rlhfkit.core.seeding import set_rng_state

        self.objects.update(objects)
        if path is None:
            return self.start
        if self.sharded:
            raise UserError("resume: not supported under DeepSpeed; resume with plain DDP, FSDP2 or one process")
        saved, state, rng = read_for_processes(self.accelerator, path, self.shared)
        load_trainable(self.model, path, saved)
        fmt, mine = state.get("optimizer_format", "torch"), self._optimizer_format()
        if fmt != mine:
            raise UserError(f"resume: {path} was written {'under' if fmt == 'fsdp2' else 'without'} FSDP2; "
                            f"resume it {'under' if fmt == 'fsdp2' else 'without'} FSDP2 too (the accelerate config)")
        _restore(path, lambda: self._restore_state(state))
        if rng is None:
            self.tracker.print(f"[resume] {path} has no RNG state for process {self.accelerator.process_index} "
                               "(another number of processes?): the continuation is not bit-exact")
        else:
            set_rng_state(rng)
        self.start = self.saved_step = int(state["step"])
        if self.accelerator.is_main_process:  # leftovers first: their space may be what the logs need
            clean_leftovers(self.run_dir / CHECKPOINTS)
        kept = truncate_logs(self.run_dir, self.start) if self.accelerator.is_main_process else []
        self.tracker.resume(kept)
        self.tracker.print(f"[resume] {path}: continuing at {self.unit} {self.start}{self._config_changes(path)}")
        return self.start

    def _restore_state(self, state: dict) -> None:
        """Optimiser (with this run's configured settings kept), schedule and objects from `state`."""
        configured = optimizer_settings(self.optimizer, self.scheduler)  # this run's lr, weight_decay, eps
        if self.on_fsdp2:
            fsdp2.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(regroup(state["optimizer"], self.optimizer))
        self.scheduler.load_state_dict(state["scheduler"])
        apply_optimizer_settings(self.optimizer, self.scheduler, configured)
        for name, obj in self.objects.items():
            if name in state["objects"]:
                set_state(obj, state["objects"][name])

    def _config_changes(self, path: Path) -> str:
        import yaml

        from rlhfkit.core.config import to_dict

        try:
            old = yaml.safe_load((path / CONFIG).read_text()) or {}
        except (OSError, yaml.YAMLError):
            return ""
        new = to_dict(self.cfg)
        changed = [k for k in new if k not in ("resume", "quiet") and k in old and old[k] != new[k]]
        return f" (changed since the checkpoint: {', '.join(changed)})" if changed else ""

    # ---- saving ---------------------------------------------------------------------------
    def _optimizer_format(self) -> str:
        return "fsdp2" if self.on_fsdp2 else "torch"

    def state(self, step: int) -> dict:
        """Everything but the weights (a collective call under FSDP2: it gathers the optimiser state)."""
        optimizer = fsdp2.optimizer_state(self.model, self.optimizer) if self.on_fsdp2 else self.optimizer.state_dict()
        return {"step": step, "optimizer": optimizer, "optimizer_format": self._optimizer_format(),
                "scheduler": self.scheduler.state_dict(),
                "objects": {name: get_state(obj) for name, obj in self.objects.items()}}

    def remaining_checkpoint(self) -> str:
        """What a run stopped at once leaves: its newest checkpoint (to resume), or none."""
        found = latest_checkpoint(self.run_dir)
        if found is None:
            return "no checkpoint was written"
        return f"the newest checkpoint is {found}: continue with rlhfkit {self.command} --resume {self.run_dir}"

    def resume_hint(self) -> str:
        """How to go on after a failure: from the newest checkpoint, or afresh when there is none."""
        if latest_checkpoint(self.run_dir) is None:
            return "no checkpoint was written, so start the run again with the changes (overwrite=true)"
        return f"then continue from the last checkpoint: rlhfkit {self.command} --resume {self.run_dir}"

    def check_finite(self, step: int) -> None:
        """Weights with NaN/inf are never saved (a checkpoint of them would also push a good one out)."""
        bad = non_finite_tensors(self.model)
        if bad:
            total = sum(p.requires_grad for p in self.model.parameters())
            advice = f"{self.guard.advice}; " if self.guard is not None else ""
            raise NonFiniteError(f"after {step} {self.unit}{'s' * (step != 1)} {len(bad)} of {total} trained "
                                 f"tensors hold NaN/inf (e.g. {bad[0]}): nothing saved; {advice}{self.resume_hint()}")

    def save(self, step: int) -> Path | None:
        import yaml

        from rlhfkit.core.config import to_dict

        acc = self.accelerator
        if self.sharded:
            return None
        self.check_finite(step)
        if acc.is_main_process:
            clean_leftovers(self.run_dir / CHECKPOINTS)
        from rlhfkit.core.seeding import rng_state

        weights = fsdp2.trainable_weights(self.model) if self.on_fsdp2 else None  # every process takes part
        rngs = gathered(acc, rng_state())  # process 0 writes every process's RNG state
        path = write_checkpoint(self.run_dir, step, model=self.model, state=self.state(step),
                                config_text=yaml.safe_dump(to_dict(self.cfg), sort_keys=False),
                                rank=acc.process_index, world_size=acc.num_processes, keep=self.keep,
                                barrier=acc.wait_for_everyone, meta={"command": self.command, "unit": self.unit},
                                weights=weights, rng_states=rngs)
        self.saved_step = step
        return path

    def _stop_signal(self) -> int | None:
        """The signal that asked this run to stop, agreed by every process (so all stop together)."""
        signum = self.signals.signum
        if self.accelerator.num_processes > 1:
            t = torch.tensor(float(signum is not None), device=self.accelerator.device)
            if self.accelerator.reduce(t, "sum").item() > 0:
                signum = signum or int(signal.SIGTERM)
        return signum

    def interrupted(self, signum: int, when: str, path: Path | None = None):
        """The one message of a run stopped by signal `signum` (an Interrupted to raise): `when` it
        came, what was saved (checkpoint `path`, else the newest one) and the command that continues."""
        stopped = f"{signal.Signals(signum).name} {when}"
        if self.sharded:
            return Interrupted(f"{stopped}; no checkpoint (not supported under DeepSpeed)", signum)
        path = path or latest_checkpoint(self.run_dir)
        if path is None:
            return Interrupted(f"{stopped}; nothing to resume from was saved (no {self.unit} was done): start the "
                               "run again", signum)
        return Interrupted(f"{stopped}; checkpoint {path}. Continue with: rlhfkit {self.command} --resume "
                           f"{self.run_dir}", signum)

    def stop_if_asked(self, when: str, done: int | None = None) -> None:
        """After a signal (agreed by every process), stop: raise `interrupted`. `done`: the steps
        done by now, saved first unless that checkpoint exists (a signal after training with
        save_every=0 keeps the trained weights)."""
        signum = self._stop_signal()
        if not signum:
            return
        path = self.save(done) if done is not None and self.saved_step != done else None
        raise self.interrupted(signum, when, path)

    def end_step(self, step: int) -> None:
        """After step `step` (0-based) is done and logged: stop if too many optimiser steps in a row
        were non-finite; checkpoint when due; after a signal, checkpoint and raise Interrupted."""
        if self.guard is not None:
            try:
                self.guard.check()
            except NonFiniteError as e:
                raise NonFiniteError(f"{e}; {self.resume_hint()}") from None
        done = step + 1
        signum = self._stop_signal()
        path = self.save(done) if signum or (self.every and done % self.every == 0) else None
        if path is not None and not signum:  # a signal during that write: stop now, not a step later
            signum = self._stop_signal()
        if signum:
            raise self.interrupted(signum, f"after {done} {self.unit}{'s' * (done != 1)}", path)

    def finish(self, steps: int) -> None:
        """The final checkpoint (unless save_every = 0 or this step is already saved). Called with
        the signals still caught: a signal during it stops the run (Interrupted) once it is written."""
        if self.every and self.saved_step != steps:
            path = self.save(steps)
            signum = self._stop_signal()
            if signum and path is not None:
                raise self.interrupted(signum, "during the final checkpoint, before the final save", path)
