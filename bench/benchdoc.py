"""Writing a benchmark's block into docs/benchmarks.md (shared by the bench scripts)."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def scratch_dir() -> str:
    """A temporary folder for one benchmark run, deleted when the process exits (each PPO run
    writes a checkpoint of ~2 GB: left behind, a full bench fills the disk)."""
    path = tempfile.mkdtemp(prefix="rlhfkit-bench-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def write_block(name: str, title: str, table: str, doc: Path = DOC) -> None:
    """Replace the text between `<!-- name:start -->` and `<!-- name:end -->` with `table`, or append
    a `## title` section holding it when the markers are not there yet."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n{block}\n"
    doc.write_text(text)


# ----------------------------------------------------------------------------- CPU time per unit and thread count
# On a shared machine wall seconds measure the scheduler as much as the code. With one torch thread a unit's CPU
# seconds (time.process_time: this process, all threads) equal its wall seconds on an idle core, and the load
# does not inflate them, so ratios of CPU seconds hold while other jobs run.


def stamp() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process over all its threads): one unit boundary."""
    return time.perf_counter(), time.process_time()


def unit_times(stamps: list[tuple[float, float]], warmup: int = 0) -> dict:
    """Mean wall and CPU seconds per unit from boundary stamps (unit k runs from stamps[k-1] to stamps[k]); the
    first `warmup` units are left out unless nothing else is left. No unit: nan.

    stamps: [(wall, cpu)] * (units + 1). Returns {"wall_s", "cpu_s", "units"}."""
    units = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(stamps, stamps[1:])]
    timed = units[warmup:] or units
    n = len(timed)
    nan = float("nan")
    return {"wall_s": sum(u[0] for u in timed) / n if n else nan,
            "cpu_s": sum(u[1] for u in timed) / n if n else nan, "units": n}


def tracker_stamps() -> list[tuple[float, float]]:
    """Patch rlhfkit's Tracker.log (called once per iteration / optimiser step) to append a stamp() per call;
    returns the list it fills. The first stamp ends unit 1, so unit_times(stamps) covers units 2.."""
    from rlhfkit.runtime import tracker

    stamps: list[tuple[float, float]] = []
    original = tracker.Tracker.log

    def log(self, iteration, metrics):
        stamps.append(stamp())
        return original(self, iteration, metrics)

    tracker.Tracker.log = log
    return stamps


def thread_env(threads: int | None) -> dict:
    """Environment for a configuration's subprocess: OpenMP/MKL capped at `threads` (None: inherited as is)."""
    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def set_threads(threads: int | None) -> None:
    """torch intra-op threads of this process (None: torch's own choice)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- ratios against TRL and the targets


def ratio_table(pairs: list[tuple[str, str, str, float, float | None]], results: dict, key: str = "cpu_s",
                memory_key: str = "peak_rss_gb") -> str:
    """Speed-up and memory ratio per (label, TRL config, rlhfkit config, speed target, memory target) pair.

    speed-up = TRL seconds / rlhfkit seconds per unit (`key` of each result); memory = rlhfkit peak / TRL peak
    (`memory_key`: peak RSS by default). "met" when speed-up >= its target and memory <= its target (a memory target
    of None: speed alone decides). A pair with a side not run (or a failure string) gets a row saying so."""
    lines = ["| pair | TRL config | rlhfkit config | speed-up (TRL / rlhfkit) | target | memory (rlhfkit / TRL) "
             "| target | met |", "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for label, trl_name, ours_name, speed_target, mem_target in pairs:
        t, ours = results.get(trl_name), results.get(ours_name)
        mem_text = "-" if mem_target is None else f"<= {mem_target:g}"
        if not isinstance(t, dict) or not isinstance(ours, dict):
            lines.append(f"| {label} | {trl_name} | {ours_name} | not run | >= {speed_target:g}x | | {mem_text} | |")
            continue
        speed, memory = t[key] / ours[key], ours[memory_key] / t[memory_key]
        fast, small = speed >= speed_target, mem_target is None or memory <= mem_target
        verdict = {(True, True): "met", (True, False): "not met (memory)", (False, True): "not met (speed)",
                   (False, False): "not met (speed, memory)"}[(fast, small)]
        lines.append(f"| {label} | {trl_name} | {ours_name} | **{speed:.2f}x** | >= {speed_target:g}x "
                     f"| **{memory:.2f}** | {mem_text} | {verdict} |")
    return "\n".join(lines)
