"""Command-line entry point: `rlhfkit COMMAND [args]`.

This module only dispatches, from the one list of commands (rlhfkit/commands/__init__.py). Each
command exposes a ``main(argv: list[str]) -> int`` function; modules are imported lazily so that
`rlhfkit --help` is instant and a missing optional dependency only affects its
own command.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import NoReturn

from rlhfkit import __version__
from rlhfkit.commands import COMMANDS, command_main
from rlhfkit.errors import run_guarded


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = [
        f"rlhfkit {__version__}: align causal language models with RLHF.",
        "",
        "usage: rlhfkit COMMAND [options]   (rlhfkit COMMAND --help for its options)",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {cmd.summary}" for name, cmd in COMMANDS.items()]
    lines += ["", "options:", "  --version  print the version",
              "  --debug    show tracebacks for errors (and the libraries' warnings; also RLHFKIT_VERBOSE=1)"]
    return "\n".join(lines)


def quiet_libraries(debug: bool) -> None:
    """transformers' advisories and the libraries' FutureWarnings off for this command (and their
    loading bars when stderr is not a terminal: a log file); RLHFKIT_VERBOSE=1 or --debug keeps them.
    Environment settings the user made win (setdefault). Set before transformers is imported."""
    if debug or os.environ.get("RLHFKIT_VERBOSE", "").strip() not in ("", "0"):
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)


def command_name(typed: str) -> str:
    """The command `typed` names, with `-` and `_` interchangeable (`online_dpo`, `reinforce-pp`)."""
    if typed in COMMANDS:
        return typed
    return next((name for name in COMMANDS if name.replace("-", "_") == typed.replace("-", "_")), typed)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"rlhfkit {__version__}")
        return 0
    name, rest = command_name(argv[0]), argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"rlhfkit: unknown command '{name}'{hint}; run 'rlhfkit --help'", file=sys.stderr)
        return 2
    quiet_libraries(debug)

    def call() -> int:
        return int(command_main(name)(rest) or 0)

    return run_guarded(call, debug=debug)


def run() -> NoReturn:
    """The `rlhfkit` program (its console script and `python -m rlhfkit.cli`): `main` on the command
    line's arguments, then the process ends with its exit status (`end_process`)."""
    end_process(main())


def end_process(code: int) -> NoReturn:
    """End the process with exit status `code`. A process of a launched run (torchrun, accelerate
    launch, Slurm: a process group is up) ends with `os._exit` once its output is flushed, without
    the interpreter's finalisation: a gloo worker thread that is still releasing a finished
    collective needs the GIL to free its tensors' Python objects, and a thread that asks for the
    GIL while the interpreter finalises is ended in a way C++ cannot unwind (std::terminate:
    SIGABRT, "terminate called without an active exception"), so a run that finished was reported
    failed and the other machines' launchers waited 300 s for it at torchrun's exit barrier. The
    commands close everything they write before they return; nothing is lost by skipping it."""
    if "torch" in sys.modules and _in_process_group():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing more to write
                pass
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def _in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


if __name__ == "__main__":
    run()
