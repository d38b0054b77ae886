"""TRPO trainer on a tiny random Llama: the accepted step stays inside the trust region, the
natural-gradient step does not depend on the micro-batch split, and a run logs PPO's metric names."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest
import torch

from rlhfkit.algos.trpo import flat_params
from rlhfkit.core.config import build_config
from rlhfkit.models.lora import add_lora
from rlhfkit.models.policy import ActorCritic, ValueHead
from rlhfkit.rollout import SamplingParams, generate, logprob_pass
from rlhfkit.trainers.ppo import compute_advantages
from rlhfkit.trainers.trpo import policy_step, train
from rlhfkit.trainers.trpo_config import TRPOConfig

from tiny_lm import build_tiny_model, build_tokenizer

PROMPTS = [f"Write a review of thing number {i}." for i in range(32)]


def tiny_cfg(tmp_path, tiny_model_dir, **kw) -> TRPOConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS))
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), reward="length:3", iterations=2,
                rollout_batch_size=8, vf_mini_batch_size=4, micro_batch_size=2, max_new_tokens=8,
                num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True,
                tensorboard=False, lora_layers=None, kl_coef=0.05)
    base.update(kw)
    return build_config(TRPOConfig, base)


def rollout_on_tiny_lora(seed: int = 0):
    """A scored rollout of 8 rows with advantages, on a tiny LoRA actor-critic."""
    tok = build_tokenizer()
    tok.padding_side = "left"
    torch.manual_seed(seed)
    model = add_lora(build_tiny_model(len(tok), seed=1), 4, 8, 0.0, None, None)
    actor = ActorCritic(model, ValueHead(model.config.hidden_size))
    torch.manual_seed(seed)
    params = SamplingParams(6, 1.0, 0, 1.0, (tok.eos_token_id,), None)
    ro = generate(model, tok, [PROMPTS[i] for i in range(8)], params)
    ro = logprob_pass(actor, None, ro, 1.0, 8)
    ro = dataclasses.replace(ro, scores=torch.linspace(-1, 1, 8))
    return actor, ro


def _step(actor, ro, micro: int, max_kl: float = 0.01, chunk: int = 640) -> tuple[torch.Tensor, dict]:
    cfg = TRPOConfig(micro_batch_size=micro, rollout_batch_size=8, vf_mini_batch_size=8, max_kl=max_kl, dtype="fp32",
                     temperature=1.0, cpu_chunk_positions=chunk)
    ro, _ = compute_advantages(ro, cfg, 0.0)
    params = [p for p in actor.policy.parameters() if p.requires_grad]
    before = flat_params(params)
    metrics = policy_step(actor, params, ro, cfg, torch.device("cpu"))
    after = flat_params(params)
    with torch.no_grad():
        for p, v in zip(params, torch.split(before, [p.numel() for p in params])):
            p.copy_(v.view_as(p))  # restore for the next call
    return after - before, metrics


def test_accepted_step_stays_inside_the_trust_region_and_improves_the_surrogate():
    actor, ro = rollout_on_tiny_lora()
    step, m = _step(actor, ro, micro=4, max_kl=0.01)
    assert m["trpo/step_accepted"] == 1.0 and step.abs().sum() > 0
    assert 0 < m["trpo/kl_after_step"] <= 0.01
    assert m["trpo/surrogate_improvement"] > 0
    assert m["ratio_first_microbatch_maxdev"] < 1e-5  # the surrogate's pi_old is the rollout's policy
    # the line search measured the KL of exactly the step it returned: halving the bound halves nothing
    # else, it only shrinks (or keeps) the accepted step
    small, m2 = _step(actor, ro, micro=4, max_kl=0.0025)
    assert m2["trpo/kl_after_step"] <= 0.0025
    assert small.norm() < step.norm()


def test_the_step_does_not_depend_on_the_micro_batch_split():
    actor, ro = rollout_on_tiny_lora()
    whole, _ = _step(actor, ro, micro=8)
    split, _ = _step(actor, ro, micro=2)
    scale = whole.norm()  # > 0 (accepted step), so the tolerance means something on every machine
    assert scale > 0
    assert (whole - split).norm() <= 1e-4 * scale


def test_the_step_in_row_chunks_is_the_step_of_whole_micro_batches(monkeypatch):
    """On the CPU the gradient, Fisher and line-search terms run in the row chunks every trainer cuts
    (rollout/logprobs.py): a budget of 40 positions (2-3 rows of ~16) gives the whole micro-batches' step."""
    import rlhfkit.rollout.logprobs as logprobs_mod

    actor, ro = rollout_on_tiny_lora()
    whole, _ = _step(actor, ro, micro=8)
    cuts, real = [], logprobs_mod.row_chunks

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        cuts.append(len(out))
        return out

    monkeypatch.setattr(logprobs_mod, "row_chunks", spy)
    chunked, _ = _step(actor, ro, micro=8, chunk=40)
    assert max(cuts) > 1  # the terms did run in chunks
    scale = whole.norm()
    assert scale > 0
    assert (whole - chunked).norm() <= 1e-4 * scale


def test_a_run_logs_the_seed_metrics_and_trpo_metrics(tmp_path, tiny_model_dir):
    summary = train(tiny_cfg(tmp_path, tiny_model_dir))
    rows = [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        for key in ("rollout/reward_mean", "rollout/kl", "loss/policy", "loss/value", "params/approx_kl",
                    "params/grad_norm", "params/value_clip_frac", "trpo/kl_after_step", "trpo/line_search_steps",
                    "trpo/cg_residual", "trpo/surrogate_improvement"):
            assert key in row, key
        assert row["trpo/kl_after_step"] <= 0.01
        assert row["params/ratio_first_microbatch_maxdev"] < 1e-4
    assert (tmp_path / "runs" / "t" / "final").is_dir() and summary["run_dir"].endswith("t")


def test_trpo_config_checks():
    with pytest.raises(Exception, match="max_kl"):
        build_config(TRPOConfig, {"max_kl": 0})
    with pytest.raises(Exception, match="vf_mini_batch_size"):
        build_config(TRPOConfig, {"rollout_batch_size": 16, "vf_mini_batch_size": 6, "micro_batch_size": 2})


def _fvp_setup(fraction: float, micro: int, mode: str = "double-backward", seed: int = 0):
    from rlhfkit.trainers.trpo import fisher_product

    actor, ro = rollout_on_tiny_lora()
    cfg = TRPOConfig(micro_batch_size=micro, rollout_batch_size=8, vf_mini_batch_size=8, dtype="fp32",
                     temperature=1.0, fvp_fraction=fraction, fvp_mode=mode, seed=seed)
    ro, _ = compute_advantages(ro, cfg, 0.0)
    params = [p for p in actor.policy.parameters() if p.requires_grad]
    v = torch.randn(sum(p.numel() for p in params), generator=torch.Generator().manual_seed(5))
    return actor, ro, cfg, params, v, fisher_product


def test_fisher_product_at_fraction_one_is_the_plain_fvp_over_the_whole_rollout():
    from rlhfkit.algos.trpo import fisher_vector_product, token_kl
    from rlhfkit.trainers.trpo import response_logits

    actor, ro, cfg, params, v, fisher_product = _fvp_setup(1.0, micro=4)
    got = fisher_product(actor, params, ro, cfg, torch.device("cpu"))(v)
    mask = ro.response_mask  # the whole rollout as one micro-batch, divided by its own token count
    with torch.no_grad():
        old = response_logits(actor, ro, 1.0)
    plain = fisher_vector_product([lambda: token_kl(old, response_logits(actor, ro, 1.0), mask)[0]], params,
                                  cfg.damping)(v)
    assert (got - plain).norm() <= 1e-4 * plain.norm()  # plain.norm() >= damping |v| > 0


def test_subsampled_fisher_product_is_the_fvp_of_the_drawn_rows_and_split_invariant():
    from rlhfkit.algos.trpo import fisher_rows
    from rlhfkit.rollout.core import trim_rows

    actor, ro, cfg, params, v, fisher_product = _fvp_setup(0.5, micro=4)
    cpu = torch.device("cpu")
    got = fisher_product(actor, params, ro, cfg, cpu, torch.Generator().manual_seed(3))(v)
    rows = fisher_rows(8, 0.5, torch.Generator().manual_seed(3))
    assert len(rows) == 4
    only = fisher_product(actor, params, trim_rows(ro, rows), replace(cfg, fvp_fraction=1.0),
                          cpu)(v)
    assert (got - only).norm() <= 1e-4 * only.norm()
    split = fisher_product(actor, params, ro, replace(cfg, micro_batch_size=1), cpu,
                           torch.Generator().manual_seed(3))(v)
    assert (got - split).norm() <= 1e-4 * got.norm()


def test_gauss_newton_mode_gives_the_double_backward_step():
    actor, ro = rollout_on_tiny_lora()
    results = {}
    for mode in ("double-backward", "gauss-newton"):
        cfg = TRPOConfig(micro_batch_size=4, rollout_batch_size=8, vf_mini_batch_size=8, max_kl=0.01, dtype="fp32",
                         temperature=1.0, fvp_mode=mode)
        ro, _ = compute_advantages(ro, cfg, 0.0)
        params = [p for p in actor.policy.parameters() if p.requires_grad]
        before = flat_params(params)
        m = policy_step(actor, params, ro, cfg, torch.device("cpu"))
        results[mode] = (flat_params(params) - before, m)
        with torch.no_grad():
            for p, old in zip(params, torch.split(before, [p.numel() for p in params])):
                p.copy_(old.view_as(p))
    (db, m_db), (gn, m_gn) = results["double-backward"], results["gauss-newton"]
    assert m_db["trpo/step_accepted"] == m_gn["trpo/step_accepted"] == 1.0
    assert m_gn["trpo/kl_after_step"] <= 0.01
    assert (db - gn).norm() <= 1e-3 * db.norm()  # float32: CG amplifies rounding, hence 1e-3


def test_fvp_fraction_is_checked():
    with pytest.raises(Exception, match="fvp_fraction"):
        build_config(TRPOConfig, {"fvp_fraction": 0})
    with pytest.raises(Exception, match="fvp_fraction"):
        build_config(TRPOConfig, {"fvp_fraction": 1.5})
