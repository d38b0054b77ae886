"""Command-line entry point: `rlhfkit COMMAND [args]`.

This module only dispatches. Each command lives in its own module and exposes a
``main(argv: list[str]) -> int`` function; modules are imported lazily so that
`rlhfkit --help` is instant and a missing optional dependency only affects its
own command.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

from rlhfkit import __version__

# command -> ("module:function", one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "ppo": ("rlhfkit.trainers.ppo:main", "PPO with GAE and a value head (the default demo)"),
    "trpo": ("rlhfkit.trainers.trpo:main", "TRPO: a natural-gradient step inside a KL trust region"),
    "sft": ("rlhfkit.trainers.sft:main", "supervised fine-tuning (LoRA or full)"),
    "rm": ("rlhfkit.trainers.rm:main", "train a reward model on preference pairs"),
    "dpo": ("rlhfkit.trainers.dpo:main", "direct preference optimisation (sigmoid, IPO, cDPO)"),
    "simpo": ("rlhfkit.trainers.dpo:simpo_main", "SimPO: reference-free, length-normalised, with a margin"),
    "orpo": ("rlhfkit.trainers.dpo:orpo_main", "ORPO: SFT plus an odds-ratio preference term, no reference"),
    "kto": ("rlhfkit.trainers.kto:main", "KTO: desirable / undesirable completions, no pairs needed"),
    "online-dpo": ("rlhfkit.trainers.online_dpo:main", "online DPO: two samples per prompt, a judge picks, DPO step"),
    "grpo": ("rlhfkit.trainers.grpo:main", "GRPO: group-relative policy optimisation"),
    "rloo": ("rlhfkit.trainers.grpo:rloo_main", "RLOO: REINFORCE with a leave-one-out baseline"),
    "gspo": ("rlhfkit.trainers.grpo:gspo_main", "GSPO: GRPO with sequence-level importance ratio and clip"),
    "dapo": ("rlhfkit.trainers.grpo:dapo_main", "DAPO: clip-higher, dynamic sampling, overlong reward shaping"),
    "reinforce_pp": ("rlhfkit.trainers.grpo:reinforce_pp_main", "REINFORCE++: KL in the reward, batch-normalised returns"),
    "prefs": ("rlhfkit.commands.prefs:main", "build preference data offline (`prefs make`)"),
    "eval": ("rlhfkit.commands.evaluate:main", "evaluate a model on a prompt set"),
    "generate": ("rlhfkit.rollout.texts:main", "sample completions from a model"),
    "export": ("rlhfkit.commands.export:main", "write a run as a transformers/peft/vLLM folder with a model card; --push-to-hub"),
    "tpo": ("rlhfkit.commands.tpo:main", "test-time preference optimisation (textual feedback) vs best-of-N"),
    "pipeline": ("rlhfkit.commands.pipeline:main", "SFT -> preferences -> RM -> PPO -> eval"),
    "label": ("rlhfkit.label.cli:main", "collect human preferences in a local web app"),
    "doctor": ("rlhfkit.diagnostics.cli:doctor_main", "print training-health findings for a run"),
    "report": ("rlhfkit.diagnostics.cli:report_main", "build an HTML report of one or more runs"),
    "selfcheck": ("rlhfkit.commands.selfcheck:main", "check the RL maths on worked examples"),
    "estimate-memory": ("rlhfkit.estimate.memory:main", "memory per device of a run, component by component"),
}


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = [
        f"rlhfkit {__version__}: align causal language models with RLHF.",
        "",
        "usage: rlhfkit COMMAND [options]   (rlhfkit COMMAND --help for its options)",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {desc}" for name, (_, desc) in COMMANDS.items()]
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
    target, _ = COMMANDS[name]
    module_name, func_name = target.split(":")
    quiet_libraries(debug)
    from rlhfkit.errors import run_guarded

    def call() -> int:
        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(rest) or 0)

    return run_guarded(call, debug=debug)


if __name__ == "__main__":
    sys.exit(main())
