"""Writing a benchmark's block into docs/benchmarks.md (shared by the bench scripts).

Each bench has one section in the doc; a run replaces its block there (figures and the lines saying when, where,
with what and how they were measured) and keeps nothing of the previous run: git keeps the history."""

from __future__ import annotations

import atexit
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"


def scratch_dir() -> str:
    """A temporary folder for one benchmark run, deleted when the process exits (each PPO run
    writes a checkpoint of ~2 GB: left behind, a full bench fills the disk)."""
    path = tempfile.mkdtemp(prefix="rlhfkit-bench-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


FIELDS = ("Date", "Commit", "Machine", "Versions", "Command")  # what every bench block of the doc names
PACKAGES = ("torch", "transformers", "peft", "trl")  # the versions a block records (those installed)


def machine_text() -> str:
    """The CPU model and logical CPU count, plus the GPU when torch sees one: 'AMD EPYC 9R14, 2 logical CPUs'."""
    model = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                  if ln.startswith("model name")), "") or platform.processor() or platform.machine()
    text = f"{model}, {os.cpu_count()} logical CPUs"
    torch = sys.modules.get("torch")  # asked only when the bench imported it: this must not load torch itself
    if torch is not None and torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def versions_text() -> str:
    """'Python 3.11.7, torch 2.13.0+cpu, transformers 5.24.0, ...' for the packages installed here."""
    found = [f"Python {platform.python_version()}"]
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def commit_text(root: Path = ROOT) -> str:
    """The short commit of the tree the bench ran from, '+ uncommitted changes' when src/ or bench/ differ from
    it, or 'unknown' outside a git checkout."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--", "src", "bench") else "")


def command_text(argv: list[str] | None = None) -> str:
    """The command line that ran the bench, from the repository root: 'python bench/growth.py --axis size'."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else None
    shown = f"bench/{script.name}" if script and script.parent.name == "bench" else (argv[0] if argv else "?")
    return shlex.join(["python", shown, *argv[1:]])


def provenance(command: str | None = None, date: str | None = None) -> str:
    """The lines that open a bench block: one `- Field: value` line per FIELDS entry, measured here and now."""
    values = {"Date": date or time.strftime("%Y-%m-%d", time.gmtime()), "Commit": commit_text(),
              "Machine": machine_text(), "Versions": versions_text(), "Command": f"`{command or command_text()}`"}
    return "\n".join(f"- {field}: {values[field]}" for field in FIELDS)


def section_span(text: str, script: str) -> tuple[int, int] | None:
    """(start, end) character offsets of the `## ` section whose heading names `bench/<script>`, or None."""
    heads = [m for m in re.finditer(r"^## .*$", text, re.M)]
    for i, m in enumerate(heads):
        if f"bench/{script}" in m.group(0):
            return m.start(), heads[i + 1].start() if i + 1 < len(heads) else len(text)
    return None


def write_block(name: str, title: str, table: str, doc: Path = DOC, command: str | None = None) -> None:
    """Replace the block between `<!-- name:start -->` and `<!-- name:end -->` with the provenance lines (date,
    commit, machine, versions, command) and `table`: the bench's figures are replaced, never appended to, and
    the history stays in git. A block not there yet goes at the end of the section whose heading names the
    same bench script as `title` (`(bench/growth.py)`), or in a new `## title` section. A table measured on
    another machine (bench/gpu.py --from-json) starts with its own provenance lines, which are kept."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    table = table.strip("\n")
    measured_elsewhere = table.startswith(f"- {FIELDS[0]}: ")  # a table that brings its own lines keeps them
    block = f"{start}\n{table if measured_elsewhere else provenance(command) + chr(10) * 2 + table}\n{end}"
    script = re.search(r"bench/([\w.]+\.py)", title)
    span = section_span(text, script.group(1)) if script else None
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    elif span:
        cut = len(text[:span[1]].rstrip("\n"))  # after the section's last line
        text = text[:cut] + f"\n\n{block}" + text[cut:]
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n{block}\n"
    doc.write_text(text)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


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
