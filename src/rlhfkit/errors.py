"""User-facing errors: one line, exit code 2, no traceback unless --debug."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable


class UserError(Exception):
    """Bad input from the user (config, data, paths). Printed as one line; exit code 2."""

    exit_code = 2
    label = "error"  # the word after "rlhfkit: " in the printed line


class ConfigError(UserError):
    """An invalid configuration key or value."""


class DataError(UserError):
    """A malformed or missing data file; the message names the file and line."""


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a reader that stopped early


def debug_requested() -> bool:
    """RLHFKIT_DEBUG set to anything but empty, 0, false, no or off."""
    return os.environ.get("RLHFKIT_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def one_line(message: object) -> str:
    """A message on one line (its lines joined by spaces), as every error must be printed."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def run_guarded(func: Callable[[], int], debug: bool = False) -> int:
    """Run a command, turning UserError into a one-line message and exit code 2.

    With `debug` (--debug or RLHFKIT_DEBUG=1) the traceback is printed first; the exit code stays.
    """
    debug = debug or debug_requested()
    try:
        code = func()
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except BrokenPipeError:
        # `rlhfkit doctor --list-rules | head`: the reader left; say nothing, write nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_EXIT
    except UserError as e:
        if debug:
            traceback.print_exc()
        if printed_here(e):
            print(f"rlhfkit: {e.label}: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rlhfkit: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if debug or not is_out_of_memory(e):
            raise
        print(f"rlhfkit: error: {out_of_memory_message(e)}", file=sys.stderr)
        return 2


def printed_here(e: UserError, env: dict | None = None) -> bool:
    """Whether this process prints `e`. Under a launcher (torchrun, accelerate launch) every process
    of a machine meets the same bad input: its first process (LOCAL_RANK 0) prints it, once. An error
    saying itself who prints it (`printed`: runtime/faults.py PeerFailure) decides alone."""
    printed = getattr(e, "printed", None)
    if printed is not None:
        return bool(printed)
    env = os.environ if env is None else env
    return env.get("LOCAL_RANK", "0") in ("", "0")


OOM_KNOBS = ("lower micro_batch_size (and prompts_per_generate), max_new_tokens or rollout_batch_size / "
             "batch_size, use dtype=bf16, gradient_checkpointing=true or lora=true")


def is_out_of_memory(e: BaseException) -> bool:
    """CUDA/MPS out-of-memory errors and failed CPU allocations (torch does not import here)."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e)
    return "out of memory" in text.lower() or "can't allocate memory" in text


def out_of_memory_message(e: BaseException) -> str:
    """One line: what ran out, then the settings that use less memory."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    first = first if len(first) <= 160 else first[:157] + "..."
    return f"out of memory ({first}); to use less: {OOM_KNOBS}"
