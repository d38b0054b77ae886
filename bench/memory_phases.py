"""Where a command's peak resident memory goes, phase by phase.

Runs an rlhfkit command in this process with its phases wrapped (sampling, log-prob pass, update,
backward, optimiser step, evaluation; DPO: reference tables, training steps, held-out metrics). At
each phase's entry the kernel's peak-RSS mark is reset (/proc/self/clear_refs, Linux), so every
phase's peak is exact, not sampled; nested phases fold into their parents. At each exit it prints
glibc's view too (mallinfo2): bytes in use, free but kept in the heap, and mmapped. Linux + glibc only.

    python bench/memory_phases.py grpo iterations=1 num_eval_prompts=64
    python bench/memory_phases.py dpo max_steps=2
    python bench/memory_phases.py grpo --wrap rlhfkit.rollout.core:generate_ids:generate ...

bench/demo_memory.py runs every trainer's demo under this script (the table of docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import sys
import time

GIB = 2**30
PHASES = [  # module, attribute (dotted under the module), label
    ("rlhfkit.trainers.rl", "RLRun.sample", "sample"),
    ("rlhfkit.trainers.rl", "RLRun.logprob_pass", "logprobs"),
    ("rlhfkit.trainers.rl", "RLRun.update", "update"),
    ("rlhfkit.trainers.rl", "evaluate_reward", "eval"),
    ("rlhfkit.trainers.rl", "RLRun.finish", "finish"),
    ("rlhfkit.trainers.rl_update", "accumulate_backward", "backward"),
    ("rlhfkit.trainers.rl_update", "guarded_step", "optim_step"),
    ("rlhfkit.runtime.optim", "optimizer_step", "optim_step"),  # Run.optimizer_step: sft, rm, DPO family, KTO
    ("rlhfkit.rollout.core", "generate_ids", "generate"),
    ("rlhfkit.trainers.dpo", "build_models", "build"),
    ("rlhfkit.trainers.dpo", "reference_tables", "ref_tables"),
    ("rlhfkit.trainers.dpo", "train_step", "step"),
    ("rlhfkit.trainers.dpo", "held_out_metrics", "held_out"),
    ("rlhfkit.trainers.rl", "evaluate_episodes", "eval"),  # multi-turn (env=) held-out episodes
    ("rlhfkit.trainers.judged", "judged_samples", "judged_eval"),  # DPO family: samples for the win rate
    ("rlhfkit.trainers.dpo", "judged_samples", "judged_eval"),  # imported by name there
    ("rlhfkit.trainers.kto", "judged_samples", "judged_eval"),
    ("rlhfkit.trainers.kto", "train_step", "step"),
    ("rlhfkit.trainers.kto", "held_out_metrics", "held_out"),
    ("rlhfkit.trainers.online_dpo", "dpo_step", "dpo_step"),
    ("rlhfkit.trainers.sft", "sft_gradients", "step"),
    ("rlhfkit.trainers.sft", "eval_stats", "eval"),
    ("rlhfkit.trainers.rm", "rm_gradients", "step"),
    ("rlhfkit.trainers.rm", "evaluate_pairs", "eval"),
    ("rlhfkit.trainers.trpo", "policy_step", "policy_step"),
    ("rlhfkit.trainers.trpo", "critic_update", "critic_update"),
    ("rlhfkit.commands.pipeline", "run_stage", "stage"),
]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _status(key: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


class PhaseMemory:
    """Wraps functions as phases and records each phase's exact peak RSS."""

    def __init__(self):
        self.stack: list[dict] = [{"label": "", "peak": 0}]
        self.peaks: dict[str, int] = {}
        self.t0 = time.time()
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _MallInfo2
            self.mallinfo = libc.mallinfo2
        except (OSError, AttributeError):
            self.mallinfo = None

    def wrap(self, module: str, attr: str, label: str) -> None:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def inner(*a, **k):
            return self.run(label, orig, a, k)

        setattr(owner, name, inner)

    def run(self, label, fn, args, kwargs):
        parent = self.stack[-1]
        parent["peak"] = max(parent["peak"], _status("VmHWM"))
        _reset_peak()
        frame = {"label": label, "peak": 0}
        self.stack.append(frame)
        entry = _status("VmRSS")
        try:
            return fn(*args, **kwargs)
        finally:
            frame["peak"] = max(frame["peak"], _status("VmHWM"))
            self.stack.pop()
            parent["peak"] = max(parent["peak"], frame["peak"])
            path = "/".join([f["label"] for f in self.stack[1:]] + [label])
            self.peaks[path] = max(self.peaks.get(path, 0), frame["peak"])
            self.report(path, entry, frame["peak"])

    def report(self, path: str, entry: int, peak: int) -> None:
        line = f"[memory {time.time() - self.t0:7.1f}s] {path}: entry {entry / GIB:.2f} peak {peak / GIB:.2f} " \
               f"exit {_status('VmRSS') / GIB:.2f} GiB RSS"
        if self.mallinfo is not None:
            mi = self.mallinfo()
            line += (f"; malloc in use {(mi.uordblks + mi.hblkhd) / GIB:.2f}, free in heap {mi.fordblks / GIB:.2f}, "
                     f"mmapped {mi.hblkhd / GIB:.2f}")
        print(line, file=sys.stderr, flush=True)

    def summary(self) -> str:
        self.stack[0]["peak"] = max(self.stack[0]["peak"], _status("VmHWM"))
        rows = [f"| {k} | {v / GIB:.2f} |" for k, v in self.peaks.items()]
        return "\n".join(["| phase | peak RSS GiB |", "| --- | ---: |", *rows,
                          f"| whole run | {self.stack[0]['peak'] / GIB:.2f} |"])


def main() -> None:
    argv = sys.argv[1:]
    extra = []
    while "--wrap" in argv:
        i = argv.index("--wrap")
        extra.append(tuple(argv[i + 1].split(":")))
        del argv[i : i + 2]
    if not argv or argv[0].startswith("-"):
        raise SystemExit(__doc__)
    probe = PhaseMemory()
    for module, attr, label in PHASES + extra:
        try:
            probe.wrap(module, attr, label)
        except (ImportError, AttributeError):
            pass  # a phase this version does not have
    from rlhfkit.cli import main as cli

    try:
        code = cli(argv)
    except SystemExit as stop:
        code = stop.code
    print(probe.summary())
    sys.exit(code)  # the command's own exit status: a failed demo is not a measurement


if __name__ == "__main__":
    main()
