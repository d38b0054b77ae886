"""Generation backends: selection and fallback without vLLM, and the vLLM backend's argument mapping,
weight sync and rollout layout against a fake engine (vLLM itself needs a GPU; never imported here)."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch

import rlhfkit.rollout.backends as backends
import rlhfkit.trainers.rl as rl
from rlhfkit.models.lora import add_lora
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.backends import HFBackend, VLLMBackend, select_backend

from tiny_lm import build_tiny_model, build_tokenizer


class FakeLLM:
    """Stands in for vllm.LLM: records weight loads and generate calls; answers with scripted tokens
    (or random ones). Reachable the way VLLMBackend finds an in-process engine's model."""

    def __init__(self, scripted=None, vocab: int = 300):
        self.scripted, self.vocab = scripted, vocab
        self.loaded: list[dict[str, torch.Tensor]] = []
        self.calls: list[dict] = []
        self.resets = 0
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)))

    def _load(self, weights):
        self.loaded.append({k: v.detach().clone() for k, v in weights})

    def reset_prefix_cache(self):
        self.resets += 1

    def generate(self, prompts, sampling_params, use_tqdm=False):
        self.calls.append({"prompts": prompts, "params": sampling_params})
        outs = []
        for i, sp in enumerate(sampling_params):
            if self.scripted:
                ids, finish, stop = self.scripted[i]
            else:
                g = torch.Generator().manual_seed(sp.seed)
                ids, finish, stop = torch.randint(3, self.vocab, (sp.max_tokens,), generator=g).tolist(), "length", None
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, finish_reason=finish, stop_reason=stop)]))
        return outs


def fake_sampling_params(**kw):
    return SimpleNamespace(**kw)


def lora_policy(tok):
    policy = add_lora(build_tiny_model(len(tok)), 4, 8, 0.0, None)
    with torch.no_grad():  # adapters off zero, so the merged weights differ from the base
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    return policy


# ----------------------------------------------------------------------------- selection and fallback


def test_backend_selection_and_fallback_reasons(monkeypatch):
    assert select_backend("hf") == ("hf", None)
    with pytest.raises(ValueError, match="generation_backend"):
        select_backend("sglang")
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: None)
    name, message = select_backend("vllm")
    assert name == "hf" and "not installed" in message and "falling back to HF generate" in message
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(backends.torch.cuda, "is_available", lambda: False)
    name, message = select_backend("vllm")
    assert name == "hf" and "CUDA" in message
    monkeypatch.setattr(backends.torch.cuda, "is_available", lambda: True)
    assert select_backend("vllm") == ("vllm", None)


def test_vllm_is_not_imported_for_the_hf_backend():
    import sys

    cfg = SimpleNamespace(generation_backend="hf")
    assert isinstance(backends.make_backend(cfg, "unused"), HFBackend)
    assert "vllm" not in sys.modules


def test_ppo_asked_for_vllm_without_it_falls_back_to_hf_and_trains(tmp_path, tiny_model_dir, capsys):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    if backends.vllm_unavailable_reason() is None:
        pytest.skip("vLLM is usable here; this test covers its absence")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Write a review of thing number {i}." for i in range(8)))
    cfg = build_config(PPOConfig, dict(model=str(tiny_model_dir), prompts=str(prompts), reward="length:3",
                                       iterations=1, rollout_batch_size=4, mini_batch_size=4, micro_batch_size=2,
                                       max_new_tokens=6, num_eval_prompts=0, dtype="fp32", quiet=True,
                                       tensorboard=False, output_dir=str(tmp_path / "runs"), run_name="t",
                                       generation_backend="vllm"))
    train(cfg)
    assert "generation_backend=vllm is unavailable" in capsys.readouterr().out
    row = json.loads((tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["params/ratio_first_microbatch_maxdev"] == 0.0


# ----------------------------------------------------------------------------- the vLLM backend, faked


def test_sampling_arguments_prompt_tokens_and_rollout_layout():
    tok = build_tokenizer()
    eos = tok.eos_token_id
    texts = ["<|im_start|>user\nWrite a short review of the new cafe.<|im_end|>\n<|im_start|>assistant\n", "Hi"]
    scripted = [([40, 41, eos], "stop", None),  # stopped on eos, which vLLM keeps in token_ids
                ([50, 51, 52, 53], "length", None),  # hit max_tokens
                ([60, 61], "stop", 7)]  # stopped on a stop id that was not kept: appended
    llm = FakeLLM(scripted)
    backend = VLLMBackend(llm, fake_sampling_params)
    params = SamplingParams(max_new_tokens=4, temperature=0.7, stop_ids=(eos, 7))
    rollout = backend.generate(None, tok, texts + ["Hi"], params, seed=11)

    call = llm.calls[0]
    enc = tok(texts + ["Hi"], return_tensors="pt", padding=True, add_special_tokens=False)
    assert [p["prompt_token_ids"] for p in call["prompts"]] == [tok(t, add_special_tokens=False)["input_ids"]
                                                                for t in texts + ["Hi"]]
    sp = call["params"]
    assert {(s.n, s.temperature, s.top_k, s.top_p, s.max_tokens, s.detokenize) for s in sp} == {(1, 0.7, -1, 1.0, 4, False)}
    assert all(s.stop_token_ids == [eos, 7] for s in sp)
    assert len({s.seed for s in sp}) == 3  # identical prompts still get different samples
    # The same left-padded prompt layout as HF generate; responses right-padded after the stop.
    assert torch.equal(rollout.query_ids, enc["input_ids"]) and torch.equal(rollout.query_mask, enc["attention_mask"])
    assert rollout.response_ids.tolist() == [[40, 41, eos, tok.pad_token_id], [50, 51, 52, 53], [60, 61, 7, tok.pad_token_id]]
    assert rollout.response_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert rollout.stopped.tolist() == [True, False, True]
    assert rollout.completions[1] == tok.decode([50, 51, 52, 53]).strip()
    assert rollout.logprobs is None  # log-probs come from the trainer's own pass


def test_weight_sync_merges_lora_without_touching_the_policy():
    tok = build_tokenizer()
    policy = lora_policy(tok)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    llm = FakeLLM()
    backend = VLLMBackend(llm, fake_sampling_params)
    backend.sync(policy)
    loaded = llm.loaded[0]
    merged = copy.deepcopy(policy).merge_and_unload()
    expected = dict(merged.named_parameters())  # Hugging Face names; tied lm_head listed once
    assert loaded.keys() == expected.keys()
    for name, w in expected.items():
        torch.testing.assert_close(loaded[name], w.detach(), rtol=1e-6, atol=1e-7, msg=name)
    base = dict(build_tiny_model(len(tok)).named_parameters())
    assert not torch.allclose(loaded["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())  # adapters still separate
    assert llm.resets == 1 and backend.syncs == 1


def test_weight_sync_of_a_fully_fine_tuned_policy_is_its_state():
    tok = build_tokenizer()
    policy = build_tiny_model(len(tok))
    llm = FakeLLM()
    VLLMBackend(llm, fake_sampling_params).sync(policy)
    assert llm.loaded[0].keys() == dict(policy.named_parameters()).keys()
    assert all(torch.equal(llm.loaded[0][n], p) for n, p in policy.named_parameters())


def test_ppo_with_a_vllm_backend_syncs_every_iteration_and_keeps_the_ratio_check(tmp_path, tiny_model_dir,
                                                                                monkeypatch):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    llm = FakeLLM(vocab=300)
    monkeypatch.setattr(rl, "make_backend", lambda *a, **k: VLLMBackend(llm, fake_sampling_params))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Write a review of thing number {i}." for i in range(8)))
    cfg = build_config(PPOConfig, dict(model=str(tiny_model_dir), prompts=str(prompts), reward="length:3",
                                       iterations=2, rollout_batch_size=4, mini_batch_size=4, micro_batch_size=2,
                                       max_new_tokens=5, num_eval_prompts=0, dtype="fp32", quiet=True, lr=1e-2,
                                       tensorboard=False, output_dir=str(tmp_path / "runs"), run_name="t"))
    train(cfg)
    assert len(llm.loaded) == 2 and len(llm.calls) == 2  # weights synced before each rollout
    q = "model.layers.1.mlp.down_proj.weight"
    assert not torch.equal(llm.loaded[0][q], llm.loaded[1][q])  # the second rollout saw the updated policy
    rows = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [r["params/ratio_first_microbatch_maxdev"] for r in rows] == [0.0, 0.0]
    assert rows[0]["rollout/response_length"] == 5.0  # the fake engine's tokens were used
