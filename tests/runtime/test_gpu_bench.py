"""bench/gpu.py: `--smoke` runs every rlhfkit part through the real trainers on a CPU and prints its row; the
summary's figures worked by hand; a failing part, a spent budget and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.estimate.flops import decode_step_bytes
from rlhfkit.estimate.shape import ModelShape

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import gpu  # noqa: E402

RLHFKIT_PARTS = ["ppo-lora-all@tiny", "grpo-lora-all@tiny", "dpo-lora-all@tiny", "ppo-lora-default@tiny",
                 "ppo-full@tiny", "grpo-full@tiny", "dpo-full@tiny"]


def cells(table: str, name: str) -> list[str]:
    line = next(ln for ln in table.splitlines() if ln.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_smoke_runs_every_part_through_the_trainers(tiny_model_dir, tmp_path):
    saved = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent / "src"), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--smoke", "--units", "2",
                           "--dpo-steps", "2", "--tokenizer", str(tiny_model_dir), "--save-json", str(saved)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(saved.read_text())
    assert list(doc["parts"]) == gpu.default_parts(["tiny"])
    for name in RLHFKIT_PARTS:
        part = doc["parts"][name]
        assert isinstance(part, dict), f"{name}: {part}"
        assert len(part["units"]) == 2 and all(u["s"] > 0 and u["gflop"]["update"] > 0 for u in part["units"])
        row = cells(proc.stdout, name)
        assert row[1].startswith("**") and "1 timed" in row[1]  # seconds per unit, the warm-up left out
        assert float(row[4]) > 0 and row[5].startswith("RSS ")  # update seconds; peak RSS on a CPU
        if name.startswith("dpo"):
            assert row[2] == row[3] == row[8] == "-"  # no sampling in DPO
        else:
            # 2 units x ceil(4 rows / 4 per call) call x 4 new tokens (a random model never stops early)
            assert all(u["decode_steps"] == 4 for u in part["units"])
            assert float(row[2]) > 0 and "bytes" in row[8]
    for algo in ("ppo", "grpo", "dpo"):  # TRL's row says why it did not run (trl is no test dependency)
        trl = doc["parts"][f"trl-{algo}@tiny"]
        assert isinstance(trl, dict) or trl.startswith("skipped: trl")


DEVICE = {"matmul_n": 8, "matmul_tflops": 2.0, "bandwidth_gbs": 100.0, "launch_ms": 0.5}
SHAPE = ModelShape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, vocab=10, tied=True)


def unit(s, gen, steps, gflop):
    return {"s": s, "generate_s": gen, "logprobs_s": 0.5, "update_s": s - gen - 0.5, "decode_steps": steps,
            "decode_rows": 4, "decode_context": 10.5, "weight_bytes": 2,
            "gflop": {"sampling": gflop[0], "log-prob pass": gflop[1], "update": gflop[2]}}


def test_summary_means_the_units_after_the_warm_up_by_hand():
    part = {"units": [unit(9.0, 5.0, 64, (1, 1, 1)), unit(4.0, 2.0, 64, (600, 200, 1000)),
                      unit(6.0, 3.0, 64, (900, 300, 1400))], "alloc_gb": 1.5, "reserved_gb": 2.0}
    s = gpu.summarise(part, SHAPE, DEVICE)
    assert s["units_timed"] == 2 and s["each"] == [9.0, 4.0, 6.0]
    assert s["s"] == pytest.approx(5.0, rel=1e-12)  # (4 + 6) / 2
    assert s["generate_s"] == pytest.approx(2.5, rel=1e-12)
    # model GFLOP per unit (600 + 200 + 1000 + 900 + 300 + 1400) / 2 = 2200 in 5 s: 440 GFLOP/s = 0.44 TFLOP/s,
    # 22% of the 2 TFLOP/s peak; the update 1200 GFLOP in (1.5 + 2.5) / 2 = 2 s: 600 GFLOP/s, 30%.
    assert s["tflops"] == pytest.approx(0.44, rel=1e-12)
    assert s["of_peak"] == pytest.approx(0.22, rel=1e-12)
    assert s["update_of_peak"] == pytest.approx(0.30, rel=1e-12)
    # decode: (2 + 3) s over 128 steps = 39.0625 ms per step
    assert s["decode_ms"] == pytest.approx(5000 / 128, rel=1e-12)
    # floor: params 10*4 (tied) + 1 layer (q 16 + k 8 + v 8 + o 16 + 3 * 32 + norms 8) + final norm 4 = 196 at 2
    # bytes = 392, KV 2 (k, v) x 1 layer x 1 head x 2 dims x 4 rows x 10 tokens (10.5 rounds to 10) x 2 bytes = 320:
    # 712 bytes / 100 GB/s = 7.12e-6 ms, under the 0.5 ms graph replay: the launch floor binds.
    assert decode_step_bytes(SHAPE, 4, 10, 2, 2) == 712
    assert (s["floor_ms"], s["floor_from"]) == (0.5, "launch")
    slow_copy = {**DEVICE, "bandwidth_gbs": 712e-6, "launch_ms": None}  # 712 kB/s: 712 bytes take 1 ms
    assert gpu.decode_floor_ms(SHAPE, part["units"][1], slow_copy) == (pytest.approx(1.0, rel=1e-12), "bytes")


def test_a_failing_part_is_one_line_and_the_next_part_runs(monkeypatch, tiny_model_dir, tmp_path):
    monkeypatch.setattr(gpu, "measure_device", lambda device, smoke: DEVICE)
    monkeypatch.setattr(gpu, "build_model", lambda shape, tok, out, device: out)
    ok = {"units": [unit(4.0, 2.0, 64, (600, 200, 1000))], "rss_gb": 0.5}

    def run_part(name, model_dir, units, smoke):
        if name.startswith("ppo"):
            raise RuntimeError("Expected all tensors to be on the same device\nsecond line")
        return ok

    monkeypatch.setattr(gpu, "run_part", run_part)
    doc = gpu.main(["--smoke", "--in-process", "--tokenizer", str(tiny_model_dir), "--parts",
                    "ppo-lora-all@tiny,grpo-lora-all@tiny"])
    assert doc["parts"]["ppo-lora-all@tiny"] == "failed: RuntimeError: Expected all tensors to be on the same device"
    assert doc["parts"]["grpo-lora-all@tiny"] == ok
    # subprocess parts: the last line of the traceback
    assert gpu.last_error("Traceback\n  File x\nRuntimeError: boom\n\n") == "RuntimeError: boom"


def test_parts_after_the_budget_are_skipped(monkeypatch, tiny_model_dir):
    monkeypatch.setattr(gpu, "measure_device", lambda device, smoke: DEVICE)
    monkeypatch.setattr(gpu, "run_part", lambda *a: pytest.fail("a part ran past the budget"))
    doc = gpu.main(["--smoke", "--in-process", "--tokenizer", str(tiny_model_dir), "--budget-s", "0",
                    "--parts", "dpo-full@tiny"])
    assert doc["parts"]["dpo-full@tiny"] == "skipped: the 0 s budget was spent"


def test_from_json_renders_a_saved_run_and_writes_its_block(monkeypatch, tmp_path):
    doc = {"machine": "NVIDIA H200 (139 GiB), CUDA 13.0, 2026-11-28, commit abc1234", "command": "python bench/gpu.py",
           "device": {**DEVICE, "matmul_n": 8192}, "shapes": ["135m"], "smoke": False, "tiny_vocab": 10, "units": 2, "dpo_steps": 4, "wall_s": 400.0,
           "parts": {"ppo-lora-all@135m": {"units": [unit(9.0, 5.0, 64, (1, 1, 1)), unit(4.0, 2.0, 64, (6, 2, 10))],
                                           "alloc_gb": 3.0, "reserved_gb": 4.0},
                     "trl-ppo@135m": {"s": 10.0, "units_timed": 2, "alloc_gb": 10.0, "reserved_gb": 12.0},
                     "grpo-lora-all@135m": "failed: RuntimeError: boom"}}
    saved = tmp_path / "gpu.json"
    saved.write_text(json.dumps(doc))
    written = {}
    monkeypatch.setattr(gpu.benchdoc, "write_block", lambda name, title, table: written.update({name: table}))
    gpu.main(["--from-json", str(saved), "--write-doc"])
    table = written["gpu_bench"]
    assert "commit abc1234" in table and "8192^3" in table and "135m (smollm2-135m: 134.5M parameters)" in table
    assert cells(table, "ppo-lora-all@135m")[5] == "3.00 / 4.00"
    assert cells(table, "grpo-lora-all@135m")[1] == "failed: RuntimeError: boom"
    # speed-up 10 / 4 = 2.50x >= 2x; memory 3 / 10 = 0.30 <= 0.5
    assert cells(table, "PPO like for like (LoRA every layer, bf16)")[3:] == [
        "**2.50x**", ">= 2x", "**0.30**", "<= 0.5", "met"]


@pytest.mark.parametrize("args, says", [
    (["--smoke", "--write-doc"], "--write-doc with --smoke"),
    (["--parts", "ppo-lora-all@7b"], "--parts: unknown ppo-lora-all@7b"),
    (["--shapes", "7b"], "--shapes: unknown 7b"),
    (["--units", "0"], "--units must be >= 1"),
    (["--dpo-steps", "0"], "--dpo-steps must be >= 1"),
])
def test_bad_arguments_exit_2_with_one_line(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        gpu.main(args)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_without_cuda_only_the_smoke_runs(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        gpu.main(["--parts", "ppo-lora-all@135m"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == ("error: no CUDA device here: bench/gpu.py measures a GPU (--smoke runs its "
                                         "plumbing on a CPU)")


def test_bad_files_exit_2_naming_them(tmp_path, capsys):
    not_json = tmp_path / "run.json"
    not_json.write_text("{")
    other = tmp_path / "other.json"
    other.write_text('{"machine": "m"}')
    smoke = tmp_path / "smoke.json"
    smoke.write_text(json.dumps({k: 1 for k in ("machine", "command", "device", "shapes", "parts", "units",
                                                "dpo_steps", "wall_s")} | {"smoke": True}))
    for args, says in ((["--from-json", str(not_json)], f"--from-json {not_json}: cannot read a saved run"),
                       (["--from-json", str(other)], f"--from-json {other}: not a bench/gpu.py --save-json file (no "
                                                     "command, device, shapes, parts, smoke, units, dpo_steps, wall_s)"),
                       (["--from-json", str(smoke), "--write-doc"], "a --smoke run; its figures are never written"),
                       (["--smoke", "--tokenizer", str(tmp_path)], f"--tokenizer {tmp_path}: no tokenizer there")):
        with pytest.raises(SystemExit) as e:
            gpu.main(args)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and says in err and len(err.splitlines()) == 1


def test_one_part_in_its_own_process_hands_back_its_figures(tiny_model_dir, tmp_path):
    # the path every part takes on the GPU (--smoke runs its parts in one process): `gpu.py --one PART --model DIR`
    # in a fresh process, its RESULT line read
    log = tmp_path / "parts.log"
    part = gpu.run_in_subprocess("dpo-full@tiny", str(tiny_model_dir), units=1, smoke=True, timeout=300, log=str(log))
    assert isinstance(part, dict), part
    assert len(part["units"]) == 1 and part["units"][0]["s"] > 0 and part["rss_gb"] > 0
    text = log.read_text()
    assert text.startswith("===== dpo-full@tiny: ") and "RESULT {" in text


def test_the_documented_commands_use_options_the_bench_has():
    doc = (BENCH.parent / "docs" / "scale.md").read_text()
    section = doc[doc.index("### GPU bench"):]
    section = section[: section.index("\n## ")]
    options = {o for action in gpu.make_parser()._actions for o in action.option_strings}
    lines = [ln for ln in section.splitlines() if "bench/gpu.py" in ln and ln.lstrip().startswith(("PYTHON", ".venv"))]
    used = {w.strip("`") for ln in lines for w in ln.split() if w.startswith("--")}
    assert len(lines) == 5 and {"--save-tokenizer", "--tokenizer", "--from-json", "--write-doc", "--sweep"} <= used
    assert used <= options, used - options


@pytest.mark.gpu
def test_on_cuda_a_part_reports_cuda_memory_and_the_device_a_launch_floor(tiny_model_dir):
    import torch

    device = torch.device("cuda")
    measured = gpu.measure_device(device, smoke=True)
    assert measured["launch_ms"] > 0 and measured["matmul_tflops"] > 0 and measured["bandwidth_gbs"] > 0
    part = gpu.run_part("ppo-lora-all@tiny", str(tiny_model_dir), units=2, smoke=True)
    assert 0 < part["alloc_gb"] <= part["reserved_gb"] and "rss_gb" not in part
    assert all(u["generate_s"] > 0 and u["update_s"] > 0 for u in part["units"])


# ----------------------------------------------------------------------------- --sweep


def test_sweep_points_cross_the_two_axes_cheapest_first():
    # rows at the first length, lengths at the first rows: (64,128) shared, then by rows x tokens: 8192, 32768,
    # 32768 (256x128 before 64x512 by rows), 131072 (1024x128 and 64x2048: 64 first)
    assert gpu.sweep_points(["135m"], (64, 256, 1024), (128, 512, 2048)) == [
        "ppo-lora-all@135m:64x128", "ppo-lora-all@135m:64x512", "ppo-lora-all@135m:256x128",
        "ppo-lora-all@135m:64x2048", "ppo-lora-all@135m:1024x128"]
    assert gpu.sweep_point("ppo-lora-all@1.7b:256x512") == (256, 512) and gpu.sweep_point("ppo-full@1.7b") is None
    assert gpu.parse_part("ppo-lora-all@1.7b:256x512") == ("rlhfkit", "ppo", "lora-all", "1.7b")


def test_generate_calls_count_the_rows_each_call_sampled():
    assert gpu.generate_calls([(64, 64)]) == {"generate_calls": 1, "rows_per_call": 64}  # CUDA: all fit
    assert gpu.generate_calls([(64, 16)]) == {"generate_calls": 4, "rows_per_call": 16}
    assert gpu.generate_calls([(10, 4), (6, 6)]) == {"generate_calls": 3 + 1, "rows_per_call": 6}  # ceil(10 / 4) = 3
    assert gpu.generate_calls([]) == {}
    # the decode steps follow the calls recorded, not prompts_per_generate
    r = {"rows": 64, "prompt": 20, "response": 128, "prompts_per_generate": 16, "generate_calls": 1}
    assert gpu.decode_fields(r, 2)["decode_steps"] == 128 and gpu.decode_fields(r, 2)["decode_rows"] == 64


def test_the_estimate_is_estimate_memory_of_the_same_run(tiny_model_dir, tmp_path):
    from rlhfkit.estimate.memory import GIB, MemoryArgs, estimate
    from rlhfkit.estimate.shape import resolve_shape

    cfg = gpu.part_config("ppo", "lora-all", str(tiny_model_dir), 1, str(tmp_path), smoke=False, point=(256, 512))
    assert (cfg.rollout_batch_size, cfg.max_new_tokens, cfg.ppo_epochs, cfg.mini_batch_size) == (256, 512, 1, 64)
    r = {"rows": 256, "prompt": 37, "response": 512, "generate_calls": 2, "rows_per_call": 128}
    args = gpu.estimate_args(cfg, r)
    assert args == {"method": "ppo", "device": "gpu", "model": str(tiny_model_dir), "dtype": "bf16", "lora": True,
                    "lora_r": cfg.lora_r, "lora_layers": None, "micro_batch_size": cfg.micro_batch_size,
                    "rollout_batch_size": 256, "mini_batch_size": 64, "prompt_length": 37, "max_new_tokens": 512,
                    "prompts_per_generate": 128}
    want = estimate(MemoryArgs(**{k: v for k, v in args.items() if k != "method"}, method="ppo"))
    # the KV cache of the 128 rows one call sampled: 2 x L x kv x d x 128 x (37 + 512) x 2 bytes
    s = resolve_shape(str(tiny_model_dir))
    assert want["KV cache"] == 2 * s.layers * s.kv_heads * s.d * 128 * 549 * 2
    assert gpu.estimate_gb(cfg, r) == pytest.approx(want["peak"] / GIB, rel=1e-12)


def sweep_unit(s, alloc_estimate):
    return {**unit(s, 1.0, 128, (1, 1, 1)), "estimate_gb": alloc_estimate}


def test_the_sweep_table_by_hand_out_of_memory_included(monkeypatch, tmp_path):
    doc = {"machine": "NVIDIA H200 (139 GiB), CUDA 13.0, 2026-11-28, commit abc1234",
           "command": "python bench/gpu.py --sweep", "device": {**DEVICE, "matmul_n": 8192}, "shapes": ["135m", "1.7b"],
           "smoke": False, "sweep": True, "tiny_vocab": 10, "units": 2, "dpo_steps": 4, "wall_s": 400.0,
           "parts": {"ppo-lora-all@135m:64x128": {"units": [sweep_unit(4.0, 3.0)], "alloc_gb": 2.7, "reserved_gb": 3},
                     "ppo-lora-all@1.7b:64x128": {"units": [sweep_unit(8.0, 12.0)], "alloc_gb": 16.0,
                                                  "reserved_gb": 18.0},
                     "ppo-lora-all@1.7b:1024x128": "failed: torch.OutOfMemoryError: CUDA out of memory."}}
    saved = tmp_path / "sweep.json"
    saved.write_text(json.dumps(doc))
    written = {}
    monkeypatch.setattr(gpu.benchdoc, "write_block", lambda name, title, table: written.update({name: table}))
    gpu.main(["--from-json", str(saved), "--write-doc"])
    table = written["gpu_sweep"]  # its own block: a sweep never replaces the parts' table
    assert "| part |" not in table and "speed targets" not in table
    # 2.7 GiB measured / 3.0 estimated = 0.90, within 20%; 16 / 12 = 1.33, not
    assert cells(table, "135m")[1:] == ["64 x 128", "**4.00**", "1.00", "0.50", "2.50", "7.81", "2.7", "3", "0.90",
                                        "met"]
    rows = [c for c in table.splitlines() if c.startswith("| 1.7b |")]
    assert rows[0].split("|")[-3:-1] == [" 1.33 ", " not met "]
    assert "| 1.7b | 1024 x 128 | failed: torch.OutOfMemoryError: CUDA out of memory. |" in rows[1]


def test_smoke_sweep_runs_every_point_through_the_trainer(tiny_model_dir, tmp_path):
    saved = tmp_path / "sweep.json"
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent / "src"), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--smoke", "--sweep", "--tokenizer",
                           str(tiny_model_dir), "--save-json", str(saved)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(saved.read_text())
    assert list(doc["parts"]) == ["ppo-lora-all@tiny:4x4", "ppo-lora-all@tiny:4x8", "ppo-lora-all@tiny:8x4"]
    for name, part in doc["parts"].items():
        rows, tokens = gpu.sweep_point(name)
        (u,) = part["units"]  # one iteration per point
        # a random model never stops early; prompts_per_generate 4 on the CPU: ceil(rows / 4) calls x tokens steps
        assert u["decode_steps"] == -(-rows // 4) * tokens and u["estimate_gb"] > 0 and u["s"] > 0
        assert cells(proc.stdout, "tiny")[1] == "4 x 4"


@pytest.mark.parametrize("parts", ["ppo-lora-all@tiny:0x4", "grpo-lora-all@tiny:4x4", "ppo-lora-all@7b:4x4",
                                   "ppo-lora-all@tiny:4"])
def test_bad_sweep_points_exit_2(parts, capsys):
    with pytest.raises(SystemExit) as e:
        gpu.main(["--smoke", "--parts", parts])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--parts: unknown {parts};" in err and "ROWSxTOKENS" in err
