"""Faults during training: stop signals and non-finite optimiser steps.

- `StopSignals`: while a run is open (runtime/run.py: from its folder to its final save), SIGINT/
  SIGTERM/SIGHUP only set a flag; the run finishes what it is `doing` (a step, an evaluation before
  or after training, a checkpoint write, the final save), writes a checkpoint where steps were done
  since the last one, and raises `Interrupted` (exit code 128 + signal: 130, 143, 129) with one
  message: what it was doing, the checkpoint, and the command that continues it. A second signal
  stops at once, naming the checkpoint that remains.
- `pause_point`: a test hook that holds the process at a named point until a signal arrives, so a
  test can signal a real process exactly there (e.g. during the evaluation after training).
- `guarded_step`: clip, then apply the optimiser step only when the loss and the gradient norm are
  finite; otherwise drop the gradients. `NonFiniteGuard` counts such skips; after
  `max_nonfinite_steps` in a row the run stops with a diagnosis (checked once the iteration's
  metrics, NaNs included, are logged).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path

import torch

from rlhfkit.errors import UserError


class Interrupted(UserError):
    """The run was stopped by a signal after a checkpoint was written; exit code 128 + signal."""

    label = "stopped"

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class NonFiniteError(UserError):
    """Too many optimiser steps in a row had a non-finite loss or gradient norm."""


class StopSignals:
    """Context manager: SIGINT/SIGTERM/SIGHUP set `signum` instead of stopping the process (main
    thread only; elsewhere handlers cannot be installed and signals keep their default effect).
    `remaining()` says, when a second signal stops the process at once, what it leaves to resume."""

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __init__(self, remaining=lambda: "") -> None:
        self.signum: int | None = None
        self.remaining = remaining
        self.doing = "this step, then writing a checkpoint"  # what a first signal lets finish (the run sets it)
        self.announce = True  # print the first signal's notice (several processes: the main one only)
        # Several processes: whether another one is gone, so the signal is its launcher stopping the
        # rest (the run reports that once its next collective call fails; no notice promising a checkpoint).
        self.peer_gone = lambda: False
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> bool:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        return False

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # asked twice: stop now, without a checkpoint
            self.__exit__()
            os.write(2, f"\nrlhfkit: {name} again: stopping at once; {self.remaining()}\n".encode())
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum
        if not self.announce or self.peer_gone():
            return
        # os.write, not print: a handler may run in the middle of another print
        os.write(2, f"\nrlhfkit: {name}: finishing {self.doing} (send {name} again to stop at once)\n".encode())


# Test hook: "POINT:FILE" makes the process create FILE at POINT (evaluation-before, evaluation-after,
# final-save) and wait there, up to PAUSE_LIMIT_S, until a stop signal has arrived.
PAUSE_ENV = "RLHFKIT_TEST_PAUSE_AT"
PAUSE_LIMIT_S = 120.0


def pause_point(point: str, signals: StopSignals) -> None:
    """Hold at `point` when the test hook PAUSE_ENV names it (see there); otherwise nothing."""
    name, _, marker = os.environ.get(PAUSE_ENV, "").partition(":")
    if name != point or not marker:
        return
    Path(marker).touch()
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while signals.signum is None and time.monotonic() < deadline:
        time.sleep(0.01)


class NonFiniteGuard:
    """Counts optimiser steps skipped for a non-finite loss or gradient norm; `check` (called after
    the step's metrics are logged) raises NonFiniteError once `max_in_a_row` were skipped in a row.
    `advice` ends the error message; `log` reports each skip."""

    def __init__(self, max_in_a_row: int = 3, advice: str = "", log=print):
        self.max_in_a_row = max_in_a_row
        self.advice = advice
        self.log = log
        self.streak = 0
        self.total = 0
        self.where = ""

    @classmethod
    def for_config(cls, cfg, log=print) -> NonFiniteGuard:
        advice = (f"lower lr (now {cfg.lr:g}) or max_grad_norm, use dtype=fp32 (now {cfg.dtype}), and check "
                  "the data and rewards for extreme values")
        return cls(cfg.max_nonfinite_steps, advice, log)

    def record(self, skipped: bool, where: str, detail: str = "") -> None:
        if not skipped:
            self.streak = 0
            return
        self.streak += 1
        self.total += 1
        self.where = where
        self.log(f"[fault] {where}: non-finite {detail or 'loss or gradient norm'}; optimiser step skipped "
                 f"({self.streak} in a row; the run stops at {self.max_in_a_row})")

    def check(self) -> None:
        if self.streak >= self.max_in_a_row:
            raise NonFiniteError(f"{self.streak} optimiser steps in a row had a non-finite loss or gradient norm "
                                 f"(last at {self.where}; none of them changed the weights): {self.advice}")

    def state_dict(self) -> dict:
        return {"streak": self.streak, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.streak, self.total = state["streak"], state["total"]


def non_finite_tensors(model: torch.nn.Module) -> list[str]:
    """Names of the trainable parameters holding NaN or inf (what must never be saved)."""
    return [n for n, p in model.named_parameters() if p.requires_grad and not bool(torch.isfinite(p).all())]


def guarded_step(params, optimizer, scheduler, accelerator, max_grad_norm: float, *, loss: float = 0.0,
                 guard: NonFiniteGuard | None = None, where: str = "") -> tuple[float, bool]:
    """Clip the accumulated gradients and step, unless the loss or the gradient norm is non-finite:
    then zero the gradients and leave weights, optimiser state and lr schedule untouched.
    Every process decides alike (any process non-finite -> all skip). Returns (grad norm, skipped)."""
    grad_norm = float(accelerator.clip_grad_norm_(params, max_grad_norm))
    bad = not (math.isfinite(loss) and math.isfinite(grad_norm))
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(torch.tensor(float(bad), device=accelerator.device), "sum").item() > 0
    if not bad:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if guard is not None:
        guard.record(bad, where, f"loss ({loss:.4g}) or gradient norm ({grad_norm:.4g})")
    return grad_norm, bad


# ----------------------------------------------------------------------------- another process stopped
# What a collective call raises when another process of the run is gone (gloo: the peer's socket
# closed; NCCL: its error or watchdog), by type (torch.distributed.DistError and its subclasses) or text.
COLLECTIVE_FAILURE_TEXT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo/transport",
                           "NCCL error", "ProcessGroupNCCL", "Socket Timeout")


class PeerFailure(UserError):
    """Another process of a multi-process run stopped, so this one cannot go on: one line naming it
    (runtime/run.py `Run.__exit__`), exit code 1. `printed`: whether this process prints it
    (the main process; another only when the main process is gone or on another machine)."""

    exit_code = 1

    def __init__(self, message: str, printed: bool = True):
        super().__init__(message)
        self.printed = printed


def is_collective_failure(e: BaseException) -> bool:
    """Whether `e` is a collective call failing because another process is gone."""
    names = {c.__name__ for c in type(e).__mro__}
    if names & {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}:
        return True
    return isinstance(e, RuntimeError) and any(t in str(e) for t in COLLECTIVE_FAILURE_TEXT)


def process_identity(pid: int | None = None) -> tuple[str, int, int]:
    """(host name, process id, start time in clock ticks since boot: 0 where /proc has none) of
    process `pid` (default: this one); the start time tells a reused process id from the original."""
    import socket

    pid = os.getpid() if pid is None else pid
    return socket.gethostname(), pid, _stat(pid)[1] if _stat(pid) else 0


def _stat(pid: int) -> tuple[str, int, int | None] | None:
    """(state letter, start time, exit status as wait(2) reports it or None) from /proc/PID/stat,
    or None when there is no such process (or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 on
    exit_status = int(fields[49]) if len(fields) > 49 else None  # field 52: exit_code (Linux >= 3.5)
    return fields[0], int(fields[19]), exit_status


def exit_cause(status: int | None) -> str:
    """A wait(2) status in words: "SIGKILL", "exit code 1"; "" when unknown."""
    if status is None:
        return ""
    if status & 0x7F:
        try:
            return signal.Signals(status & 0x7F).name
        except ValueError:
            return f"signal {status & 0x7F}"
    return f"exit code {(status >> 8) & 0xFF}"


def peer_states(peers: list[tuple[str, int, int]], me: int) -> dict[int, str]:
    """rank -> what became of that process, for the processes of `peers` (process_identity of every
    rank) on this machine that are gone: "died (SIGKILL)" while its launcher has not collected it
    yet, else "is gone". Processes on other machines cannot be seen from here: not listed."""
    host = peers[me][0]
    out: dict[int, str] = {}
    for rank, (their_host, pid, started) in enumerate(peers):
        if rank == me or their_host != host:
            continue
        stat = _stat(pid)
        if stat is None or (started and stat[1] != started):
            out[rank] = "is gone"
        elif stat[0] in ("Z", "X"):
            cause = exit_cause(stat[2])
            out[rank] = f"died ({cause})" if cause else "died"
    return out


def ignore_launcher_stop() -> None:
    """After a PeerFailure: the SIGTERM the launcher sends the processes left (torchrun, accelerate)
    would end this one before it writes failed.json and says why; it does both and exits at once."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
