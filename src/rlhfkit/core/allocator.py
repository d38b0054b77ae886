"""CPU memory settings for training: glibc malloc keeps freed tensor memory in the process for
reuse; oneDNN's per-shape kernel caches are bounded (`cap_kernel_caches`).

PyTorch's CPU allocator is plain malloc. glibc serves blocks above its mmap threshold (128 KiB at
start, raised only as mmapped blocks are freed) with fresh mmaps that go back to the kernel on free,
and it returns the top of the heap whenever more than its trim threshold is free. A training step
frees almost everything it allocated (activations, gradients), so the next micro-batch gets new
pages and takes a page fault on the first touch of each 4 KiB. On the 2-core VM of
docs/benchmarks.md that faulting was a fifth of a PPO update. With the mmap threshold at glibc's
maximum (32 MiB) and the trim threshold at 1 GiB, freed blocks stay in the heap and the next micro-batch
reuses them. Peak RSS does not grow (the same blocks are live at the peak); the process only stops
handing freed memory back between steps.

A process of an FSDP2 run (runtime/fsdp2.py) takes a lower mmap threshold, 8 MiB
(`SHARDED_MMAP_THRESHOLD`): each layer's forward and backward gather its weights into a fresh buffer
and free it, and the backward allocates a reduce-scatter buffer per layer, between other blocks that
stay (gradients, shards, AdamW state). Below 32 MiB (a SmolLM2-135M layer is 14 MB in fp32) glibc
placed those buffers in the heap, and its free space, reused only in part, grew with every layer:
on 2 CPU processes (bench/fsdp2_memory.py) the update's peak resident set was 3.4-3.7 GiB while
the bytes in use peaked at 2.1 GiB. Mapped on their own, they go back to the kernel when freed:
2.8-2.9 GiB. Larger models' layers are above 32 MiB and were mapped already.

Skipped when glibc is not the C library (macOS, musl), when the user set MALLOC_MMAP_THRESHOLD_ or
MALLOC_TRIM_THRESHOLD_ themselves, when another allocator is preloaded (LD_PRELOAD jemalloc /
tcmalloc), or with RLHFKIT_TUNE_MALLOC=0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
SHARDED_MMAP_THRESHOLD = 8 * 2**20  # a process of an FSDP2 run (module doc)
TRIM_THRESHOLD = 2**30  # mallopt takes a C int: at most 2**31 - 1

_applied: dict[str, int] | None = None

# oneDNN keeps compiled kernels for each matmul shape it has seen in two LRU caches: its primitive
# cache and ideep's computation cache (1024 entries each by default). In bf16 an entry holds ~0.5 MiB
# of malloc'd memory, and every new row count (a micro-batch width, a number of unfinished rows
# while sampling) is a new shape, so a run's bytes in use grew ~30 MiB per iteration up to ~0.6 GiB
# (bench/shape_cache.py). 64 entries hold every kernel a whole PPO iteration creates (53 distinct
# primitives, ONEDNN_VERBOSE=profile_create: the same misses with 64 entries as with 1024), so
# nothing an iteration reuses is evicted.
KERNEL_CACHE_ENTRIES = 64
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def tune_malloc(sharded: bool = False) -> dict[str, int] | None:
    """Apply the settings once per process; returns them, or None where skipped (see module doc).
    `sharded`: the process runs FSDP2, so blocks from SHARDED_MMAP_THRESHOLD up are mapped."""
    global _applied
    if _applied is not None:
        return _applied
    if not _wanted(os.environ):
        return None
    libc_path = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(libc_path).mallopt
    except (OSError, AttributeError, TypeError):
        return None
    mmap_threshold = SHARDED_MMAP_THRESHOLD if sharded else MMAP_THRESHOLD
    settings = {"M_MMAP_THRESHOLD": mmap_threshold, "M_TRIM_THRESHOLD": TRIM_THRESHOLD}
    ok = all(mallopt(ctypes.c_int(param), _c_int(value)) == 1
             for param, value in ((M_MMAP_THRESHOLD, mmap_threshold), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)))
    _applied = settings if ok else None
    return _applied


def trim_heap() -> bool:
    """Give the heap's free pages back to the kernel (glibc malloc_trim) where `tune_malloc` applied
    its settings; returns whether it did. For the boundaries between phases (sampling, the update,
    evaluation): the tuning keeps freed blocks for the next micro-batch of the same phase, but a
    phase of other shapes does not reuse them and grows the heap anew, so without a trim RSS sums
    the phases' peaks instead of taking the largest (bench/demo_memory.py)."""
    if _applied is None:
        return False
    try:
        return bool(ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(ctypes.c_size_t(0)))
    except (OSError, AttributeError, TypeError):
        return False


def cap_kernel_caches(env=os.environ) -> dict[str, str]:
    """Bound oneDNN's per-shape kernel caches (see KERNEL_CACHE_ENTRIES) unless the user set them;
    returns the variables it set. Both caches read their capacity on first use, so this must run
    before the process's first oneDNN matmul (Run calls it first thing; importing torch is fine)."""
    chosen = {name: str(KERNEL_CACHE_ENTRIES) for name in KERNEL_CACHE_VARIABLES if name not in env}
    env.update(chosen)
    return chosen


def _c_int(value: int) -> ctypes.c_int:
    """`value` as a C int; ctypes would silently wrap a larger one (8 GiB -> 0)."""
    if not 0 <= value < 2**31:
        raise ValueError(f"mallopt value {value} does not fit a C int")
    return ctypes.c_int(value)


def _wanted(env) -> bool:
    """Whether this process should be tuned (pure: reads the environment mapping and the platform)."""
    if env.get("RLHFKIT_TUNE_MALLOC", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(k in env for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
        return False  # the user chose their own settings
    return not any(name in env.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc"))
