"""PPO trainer tests on a tiny random Llama (seconds on CPU)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import LogitsProcessorList

from rlhfkit.algos import logprobs_from_logits, shape_rewards
from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.models.lora import add_lora
from rlhfkit.models.policy import ActorCritic, Reference, ValueHead
from rlhfkit.rollout import SamplingParams, forward_logprobs, generate, logprob_pass
from rlhfkit.rollout.sampling import ExponentialRaceSampler
from rlhfkit.trainers.ppo import RatioCheckError, train
from rlhfkit.trainers.ppo_config import PPOConfig

from tiny_lm import build_tiny_model, build_tokenizer

PROMPTS = [f"Write a review of thing number {i}." for i in range(32)]


def tiny_cfg(tmp_path, tiny_model_dir, **kw) -> PPOConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS))
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), reward="length:3", iterations=1,
                rollout_batch_size=8, mini_batch_size=4, micro_batch_size=2, max_new_tokens=8,
                num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True,
                tensorboard=False)
    base.update(kw)
    return build_config(PPOConfig, base)


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_one_iteration_changes_trainable_parameters_and_nothing_else(tmp_path, tiny_model_dir, monkeypatch):
    import rlhfkit.trainers.ppo as ppo_mod

    captured = {}
    real_build = ppo_mod.build_actor_critic

    def spy(cfg):
        actor, ref, tok = real_build(cfg)
        captured["actor"], captured["before"] = actor, _snapshot(actor)
        return actor, ref, tok

    monkeypatch.setattr(ppo_mod, "build_actor_critic", spy)
    train(tiny_cfg(tmp_path, tiny_model_dir, lr=1e-2))
    after = _snapshot(captured["actor"])
    changed = {n for n in after if not torch.equal(after[n], captured["before"][n])}
    trainable = {n for n, p in captured["actor"].named_parameters() if p.requires_grad}
    assert changed, "no parameter changed"
    assert changed <= trainable, f"frozen parameters changed: {sorted(changed - trainable)[:3]}"
    assert any("lora_" in n for n in changed) and any("value_head" in n for n in changed)
    assert not any("lora_" not in n and "value_head" not in n for n in trainable)


def test_run_folder_metrics_and_ratio_check(tmp_path, tiny_model_dir):
    train(tiny_cfg(tmp_path, tiny_model_dir, iterations=2, ppo_epochs=2))
    run = tmp_path / "runs" / "t"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    for key in ("rollout/reward_mean", "rollout/reward_std", "rollout/score_mean", "rollout/kl",
                "rollout/response_length", "rollout/stop_fraction", "loss/policy", "loss/value", "loss/entropy",
                "loss/total", "params/policy_clip_frac", "params/value_clip_frac", "params/approx_kl",
                "params/grad_norm", "params/kl_coef", "params/lr", "timing/rollout_s", "timing/update_s",
                "throughput/tokens_per_s"):
        assert key in rows[0], key
    # The first micro-batch repeats the scoring pass exactly: ratio 1 to the last bit.
    assert all(r["params/ratio_first_microbatch_maxdev"] == 0.0 for r in rows)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {"iteration", "prompt", "completion", "score", "reward"} <= set(samples[0])
    assert (run / "final" / "value_head.safetensors").is_file() and (run / "config.yaml").is_file()


def test_shared_prefix_runs_in_scoring_and_update_and_keeps_the_ratio_exact(tmp_path, tiny_model_dir, monkeypatch):
    """The prompts share a chat header + 'Write a review of thing number': every scoring and update
    micro-batch runs it once, and the first update micro-batch still repeats scoring to the bit."""
    import rlhfkit.models.policy as policy_mod

    real, used = policy_mod.shared_prefix_hidden, []

    def spy(decoder, ids, mask, R):
        out = real(decoder, ids, mask, R)
        used.append(out is not None)
        return out

    monkeypatch.setattr(policy_mod, "shared_prefix_hidden", spy)
    train(tiny_cfg(tmp_path, tiny_model_dir, ppo_epochs=2))
    # 4 scoring micro-batches x (policy + adapter-off reference) + 2 epochs x 4 update micro-batches
    assert used == [True] * 16
    rows = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["params/ratio_first_microbatch_maxdev"] == 0.0


def test_broken_logprob_reconstruction_is_caught(tmp_path, tiny_model_dir, monkeypatch):
    import rlhfkit.trainers.ppo as ppo_mod

    real = ppo_mod.forward_logprobs

    def wrong_temperature(actor, mb, temperature, **kw):  # the update uses T=2 while rollouts used T=1
        return real(actor, mb, temperature * 2.0, **kw)

    monkeypatch.setattr(ppo_mod, "forward_logprobs", wrong_temperature)
    with pytest.raises(RatioCheckError, match="log-prob reconstruction is broken"):
        train(tiny_cfg(tmp_path, tiny_model_dir))


@pytest.fixture()
def tiny_actor():
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_model(len(tok), seed=1).eval()
    return ActorCritic(model, ValueHead(model.config.hidden_size)), tok


def test_generation_logprobs_equal_teacher_forced(tiny_actor):
    """Log-probs of the sampled tokens under the generation-time logits (temperature-scaled) equal
    the teacher-forced pass over left-padded prompt + response (pitfalls docs/pitfalls.md#temperature, docs/pitfalls.md#padding-and-positions, docs/pitfalls.md#off-by-one)."""
    actor, tok = tiny_actor
    prompts = ["Hi", "Write a short review of the new cafe please", "What is 3 + 4?"]  # different lengths
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (enc["attention_mask"][:, 0] == 0).any(), "test needs left padding"
    T = 0.7
    torch.manual_seed(0)
    sampler = LogitsProcessorList([ExponentialRaceSampler(T)])  # the draw generate() makes (rollout/sampling.py)
    out = actor.policy.generate(**enc, do_sample=False, logits_processor=sampler, max_new_tokens=10,
                                output_logits=True, return_dict_in_generate=True, pad_token_id=2, eos_token_id=[2])
    gen_logits = torch.stack(out.logits, dim=1)  # (B, R, V), raw logits
    response = out.sequences[:, enc["input_ids"].shape[1]:]
    lp_gen = logprobs_from_logits(gen_logits, response, T)
    torch.manual_seed(0)
    ro = generate(actor.policy, tok, prompts, SamplingParams(max_new_tokens=10, temperature=T, stop_ids=(2,)))
    assert torch.equal(ro.response_ids, response), "same seed must give the same sample"
    lp_tf, _, _ = forward_logprobs(actor, ro, T, with_values=False)
    m = ro.response_mask.bool()
    torch.testing.assert_close(lp_tf[m], lp_gen[m], atol=1e-4, rtol=1e-4)


def test_adapter_disabled_reference_equals_untrained_policy(tiny_actor):
    actor, tok = tiny_actor
    base_copy = build_tiny_model(len(tok), seed=1).eval()  # same init as the policy's base
    peft_model = add_lora(actor.policy, r=4, alpha=8, dropout=0.0, targets=None)
    with torch.no_grad():  # make the adapter non-trivial, as after training
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    actor = ActorCritic(peft_model, actor.value_head)
    ref = Reference(actor, use_adapter_off=True)
    ids = tok(["Hello there", "Hi"], return_tensors="pt", padding=True, add_special_tokens=False)
    ref_logits = ref.logits(ids["input_ids"], ids["attention_mask"], 2)
    base_actor = ActorCritic(base_copy, ValueHead(32))
    base_logits, _ = base_actor.logits(ids["input_ids"], ids["attention_mask"], 2)
    pol_logits, _ = actor.logits(ids["input_ids"], ids["attention_mask"], 2)
    torch.testing.assert_close(ref_logits, base_logits)
    assert not torch.allclose(pol_logits, base_logits, atol=1e-3), "adapter should change the policy"


def test_score_on_last_valid_token_left_padding_pad_equals_eos(tiny_actor):
    """With pad == eos (2), the score goes on the first eos (the stop token), not on later pads."""
    actor, tok = tiny_actor
    ro = generate(actor.policy, tok, ["Hi", "Write a review"], SamplingParams(max_new_tokens=6, stop_ids=(2,)))
    # Overwrite responses with known tokens: row 0 stops at index 2 then pads (== eos); row 1 never stops.
    ro = dataclasses.replace(ro, response_ids=torch.tensor([[40, 41, 2, 2, 2, 2], [40, 41, 42, 43, 44, 45]]))
    from rlhfkit.algos import response_mask

    mask, stopped = response_mask(ro.response_ids, (2,))
    assert mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]] and stopped.tolist() == [True, False]
    ro = dataclasses.replace(ro, response_mask=mask.float(), stopped=stopped)
    ro = logprob_pass(actor, None, ro, 1.0, micro_batch_size=2)
    rewards, _ = shape_rewards(torch.tensor([5.0, 7.0]), ro.logprobs, ro.logprobs, ro.response_mask, 0.1)
    assert rewards[0].tolist() == [0, 0, 5.0, 0, 0, 0]
    assert rewards[1].tolist() == [0, 0, 0, 0, 0, 7.0]
    assert (ro.logprobs[0, 3:] == 0).all() and (ro.values[0, 3:] == 0).all()


def test_logprob_pass_order_does_not_change_results(tiny_actor):
    actor, tok = tiny_actor
    with torch.no_grad():  # a zero-initialised head gives values that are 0 in any order: nothing to compare
        actor.value_head.summary.weight.normal_(0, 0.5)
    torch.manual_seed(3)
    ro = generate(actor.policy, tok, ["Hi", "Write a review", "What is 3 + 4?", "Go"],
                  SamplingParams(max_new_tokens=6, stop_ids=(2,)))
    a = logprob_pass(actor, None, ro, 1.0, micro_batch_size=2)
    lp_a, v_a = a.logprobs.clone(), a.values.clone()
    b = logprob_pass(actor, None, ro, 1.0, micro_batch_size=2, order=torch.tensor([3, 1, 0, 2]))
    torch.testing.assert_close(b.logprobs, lp_a, atol=1e-5, rtol=0)
    assert v_a.abs().max() > 0.1
    torch.testing.assert_close(b.values, v_a, atol=1e-5 * float(v_a.abs().max()), rtol=0)


def test_tiny_model_learns_toy_reward(tmp_path, tiny_model_dir):
    """Reward = share of vowels in the completion (about 0.12 for the random model); ten PPO
    iterations of full fine-tuning must raise it clearly (seen: 0.13 -> 0.5)."""
    rw = tmp_path / "vowels.py"
    rw.write_text("def reward(prompts, completions, **kw):\n"
                  "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")
    cfg = tiny_cfg(tmp_path, tiny_model_dir, reward=f"python:{rw}:reward", iterations=10, lora=False, lr=1e-2,
                   rollout_batch_size=16, mini_batch_size=8, micro_batch_size=8, max_new_tokens=6, kl_coef=0.0,
                   warmup_steps=1)
    train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    first = sum(r["rollout/score_mean"] for r in rows[:3]) / 3
    last = sum(r["rollout/score_mean"] for r in rows[-3:]) / 3
    assert last > first + 0.15, (first, last)


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout_batch_size \(10\) must be divisible by mini_batch_size \(4\)"):
        build_config(PPOConfig, {"rollout_batch_size": 10, "mini_batch_size": 4, "micro_batch_size": 2})
    with pytest.raises(ConfigError, match="did you mean 'clip_eps'"):
        parse_args(PPOConfig, ["clip_esp=0.1"], "rlhfkit ppo")
    with pytest.raises(ConfigError, match="lr='fast': expected float"):
        parse_args(PPOConfig, ["lr=fast"], "rlhfkit ppo")
    with pytest.raises(ConfigError, match="kl_estimator='k9': expected one of k1, k2, k3, abs"):
        parse_args(PPOConfig, ["kl_estimator=k9"], "rlhfkit ppo")
    bad = tmp_path / "c.yaml"
    bad.write_text("lr: 1e-5\nitterations: 3\n")
    with pytest.raises(ConfigError, match="c.yaml: unknown config key 'itterations' \\(did you mean 'iterations'\\?\\)"):
        parse_args(PPOConfig, [str(bad)], "rlhfkit ppo")


def test_help_lists_every_field(capsys):
    import dataclasses

    assert parse_args(PPOConfig, ["--help"], "rlhfkit ppo") is None
    out = capsys.readouterr().out
    for f in dataclasses.fields(PPOConfig):
        assert f"  {f.name} (" in out, f.name


def test_held_out_eval_draws_several_samples_per_prompt(tmp_path, tiny_model_dir, capsys):
    """eval_samples_per_prompt=k: k completions per held-out prompt, before and after, same draws."""
    prompts = tmp_path / "held.txt"
    prompts.write_text("\n".join(PROMPTS[:3]))
    summary = train(tiny_cfg(tmp_path, tiny_model_dir, eval_prompts=str(prompts), num_eval_prompts=3,
                             eval_samples_per_prompt=2, quiet=False))
    assert summary["eval_before"]["n"] == 6 and summary["eval_after"]["n"] == 6
    assert "on 3 held-out prompts, 6 samples" in capsys.readouterr().out
    prompts_seen = [s["prompt"] for s in summary["eval_before"]["samples"]]
    assert sorted(prompts_seen) == sorted(PROMPTS[:3] * 2)  # each prompt twice


def test_the_cpu_config_file_spells_out_the_defaults():
    """configs/ppo-cpu.yaml promises `rlhfkit ppo configs/ppo-cpu.yaml` == `rlhfkit ppo`."""
    from pathlib import Path

    import yaml

    spelled = yaml.safe_load((Path(__file__).parents[2] / "configs" / "ppo-cpu.yaml").read_text())
    defaults = build_config(PPOConfig, {})
    assert set(spelled) <= {f.name for f in dataclasses.fields(PPOConfig)}
    # validation resolves dtype=auto (ModelArgs.derived): the file and the defaults resolve alike
    assert build_config(PPOConfig, spelled) == defaults
