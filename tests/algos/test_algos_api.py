"""The public API other modules build on: importable, torch-only, signatures pinned."""

import inspect
import subprocess
import sys

import pytest

import rlhfkit.algos as algos


def test_algos_imports_torch_only():
    code = (
        "import sys, rlhfkit.algos\n"
        "heavy = [m for m in ('transformers', 'accelerate', 'peft', 'numpy', 'datasets') if m in sys.modules]\n"
        "assert 'transformers' not in sys.modules, heavy\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "transformers" not in out.stdout


# name -> the parameters (in order) the trainers call it with
SIGNATURES = {
    "masked_sum": ["x", "mask", "dim"],
    "masked_mean": ["x", "mask", "dim"],
    "masked_var": ["x", "mask", "unbiased"],
    "masked_whiten": ["x", "mask", "shift_mean", "eps"],
    "response_mask": ["tokens", "stop_ids", "attention_mask"],
    "last_valid_index": ["mask"],
    "logprobs_from_logits": ["logits", "tokens", "temperature"],
    "entropy_from_logits": ["logits", "temperature"],
    "logprobs_and_entropy": ["logits", "tokens", "temperature", "with_entropy", "chunk_size"],
    "kl_k1": ["logp", "ref_logp"],
    "kl_k2": ["logp", "ref_logp"],
    "kl_k3": ["logp", "ref_logp"],
    "kl_abs": ["logp", "ref_logp"],
    "kl_estimate": ["logp", "ref_logp", "kind"],
    "shape_rewards": [
        "scores", "logp", "ref_logp", "mask", "kl_coef", "kl_estimator", "stopped", "no_stop_penalty", "score_clip",
    ],
    "gae": ["rewards", "values", "mask", "gamma", "lam", "bootstrap_value"],
    "gae_reference": ["rewards", "values", "mask", "gamma", "lam", "bootstrap_value"],
    "group_advantages": ["scores", "group_size", "scale_by_std", "eps"],
    "leave_one_out_advantages": ["scores", "group_size"],
    "aggregate_loss": ["per_token", "mask", "mode", "num_tokens", "num_seqs", "constant"],
    "ppo_policy_loss": [
        "logp", "old_logp", "advantages", "mask", "clip_eps", "agg_mode", "num_tokens", "num_seqs",
    ],
    "ppo_value_loss": [
        "values", "old_values", "returns", "mask", "clip_eps", "agg_mode", "num_tokens", "num_seqs",
    ],
    "entropy_loss": ["entropy", "mask", "agg_mode"],
    "dpo_loss": [
        "policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps",
        "beta", "loss_type", "label_smoothing",
    ],
    "bradley_terry_loss": ["chosen_scores", "rejected_scores", "margin"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_prefix_is_stable(name):
    fn = getattr(algos, name)
    assert name in algos.__all__
    params = list(inspect.signature(fn).parameters)
    assert params[: len(SIGNATURES[name])] == SIGNATURES[name]
    assert fn.__doc__ and len(fn.__doc__) > 40  # every public function documents itself


def test_controllers_interface():
    for ctl in (algos.FixedKLController(0.1), algos.AdaptiveKLController(0.1, target=6.0, horizon=10_000)):
        assert isinstance(ctl.value, float)
        ctl.update(current_kl=1.0, n_steps=8)
        state = ctl.state_dict()
        ctl.load_state_dict(state)
        assert ctl.state_dict() == state
