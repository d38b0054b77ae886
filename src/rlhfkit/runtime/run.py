"""The run harness every trainer stands on: one place for what is not a method's maths.

A trainer's `train(cfg)` reads:

    launch = Launch(cfg)               # accelerator, seeds, allocator, resolved dtype; the run folder checked
    ... load and check data and models (bad input stops here: no run folder yet) ...
    with Run(launch, COMMAND, STEPS, model, optimizer, scheduler, micro_batch_size, stream=...) as run:
        run.resume()                   # continue from the checkpoint, when resuming
        with run.evaluation("before"): # (a signal during it stops the run right after it)
            before = run.once("eval_before", evaluate)
        for step in run.steps():       # checkpoints when due
            ... the method's step; run.optimizer_step(loss, step) ...
            run.log(step, metrics)
        return run.finish(save_final)  # final weights (gathered when sharded), summary.json

`Run(...)` is complete when it returns: the run folder taken (config.yaml, tracker, non-finite guard,
signal handlers) and the model, optimiser and schedule prepared (DDP/FSDP/DeepSpeed), with checkpoints
set up; a failure while building it releases what it took. Leaving the `with` block releases the run
folder and the signal handlers however it ends: a failed run's folder is removed when the run created
it and had logged nothing yet, else marked failed (runtime/run_folder.py); a stop by a signal
(Interrupted) after some steps is not a failure: its checkpoint is there to resume from.

From the folder's claim to the end of `finish`, SIGINT/SIGTERM/SIGHUP let the run finish what it is
doing (a step, an evaluation, a checkpoint write, the final save), then stop it with a checkpoint of
the steps done and one message (runtime/checkpointer.py `interrupted`): exit 128 + signal.

`run.summary` is the dict written to summary.json; it is checkpointed, so a resumed run keeps
its before-training evaluation. Modes are explicit: the trained model is put in train mode (dropout
stays off: models/loading.disable_dropout; gradient checkpointing needs it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rlhfkit.core.allocator import cap_kernel_caches, tune_malloc
from rlhfkit.core.disk import out_of_space
from rlhfkit.core.run_files import checkpoint_step
from rlhfkit.diagnostics.console import closing_line
from rlhfkit.errors import UserError, one_line
from rlhfkit.models.loading import resolve_dtype
from rlhfkit.runtime.checkpointer import Checkpointer
from rlhfkit.runtime.distributed import (
    LAUNCHER_ENV,
    configure_deepspeed,
    decided_on_main,
    deepspeed_plugin,
    full_state_dict,
    gathered,
    generation_weights,
    processes_line,
    refuse_deepspeed,
    report_failure,
    reported_failures,
    sees_main_folder,
    sharding_name,
)
from rlhfkit.runtime.faults import (
    COLLECTIVE_FAILURE_TEXT,
    Interrupted,
    NonFiniteGuard,
    PeerFailure,
    StopSignals,
    ignore_launcher_stop,
    is_collective_failure,
    pause_point,
    peer_states,
    process_identity,
)
from rlhfkit.runtime.final_folder import store_adapter_base, write_model_card
from rlhfkit.runtime.fsdp2 import for_compute_dtype, requested_plan, shard, shard_frozen
from rlhfkit.runtime.optim import optimizer_step
from rlhfkit.runtime.run_folder import FAILED, RunFolder, check_run_folder, claim_run_folder
from rlhfkit.runtime.tracker import Tracker


class Launch:
    """This process's part of a run before its folder exists: the accelerator (one scheduler step per
    optimiser step), the FSDP2 plan a distributed launch asks for, seeds, allocator settings and the
    resolved dtype; the run folder is checked (on the main process) before any model loads."""

    def __init__(self, cfg: Any):
        from accelerate import Accelerator

        from rlhfkit.core.seeding import seed_everything

        refuse_deepspeed()  # a DeepSpeed launch stops here, before anything is set up (docs/scale.md)
        cap_kernel_caches()  # before any matmul: each new shape's kernels stay cached (core/allocator.py)
        self.cfg = cfg
        # One scheduler step per optimiser step (runtime/faults.guarded_step steps it): accelerate's default
        # steps it once per process, so N processes would warm up N times faster.
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.fsdp2 = requested_plan() if distributed else None  # the launch asks for FSDP2: rlhfkit shards (Run)
        if self.accelerator.is_main_process:  # before any model loads: a run without its folder stops now
            check_run_folder(cfg)  # (the main process only: the others may see the folder it has just taken)
        seed_everything(cfg.seed)
        # freed CPU tensors stay in the process for reuse; FSDP2's per-layer buffers are mapped (core/allocator.py)
        tune_malloc(sharded=self.fsdp2 is not None)
        # 'auto' -> bf16 where bf16 matmuls are fast: a validated config has it resolved already
        # (DtypeArgs.derived, so config.yaml records it); the run keeps it for one built directly
        self.dtype = resolve_dtype(cfg.dtype)
        if self.fsdp2 is not None:  # a bf16 run gathers its layers in bf16 whatever the preset says
            self.fsdp2 = for_compute_dtype(self.fsdp2, self.dtype)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def world(self) -> int:
        """Number of processes; per-process batch sizes times this are the global ones."""
        return self.accelerator.num_processes

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process


def check_resume_fits(checkpoint: Path, total: int, unit: str) -> None:
    """A checkpoint after more steps than this run is set to is refused before anything is written."""
    step = checkpoint_step(checkpoint)
    if step > total:
        raise UserError(f"resume: {checkpoint} is after {step} {unit}s, but this run is set to {total}: ask for "
                        f"at least {step} (iterations / max_steps)")


class Run(Launch):
    """One training run, complete when built: the launch's process set-up, the run folder (new, or
    the one resumed; locked for this run: runtime/run_folder.py), config.yaml, the tracker (`total`
    steps for its progress bar), the non-finite guard and the signal handlers; the model, optimiser
    and schedule handed to Accelerate (DDP, DeepSpeed) or sharded with FSDP2 (runtime/fsdp2.py), the
    model in train mode, and checkpoints of it and of `objects` (data stream, generators, ...: anything
    with state_dict/load_state_dict, or a dict). A frozen `reference` copy still in use is sharded like
    the policy under FSDP2. `summary` seeds summary.json. A context manager: leaving it releases the run
    folder and the signals (see the module docstring). A resumed run writes config.yaml once `resume`
    has restored the checkpoint (a refused resume changes nothing)."""

    def __init__(self, launch: Launch, command: str, total: int, model: torch.nn.Module, optimizer, scheduler,
                 micro_batch_size: int, *, unit: str = "iteration", summary: dict | None = None, reference=None,
                 **objects: Any):
        from rlhfkit.core.config import to_dict

        # the launch's set-up, taken over (not redone): its properties (device, world, rank, is_main) read these
        self.cfg, self.accelerator, self.fsdp2, self.dtype = launch.cfg, launch.accelerator, launch.fsdp2, launch.dtype
        cfg = self.cfg
        self.command, self.total, self.unit = command, total, unit
        self.summary: dict = {}

        def claim() -> tuple[Path, Path | None]:
            self.folder = claim_run_folder(cfg, command)
            return self.folder.path, self.folder.resume_from

        self.run_dir, self.resume_from = decided_on_main(self.accelerator, claim)
        if not self.is_main:
            self.folder = RunFolder(self.run_dir, self.resume_from)
        self.shared: list[bool] = [True]  # per process: whether it sees the main process's run folder
        self.peers: list[tuple[str, int, int]] = []  # per process: (host, process id, start time)
        self.signals = StopSignals(self._remaining)
        if self.world > 1:  # the main process says it, once; a launcher stopping the run after a process died says nothing
            self.signals.announce = self.is_main
            self.signals.peer_gone = lambda: bool(peer_states(self.peers, self.rank))
        self.signals.doing = "the preparation before training, then stopping"
        self.signals.__enter__()  # released by `close`
        try:
            self.shared = sees_main_folder(self.accelerator, self.run_dir)
            self.peers = gathered(self.accelerator, process_identity())
            if self.resume_from is not None:
                check_resume_fits(self.resume_from, total, unit)
            else:
                self._save_config()
            self.tracker = Tracker(self.run_dir, total, cfg.quiet, self.is_main, cfg.tensorboard, cfg.wandb,
                                   config=to_dict(cfg), logging_steps=cfg.logging_steps)
            for notice in self.folder.notices:  # a damaged newer checkpoint was skipped
                self.tracker.print(notice)
            warning = getattr(scheduler, "warning", None)  # runtime/optim.py optimizer_for: a warm-up past the end
            if warning and self.is_main:
                print(f"rlhfkit: warning: {warning}", file=sys.stderr, flush=True)
            self.summary.update({"run_dir": str(self.run_dir), **self._processes(), **(summary or {})})
            self.guard = NonFiniteGuard.for_config(cfg, self.tracker.print)
            self.model, self.optimizer, self.scheduler = self._prepare(model, optimizer, scheduler, micro_batch_size)
            self.core = self.accelerator.unwrap_model(self.model)  # unwrapped: sampling, evaluation, saving
            self.model.train()  # explicit: gradient checkpointing only recomputes in train mode
            self.checkpointer = Checkpointer(cfg, self.run_dir, command, self.accelerator, self.tracker,
                                             model=self.core, optimizer=self.optimizer, scheduler=self.scheduler,
                                             objects={**objects, "summary": self.summary}, guard=self.guard,
                                             unit=unit, total=total, signals=self.signals, shared=self.shared)
            self._shard_reference(reference)
        except BaseException as e:
            self.close(e)
            raise

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, error, trace) -> None:
        """However the block ends, the folder and the signals are released; after an error the folder is
        removed or marked failed, unless a signal stopped a run with steps to resume from. In a run of
        several processes an error is reported as `failure` words it (one line naming the process that
        stopped), and raised in its place."""
        reported = self.failure(error) if error is not None and self.world > 1 else error
        self.close(None if isinstance(error, Interrupted) and self.has_steps() else reported)
        if reported is not error:
            raise reported from None

    # ---- properties ---------------------------------------------------------------------
    @property
    def start(self) -> int:
        """First step to run: 0, or the checkpoint's step after `resume`."""
        return self.checkpointer.start

    # ---- set-up -------------------------------------------------------------------------
    def _remaining(self) -> str:
        """What a run stopped at once leaves (the second signal's message)."""
        if hasattr(self, "checkpointer"):  # (a signal while the run is being built: none yet)
            return self.checkpointer.remaining_checkpoint()
        return "no checkpoint was written" if self.resume_from is None else f"the checkpoint is {self.resume_from}"

    def _processes(self) -> dict:
        """{"processes", "machines", "sharding"} of this launch (summary.json), printed once at start."""
        import os

        plugin = deepspeed_plugin(self.accelerator)
        engine = getattr(self.accelerator.distributed_type, "value", str(self.accelerator.distributed_type))
        sharding = sharding_name(self.world, self.fsdp2 is not None, engine,
                                 plugin.zero_stage if plugin is not None else None)
        per_machine = int(os.environ.get("LOCAL_WORLD_SIZE") or self.world)
        machines = max(1, self.world // max(1, per_machine))
        line = processes_line(self.world, machines, sharding, any(k in os.environ for k in LAUNCHER_ENV))
        if line:
            self.tracker.print(line)
        return {"processes": self.world, "machines": machines, "sharding": sharding}

    def _save_config(self) -> None:
        """RUN/config.yaml, by the main process; on a machine whose processes do not see the main
        process's run folder (node-local disks) also by its first process into the folder of that
        name on its own disk, so `--resume RUN` there reads the same configuration (the checkpoints
        and final/ are on the main process's disk: runtime/checkpoint.py)."""
        from rlhfkit.core.config import save_config

        if self.is_main:
            save_config(self.cfg, self.run_dir / "config.yaml")
        elif not self.shared[self.rank] and self.accelerator.local_process_index == 0:
            with contextlib.suppress(OSError):  # a copy for convenience: the run goes on without it
                self.run_dir.mkdir(parents=True, exist_ok=True)
                save_config(self.cfg, self.run_dir / "config.yaml")

    def failure(self, error: BaseException) -> BaseException:
        """What this process reports for `error` in a multi-process run: a collective call that failed
        because another process is gone becomes one line (PeerFailure) naming that process and what is
        known of why (its own line, or how it died when it ran on this machine), the newest checkpoint
        and the command that continues; an error of this process's own is left for the others (the
        launcher's store) and returned as it is."""
        if not is_collective_failure(error):
            if not isinstance(error, (KeyboardInterrupt, SystemExit, Interrupted)):
                report_failure(self.rank, f"{one_line(error)[:300]}" if isinstance(error, UserError)
                               else f"{type(error).__name__}: {one_line(error)[:300]}")
            return error
        gone = peer_states(self.peers, self.rank) if self.peers else {}
        for _ in range(30):  # a killed peer's sockets close before /proc shows it dead: give it up to 3 s
            if gone or not self.peers:
                break
            time.sleep(0.1)
            gone = peer_states(self.peers, self.rank)
        main_seen = bool(self.peers) and self.peers[0][0] == self.peers[self.rank][0] and 0 not in gone
        printed = self.is_main or (not main_seen and self.accelerator.local_process_index == 0)
        # the store lives with machine 0's launcher: only its main process asks (elsewhere it may be gone too)
        said = reported_failures(self.world, self.rank) if self.is_main else {}
        who = [f"rank {r} stopped ({said[r]})" for r in sorted(said)]
        who += [f"rank {r} {gone[r]}" for r in sorted(gone) if r not in said]
        if not who:
            where = "on another machine: its launcher's log says why" if self._machines_apart() else "its cause unknown"
            who = [f"another process stopped ({where})"]
        seen = next((t for t in COLLECTIVE_FAILURE_TEXT if t in str(error)), type(error).__name__)
        message = f"{', '.join(who)}, so the run stopped (this process: {seen}); {self._remaining()}"
        return PeerFailure(message, printed)

    def _machines_apart(self) -> bool:
        return len({host for host, _, _ in self.peers}) > 1

    def has_steps(self) -> bool:
        """Whether this run has steps to resume from: logged ones, or a checkpoint it resumed."""
        return self.resume_from is not None or self._logged() > 0

    def _logged(self) -> int:
        """Steps logged (none while the run is being built)."""
        return self.tracker.logged if hasattr(self, "tracker") else 0

    def _prepare(self, model: torch.nn.Module, optimizer, scheduler, micro_batch_size: int) -> tuple:
        """(model, optimizer, scheduler) handed to Accelerate, or the model sharded with FSDP2."""
        configure_deepspeed(self.accelerator, micro_batch_size, self.cfg.max_grad_norm)
        if self.fsdp2 is None:
            return self.accelerator.prepare(model, optimizer, scheduler)
        # accelerate's FSDP2 (GPUs) passes a sharded model through; elsewhere it would wrap it in DDP
        model = shard(model, optimizer, self.fsdp2, self.device)
        self.summary["fsdp2"] = {"processes": self.world, **dataclasses.asdict(self.fsdp2)}
        self.tracker.print(f"[fsdp2] weights, gradients and optimiser state sharded over {self.world} "
                           f"process{'es' * (self.world != 1)} "
                           f"(reshard_after_forward={self.fsdp2.reshard_after_forward}, "
                           f"mixed_precision={self.fsdp2.mixed_precision})")
        if self.accelerator.is_fsdp2:
            return self.accelerator.prepare(model, optimizer, scheduler)
        optimizer, scheduler = self.accelerator.prepare(optimizer, scheduler)
        return model, optimizer, scheduler

    def _shard_reference(self, reference) -> None:
        """Under FSDP2, shard a frozen reference copy (full fine-tuning) like the policy, so each
        process keeps 1/N of it; without one (LoRA: the adapter-disabled policy) or with one kept
        in CPU memory (`offload_reference`, moved whole for each pass) nothing changes."""
        frozen = getattr(reference, "frozen", None)
        if self.fsdp2 is None or frozen is None or reference.offload:
            return
        shard_frozen(frozen, self.fsdp2, self.device)
        self.summary["fsdp2"]["reference"] = "sharded"

    def full_weights(self):
        """Context manager around sampling: the whole policy gathered once under FSDP2 and DeepSpeed
        ZeRO-3 (sampling calls the causal LM inside the prepared model directly), else nothing."""
        return generation_weights(self.accelerator, self.model, self.fsdp2)

    def resume(self, **objects: Any) -> int:
        """Register more state to checkpoint (e.g. kl_ctl=...), then, when resuming, restore
        everything from the checkpoint and cut the logs back to it. Returns the first step."""
        start = self.checkpointer.resume(self.resume_from, **objects)
        if self.resume_from is not None:
            self._save_config()
        return start

    # ---- the loop -----------------------------------------------------------------------
    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """summary[key], computed by `compute()` unless a resumed checkpoint restored it (the
        before-training evaluation runs once per run, not once per process start)."""
        if key not in self.summary:
            self.summary[key] = compute()
        return self.summary[key]

    @contextlib.contextmanager
    def evaluation(self, when: str):
        """Around the evaluation `when` ("before" or "after") training: a signal during it lets it
        finish, then stops the run (after training: with a checkpoint of every step)."""
        then = "stopping" if when == "before" else "stopping with a checkpoint"
        done = None if when == "before" else self.total
        # a signal already there (e.g. during a reference pass): no evaluation
        self.checkpointer.stop_if_asked(f"before the evaluation {when} training", done)
        self.signals.doing = f"the evaluation {when} training, then {then}"
        pause_point(f"evaluation-{when}", self.signals)
        yield
        self.checkpointer.stop_if_asked(f"during the evaluation {when} training", done)

    def steps(self) -> Iterator[int]:
        """The steps still to run. A signal before the first one stops the run; after each one: stop
        after too many non-finite steps, checkpoint when due; on SIGINT/SIGTERM/SIGHUP checkpoint and
        raise Interrupted. After the last: the final checkpoint."""
        self.checkpointer.stop_if_asked("before training (during its preparation)")
        self.signals.doing = "this step, then writing a checkpoint"
        for step in range(self.checkpointer.start, self.total):
            yield step
            self.checkpointer.end_step(step)
        self.checkpointer.finish(self.total)
        self.signals.doing = "the work after training, then stopping with a checkpoint"

    def eval_due(self, step: int, every: int) -> bool:
        """Evaluate after step `step`: every `every` steps (0: never) and after the last one."""
        return (every > 0 and (step + 1) % every == 0) or step == self.total - 1

    def optimizer_step(self, loss: float, step: int) -> dict[str, float]:
        """One optimiser step of the run's model on its accumulated gradients (runtime/optim.py
        `optimizer_step`): clip and step unless non-finite (runtime/faults.py), then give the step's freed
        heap back. `loss` (the step's, for the non-finite check) and `step` name it in a warning. Returns
        params/grad_norm, params/lr and params/skipped_steps."""
        return optimizer_step(self.model.parameters(), self.optimizer, self.scheduler, self.accelerator,
                              self.cfg.max_grad_norm, loss, self.guard, f"{self.unit} {step}")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.tracker.log(step, metrics)

    def print(self, text: str) -> None:
        self.tracker.print(text)

    def finish(self, save: Callable[[Path, dict | None], dict | None]) -> dict:
        """The final save and summary.json. `save(folder, state_dict)` writes the final model into
        RUN/final on the main process; `state_dict` is the gathered full weights when they are
        sharded (FSDP / ZeRO-3), else None (save the live model). Whatever it returns joins the
        summary."""
        import shutil

        self.checkpointer.check_finite(self.total)  # never a final model of NaNs with exit 0
        self.checkpointer.stop_if_asked("after training, before the final save", self.total)
        self.signals.doing = "the final save, then stopping"
        state = full_state_dict(self.accelerator, self.model)  # every process takes part in the gather
        if self.is_main:
            final = self.run_dir / "final"
            pause_point("final-save", self.signals)
            try:
                with out_of_space(final, self.run_dir):
                    self.summary.update(save(final, state) or {})
                    store_adapter_base(final, self.cfg.model)
            except BaseException:
                shutil.rmtree(final, ignore_errors=True)  # no half-written final model
                raise
            if self.tracker.last_row is not None:  # the last step's metrics, evaluated or not
                self.summary.setdefault("final_metrics", dict(self.tracker.last_row))
            self.tracker.write_json("summary.json", self.summary)
            if (final / "README.md").is_file() or (final / "adapter_config.json").is_file():
                from rlhfkit.core.config import to_dict

                write_model_card(final, self.command, self.run_dir.name, to_dict(self.cfg), self.summary)
            self._clear_failure()
            self.print(closing_line(self.run_dir))
        self.tracker.close()
        signum = self.checkpointer._stop_signal()
        self.close()
        if signum:  # the run is complete: nothing to continue
            raise Interrupted(f"{signal.Signals(signum).name} during the final save, which was completed: the run is "
                              f"finished ({self.run_dir / 'final'}, {self.run_dir / 'summary.json'})", signum)
        return self.summary

    def _clear_failure(self) -> None:
        """A run that finished is no longer a failed one: an earlier attempt's RUN/failed.json goes."""
        (self.run_dir / FAILED).unlink(missing_ok=True)

    def close(self, error: BaseException | None = None) -> None:
        """Release the run folder and the signals (idempotent); after an `error`, remove or mark it
        (runtime/run_folder.py RunFolder.close)."""
        self.signals.__exit__()
        if isinstance(error, PeerFailure):
            ignore_launcher_stop()
        if self.folder is not None:
            folder, self.folder = self.folder, None
            if self.is_main:
                folder.close(error, logged=self._logged() > 0)
