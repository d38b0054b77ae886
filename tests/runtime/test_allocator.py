"""glibc malloc tuning (core/allocator.py): applied on glibc Linux unless the user opted out or
chose their own allocator settings."""

from __future__ import annotations

import ctypes
import platform

import pytest

from rlhfkit.core import allocator
from rlhfkit.core.allocator import _wanted, tune_malloc

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, GLIBC),
    ({"RLHFKIT_TUNE_MALLOC": "0"}, False),
    ({"RLHFKIT_TUNE_MALLOC": "off"}, False),
    ({"RLHFKIT_TUNE_MALLOC": "1"}, GLIBC),
    ({"MALLOC_MMAP_THRESHOLD_": "65536"}, False),
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, False),
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, False),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, False),
    ({"LD_PRELOAD": "/opt/libfoo.so"}, GLIBC),
])
def test_who_gets_tuned(env, wanted):
    assert _wanted(env) is wanted


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_tuning_applies_the_settings_once(monkeypatch):
    calls = []
    real = ctypes.CDLL

    class Recording:
        def __init__(self, path):
            self._libc = real(path)

        def mallopt(self, param, value):
            calls.append((param.value, value.value))  # as C ints, so a value that wrapped would show
            return self._libc.mallopt(param, value)

    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", Recording)
    monkeypatch.delenv("RLHFKIT_TUNE_MALLOC", raising=False)
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD"):
        monkeypatch.delenv(k, raising=False)
    first = tune_malloc()
    assert first == {"M_MMAP_THRESHOLD": 32 * 2**20, "M_TRIM_THRESHOLD": 2**30}
    assert calls == [(allocator.M_MMAP_THRESHOLD, 32 * 2**20), (allocator.M_TRIM_THRESHOLD, 2**30)]
    assert tune_malloc() == first and len(calls) == 2  # once per process


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_a_process_of_an_fsdp2_run_maps_blocks_from_8_mib(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.delenv("RLHFKIT_TUNE_MALLOC", raising=False)
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD"):
        monkeypatch.delenv(k, raising=False)
    try:
        assert tune_malloc(sharded=True) == {"M_MMAP_THRESHOLD": 8 * 2**20, "M_TRIM_THRESHOLD": 2**30}
    finally:
        allocator.ctypes.CDLL(allocator.ctypes.util.find_library("c")).mallopt(
            allocator.ctypes.c_int(allocator.M_MMAP_THRESHOLD), allocator.ctypes.c_int(allocator.MMAP_THRESHOLD))


_MAPPED_SCRIPT = """
import ctypes, sys
import torch
from rlhfkit.core.allocator import tune_malloc
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in 'arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost'.split()]
libc = ctypes.CDLL('libc.so.6'); libc.mallinfo2.restype = MallInfo2
if tune_malloc(sharded=sys.argv[1] == 'sharded') is None:
    print('skip'); raise SystemExit
before = libc.mallinfo2().hblkhd
layer = torch.empty(3_540_096)  # a SmolLM2-135M decoder layer gathered in fp32: 14.2 MB
print(libc.mallinfo2().hblkhd - before)
"""


def test_fsdp2s_gathered_layer_is_mapped_on_its_own_in_a_sharded_process(tmp_path):
    """A buffer of one gathered SmolLM2-135M layer (576 x (2 x 576 + 2 x 192 + 3 x 1536) + 2 x 576
    fp32 values = 14,160,384 bytes) is mapped on its own in a process of an FSDP2 run, so freeing it
    hands it back to the kernel; elsewhere it is a heap block (core/allocator.py). Fresh processes:
    the tuning is once per process."""
    import subprocess
    import sys

    assert 576 * (2 * 576 + 2 * 192 + 3 * 1536) + 2 * 576 == 3_540_096
    script = tmp_path / "mapped.py"
    script.write_text(_MAPPED_SCRIPT)
    env = {k: v for k, v in __import__("os").environ.items() if k != "RLHFKIT_TUNE_MALLOC"}
    mapped = {mode: subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, check=True,
                                   env=env).stdout.split()[-1] for mode in ("sharded", "unsharded")}
    if "skip" in mapped.values() or not GLIBC:
        pytest.skip("glibc's malloc not tuned here")
    assert int(mapped["sharded"]) >= 3_540_096 * 4 and int(mapped["unsharded"]) == 0, mapped


def test_opting_out_changes_nothing(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setenv("RLHFKIT_TUNE_MALLOC", "0")
    assert tune_malloc() is None


def test_a_value_that_does_not_fit_a_c_int_is_refused():
    """ctypes would pass 8 GiB as 0 (a trim threshold of 0: trim on every free)."""
    with pytest.raises(ValueError, match="C int"):
        allocator._c_int(8 * 2**30)
    assert allocator._c_int(2**31 - 1).value == 2**31 - 1


def test_trim_heap_gives_freed_heap_blocks_back(tmp_path):
    """After the tuning, freed blocks below the mmap threshold stay in the heap (RSS keeps them);
    trim_heap hands their pages back. In a fresh process: the tuning is once per process."""
    import subprocess
    import sys

    script = tmp_path / "trim.py"
    script.write_text(
        "import torch\n"
        "from rlhfkit.core.allocator import trim_heap, tune_malloc\n"
        "def rss():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) * 1024\n"
        "assert trim_heap() is False  # not tuned: nothing to undo\n"
        "if tune_malloc() is None:\n"
        "    print('skip'); raise SystemExit\n"
        "blocks = [torch.ones(2**18) for _ in range(400)]  # 400 x 1 MiB, below the 32 MiB mmap threshold\n"
        "keep = torch.ones(16)  # allocated above them: the heap's top cannot shrink by itself\n"
        "del blocks\n"
        "before = rss()\n"
        "assert trim_heap() is True\n"
        "print(before - rss())\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout.split()[-1]
    if out == "skip":
        return  # not glibc, or opted out in this environment
    assert int(out) > 300 * 2**20  # most of the 400 MiB went back


def test_kernel_caches_are_capped_unless_the_user_chose():
    env = {"LRU_CACHE_CAPACITY": "8"}
    assert allocator.cap_kernel_caches(env) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
    assert env == {"LRU_CACHE_CAPACITY": "8", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
    assert allocator.cap_kernel_caches(env) == {}  # both set now: nothing to do


_SHAPES_SCRIPT = """
import ctypes, sys
import torch
from rlhfkit.core.allocator import cap_kernel_caches
if sys.argv[1] == 'capped':
    cap_kernel_caches()  # after importing torch, before the first matmul: as Run does
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in 'arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost'.split()]
libc = ctypes.CDLL('libc.so.6'); libc.mallinfo2.restype = MallInfo2
def in_use():
    m = libc.mallinfo2(); return m.uordblks + m.hblkhd
torch.set_num_threads(1)
w = torch.randn(576, 1536).bfloat16()
def step(rows):
    x = torch.randn(rows, 576, requires_grad=True)
    (x.bfloat16() @ w).float().sum().backward()
for rows in range(100, 110):
    step(rows)  # warm-up: first-use allocations of torch and oneDNN
start = in_use()
for rows in range(110, 250):
    step(rows)  # 140 new row counts: 140 new matmul shapes forward and backward
print(in_use() - start)
"""


@pytest.mark.skipif(not GLIBC, reason="mallinfo2 is glibc's")
def test_capped_kernel_caches_stop_growing_with_new_shapes(tmp_path):
    """bf16 matmuls of a new row count each leave kernels cached (~0.5 MiB, bench/shape_cache.py);
    with the caps the bytes in use stop growing once 64 shapes are cached. Checks that oneDNN still
    reads the capacities when they are set after `import torch` (a torch upgrade could move that)."""
    import subprocess
    import sys

    script = tmp_path / "shapes.py"
    script.write_text(_SHAPES_SCRIPT)
    env = {k: v for k, v in __import__("os").environ.items() if k not in allocator.KERNEL_CACHE_VARIABLES}
    grown = {mode: int(subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                                      check=True, env=env).stdout.split()[-1]) for mode in ("uncapped", "capped")}
    if grown["uncapped"] < 40 * 2**20:
        pytest.skip(f"no per-shape kernel cache to bound here (uncapped growth {grown['uncapped'] / 2**20:.0f} MiB)")
    assert grown["capped"] < grown["uncapped"] / 2, grown
