"""rlhfkit.estimate.memory against hand arithmetic and against real (tiny) models."""

from __future__ import annotations

import pytest

from rlhfkit.commands.estimate_memory import main
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.estimate.memory import MemoryArgs, estimate, kv_cache_bytes
from rlhfkit.estimate.shape import PRESETS, ModelShape
from rlhfkit.models.lora import add_lora

from tiny_lm import build_tiny_model, build_tokenizer

SMOL = PRESETS["smollm2-135m"]


def test_smollm2_parameter_and_lora_counts_by_hand():
    # embeddings (tied) + 30 x (q, o: 576x576; k, v: 576x192; gate, up, down: 576x1536; 2 norms) + final norm
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    assert SMOL.param_count() == 49152 * 576 + 30 * per_layer + 576 == 134_515_008
    # r * (in + out): q, o 16*(576+576); k, v 16*(576+192); gate, up, down 16*(576+1536)
    lora_per_layer = 2 * 16 * 1152 + 2 * 16 * 768 + 3 * 16 * 2112
    assert lora_per_layer == 162_816
    assert SMOL.lora_count(16) == 30 * lora_per_layer == 4_884_480
    assert SMOL.lora_count(16, top_layers=12) == 12 * lora_per_layer
    assert PRESETS["llama-2-7b"].param_count() == 6_738_415_616  # the published 6.74B
    assert PRESETS["llama-3-8b"].param_count() == 8_030_261_248  # the published 8.03B


def test_counts_match_a_real_model_and_real_lora_adapters(tiny_model_dir):
    import json

    shape = ModelShape.from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    model = build_tiny_model(len(build_tokenizer()))
    assert shape.param_count() == sum(p.numel() for p in model.parameters())
    for top in (None, 1):
        lora = add_lora(build_tiny_model(len(build_tokenizer())), 4, 8, 0.0, None, top)
        assert shape.lora_count(4, top) == sum(p.numel() for p in lora.parameters() if p.requires_grad)


def test_components_by_hand_for_the_cpu_demo():
    args = build_config(MemoryArgs, dict(model="smollm2-135m", dtype="fp32", micro_batch_size=8, prompt_length=64,
                                         max_new_tokens=48, prompts_per_generate=16))
    est = estimate(args)
    assert est["policy weights"] == 134_515_008 * 4 + 4_884_480 * 4  # fp32 base + fp32 adapters
    assert est["gradients"] == 4_884_480 * 4 and est["optimiser"] == 4_884_480 * 8
    assert est["reference"] == 0  # LoRA: the adapter-disabled policy
    assert est["value head"] == 577 * 16
    assert est["KV cache"] == 2 * 30 * 3 * 64 * 16 * (64 + 48) * 4 == 82_575_360
    assert est["activations"] == 30 * 8 * 112 * 576 * 34 * 4 // 2 == 1_052_835_840
    assert est["logits"] == 8 * 48 * 49152 * 8  # two fp32 (rows, V) buffers of the fused head
    persistent = est["policy weights"] + est["optimiser"] + est["value head"]
    assert est["training phase"] == persistent + est["gradients"] + est["activations"] + est["logits"]
    assert est["peak"] == max(est["training phase"], est["generation phase"])


def test_lora_sampling_counts_a_merged_copy_of_the_adapted_weights():
    base = dict(model="smollm2-135m", dtype="fp32", prompt_length=64, max_new_tokens=48)
    cpu = estimate(build_config(MemoryArgs, {**base, "device": "cpu"}))
    per_layer = 576 * 576 * 2 + 576 * 192 * 2 + 576 * 1536 * 3  # q, o; k, v; gate, up, down
    assert cpu["merged LoRA"] == 30 * per_layer * 4 == 424_673_280
    assert cpu["generation phase"] == cpu["process baseline"] + cpu["policy weights"] + cpu["optimiser"] \
        + cpu["value head"] + cpu["KV cache"] + cpu["merged LoRA"]
    top = estimate(build_config(MemoryArgs, {**base, "device": "cpu", "lora_layers": 12}))
    assert top["merged LoRA"] == 12 * per_layer * 4
    assert estimate(build_config(MemoryArgs, base))["merged LoRA"] == 30 * per_layer * 4  # a GPU merges alike
    for other in ({"lora": False}, {"num_devices": 2}, {"method": "dpo"}):  # no LoRA, 2 processes, no sampling
        for device in ("cpu", "gpu"):
            assert estimate(build_config(MemoryArgs, {**base, "device": device, **other}))["merged LoRA"] == 0


def test_kv_cache_bytes_is_two_tensors_per_layer_of_every_cached_position():
    # SmolLM2-1.7B: 24 layers, 32 key/value heads of 64; 64 rows x (256 + 256) positions in bf16
    assert kv_cache_bytes(24, 32, 64, 64 * 512, 2) == 2 * 24 * 32 * 64 * 32768 * 2 == 6_442_450_944


def test_sharding_reference_offload_and_checkpointing():
    base = dict(model="llama-2-7b", lora=False, dtype="bf16", num_devices=8, micro_batch_size=4, prompt_length=512,
                max_new_tokens=512)
    P = 6_738_415_616
    ddp = estimate(build_config(MemoryArgs, base))
    z2 = estimate(build_config(MemoryArgs, {**base, "sharding": "zero2"}))
    z3 = estimate(build_config(MemoryArgs, {**base, "sharding": "zero3"}))
    assert (ddp["policy weights"], ddp["gradients"], ddp["optimiser"]) == (P * 4, P * 4, P * 8)
    assert (z2["policy weights"], z2["gradients"], z2["optimiser"]) == (P * 4, P * 4 / 8, P * 8 / 8)
    # the reference is not sharded; its linear layers are bf16, embeddings + untied head + norms fp32:
    # Llama-2-7B: 2 x 32000 x 4096 embedding/head parameters, (2 x 32 + 1) x 4096 norm weights
    kept = 2 * 32000 * 4096 + 65 * 4096
    assert z3["policy weights"] == P * 4 / 8 and z3["reference"] == (P - kept) * 2 + kept * 4
    assert z3["generation gather"] == P * 2 and ddp["generation gather"] == 0  # ZeRO-3 samples with full weights
    assert z3["generation phase"] == z3["policy weights"] + z3["optimiser"] + z3["reference"] + z3["value head"] \
        + z3["KV cache"] + z3["generation gather"]
    assert estimate(build_config(MemoryArgs, {**base, "offload_reference": True}))["reference"] == 0
    ckpt = estimate(build_config(MemoryArgs, {**base, "gradient_checkpointing": True}))
    assert ckpt["activations"] == 32 * 4 * 1024 * 4096 * 2 + 4 * 1024 * 4096 * 34
    assert ckpt["activations"] < ddp["activations"] / 10
    assert estimate(build_config(MemoryArgs, {**base, "method": "sft"}))["reference"] == 0


def test_ddp_counts_its_flat_copy_of_the_gradients():
    """Unsharded on N > 1 devices, torch DDP keeps its buckets: a flat copy of every trainable
    parameter's gradient, fp32, from the wrap on (gradient_as_bucket_view=False), in every phase."""
    base = dict(model="smollm2-135m", lora=False, dtype="fp32", device="cpu", num_devices=2, micro_batch_size=2,
                prompt_length=54, max_new_tokens=16, prompts_per_generate=4, rollout_batch_size=4)
    P, T = 134_515_008, 4_884_480
    ddp = estimate(build_config(MemoryArgs, base))
    assert ddp["DDP buckets"] == P * 4 == 538_060_032
    assert ddp["generation phase"] == (ddp["process baseline"] + P * 4 + P * 4 + P * 8 + ddp["reference"]
                                       + ddp["value head"] + ddp["KV cache"])
    assert ddp["training phase"] == (ddp["process baseline"] + P * 4 + P * 4 + P * 4 + P * 8 + ddp["reference"]
                                     + ddp["value head"] + ddp["activations"] + ddp["logits"] + ddp["heap retention"])
    assert estimate(build_config(MemoryArgs, {**base, "lora": True}))["DDP buckets"] == T * 4  # adapters only
    for other in ({"num_devices": 1}, {"sharding": "zero2"}, {"sharding": "zero3"}, {"sharding": "fsdp2"}):
        assert estimate(build_config(MemoryArgs, {**base, **other}))["DDP buckets"] == 0


def test_fsdp2_by_hand_full_fine_tuning_in_bf16_and_fp32_and_lora():
    """sharding=fsdp2: what runtime/fsdp2.py holds. Llama-2-7B, untied: the root is the embedding, the
    output layer and the final norm (2 x 32000 x 4096 + 4096), the rest is 32 layers."""
    base = dict(model="llama-2-7b", lora=False, dtype="bf16", num_devices=8, micro_batch_size=4, prompt_length=512,
                max_new_tokens=512, sharding="fsdp2")
    P, root = 6_738_415_616, 2 * 32000 * 4096 + 4096
    kept = 2 * 32000 * 4096 + 65 * 4096
    est = estimate(build_config(MemoryArgs, base))
    assert (est["policy weights"], est["gradients"], est["optimiser"]) == (P * 4 / 8, P * 4 / 8, P * 8 / 8)
    reference = (P - kept) * 2 + kept * 4  # 13.04 GiB whole: linear layers bf16, embeddings/head/norms fp32
    assert est["reference"] == reference / 8  # sharded like the policy
    # sampling gathers the whole policy: layers in bf16 (the bf16 run's mixed precision), the root fp32
    assert est["generation gather"] == (P - root) * 2 + root * 4
    # training: the root's fp32 weights and its whole fp32 gradient, two bf16 layers, and (4 rows a
    # micro-batch, 16 a rollout: the step accumulates) every trainable parameter's whole fp32 gradient
    assert est["training gather"] == root * 4 + root * 4 + 2 * (P - root) / 32 * 2 + P * 4
    whole = estimate(build_config(MemoryArgs, {**base, "micro_batch_size": 16, "rollout_batch_size": 16}))
    assert whole["training gather"] == root * 4 + root * 4 + 2 * (P - root) / 32 * 2  # one micro-batch a step
    # the whole frozen copy moves onto each GPU before it is sharded, beside the policy's shards (the
    # policy is sharded onto the device from CPU memory); on the CPU both are whole in the process
    assert est["loading phase"] == P * 4 / 8 + reference + est["value head"]
    cpu = estimate(build_config(MemoryArgs, {**base, "device": "cpu"}))
    assert cpu["loading phase"] == cpu["process baseline"] + P * 4 + reference + cpu["value head"]
    assert est["peak"] == max(est["generation phase"], est["training phase"], est["loading phase"])
    assert est["training phase"] == (est["policy weights"] + est["optimiser"] + est["reference"] + est["value head"]
                                     + est["gradients"] + est["training gather"] + est["activations"] + est["logits"])
    fp32 = estimate(build_config(MemoryArgs, {**base, "dtype": "fp32"}))
    assert fp32["generation gather"] == P * 4  # no mixed precision: the layers gather in fp32
    off = estimate(build_config(MemoryArgs, {**base, "offload_reference": True}))
    assert off["reference"] == 0 and off["loading phase"] == P * 4 / 8 + off["value head"]
    T = PRESETS["llama-2-7b"].lora_count(16)
    lora = estimate(build_config(MemoryArgs, {**base, "lora": True}))
    assert lora["policy weights"] == (P * 2 + T * 4) / 8 and lora["reference"] == 0
    assert lora["generation gather"] == (P - root + T) * 2 + root * 2  # a bf16 base; adapters gathered in bf16
    assert lora["training gather"] == root * 2 + 2 * (P - root + T) / 32 * 2 + T * 4  # a frozen root: no gradient
    for other in ("none", "zero2", "zero3"):
        assert estimate(build_config(MemoryArgs, {**base, "sharding": other}))["loading phase"] == 0


def test_cli_prints_a_table_for_a_model_folder(tiny_model_dir, capsys):
    assert main([f"model={tiny_model_dir}", "method=grpo"]) == 0
    out = capsys.readouterr().out
    assert "| peak |" in out and "| KV cache |" in out


@pytest.mark.parametrize("method,config", [
    ("ppo", "rlhfkit.trainers.ppo_config:PPOConfig"), ("trpo", "rlhfkit.trainers.trpo_config:TRPOConfig"),
    ("grpo", "rlhfkit.trainers.grpo_config:GRPOConfig"), ("dpo", "rlhfkit.trainers.dpo_config:DPOConfig"),
    ("sft", "rlhfkit.trainers.sft_config:SFTConfig"), ("rm", "rlhfkit.trainers.rm_config:RMConfig")])
def test_options_not_given_take_the_methods_trainer_defaults(method, config):
    """`estimate-memory method=M` estimates `rlhfkit M` as it runs by default: every option the two
    share takes the trainer's value (read from a trainer config built with its defaults), bar DPO's
    judged-sampling lengths; a given option wins, `null` included."""
    import importlib

    from rlhfkit.commands.estimate_memory import TRAINER_OPTIONS, for_method

    module, name = config.split(":")
    required = {"data": "prefs.jsonl"} if method == "rm" else {}  # rm has no default data
    trainer = build_config(getattr(importlib.import_module(module), name), required)
    args = for_method({"method": method})
    shared = [k for k in TRAINER_OPTIONS if hasattr(trainer, k)]
    assert {"micro_batch_size", "lora_layers", "lora_r", "lora_dropout"} <= set(shared)
    for k in shared:
        if method == "dpo" and k in ("max_new_tokens", "prompts_per_generate"):
            assert getattr(args, k) == getattr(MemoryArgs(), k)  # the estimate's own: DPO's are its samples'
        else:
            assert getattr(args, k) == getattr(trainer, k), k
    assert for_method({"method": method, "micro_batch_size": 3}).micro_batch_size == 3
    assert for_method({"method": method, "lora_layers": None}).lora_layers is None


def test_the_estimates_lora_dropout_is_each_trainers_default():
    """estimate/memory.py imports no trainer: its copy of their LoRA dropout defaults stays theirs."""
    import dataclasses

    from rlhfkit.commands import COMMANDS, load
    from rlhfkit.estimate.memory import ESTIMATED_METHODS, TRAINER_LORA_DROPOUT

    for method in ESTIMATED_METHODS:
        fields = {f.name: f.default for f in dataclasses.fields(load(COMMANDS[method].config))}
        assert TRAINER_LORA_DROPOUT.get(method, 0.0) == fields["lora_dropout"], method


def test_trainer_defaults_by_hand():
    from rlhfkit.commands.estimate_memory import for_method

    grpo = for_method({"method": "grpo"})
    assert (grpo.micro_batch_size, grpo.group_size, grpo.rollout_batch_size, grpo.mini_batch_size,
            grpo.max_new_tokens, grpo.prompts_per_generate) == (16, 8, 64, 32, 16, 64)
    assert for_method({"method": "ppo"}).lora_layers == 12  # rlhfkit ppo adapts the top 12 layers
    assert for_method({"method": "dpo"}).group_size == 2  # a pair's prompt runs once (share_prompts)
    assert for_method({"method": "sft"}).lora_dropout == 0.05
    assert for_method({"method": "trpo"}).fvp_fraction == 0.25
    with pytest.raises(ConfigError, match="method"):
        for_method({"method": "no-such-trainer"})


def test_cli_method_alone_equals_the_trainers_shapes_written_out(capsys):
    """The command line takes the same path: `method=grpo device=cpu prompt_length=62` prints the
    table of the same run with `rlhfkit grpo`'s shapes given one by one."""
    assert main(["method=grpo", "device=cpu", "prompt_length=62"]) == 0
    short = capsys.readouterr().out
    assert main(["method=grpo", "device=cpu", "prompt_length=62", "micro_batch_size=16", "group_size=8",
                 "rollout_batch_size=64", "mini_batch_size=32", "max_new_tokens=16", "prompts_per_generate=64",
                 "lora_layers=null"]) == 0
    assert capsys.readouterr().out == short
    assert main(["method=grpo", "device=cpu", "prompt_length=62", "micro_batch_size=8"]) == 0
    assert capsys.readouterr().out != short


def test_unknown_model_is_a_one_line_error():
    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="expected one of smollm2-135m"):
        main(["model=no-such-model"])


def test_the_worked_table_in_docs_is_what_the_function_computes():
    from pathlib import Path

    from rlhfkit.commands.estimate_memory import worked_table

    doc = (Path(__file__).parents[2] / "docs" / "scale.md").read_text()
    assert worked_table() in doc, "docs/scale.md's worked table is stale: paste rlhfkit.estimate.memory.worked_table()"


def test_cpu_terms_by_hand_for_the_multi_turn_grpo_demo():
    """device=cpu adds the process baseline, runs long micro-batches in row chunks of at most
    CHUNK_POSITIONS positions and takes the activation bytes measured on the CPU (bench/activation_bytes.py)."""
    from rlhfkit.estimate.memory import CHUNK_POSITIONS, CPU_ACTIVATION_BYTES, PROCESS_BASELINE

    args = build_config(MemoryArgs, dict(model="smollm2-135m", device="cpu", dtype="bf16", method="grpo",
                                         micro_batch_size=16, prompt_length=260, max_new_tokens=128,
                                         prompts_per_generate=64, group_size=8))
    est = estimate(args)
    assert est["process baseline"] == PROCESS_BASELINE == 0.41e9
    # 16 rows of 128 response tokens in groups of 8 sharing a 260-token prompt run 16 x 128 + 2 x 260
    # = 2568 positions whole; a chunk runs at most 640 (CHUNK_POSITIONS)
    assert CHUNK_POSITIONS == 640
    # 30 layers x 640 positions x 576 hidden x 54 bytes (measured on the CPU: bf16, LoRA without dropout)
    assert CPU_ACTIVATION_BYTES[("bf16", "lora")] == 54
    assert est["activations"] == 30 * 640 * 576 * 54 == 597_196_800
    assert est["logits"] == 16 * 640 / 2568 * 128 * 49152 * 8  # the head's two fp32 buffers for a chunk's share
    weights = 134_515_008 * 2 + 4_884_480 * 4  # bf16 base, fp32 adapters
    assert est["policy weights"] == weights
    # glibc's kept blocks: half the transient (CPU_HEAP_RETENTION)
    assert est["heap retention"] == 0.5 * (est["activations"] + est["logits"])
    assert est["training phase"] == 0.41e9 + weights + 4_884_480 * 8 + 4_884_480 * 4 \
        + 1.5 * (est["activations"] + est["logits"])
    assert est["peak"] == est["training phase"] > est["generation phase"]
    # the GPU path is unchanged: no baseline, the whole micro-batch, Korthikanti's 34 / 2 x b_c
    gpu = estimate(build_config(MemoryArgs, dict(model="smollm2-135m", dtype="bf16", method="grpo",
                                                 micro_batch_size=16, prompt_length=260, max_new_tokens=128)))
    assert gpu["process baseline"] == gpu["heap retention"] == 0
    assert gpu["activations"] == 30 * 16 * 388 * 576 * 34 and gpu["logits"] == 16 * 128 * 49152 * 8
    # group_size on the GPU: 16 x 128 response + 2 x 260 prompt positions
    shared = estimate(build_config(MemoryArgs, dict(model="smollm2-135m", dtype="bf16", method="grpo",
                                                    micro_batch_size=16, prompt_length=260, max_new_tokens=128,
                                                    group_size=8)))
    assert shared["activations"] == 30 * (16 * 128 + 2 * 260) * 576 * 34
    # SFT's chunks: at most 640 of the 16 x 388 positions; the reward model has none
    sft = estimate(build_config(MemoryArgs, dict(model="smollm2-135m", device="cpu", method="sft",
                                                 micro_batch_size=16, prompt_length=260, max_new_tokens=128)))
    assert sft["activations"] == 30 * 640 * 576 * 88  # SFT's LoRA dropout (0.05) keeps input copies
    rm = estimate(build_config(MemoryArgs, dict(model="smollm2-135m", device="cpu", method="rm",
                                                micro_batch_size=8, prompt_length=260, max_new_tokens=128)))
    assert rm["activations"] == 30 * 16 * 388 * 576 * 54  # 8 pairs = 16 sequences, whole


def test_cpu_activation_bytes_follow_dtype_dropout_and_full_fine_tuning():
    """The measured factor per position, layer and hidden unit (bench/activation_bytes.py): a dropout
    layer keeps a copy of its input, so LoRA dropout costs more than the dtype; full fine-tuning has its own."""
    def acts(**kw):
        args = dict(model="smollm2-135m", device="cpu", method="sft", micro_batch_size=4, prompt_length=60,
                    max_new_tokens=53)  # 4 x 113 = 452 positions: one chunk
        return estimate(build_config(MemoryArgs, {**args, **kw}))["activations"] / (30 * 452 * 576)

    assert acts() == acts(lora_dropout=0.05) == acts(lora_dropout=0.3) == 88  # SFT's default dropout: 0.05
    assert acts(lora_dropout=0) == 54 and acts(method="grpo", group_size=1) == 54  # the RL trainers': 0
    assert acts(dtype="fp32", lora_dropout=0) == 71 and acts(dtype="fp32") == 121
    assert acts(lora=False) == 69 and acts(lora=False, dtype="fp32") == 78
    assert acts(lora=False, lora_dropout=0.05) == 69  # no adapters, no adapter dropout
    gpu = estimate(build_config(MemoryArgs, dict(model="smollm2-135m", method="sft", micro_batch_size=4,
                                                 prompt_length=60, max_new_tokens=53, lora_dropout=0.05)))
    assert gpu["activations"] == 30 * 452 * 576 * 34  # the GPU formula: 17 x b_c whatever the dropout
    with pytest.raises(ConfigError, match="lora_dropout"):
        build_config(MemoryArgs, {"lora_dropout": 1.0})


def test_chunked_positions_are_at_most_the_budget():
    """On the CPU a chunk runs at most cpu_chunk_positions positions, or one row alone: activations
    count min(the micro-batch's positions, max(budget, one row's)); on the GPU the whole micro-batch."""
    def acts(device, **kw):
        args = dict(model="smollm2-135m", device=device, dtype="bf16", method="ppo", micro_batch_size=8,
                    prompt_length=54, max_new_tokens=48)
        return estimate(build_config(MemoryArgs, {**args, **kw}))["activations"]

    assert acts("cpu") == 30 * 640 * 576 * 54  # PPO: 8 x 102 = 816 positions > 640
    assert acts("cpu", micro_batch_size=4) == 30 * 408 * 576 * 54  # 4 x 102 = 408 fit whole
    assert acts("cpu", prompt_length=900) == 30 * 948 * 576 * 54  # one row of 948 runs alone
    assert acts("cpu", cpu_chunk_positions=10**6) == 30 * 816 * 576 * 54  # no chunks
    assert acts("gpu") == 30 * 816 * 576 * 34  # GPUs run whole micro-batches (17 x b_c per position)


def test_chunk_size_matches_the_trainers():
    from rlhfkit.estimate.memory import CHUNK_POSITIONS as ESTIMATED
    from rlhfkit.rollout.logprobs import CHUNK_POSITIONS

    assert ESTIMATED == CHUNK_POSITIONS
    from dataclasses import fields

    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.options import ModelArgs

    (default,) = [f.default for f in fields(ModelArgs) if f.name == "cpu_chunk_positions"]
    assert default == CHUNK_POSITIONS  # the trainers' option starts at the module's budget
    with pytest.raises(ConfigError, match="cpu_chunk_positions"):
        build_config(GRPOConfig, {"cpu_chunk_positions": 0})
    # the estimate follows the option
    wide = estimate(build_config(MemoryArgs, dict(model="smollm2-135m", device="cpu", method="grpo", micro_batch_size=16,
                                                  prompt_length=260, max_new_tokens=128, group_size=8,
                                                  cpu_chunk_positions=800)))
    assert wide["activations"] == 30 * 800 * 576 * 54


def _prompts(**kw) -> int:
    from rlhfkit.estimate.memory import prompts_per_micro_batch

    base = dict(model="smollm2-135m", device="cpu", method="grpo", micro_batch_size=16, group_size=8,
                rollout_batch_size=64)
    return prompts_per_micro_batch(build_config(MemoryArgs, {**base, **kw}))


def test_prompts_per_micro_batch_by_hand():
    """Whole groups in order: the most groups any micro-batch window spans; GRPO's shuffled
    mini-batches of M < B rows: k = g * M / B rows of each prompt per mini-batch, ceil(m / k) + 1."""
    assert _prompts() == 16 // 8 == 2  # mini-batch = rollout: 2 whole groups per micro-batch
    assert _prompts(mini_batch_size=64) == _prompts(mini_batch_size=128) == 2
    # DAPO's demo: M = 32 of B = 64 -> k = 8 * 32 / 64 = 4 rows per prompt -> 16 / 4 + 1 = 5
    assert _prompts(mini_batch_size=32) == 5
    assert _prompts(mini_batch_size=16, micro_batch_size=8) == 8 // 2 + 1 == 5  # k = 2
    assert _prompts(mini_batch_size=8, micro_batch_size=8) == 8  # k = 1: as many prompts as rows
    assert _prompts(rollout_batch_size=128, mini_batch_size=32) == 16 // 2 + 1 == 9  # k = 2
    assert _prompts(rollout_batch_size=16, mini_batch_size=8, micro_batch_size=8) == 2  # at most B / g prompts
    assert _prompts(rollout_batch_size=8) == 1  # a micro-batch larger than the rollout: its one group
    assert _prompts(group_size=1, mini_batch_size=32) == 16  # no sharing: every row its prompt
    # micro-batches straddling groups (m = 5, g = 3, 15 rows in order): rows 5-9 touch groups 1, 2, 3
    assert _prompts(micro_batch_size=5, group_size=3, rollout_batch_size=15) == 3
    # DPO's pairs stay together: 8 pairs -> 16 sequences, 8 prompts, however the rollout is split
    assert _prompts(method="dpo", micro_batch_size=8, group_size=2, mini_batch_size=4) == 8
    with pytest.raises(ConfigError, match="mini_batch_size"):
        _prompts(mini_batch_size=0)


@pytest.mark.parametrize("B,M,m,g", [(64, 32, 16, 8), (64, 16, 8, 8), (128, 32, 16, 8), (64, 32, 8, 4),
                                     (64, 64, 16, 8), (48, 48, 16, 8), (64, 32, 16, 1)])
def test_prompts_per_micro_batch_follow_the_trainers_shuffle(B, M, m, g):
    """The count against the update's own shuffle (trainers/rl_update.py shuffled_rows, as update_on
    calls it): within 0.75 of the mean over draws of the largest micro-batch's distinct prompts, and
    exactly that largest count when the mini-batch is the whole rollout (rows then in group order)."""
    import torch

    from rlhfkit.trainers.rl_update import shuffled_rows

    gen = torch.Generator().manual_seed(0)
    largest = []
    for _ in range(300):
        perm = shuffled_rows(B, gen, g, M)
        largest.append(max(len(set((perm[i : i + m] // g).tolist())) for i in range(0, B, m)))
    want = _prompts(rollout_batch_size=B, mini_batch_size=M, micro_batch_size=m, group_size=g)
    if M >= B or g == 1:
        assert set(largest) == {want}
    else:
        assert abs(sum(largest) / len(largest) - want) <= 0.75, (sum(largest) / len(largest), want)


def test_dapo_demo_activations_count_the_shuffled_prompts():
    """DAPO's demo update (64 rows, mini-batches of 32, micro-batches of 16, groups of 8, prompts up to
    62 tokens, 16 new): 16 x 16 response + 5 x 62 prompt positions = 566, whole (< 640)."""
    est = estimate(build_config(MemoryArgs, dict(model="smollm2-135m", device="cpu", dtype="bf16", method="grpo",
                                                 micro_batch_size=16, group_size=8, prompt_length=62,
                                                 max_new_tokens=16, rollout_batch_size=64, mini_batch_size=32)))
    assert est["activations"] == 30 * (16 * 16 + 5 * 62) * 576 * 54
    assert est["logits"] == 16 * 16 * 49152 * 8


def test_trpo_terms_by_hand_for_its_cpu_demo():
    """TRPO's policy step keeps the rollout's float32 logits and the Fisher graphs of ceil(0.25 x 16) = 4
    rows through its conjugate gradients; no AdamW moments, 7 flat vectors instead."""
    A = 54  # CPU activation bytes: bf16, LoRA without dropout

    args = dict(model="smollm2-135m", device="cpu", dtype="bf16", lora_layers=12, micro_batch_size=8,
                prompt_length=54, max_new_tokens=48, prompts_per_generate=48)
    trpo = estimate(build_config(MemoryArgs, {**args, "method": "trpo"}))
    ppo = estimate(build_config(MemoryArgs, {**args, "method": "ppo"}))
    T = 12 * 162_816  # LoRA r=16 on the top 12 layers
    assert trpo["optimiser"] == 7 * T * 4 and ppo["optimiser"] == T * 8
    assert trpo["old logits"] == 16 * 48 * 49152 * 4 and ppo["old logits"] == 0
    # 8 rows x 102 = 816 positions > 640: a chunk runs at most 640, i.e. 8 x 640 / 816 rows
    rows = 8 * 640 / 816
    assert trpo["activations"] == ppo["activations"] == 12 * 640 * 576 * A
    assert trpo["logits"] == rows * 48 * 49152 * 16 == 2 * ppo["logits"]  # four float32 copies, not two
    # 4 Fisher rows of 102 positions: two graphs through 12 layers, and z, p, u (4, 48, V) float32
    assert trpo["Fisher graphs"] == 2 * 4 * 102 * 12 * 576 * A + 3 * 4 * 48 * 49152 * 4
    # one product backs through one chunk of them (4 rows < the chunk's 6.3) with 3 more (4, 48, V) tensors
    assert trpo["Fisher product"] == 4 * (640 / rows) * 12 * 576 * A + 3 * 4 * 48 * 49152 * 4
    persistent = trpo["process baseline"] + trpo["policy weights"] + trpo["optimiser"] + trpo["value head"]
    gradient_pass = 1.5 * (trpo["activations"] + trpo["logits"])
    products = trpo["Fisher graphs"] + 1.5 * trpo["Fisher product"]
    assert products > gradient_pass  # the demo's peak is in the conjugate gradients
    assert trpo["training phase"] == pytest.approx(persistent + trpo["gradients"] + trpo["old logits"] + products,
                                                   rel=1e-12)
    with pytest.raises(ConfigError, match="fvp_fraction"):
        build_config(MemoryArgs, {**args, "method": "trpo", "fvp_fraction": 0})


def test_the_micro_batch_that_fits_a_gpu_by_hand(capsys):
    from rlhfkit.estimate.memory import GIB, micro_batch_that_fits

    shape = ModelShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=1000, tied=True)
    args = build_config(MemoryArgs, dict(model="smollm2-135m", method="ppo", micro_batch_size=1, mini_batch_size=48,
                                         rollout_batch_size=48, prompt_length=32, max_new_tokens=64,
                                         prompts_per_generate=4))
    # one more row of a micro-batch adds its activations, L x S x H x 34 x b_c / 2 = 2 x 96 x 64 x 34 = 417,792
    # bytes, and its fused-head buffers, R x V x 8 = 64 x 1000 x 8 = 512,000 bytes
    per_row = 2 * 96 * 64 * 34 + 64 * 1000 * 8
    assert per_row == 929_792

    def peak(m):
        return estimate(build_config(MemoryArgs, {**vars(args), "micro_batch_size": m}), shape)["peak"]

    fixed = peak(1) - per_row  # weights, optimiser, gradients: the same at every micro-batch
    assert peak(16) == fixed + 16 * per_row and peak(24) == fixed + 24 * per_row
    # room for 20 rows: the largest divisor of 48 at most 20 is 16 (not 20: 48 / 20 is no whole accumulation)
    assert micro_batch_that_fits(args, fixed + 20 * per_row, shape) == 16
    assert micro_batch_that_fits(args, fixed + 24 * per_row, shape) == 24
    assert micro_batch_that_fits(args, fixed + 24 * per_row - 1, shape) == 16
    assert micro_batch_that_fits(args, fixed + 10 * GIB, shape) == 48  # the whole mini-batch
    assert micro_batch_that_fits(args, fixed, shape) is None  # not one row
    # the command prints it for a GPU run of ppo or grpo, and nothing more otherwise
    assert main(["model=smollm2-135m", "gpu_memory_gib=80"]) == 0
    assert "micro_batch_size that fits 90% of 80 GiB (72.0 GiB): 8 (the largest divisor of the mini-batch's 8 rows" \
        in capsys.readouterr().out
    assert main(["model=smollm2-135m", "gpu_memory_gib=80", "device=cpu"]) == 0
    assert "fits" not in capsys.readouterr().out


def test_the_teacher_is_counted_like_a_frozen_reference_copy():
    """method=distill: the teacher's linear layers in b_c, embeddings and norms in fp32 (2 + 2 bytes
    here: bf16), on top of the LoRA policy; grpo counts one only when given; jsd keeps logits."""
    kept = 49152 * 576 + (2 * 30 + 1) * 576  # tied embeddings and the norms
    args = {"model": "smollm2-135m", "micro_batch_size": 4, "prompt_length": 32, "max_new_tokens": 16}
    distill = estimate(build_config(MemoryArgs, {**args, "method": "distill"}))
    assert distill["teacher"] == (134_515_008 - kept) * 2 + kept * 4
    assert distill["teacher logits"] == 0  # reverse-kl reads one log-prob per token
    grpo = estimate(build_config(MemoryArgs, {**args, "method": "grpo"}))
    assert grpo["teacher"] == 0
    assert estimate(build_config(MemoryArgs, {**args, "method": "grpo", "teacher": "smollm2-135m"}))["teacher"] \
        == distill["teacher"]
    jsd = estimate(build_config(MemoryArgs, {**args, "method": "distill", "distill_loss": "jsd"}))
    assert jsd["teacher logits"] == 4 * 16 * 49152 * 12 and jsd["logits"] == 4 * 16 * 49152 * 16
    top = estimate(build_config(MemoryArgs, {**args, "method": "distill", "distill_loss": "jsd", "distill_topk": 64}))
    assert top["teacher logits"] == 4 * 16 * 64 * 12
    assert jsd["training phase"] - distill["training phase"] == jsd["teacher logits"] + 4 * 16 * 49152 * 8
