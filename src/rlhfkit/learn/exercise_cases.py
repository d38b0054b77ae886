"""The exercises of `rlhfkit selfcheck --exercise` (stubs in rlhfkit/learn/exercises/): for each, its
random inputs (several shapes, right-padded masks with garbage at the padding, several seeds), the
function of `rlhfkit.algos` the trainers use as the reference, the classic bugs a wrong answer is
compared with, and where a mismatch points; `EXERCISES` is the table. rlhfkit.learn.exercise_check
runs a learner's function against them.

Notation: B batch, T response length, G group size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

SEEDS = (0, 1, 2)
SHAPES = ((1, 1), (2, 6), (4, 11), (3, 23))  # (B, T)
GROUPS = ((2, 3), (4, 2), (8, 3))  # (G, number of groups)


@dataclass(frozen=True)
class Bug:
    """A classic mistake: a function with the learner's signature, and the hint to print when it matches."""

    fn: Callable
    hint: str


@dataclass(frozen=True)
class Exercise:
    """One exercise: the function the learner writes, its stub file, and how to check it."""

    name: str
    function: str
    stub: str
    title: str
    cases: Callable[[], Iterator[tuple[str, tuple, dict]]]
    reference: Callable
    bugs: tuple[Bug, ...]
    locate: Callable[[tuple, tuple[int, ...], float], str]  # (inputs, index of the first mismatch, its value) -> a hint
    grad_of: int | None = None  # index of the input whose gradient is compared (losses)

    @property
    def stub_path(self) -> Path:
        return Path(__file__).parent / "exercises" / self.stub


# ---- random inputs ------------------------------------------------------------------------------


def _generator(seed: int):
    import torch

    return torch.Generator(device="cpu").manual_seed(seed)


def _right_mask(B: int, T: int, gen):
    """(B, T) bool, row b valid for its first n_b >= 1 tokens; row 0 is full when B > 1 so T-1 is hit."""
    import torch

    lengths = torch.randint(1, T + 1, (B,), generator=gen, device="cpu")
    lengths[0] = T
    return torch.arange(T, device="cpu")[None, :] < lengths[:, None]


def _garbage(x, mask, gen):
    """x with large random numbers at the padding, so code that reads padding shows it."""
    import torch

    return torch.where(mask, x, 50.0 * torch.randn(x.shape, generator=gen, device="cpu") + 17.0)


def _token_cases(make: Callable) -> Callable[[], Iterator[tuple[str, tuple, dict]]]:
    def cases():
        for seed in SEEDS:
            for B, T in SHAPES:
                gen = _generator(seed * 100 + B * 10 + T)
                mask = _right_mask(B, T, gen)
                args, kwargs = make(B, T, mask, gen)
                yield f"seed {seed}, B={B}, T={T}, lengths {mask.sum(1).tolist()}", args, kwargs

    return cases


# ---- 1. GAE -------------------------------------------------------------------------------------


def _gae_inputs(B, T, mask, gen):
    import torch

    rewards = _garbage(torch.randn(B, T, generator=gen, device="cpu"), mask, gen)
    values = _garbage(torch.randn(B, T, generator=gen, device="cpu"), mask, gen)
    return (rewards, values, mask, 0.9, 0.8), {}


def _gae_reference(rewards, values, mask, gamma, lam):
    from rlhfkit import algos

    return algos.gae(rewards, values, mask, gamma, lam)


def _gae_loop(rewards, values, mask, gamma, lam, next_value_at_end, carry, returns_fn=None, forwards=False):
    """A GAE loop with one thing changed, for the classic bugs."""
    import torch

    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float32, device="cpu")
    for b in range(B):
        n = int(mask[b].sum())
        a_next = 0.0
        steps = range(n) if forwards else reversed(range(n))
        for t in steps:
            v_next = next_value_at_end(values, b, t, n) if t == n - 1 else float(values[b, t + 1])
            delta = float(rewards[b, t]) + gamma * v_next - float(values[b, t])
            a_next = delta + carry(gamma, lam) * a_next
            adv[b, t] = a_next
    ret = adv + torch.where(mask, values, torch.zeros((), device="cpu")) if returns_fn is None else returns_fn(rewards, values, mask, adv)
    return adv, torch.where(mask, ret, torch.zeros((), device="cpu"))


def _terminal(values, b, t, n):
    return 0.0


def _gamma_lam(gamma, lam):
    return gamma * lam


def _reward_to_go(rewards, values, mask, adv):
    from rlhfkit import algos

    return algos.discounted_reverse_cumsum(mask * rewards, 0.9)


GAE_BUGS = (
    Bug(lambda r, v, m, g, lam: _gae_loop(r, v, m, g, lam, lambda vals, b, t, n: float(vals[b, t + 1])
                                          if t + 1 < vals.shape[1] else float(vals[b, 0]), _gamma_lam),
        "bootstrapping past the last token? The state after a row's last valid token is terminal: "
        "the value after the end must be 0, not the padding's value (nor V_0 through torch.roll)"),
    Bug(lambda r, v, m, g, lam: _gae_loop(r, v, m, g, lam, lambda vals, b, t, n: float(vals[b, t + 1])
                                          if t + 1 < vals.shape[1] else 0.0, _gamma_lam),
        "bootstrapping past the last token into the padding? The state after a row's last valid token is "
        "terminal: the value after the end must be 0, not the padding's value"),
    Bug(lambda r, v, m, g, lam: _gae_loop(r, v, m, g, lam, _terminal, lambda gamma, la: gamma),
        "lambda missing from the recursion? A_t = delta_t + gamma * lam * A_{t+1}"),
    Bug(lambda r, v, m, g, lam: _gae_loop(r, v, m, g, lam, _terminal, lambda gamma, la: la),
        "gamma missing from the recursion? A_t = delta_t + gamma * lam * A_{t+1}"),
    Bug(lambda r, v, m, g, lam: _gae_loop(r, v, m, g, lam, _terminal, _gamma_lam, forwards=True),
        "computed forwards? A_t needs A_{t+1}: loop t from the last valid token down to 0"),
    Bug(lambda r, v, m, g, lam: _gae_loop(r, v, m, g, lam, _terminal, _gamma_lam, returns_fn=_reward_to_go),
        "returns are the discounted reward-to-go? The value target here is R_t = A_t + V(s_t) "
        "(the lambda-return), the same as the reward-to-go only at lam = 1"),
)


def _gae_locate(inputs, index, got) -> str:
    rewards, values, mask = inputs[:3]
    out, b, t = index
    n = int(mask[b].sum())
    if not bool(mask[b, t]):
        return "the outputs must be 0 at padding (mask False)"
    if out == 1:
        return "the advantages are right, the returns are not: R_t = A_t + V(s_t), before any whitening"
    if t == n - 1:
        last = "t=T-1" if t == mask.shape[1] - 1 else f"t={t}, the row's last valid token (the rest is padding)"
        return (f"wrong at {last}: bootstrapping past the last token? The state after it is terminal: "
                "the value after the end must be 0, so delta = r_t - V(s_t) there")
    return ("the last valid token is right but an earlier one is not: check the recursion "
            "A_t = delta_t + gamma * lam * A_{t+1} and delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)")


# ---- 2. the clipped policy loss -----------------------------------------------------------------


def _policy_inputs(B, T, mask, gen):
    import torch

    old = -torch.rand(B, T, generator=gen, device="cpu") * 3  # log-probs
    logp = old + 0.4 * torch.randn(B, T, generator=gen, device="cpu")  # ratios from ~0.45 to ~2.2: some clipped
    adv = torch.randn(B, T, generator=gen, device="cpu")
    return (_garbage(logp, mask, gen), _garbage(old, mask, gen), _garbage(adv, mask, gen), mask, 0.2), {}


def _policy_reference(logp, old_logp, advantages, mask, clip_eps):
    from rlhfkit import algos

    return algos.ppo_policy_loss(logp, old_logp, advantages, mask, clip_eps=clip_eps)[0]


def _policy_variant(kind: str):
    def loss(logp, old_logp, advantages, mask, clip_eps):
        import torch

        m = mask.float()
        lr = torch.where(mask, logp - old_logp, torch.zeros((), device="cpu"))
        a = torch.where(mask, advantages, torch.zeros((), device="cpu"))
        ratio = torch.exp(-lr if kind == "inverted" else lr)
        if kind == "detached":
            ratio = ratio.detach()
        clipped = ratio if kind == "no-clip" else ratio.clamp(1 - clip_eps, 1 + clip_eps)
        pick = torch.minimum if kind == "min" else torch.maximum
        per_token = pick(-a * ratio, -a * clipped)
        if kind == "positive":
            per_token = torch.maximum(a * ratio, a * clipped)
        if kind == "all-positions":
            return (per_token * m).sum() / m.numel()
        return (per_token * m).sum() / m.sum()

    return loss


POLICY_BUGS = (
    Bug(_policy_variant("min"), "min instead of max? The loss is max(-A*ratio, -A*clip(ratio)): the "
                                "pessimistic of the two, i.e. min of the objectives A*ratio and A*clip(ratio)"),
    Bug(_policy_variant("no-clip"), "the clip is missing: the second term uses clip(ratio, 1 - eps, 1 + eps)"),
    Bug(_policy_variant("inverted"), "the ratio is upside down: ratio = exp(logp - old_logp) = pi / pi_old"),
    Bug(_policy_variant("positive"), "a loss to minimise has the sign flipped: l_t = max(-A*ratio, -A*clip(ratio))"),
    Bug(_policy_variant("all-positions"), "averaged over padding too? Divide by the number of VALID tokens "
                                          "(mask.sum()), not B*T"),
    Bug(_policy_variant("detached"), "the value is right but no gradient flows: the ratio must keep logp's "
                                     "graph (no .detach(), .item() or torch.tensor(...) around it)"),
)


def _loss_locate(what: str) -> Callable[[tuple, tuple[int, ...], float], str]:
    def locate(inputs, index, got) -> str:
        if got != got:  # NaN
            return ("NaN: exp() of the garbage at padding overflows and 0 * inf is NaN, in the loss or its "
                    "gradient: mask the log-ratio with torch.where BEFORE exp (multiplying by the mask after is too late)")
        if index[0] == 0:
            return f"the {what} itself differs: compare your formula with the stub's, term by term"
        return (f"the {what} is right but its gradient is not: is the clip applied to the ratio "
                "(so the gradient is 0 where the clipped term wins), and nothing detached?"
                if what == "loss" else f"the {what} is right but its gradient is not: nothing may be detached")

    return locate


# ---- 3. the KL reward ---------------------------------------------------------------------------


def _kl_inputs(B, T, mask, gen):
    import torch

    logp = -torch.rand(B, T, generator=gen, device="cpu") * 4
    ref = logp + 0.5 * torch.randn(B, T, generator=gen, device="cpu")
    scores = 2 * torch.randn(B, generator=gen, device="cpu")
    return (scores, _garbage(logp, mask, gen), _garbage(ref, mask, gen), mask, 0.1), {}


def _kl_reference(scores, logp, ref_logp, mask, kl_coef):
    from rlhfkit import algos

    return algos.shape_rewards(scores, logp, ref_logp, mask, kl_coef, "k1")[0]


def _kl_variant(kind: str):
    def rewards(scores, logp, ref_logp, mask, kl_coef):
        import torch

        kl = ref_logp - logp if kind == "sign" else logp - ref_logp
        r = -kl_coef * kl
        if kind != "unmasked":
            r = torch.where(mask, r, torch.zeros((), device="cpu"))
        if kind == "every-token":
            return r + torch.where(mask, scores[:, None], torch.zeros((), device="cpu"))
        last = torch.full_like(scores, r.shape[1] - 1, dtype=torch.long) if kind == "last-column" \
            else mask.sum(1) - 1
        if kind == "first-token":
            last = torch.zeros_like(last)
        return r.scatter_add(1, last[:, None], scores[:, None].to(r.dtype))

    return rewards


KL_BUGS = (
    Bug(_kl_variant("sign"), "the KL has the wrong sign: KL_t = logp_t - ref_logp_t (log pi - log pi_ref), "
                             "and the reward is -kl_coef * KL_t"),
    Bug(_kl_variant("last-column"), "the score went to column T-1: it belongs on each row's last VALID token "
                                    "(rows are right-padded: index mask.sum(1) - 1)"),
    Bug(_kl_variant("every-token"), "the score was added to every token: it goes once, on the last valid token"),
    Bug(_kl_variant("first-token"), "the score went to the first token: it goes on the last valid token, "
                                    "where the whole answer is known"),
    Bug(_kl_variant("unmasked"), "the padding got a KL penalty: rewards are 0 where mask is False"),
)


def _kl_locate(inputs, index, got) -> str:
    scores, logp, ref_logp, mask = inputs[:4]
    _, b, t = index
    n = int(mask[b].sum())
    if not bool(mask[b, t]):
        return "the rewards must be 0 on padding (mask False)"
    if t == n - 1:
        return "wrong on the row's last valid token: r = -kl_coef * (logp - ref_logp) + score there"
    return "wrong on a token before the last: r_t = -kl_coef * (logp_t - ref_logp_t), no score there"


# ---- 4. group advantages ------------------------------------------------------------------------


def _group_cases() -> Iterator[tuple[str, tuple, dict]]:
    import torch

    for seed in SEEDS:
        for G, n in GROUPS:
            gen = _generator(seed * 100 + G * 10 + n)
            scores = torch.randn(G * n, generator=gen, device="cpu") * 3 + 1
            scores[:G] = 0.5  # one group of equal scores: std 0, advantages 0
            yield f"seed {seed}, G={G}, {n} groups (the first one all equal)", (scores, G), {}


def _group_reference(scores, group_size):
    from rlhfkit import algos

    return algos.group_advantages(scores, group_size)


def _group_variant(kind: str):
    def advantages(scores, group_size):
        g = scores.view(group_size, -1).T if kind == "strided" else scores.view(-1, group_size)
        if kind == "batch":
            g = scores.view(1, -1)
        centred = g - g.mean(dim=1, keepdim=True)
        if kind == "no-std":
            out = centred
        else:
            std = g.std(dim=1, keepdim=True, unbiased=kind != "biased")
            out = centred / (std if kind == "no-eps" else std + 1e-6)
        return out.T.reshape(-1) if kind == "strided" else out.reshape(-1)

    return advantages


GROUP_BUGS = (
    Bug(_group_variant("biased"), "std divides by G, not G - 1: use the unbiased std (torch.std's default, "
                                  "unbiased=True)"),
    Bug(_group_variant("batch"), "normalised over the whole batch: each group of G answers to one prompt is "
                                 "normalised on its own (scores.view(-1, G))"),
    Bug(_group_variant("strided"), "the groups are consecutive, [g0 x G, g1 x G, ...]: scores.view(-1, G), "
                                   "not view(G, -1)"),
    Bug(_group_variant("no-eps"), "a group of equal scores has std 0: add 1e-6 to the std (its advantages "
                                  "are then 0, not NaN)"),
    Bug(_group_variant("no-std"), "only centred: GRPO divides by the group's std (+ 1e-6) as well"),
)


def _group_locate(inputs, index, got) -> str:
    scores, G = inputs
    i = index[-1]
    if i < G:
        return "the first group has equal scores: std 0, so its advantages must be 0 (add 1e-6 to the std)"
    return "A_i = (s_i - mean of its group) / (unbiased std of its group + 1e-6), groups of G consecutive scores"


# ---- 5. the DPO loss ----------------------------------------------------------------------------


def _dpo_cases() -> Iterator[tuple[str, tuple, dict]]:
    import torch

    for seed in SEEDS:
        for B in (1, 5, 16):
            gen = _generator(seed * 100 + B)
            logps = [-torch.rand(B, generator=gen, device="cpu") * 60 - 5 for _ in range(4)]  # summed log-probs
            yield f"seed {seed}, B={B}, beta 0.1", (*logps, 0.1), {}
        gen = _generator(seed + 7)
        pc, pr, rc, rr = (-torch.rand(4, generator=gen, device="cpu") * 60 - 5 for _ in range(4))
        pr = pr.clone()
        pr[0] = pc[0] + 6000.0  # beta * h = 0.1 * (-6000 + ...) ~ -600: log sigmoid must not be -inf
        yield f"seed {seed}, B=4, beta 0.1, one pair with beta*h near -600", (pc, pr, rc, rr, 0.1), {}


def _dpo_reference(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    from rlhfkit import algos

    return algos.dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta=beta)[0]


def _dpo_variant(kind: str):
    def losses(pc, pr, rc, rr, beta):
        import torch
        import torch.nn.functional as F

        h = pc - pr if kind == "no-ref" else (pc - rc) - (pr - rr)
        if kind == "swapped":
            h = -h
        if kind == "beta-outside":
            return -beta * F.logsigmoid(h)
        if kind == "naive-log":
            return -torch.log(torch.sigmoid(beta * h))
        if kind == "mean":
            return -F.logsigmoid(beta * h).mean()
        return -F.logsigmoid(beta * h)

    return losses


DPO_BUGS = (
    Bug(_dpo_variant("no-ref"), "the reference is missing: h = (log pi(y_w) - log pi_ref(y_w)) - "
                                "(log pi(y_l) - log pi_ref(y_l))"),
    Bug(_dpo_variant("swapped"), "chosen and rejected are swapped: the loss falls as the CHOSEN answer's "
                                 "log-ratio rises"),
    Bug(_dpo_variant("beta-outside"), "beta goes inside the sigmoid: -log sigmoid(beta * h), not "
                                      "-beta * log sigmoid(h)"),
    Bug(_dpo_variant("naive-log"), "log(sigmoid(x)) underflows to -inf for x below about -100 (float32): "
                                   "use torch.nn.functional.logsigmoid"),
)


def _dpo_locate(inputs, index, got) -> str:
    if index[0] == 1:
        return "the losses are right but their gradient is not: nothing may be detached"
    return "loss_i = -logsigmoid(beta * h_i) with h_i the chosen log-ratio minus the rejected one"


# ---- the table ----------------------------------------------------------------------------------

EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    Exercise("gae", "gae", "gae.py", "GAE backwards over right-padded rows",
             _token_cases(_gae_inputs), _gae_reference, GAE_BUGS, _gae_locate),
    Exercise("policy-loss", "policy_loss", "policy_loss.py", "PPO's clipped policy loss, token mean",
             _token_cases(_policy_inputs), _policy_reference, POLICY_BUGS, _loss_locate("loss"), grad_of=0),
    Exercise("kl-reward", "kl_reward", "kl_reward.py", "per-token KL penalty plus the score on the last token "
             "", _token_cases(_kl_inputs), _kl_reference, KL_BUGS, _kl_locate),
    Exercise("group-advantages", "group_advantages", "group_advantages.py", "GRPO's group-normalised "
             "advantages", _group_cases, _group_reference, GROUP_BUGS, _group_locate),
    Exercise("dpo-loss", "dpo_loss", "dpo_loss.py", "the DPO loss per pair", _dpo_cases,
             _dpo_reference, DPO_BUGS, _dpo_locate, grad_of=0),
)}
