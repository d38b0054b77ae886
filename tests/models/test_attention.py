"""bf16 attention on the CPU runs in float32 (models/attention.py)."""

from __future__ import annotations

import torch

from rlhfkit.models import attention
from rlhfkit.models.attention import cpu_fp32_sdpa


class _Module(torch.nn.Module):  # what transformers' sdpa reads from an attention module
    num_key_value_groups = 2
    is_causal = True
    training = False


def _qkv(q_len: int, kv_len: int, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(q_len * 1000 + kv_len)
    q = torch.randn(2, 4, q_len, 8, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, kv_len, 8, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(2, 1, q_len, kv_len, dtype=dtype)
    mask[0, :, -3:, :1] = float("-inf")  # a key hidden from row 0's last queries: not only the causal pattern
    mask += torch.full((q_len, kv_len), float("-inf"), dtype=dtype).triu(kv_len - q_len + 1)
    return q, k, v, mask


def _expected(q, k, v, mask):
    """Attention computed in float32 from the same bf16 inputs, by hand (GQA: each kv head serves 2)."""
    k, v = (t.float().repeat_interleave(2, dim=1) for t in (k, v))
    scores = q.float() @ k.transpose(-1, -2) / 8**0.5 + mask.float()
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)  # (B, q, heads, d), as transformers returns


def test_bf16_queries_are_computed_in_float32_and_returned_in_bf16(monkeypatch):
    from transformers.integrations import sdpa_attention

    kernel_dtypes = []
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda m, q, k, v, *a, **kw: kernel_dtypes.append((q.dtype, k.dtype, v.dtype))
                        or real(m, q, k, v, *a, **kw))
    q, k, v, mask = _qkv(5, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as in the trainers: must not undo the casts
        out, _ = cpu_fp32_sdpa(_Module(), q, k, v, mask, scaling=8**-0.5)
    assert kernel_dtypes == [(torch.float32,) * 3] and out.dtype == torch.bfloat16
    want = _expected(q, k, v, mask)
    scale = want.abs().max()  # > 0: random values
    torch.testing.assert_close(out.float(), want, rtol=2**-8, atol=1e-6 * float(scale))  # one bf16 rounding


def test_float64_attention_stays_float64(monkeypatch):
    """Only bf16 / fp16 queries are cast: a float64 model (the TRPO tests' exact comparisons) keeps
    float64 attention, where the float32 cast had rounded it to ~1e-7."""
    from transformers.integrations import sdpa_attention

    kernel_dtypes = []
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda m, q, k, v, *a, **kw: kernel_dtypes.append(q.dtype) or real(m, q, k, v, *a, **kw))
    q, k, v, mask = _qkv(5, 5, torch.float64)
    out, _ = cpu_fp32_sdpa(_Module(), q, k, v, mask, scaling=8**-0.5)
    assert kernel_dtypes == [torch.float64] and out.dtype == torch.float64
    kr, vr = (t.repeat_interleave(2, dim=1) for t in (k, v))  # by hand, in float64
    want = (torch.softmax(q @ kr.transpose(-1, -2) / 8**0.5 + mask, dim=-1) @ vr).transpose(1, 2)
    scale = float(want.abs().max())  # > 0: random values
    assert (out - want).abs().max() <= 1e-12 * scale  # float32 would be ~1e-7 off


def test_decoding_steps_and_float32_go_to_transformers_sdpa_unchanged():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    long = _qkv(3, attention.MAX_FP32_KEYS + 1)  # past the length where float32 pays
    for q, k, v, mask in (_qkv(1, 7), _qkv(5, 5, torch.float32), long):  # one query against a cache; fp32 model
        out, _ = cpu_fp32_sdpa(_Module(), q, k, v, mask, scaling=8**-0.5)
        ref, _ = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=8**-0.5)
        assert out.dtype == q.dtype and torch.equal(out, ref)
    q, k, v, mask = _qkv(5, 5)
    with attention.native_attention():  # sampling: bf16 as the model computes it
        out, _ = cpu_fp32_sdpa(_Module(), q, k, v, mask, scaling=8**-0.5)
    assert torch.equal(out, sdpa_attention_forward(_Module(), q, k, v, mask, scaling=8**-0.5)[0])
    assert not torch.equal(out, cpu_fp32_sdpa(_Module(), q, k, v, mask, scaling=8**-0.5)[0])  # and outside: float32


def test_rlhfkit_sampling_runs_attention_in_the_models_dtype(tiny_model_dir, monkeypatch):
    """generate() and the lean loop sample inside native_attention: their prefill, a bf16 forward of
    several queries, does not take the float32 path (no backward to speed up there)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.rollout import SamplingParams, generate
    from rlhfkit.rollout.decode import lean_generate

    model, tok = load_causal_lm(str(tiny_model_dir), dtype="bf16", trainable=False), load_tokenizer(str(tiny_model_dir))
    native = []
    real = attention.cpu_fp32_sdpa
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, attention.CPU_FP32_SDPA,
                        lambda *a, **kw: native.append(getattr(attention._state, "native", False)) or real(*a, **kw))
    for sample in (generate, lean_generate):
        native.clear()
        sample(model, tok, ["a b c", "d e"], SamplingParams(max_new_tokens=3, temperature=0.0))
        assert native and all(native), sample.__name__
    assert not getattr(attention._state, "native", False)  # restored afterwards


def test_loading_a_model_routes_its_sdpa_attention_through_the_float32_path(tiny_model_dir, monkeypatch):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rlhfkit.models import load_causal_lm

    model = load_causal_lm(str(tiny_model_dir), dtype="bf16", trainable=False)
    assert model.config._attn_implementation == attention.CPU_FP32_SDPA  # this model's choice, not the process's
    assert ALL_ATTENTION_FUNCTIONS[attention.CPU_FP32_SDPA] is cpu_fp32_sdpa
    seen = []
    real = attention.cpu_fp32_sdpa
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, attention.CPU_FP32_SDPA,
                        lambda m, q, *a, **kw: seen.append((q.dtype, q.shape[2])) or real(m, q, *a, **kw))
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    assert seen and all(s == (torch.bfloat16, 4) for s in seen)  # every layer, bf16 queries: the float32 path


def test_grouped_heads_reach_the_cpu_kernel_without_copies_and_give_the_same_output(monkeypatch):
    """Several queries on the CPU outside sampling: the kernel gets the 2 key/value heads themselves with
    enable_gqa (no repeat_kv copies) and returns exactly what it returns on copied heads; one query
    (decoding), sampling and CUDA-style decisions outside are left to transformers."""
    from transformers.integrations import sdpa_attention

    attention.use_cpu_fp32_attention(None)
    attention.use_cpu_fp32_attention(None)  # idempotent: one wrapper, not two
    assert sdpa_attention.use_gqa_in_sdpa.rlhfkit_grouped
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, *a, **kw: calls.append((k.shape[1], kw.get("enable_gqa", False))) or real(q, k, *a, **kw))
    cases = {"bf16": _qkv(5, 5), "fp32": _qkv(5, 5, torch.float32),
             "long bf16": _qkv(3, attention.MAX_FP32_KEYS + 1), "decode": _qkv(1, 7)}
    for name, (q, k, v, mask) in cases.items():
        calls.clear()
        out, _ = cpu_fp32_sdpa(_Module(), q, k, v, mask, scaling=8**-0.5)
        if name == "decode":  # transformers packs the query heads itself there
            assert [grouped for _, grouped in calls] == [False], calls
        else:
            assert calls == [(2, True)], (name, calls)
        # the same kernel on heads copied per query head (transformers' own path): the same bits
        kq, kv_ = (t.repeat_interleave(2, dim=1) for t in (k, v))
        copied = _Module()
        copied.num_key_value_groups = 1
        if name == "bf16":
            q, kq, kv_, mask = q.float(), kq.float(), kv_.float(), mask.float()
        ref, _ = sdpa_attention.sdpa_attention_forward(copied, q, kq, kv_, mask, scaling=8**-0.5)
        assert torch.equal(out, ref.to(out.dtype)), name
    assert not getattr(attention._state, "grouped", False)  # restored afterwards
    calls.clear()
    with attention.native_attention():  # sampling: transformers decides (copies, with a mask)
        cpu_fp32_sdpa(_Module(), *_qkv(5, 5), scaling=8**-0.5)
    assert calls == [(4, False)]


def test_a_decoding_step_without_a_mask_packs_the_grouped_heads(monkeypatch):
    """One bf16 query per row and no padding mask (one prompt's samples): transformers would pass the
    grouped heads with enable_gqa, which torch's bf16 CPU kernel runs ~4x slower; the kernel gets them
    packed as queries of their key/value head instead ((2, 4, 1, 8) -> (2, 2, 2, 8)), and the output is
    the attention computed by hand in float32 to bf16 rounding. float32 and masked steps are unchanged."""
    attention.use_cpu_fp32_attention(None)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, *a, **kw: calls.append((tuple(q.shape), kw.get("enable_gqa", False)))
                        or real(q, k, *a, **kw))
    q, k, v, _ = _qkv(1, 9)
    with attention.native_attention():  # as sampling runs it
        out, _ = cpu_fp32_sdpa(_Module(), q, k, v, None, scaling=8**-0.5)
    assert calls == [((2, 2, 2, 8), False)]
    want = _expected(q, k, v, torch.zeros(1, 1, 1, 9))
    assert out.dtype == torch.bfloat16
    assert (out.float() - want).abs().max() <= 2**-7 * want.abs().max()  # bf16 keeps 8 significant bits
    assert not getattr(attention._state, "packed", False)  # restored afterwards
    calls.clear()
    cpu_fp32_sdpa(_Module(), *(t.float() for t in (q, k, v)), None, scaling=8**-0.5)  # float32: transformers decides
    assert calls == [((2, 4, 1, 8), True)]


def test_the_attention_choice_is_per_model_and_not_saved(tiny_model_dir, tmp_path):
    """Loading a model through rlhfkit switches that model only: a model loaded by transformers in the
    same process keeps transformers' sdpa (and runs transformers' function), and a saved model's
    config.json names no rlhfkit implementation."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rlhfkit.models import load_causal_lm

    ours = load_causal_lm(str(tiny_model_dir), dtype="fp32", trainable=False)
    theirs = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert ours.config._attn_implementation == attention.CPU_FP32_SDPA
    assert theirs.config._attn_implementation == "sdpa" and ALL_ATTENTION_FUNCTIONS["sdpa"] is not cpu_fp32_sdpa
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids, attention_mask=mask).logits, theirs(input_ids=ids, attention_mask=mask).logits)
    ours.save_pretrained(tmp_path / "saved")
    assert "rlhfkit" not in (tmp_path / "saved" / "config.json").read_text()
