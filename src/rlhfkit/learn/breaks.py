"""`rlhfkit selfcheck --break NAME`: the classic RLHF bugs, each made on purpose next to the right
code, with the symptom in numbers and the doctor's finding where the doctor can see it
(docs/learn/30-break-it-yourself.md). Tiny models and exact arithmetic: seconds on a CPU.

A break *passes* (exit status 0) when the symptom shows: the broken number is far from the right
one, so the check that watches for it in a real run would catch it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhfkit import algos
from rlhfkit.core.devices import HOST
from rlhfkit.diagnostics import diagnose
from rlhfkit.learn import bandit
from rlhfkit.learn.worked import Check, row, tiny_llama


def _doctor(check: Check, rows: list[dict]) -> None:
    """Append what `rlhfkit doctor` says about a metric history (rows of metrics.jsonl)."""
    found = diagnose(rows)
    check.lines += [f"doctor: {f.severity.upper()} {f.rule} @ it {f.iteration}: {f.message}" for f in found] or [
        "doctor: no finding"]


def _first_ratio(temperature_scored: float, dropout: float = 0.0, off_by_one: bool = False) -> float:
    """Sample 6 tokens at temperature 0.7 from a tiny random Llama (one forward per token, in eval mode),
    then score them in one teacher-forced pass as the first PPO micro-batch does: the scoring pass at
    `temperature_scored`, in train mode with attention dropout `dropout`, with the logits slice
    [P-1 : P+R-1] or, `off_by_one`, [P : P+R]. Returns max |ratio - 1| over the 6 tokens."""
    lm = tiny_llama()
    lm.config.attention_dropout = dropout
    for layer in lm.model.layers:
        layer.self_attn.attention_dropout = dropout
    ids, R, gen = torch.tensor([[5, 17, 9, 30]], device=HOST), 6, torch.Generator(device=HOST).manual_seed(0)
    P = ids.shape[1]
    old = []
    with torch.no_grad():
        for _ in range(R):
            logp = (lm(ids).logits[:, -1].float() / 0.7).log_softmax(-1)  # (1, V) at the sampling temperature
            tok = torch.multinomial(logp.exp(), 1, generator=gen)
            old.append(logp.gather(-1, tok))
            ids = torch.cat([ids, tok], dim=1)
        lm.train(dropout > 0)
        torch.manual_seed(1)  # the dropout mask of the scoring pass
        logits = lm(ids).logits.float() / temperature_scored  # (1, L, V)
        lm.eval()
        start = P if off_by_one else P - 1
        new = logits[:, start : start + R].log_softmax(-1).gather(-1, ids[:, P:, None]).squeeze(-1)  # (1, R)
    return float((new - torch.cat(old, dim=1)).exp().sub(1).abs().max())


def _ratio_break(name: str, title: str, broken: float, note: str) -> Check:
    """The right first-micro-batch ratio next to a broken one, and the doctor's ratio_first_microbatch."""
    c = Check(name, title)
    right = _first_ratio(0.7)
    c.lines.append(f"max |ratio - 1| on the first micro-batch, right: {right:.2e} (float error)")
    c.lines.append(f"max |ratio - 1| on the first micro-batch, broken: {broken:.3f}   ({note})")
    c.ok = right < 1e-4 and broken > 5e-2
    c.lines.append("rlhfkit ppo stops the run here (ratio_check_tol 1e-3: RatioCheckError); a run that logged it:")
    _doctor(c, [{"iteration": 0, "params/ratio_first_microbatch_maxdev": broken}])
    return c


def break_off_by_one() -> Check:
    """The logits slice [P : P+R] instead of [P-1 : P+R-1] (docs/pitfalls.md#off-by-one)."""
    return _ratio_break("off-by-one", "logits slice [P : P+R]: each token 'predicted' by the position that has seen it",
                        _first_ratio(0.7, off_by_one=True), "slice [P : P+R]")


def break_temperature() -> Check:
    """Sampled at T = 0.7, scored at T = 1 (docs/pitfalls.md#temperature)."""
    return _ratio_break("temperature", "sampled at temperature 0.7, log-probs recomputed at 1.0",
                        _first_ratio(1.0), "logits not divided by T = 0.7")


def break_dropout() -> Check:
    """Attention dropout 0.1 left on in the scoring pass (docs/pitfalls.md#dropout)."""
    return _ratio_break("dropout", "dropout on (attention dropout 0.1, train mode) in the teacher-forced pass",
                        _first_ratio(0.7, dropout=0.1), "a different dropout mask than sampling's none")


def break_no_whitening() -> Check:
    """PPO on rewards of order 100 without whitening the advantages (a 5-armed bandit, rlhfkit.learn.bandit)."""
    c = Check("no-whitening", "rewards x 100 (a 5-armed bandit), advantages not whitened: each step is 100x larger")
    means = tuple(100 * m for m in bandit.MEANS)
    runs = {w: bandit.train("ppo", iterations=6, batch=32, lr=1.0, means=means, noise=100.0, whiten=w)
            for w in (True, False)}
    c.lines.append(f"{'iteration':<19}" + "".join(f"{i:>8}" for i in range(6)))
    for w, label in ((True, "whitened"), (False, "raw")):
        t = runs[w]
        for name, values in (("approx KL", [m["params/approx_kl"] for m in t.metrics]),
                             ("clip frac", [m["params/policy_clip_frac"] for m in t.metrics]), ("J", t.reward)):
            c.lines.append(f"{label + ' ' + name:<19}" + "".join(f"{x:>8.3g}" for x in values))
    raw, white = runs[False], runs[True]
    c.ok = raw.metrics[0]["params/approx_kl"] > 10 * max(m["params/approx_kl"] for m in white.metrics)
    c.lines.append("J is the expected reward (best arm: 80). Unwhitened, the first update throws the policy onto "
                   "one arm (worth 20) and nothing moves after it: approx KL 0, clip fraction 0, a calm-looking "
                   "collapse, as in the unhealthy run of entry 19.")
    _doctor(c, [{"iteration": i, **m} for i, m in enumerate(raw.metrics)])
    return c


def break_unmasked_gae() -> Check:
    """GAE run over padding: the junk values at the padded positions bootstrap into the valid tokens."""
    c = Check("unmasked-gae", "GAE over the padding of a 2-token response (values 5.0 at the padded positions), "
                              "gamma 1, lambda 0.95")
    r = torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64, device=HOST)  # score 1 on the last valid token, t = 1
    v = torch.tensor([[0.4, 0.6, 5.0, 5.0]], dtype=torch.float64, device=HOST)  # junk values where the row is padding
    mask = torch.tensor([[True, True, False, False]], device=HOST)
    right, _ = algos.gae(r, v, mask, gamma=1.0, lam=0.95)
    wrong, _ = algos.gae(r, v, torch.ones_like(mask), gamma=1.0, lam=0.95)
    # right, terminal after t = 1: A_1 = 1 - 0.6 = 0.4; A_0 = (0 + 0.6 - 0.4) + 0.95 * 0.4 = 0.58
    # wrong: deltas (0.2, 1 + 5 - 0.6, 5 - 5, -5) = (0.2, 5.4, 0, -5): A_3 = -5, A_2 = -4.75,
    #        A_1 = 5.4 - 0.95 * 4.75 = 0.8875, A_0 = 0.2 + 0.95 * 0.8875 = 1.043125
    c.lines.append(row("t", "r_t", "V(s_t)", "A masked", "by hand", "A unmasked", "by hand", ""))
    for t, hand, hand_wrong in ((0, 0.58, 1.043125), (1, 0.4, 0.8875)):
        ok = [c.expect(float(right[0, t]), hand), c.expect(float(wrong[0, t]), hand_wrong)]
        c.lines.append(row(t, float(r[0, t]), float(v[0, t]), float(right[0, t]), hand, float(wrong[0, t]),
                            hand_wrong, "ok" if ok == ["ok", "ok"] else "MISMATCH"))
    c.ok = c.ok and abs(float(wrong[0, 1]) - float(right[0, 1])) > 0.1
    c.lines.append("the padding's values leak into the valid tokens' advantages (A_1: 0.4 -> 0.89); at lambda = 1 "
                   "they telescope away, but rewards at padding would not. No metric names it: the doctor cannot "
                   "see it, only a test with junk at the padding can "
                   "(tests/algos/test_algos_advantages.py::test_masked_rewards_and_values_never_change_results)")
    return c


def break_k1_loss() -> Check:
    """k1 = log pi - log pi_ref as a KL *loss*: its expected gradient is 0, so it holds nothing back."""
    c = Check("k1-loss", "a KL penalty in the loss with k1: reward 1 on token 0, beta 0.5, 300 exact gradient steps")
    ref = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64, device=HOST).log()
    reward = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64, device=HOST)
    beta = 0.5
    best = ref.exp() * torch.exp(reward / beta)
    best = best / best.sum()  # the KL-regularised optimum pi_ref exp(r / beta) / Z (entry 27)
    c.lines.append(row("estimator", "pi(token 0)", "KL(pi||ref)", "reward", width=12))
    kls = {}
    for name, estimator in (("k1", algos.kl_k1), ("k2", algos.kl_k2), ("k3", algos.kl_k3)):
        z = torch.zeros(3, dtype=torch.float64, requires_grad=True, device=HOST)
        opt = torch.optim.SGD([z], lr=0.5)
        for _ in range(300):
            logp = z.log_softmax(-1)
            pi = logp.exp()
            loss = -(pi * reward).sum() + beta * (pi.detach() * estimator(logp, ref)).sum()  # E_{a~pi}[k(a)], a ~ pi
            opt.zero_grad()
            loss.backward()
            opt.step()
        logp = z.detach().log_softmax(-1)
        kls[name] = float((logp.exp() * (logp - ref)).sum())
        c.lines.append(row(name, float(logp.exp()[0]), kls[name], float((logp.exp() * reward).sum()), width=12))
    opt_kl = float((best * (best.log() - ref)).sum())
    c.lines.append(row("optimum", float(best[0]), opt_kl, float(best[0]), width=12))
    c.ok = kls["k1"] > 2 * opt_kl and abs(kls["k2"] - opt_kl) < 1e-3 * max(1.0, opt_kl)
    c.lines.append("k1's gradient averages to 0: the policy runs to the rewarded token as if beta were 0 "
                   "(KL -> ln(1/0.3) = 1.204); k2 reaches the optimum; k3 follows KL(ref || pi) and stops elsewhere (entry 17).")
    return c


BREAKS: dict[str, Callable[[], Check]] = {
    "off-by-one": break_off_by_one,
    "temperature": break_temperature,
    "dropout": break_dropout,
    "no-whitening": break_no_whitening,
    "unmasked-gae": break_unmasked_gae,
    "k1-loss": break_k1_loss,
}
