"""The one-file PPO (rlhfkit.learn.minimal_ppo) computes what rlhfkit's own functions compute on the
same tensors: the KL-shaped rewards, GAE, whitening, both clipped losses and one optimiser step. It
imports nothing of rlhfkit, and it learns the vowel task within a few seconds of iterations."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from rlhfkit import algos
from rlhfkit.learn import minimal_ppo as mp

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as main() runs: on a busy 2-core machine a second thread only slows a model this small."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5) -> None:
    """Elementwise agreement relative to the larger of want's scale and 1 (a scale that is never 0)."""
    scale = max(1.0, want.abs().max().item())
    assert (got - want).abs().max().item() <= rtol * scale, (got, want)


def _batch(seed: int = 0, B: int = 5, T: int = 7):
    g = torch.Generator(device=CPU).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device=CPU)  # noqa: E731
    return dict(scores=r(B), logp=-r(B, T).abs(), ref_logp=-r(B, T).abs(), old_logp=-r(B, T).abs(),
                values=r(B, T), old_values=r(B, T), adv=r(B, T), returns=r(B, T), mask=torch.ones(B, T, device=CPU))


def test_it_imports_torch_and_transformers_only():
    """And stays one readable file, as the learning path's index says (about 180 lines)."""
    source = Path(mp.__file__).read_text(encoding="utf-8")
    assert 150 <= len(source.splitlines()) <= 200
    index = (Path(__file__).resolve().parents[2] / "docs" / "learn" / "README.md").read_text(encoding="utf-8")
    assert "## Read one file first: PPO in about 180 lines" in index and "python -m rlhfkit.learn.minimal_ppo" in index
    tree = ast.parse(source)
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= {"__future__", "argparse", "copy", "time", "torch", "transformers"}, roots


def test_gae_whitening_and_rewards_match_rlhfkits():
    b = _batch()
    rewards = mp.kl_rewards(b["scores"], b["logp"], b["ref_logp"], 0.05)
    want_rewards, _ = algos.shape_rewards(b["scores"], b["logp"], b["ref_logp"], b["mask"], 0.05)
    _close(rewards, want_rewards)
    for gamma, lam in ((1.0, 1.0), (1.0, 0.95), (0.9, 0.0)):
        adv, ret = mp.gae(rewards, b["values"], gamma, lam)
        want_adv, want_ret = algos.gae(rewards, b["values"], b["mask"], gamma, lam)
        _close(adv, want_adv)
        _close(ret, want_ret)
    _close(mp.whiten(adv), algos.masked_whiten(adv, b["mask"]))


def test_gae_golden_two_steps():
    """r = (0, 1), V = (0.5, 0.25), gamma = 1, lam = 0.5: delta_1 = 1 - 0.25 = 0.75,
    delta_0 = 0 + 0.25 - 0.5 = -0.25, A_0 = -0.25 + 0.5 * 0.75 = 0.125; returns = A + V."""
    adv, ret = mp.gae(torch.tensor([[0.0, 1.0]], device=CPU), torch.tensor([[0.5, 0.25]], device=CPU), 1.0, 0.5)
    assert adv.tolist() == [[0.125, 0.75]] and ret.tolist() == [[0.625, 1.0]]


def test_the_clipped_losses_match_rlhfkits():
    b = _batch(1)
    for eps in (0.1, 0.2):
        want, _ = algos.ppo_policy_loss(b["logp"], b["old_logp"], b["adv"], b["mask"], clip_eps=eps)
        _close(mp.policy_loss(b["logp"], b["old_logp"], b["adv"], eps), want)
        want, _ = algos.ppo_value_loss(b["values"], b["old_values"], b["returns"], b["mask"], clip_eps=eps)
        _close(mp.value_loss(b["values"], b["old_values"], b["returns"], eps), want)


def test_teacher_forced_logprobs_are_the_samplers_token_by_token():
    """Loop against one pass: the log-prob of answer token t, read from the last logits of the
    prefix the sampler saw, equals the one forward() reads at position P + t - 1."""
    agent = mp.Agent(seed=0)
    prompts = mp.encode(mp.PROMPTS[:4])
    P = prompts.shape[1]
    ids = mp.sample(agent, prompts, torch.Generator(device=CPU).manual_seed(1))
    with torch.no_grad():
        logp, values = agent(ids, P)
        for t in range(mp.ANSWER_LEN):
            last = torch.log_softmax(agent.lm(input_ids=ids[:, :P + t]).logits[:, -1].float(), dim=-1)
            _close(logp[:, t], last.gather(1, ids[:, P + t, None]).squeeze(1))
    assert logp.shape == values.shape == (4, mp.ANSWER_LEN) and bool((values == 0).all())  # zero value head


def test_one_update_matches_an_update_built_on_rlhfkits_losses():
    """One rollout, one epoch, one mini-batch: the minimal update and the same step written with
    algos.ppo_policy_loss / ppo_value_loss move every weight to the same place."""
    cfg = {**mp.CONFIG, "batch": 8, "mini_batch": 8, "epochs": 1}
    agent = mp.Agent(seed=0)
    ref = copy.deepcopy(agent)
    gen = torch.Generator(device=CPU).manual_seed(0)
    batch = mp.rollout(agent, ref, mp.encode(mp.PROMPTS[:8]), gen, cfg)
    twin = copy.deepcopy(agent)
    mp.update(agent, torch.optim.Adam(agent.parameters(), lr=cfg["lr"]), batch, cfg, gen)

    opt = torch.optim.Adam(twin.parameters(), lr=cfg["lr"])
    logp, values = twin(batch["ids"], len(mp.PROMPTS[0]))
    mask = torch.ones_like(logp)
    pg, _ = algos.ppo_policy_loss(logp, batch["logp"], batch["advantages"], mask, clip_eps=cfg["clip_eps"])
    vf, _ = algos.ppo_value_loss(values, batch["values"], batch["returns"], mask, clip_eps=cfg["clip_eps"])
    (pg + cfg["vf_coef"] * vf).backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), cfg["max_grad_norm"])
    opt.step()
    moved = 0.0
    for (name, p), q in zip(agent.named_parameters(), twin.parameters(), strict=True):
        _close(p.detach(), q.detach(), rtol=1e-4)
        moved = max(moved, (p - ref.get_parameter(name)).abs().max().item())
    assert moved > 1e-4  # the step did move the weights (Adam's first step is about lr)


def test_it_learns_the_vowels():
    """15 iterations of 32 answers at seed 0; seen on a loaded 2-core CPU, one thread, 3 s:
    0.133, 0.105, 0.125 at first, 0.895, 0.934, 0.953 at iterations 12-14."""
    means = mp.train(15, seed=0, log=lambda line: None)
    assert len(means) == 15 and 0.05 < sum(means[:3]) / 3 < 0.3
    assert sum(means[-3:]) / 3 > sum(means[:3]) / 3 + 0.15, means
