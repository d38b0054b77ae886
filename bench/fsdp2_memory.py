"""Peak resident memory of each process of a 2-process FSDP2 run on the CPU, against
`rlhfkit estimate-memory ... sharding=fsdp2 num_devices=2` (and the same run unsharded against
sharding=none).

The run: `rlhfkit ppo` with full fine-tuning in fp32 (the frozen reference copy sharded too) on the
materialised SmolLM2-135M (or --model), one iteration of 4 rows, launched as docs/scale.md says
(ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2),
one torch thread per process. Each process reports its VmHWM (the kernel's peak resident set) after
the run, and from a thread sampling every 5 ms the peaks of its resident set and of the bytes malloc
holds in use (glibc's mallinfo2: live blocks, without the free space glibc keeps), each with the
main thread's rlhfkit frames at that moment (every 0.25 s also a timeline, kept in --save-json's
file), and its CPU seconds and minor page faults; the estimate gets the run's own shapes (the widest chat-formatted prompt of the built-in
review prompts, 54 tokens, and the run's batch sizes). Memory figures do not depend on the machine's
load; the run takes about a minute on 2 free cores.

    python bench/fsdp2_memory.py [--model DIR] [--modes fsdp2,ddp] [--save-json runs/fsdp2_memory.json]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GIB = 2**30
RUN = ["lora=false", "dtype=fp32", "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
       "prompts_per_generate=4", "max_new_tokens=16", "num_eval_prompts=0", "iterations=1", "reward=length:3",
       "save_every=0", "quiet=true", "tensorboard=false"]
# the same run for estimate-memory: 54 = the widest built-in review prompt after the chat template
ESTIMATE = ["method=ppo", "device=cpu", "lora=false", "dtype=fp32", "num_devices=2", "micro_batch_size=2",
            "prompts_per_generate=4", "rollout_batch_size=4", "mini_batch_size=4", "max_new_tokens=16",
            "prompt_length=54"]
SHARDING = {"fsdp2": "sharding=fsdp2", "ddp": "sharding=none"}


def vm_hwm() -> int:
    """This process's peak resident set in bytes (VmHWM, Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class Mallinfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (<malloc.h>, glibc >= 2.33)."""

    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_sampler(period_s: float = 0.005):
    """A daemon thread sampling, every `period_s`, the resident set (/proc/self/statm) and the bytes
    malloc holds in use (mallinfo2: uordblks + hblkhd, every live malloc'd block: tensors and the
    rest, without the free blocks glibc keeps); returns a function that stops it and returns the
    peaks with the main thread's stack (rlhfkit frames) at each. None where glibc has no mallinfo2."""
    try:
        mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = Mallinfo2
    page = os.sysconf("SC_PAGE_SIZE")
    main_id = threading.main_thread().ident
    peaks = {"rss": [0, []], "in_use": [0, []], "free_kept_at_rss_peak": 0, "timeline": []}
    stop = threading.Event()

    def where() -> list[str]:
        frame, names = sys._current_frames().get(main_id), []
        while frame is not None and len(names) < 6:
            code = frame.f_code
            if "rlhfkit" in code.co_filename:
                names.append(f"{code.co_filename.rsplit('rlhfkit/', 1)[-1]}:{code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return names

    def run() -> None:
        with open("/proc/self/statm") as statm:
            n = 0
            while not stop.wait(period_s):
                statm.seek(0)
                rss = int(statm.read().split()[1]) * page
                info = mallinfo2()
                in_use = info.uordblks + info.hblkhd
                n += 1
                if n % 50 == 0:
                    peaks["timeline"].append([round(time.monotonic(), 2), rss, in_use, info.fordblks, where()[:3]])
                if rss > peaks["rss"][0]:
                    peaks["rss"] = [rss, where()]
                    peaks["free_kept_at_rss_peak"] = info.fordblks
                if in_use > peaks["in_use"][0]:
                    peaks["in_use"] = [in_use, where()]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def finish() -> dict:
        stop.set()
        thread.join()
        return peaks

    return finish


def worker(model: str, out: Path) -> None:
    """One process of the launch: the run, then its peaks into out/rank-R.json."""
    import torch

    from rlhfkit.cli import end_process, main

    finish = heap_sampler()
    code = main(["ppo", f"model={model}", f"output_dir={out}", "run_name=run", *RUN])
    rank = int(os.environ.get("RANK", "0"))
    sampled = finish() if finish else None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    (out / f"rank-{rank}.json").write_text(json.dumps({"code": code, "vm_hwm": vm_hwm(), "sampled": sampled,
                                                       "cpu_s": usage.ru_utime + usage.ru_stime,
                                                       "minor_faults": usage.ru_minflt}))
    torch.distributed.barrier()
    end_process(0)  # no interpreter finalisation, where a gloo thread can abort the process (rlhfkit.cli.end_process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode: str, model: str, out: Path) -> list[dict]:
    """What each of the 2 processes of one launch reports (`worker`); `mode` fsdp2 (sharded) or ddp (the same preset
    with ACCELERATE_USE_FSDP=false: plain data parallelism)."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    if mode == "ddp":
        env["ACCELERATE_USE_FSDP"] = "false"  # read after the launcher sets it: the process runs unsharded
    cmd = [accelerate, "launch", "--config_file", str(REPO / "configs/accelerate/fsdp2.yaml"), "--num_processes", "2",
           "--main_process_port", str(free_port()), str(Path(__file__).resolve()), "--worker", model, str(out)]
    if mode == "ddp":
        cmd = [*cmd[:2], *cmd[4:]]  # no config file: the launcher would set ACCELERATE_USE_FSDP=true again
        cmd[2:2] = ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: the launch failed:\n{proc.stderr[-3000:]}")
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


def estimated(mode: str) -> dict[str, float]:
    sys.path.insert(0, str(REPO / "src"))
    from rlhfkit.commands.estimate_memory import PROG, for_method
    from rlhfkit.core.command_line import parse_values
    from rlhfkit.estimate.memory import MemoryArgs, estimate

    return estimate(for_method(parse_values(MemoryArgs, [*ESTIMATE, SHARDING[mode]], PROG)[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(Path.home() / ".cache/rlhfkit/models/smollm2-135m-instruct"),
                        help="the model folder (default: the materialised SmolLM2-135M-Instruct)")
    parser.add_argument("--modes", default="fsdp2,ddp", help="fsdp2 (sharded), ddp (unsharded), comma-separated")
    parser.add_argument("--save-json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]))
        return 0
    results = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"fsdp2-memory-{mode}-") as tmp:
            reports = launch(mode, args.model, Path(tmp))
        est = estimated(mode)
        peaks = [r["vm_hwm"] for r in reports]
        in_use = [r["sampled"]["in_use"][0] if r["sampled"] else float("nan") for r in reports]
        phases = {k: est[k] / GIB for k in ("loading phase", "generation phase", "training phase", "peak")}
        results[mode] = {"measured_gib": [p / GIB for p in peaks], "in_use_gib": [b / GIB for b in in_use],
                         "estimate_gib": phases, "processes": reports}
        ratio = max(peaks) / est["peak"]
        cpu_s = ", ".join(f"{r['cpu_s']:.0f}" for r in reports)
        faults = ", ".join(f"{r['minor_faults'] / 1e6:.2f}M" for r in reports)
        print(f"{mode}: measured peak per process {', '.join(f'{p / GIB:.3f}' for p in peaks)} GiB (malloc's bytes "
              f"in use at most {', '.join(f'{b / GIB:.3f}' for b in in_use)}; CPU "
              f"{cpu_s} s, minor page faults "
              f"{faults}); estimate "
              f"{est['peak'] / GIB:.3f} GiB (loading {phases['loading phase']:.3f}, generation "
              f"{phases['generation phase']:.3f}, training {phases['training phase']:.3f}); largest / estimate "
              f"{ratio:.2f} ({'within' if abs(ratio - 1) <= 0.2 else 'OUTSIDE'} 20%)")
    if args.save_json:
        args.save_json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
