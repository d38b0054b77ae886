"""How many rows one generate() call takes (rollout/core.py `generation_rows`): the configured batch
on the CPU, unchanged; on a CUDA GPU the whole rollout where free memory holds its KV cache."""

from __future__ import annotations

from rlhfkit.rollout.core import GPU_GENERATION_SHARE, decode_row_bytes, generation_rows

from tiny_lm import build_tiny_model


def test_the_cpu_takes_the_configured_batch_or_every_row():
    assert generation_rows(64, 16) == 16
    assert generation_rows(64, None) == 64


def test_a_gpu_takes_the_whole_rollout_where_its_kv_cache_fits():
    assert GPU_GENERATION_SHARE == 0.8
    # 0.8 x 100_000 free bytes hold 80 rows of 1_000 bytes: all 64 rows in one call
    assert generation_rows(64, 16, row_bytes=1_000, free_bytes=100_000) == 64
    # 0.8 x 50_000 hold 40 rows: calls of 40 (more than the configured 16)
    assert generation_rows(64, 16, row_bytes=1_000, free_bytes=50_000) == 40
    # 0.8 x 10_000 hold 8 rows: never fewer than the configured batch
    assert generation_rows(64, 16, row_bytes=1_000, free_bytes=10_000) == 16
    assert generation_rows(64, None, row_bytes=1_000, free_bytes=100) == 1


def test_a_row_is_its_kv_cache_a_layer_of_prefill_and_three_float32_vocabulary_rows():
    config = build_tiny_model(320).config  # 2 layers, hidden 32, 4 heads of 8, 2 key/value heads, MLP 64
    width, b = 20 + 12, 2  # prompt + new tokens, bf16
    kv = 2 * 2 * 2 * 8 * width * b  # keys and values x layers x kv heads x head size x positions x bytes
    prefill = width * (4 * 32 + 3 * 64) * b
    assert decode_row_bytes(config, width, b) == kv + prefill + 3 * 320 * 4 == 28_416
