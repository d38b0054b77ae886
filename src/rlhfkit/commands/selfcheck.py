"""`rlhfkit selfcheck`: the learning path's worked examples, run on the installed code.

Each check feeds a small example with numbers worked out by hand (docs/learn/) to rlhfkit's own
functions, prints both side by side, and fails when they disagree. Exit status 0 when every
check passes, 1 when one fails (a broken install, or an edit that changed the maths), 2 for a
usage error. Runs in seconds on a CPU: no download, the one model is a tiny random Llama.

`--break NAME` runs rlhfkit.learn.breaks instead: a classic bug made on purpose, its symptom in
numbers next to the right code, and the doctor's finding (docs/learn/30-break-it-yourself.md).
`--exercise NAME FILE` checks a learner's own function (from a stub of rlhfkit/learn/exercises/)
against rlhfkit's on random tensors (rlhfkit.learn.exercise_check).

The functions under test are looked up on their modules at call time (``algos.gae``, not a
name bound at import), so a test can swap one for a broken version and see the check fail.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

from rlhfkit.core.argv import OptionsHelpFormatter, parse_command_line
from rlhfkit.errors import UserError
from rlhfkit.learn import exercise_check
from rlhfkit.learn.worked import Check, row, tiny_llama


def _gae_table(check: Check, rewards, values, gamma: float, lam: float, want_adv, boot=None) -> None:
    """Run algos.gae and algos.gae_reference on one row, print t, r, V, delta, A and returns."""
    import torch

    from rlhfkit import algos
    from rlhfkit.core.devices import HOST

    r = torch.tensor([rewards], dtype=torch.float64, device=HOST)
    v = torch.tensor([values], dtype=torch.float64, device=HOST)
    m = torch.ones_like(r, dtype=torch.bool)
    b = None if boot is None else torch.tensor([boot], dtype=torch.float64, device=HOST)
    adv, ret = algos.gae(r, v, m, gamma, lam, bootstrap_value=b)
    adv_loop, _ = algos.gae_reference(r, v, m, gamma, lam, bootstrap_value=b)
    next_v = list(values[1:]) + [0.0 if boot is None else boot]
    check.lines.append(row("t", "r_t", "V(s_t)", "delta_t", "A_t (by hand)", "A_t gae", "A_t loop", "R_t = A+V", ""))
    for t, (rt, vt) in enumerate(zip(rewards, values)):
        delta = rt + gamma * next_v[t] - vt
        a, a_loop, r_t = float(adv[0, t]), float(adv_loop[0, t]), float(ret[0, t])
        verdicts = [check.expect(a, want_adv[t]), check.expect(a_loop, want_adv[t]), check.expect(r_t, want_adv[t] + vt)]
        verdict = "ok" if all(v == "ok" for v in verdicts) else "MISMATCH"
        check.lines.append(row(t, rt, vt, delta, want_adv[t], a, a_loop, r_t, verdict))


def check_gae_worked_example() -> Check:
    """GAE backwards over 3 tokens, gamma 0.9, lambda 0.95, terminal after the last token."""
    c = Check("gae", "GAE worked example: gamma 0.9, lambda 0.95, the state after t=2 is terminal (V = 0)")
    # delta = (1 + 0.9*2.5 - 2.0, 0 + 0.9*3.0 - 2.5, 2 + 0.9*0 - 3.0) = (1.25, 0.2, -1.0); gamma*lam = 0.855
    # A_2 = -1.0; A_1 = 0.2 + 0.855*(-1.0) = -0.655; A_0 = 1.25 + 0.855*(-0.655) = 0.689975
    _gae_table(c, [1.0, 0.0, 2.0], [2.0, 2.5, 3.0], 0.9, 0.95, [0.689975, -0.655, -1.0])
    c.lines.append("A is computed from the end backwards: A_t = delta_t + gamma*lambda*A_{t+1} needs A_{t+1} first.")
    return c


def check_gae_lambda_limits() -> Check:
    """lambda 0 is the one-step TD error; lambda 1 is the discounted return minus V (Monte Carlo)."""
    c = Check("gae-limits", "lambda limits on the same trajectory: 0 = one-step TD, 1 = Monte Carlo")
    c.lines.append("lambda = 0: A_t = delta_t = (1.25, 0.2, -1.0); the target R_t = r_t + gamma*V(s_t+1) leans on V")
    _gae_table(c, [1.0, 0.0, 2.0], [2.0, 2.5, 3.0], 0.9, 0.0, [1.25, 0.2, -1.0])
    # G = (1 + 0.9*0 + 0.81*2, 0 + 0.9*2, 2) = (2.62, 1.8, 2.0); A = G - V = (0.62, -0.7, -1.0)
    c.lines.append("lambda = 1: A_t = G_t - V(s_t) with G = (2.62, 1.8, 2.0); the target R_t = G_t ignores V")
    _gae_table(c, [1.0, 0.0, 2.0], [2.0, 2.5, 3.0], 0.9, 1.0, [0.62, -0.7, -1.0])
    return c


def check_bootstrap() -> Check:
    """A response cut off by max_new_tokens: bootstrapping with V(s_3) = 1.5 instead of 0."""
    c = Check("bootstrap", "truncated, not terminal: bootstrap_value V(s_3) = 1.5 replaces the terminal V = 0")
    # delta_2 = 2 + 0.9*1.5 - 3.0 = 0.35; A_1 = 0.2 + 0.855*0.35 = 0.49925; A_0 = 1.25 + 0.855*0.49925
    _gae_table(c, [1.0, 0.0, 2.0], [2.0, 2.5, 3.0], 0.9, 0.95, [1.67685875, 0.49925, 0.35], boot=1.5)
    c.lines.append("rlhfkit's PPO trainer treats max_new_tokens as terminal (no bootstrap); no_stop_penalty "
                   "can score responses that never stopped instead.")
    return c


def check_clip_gradients() -> Check:
    """Gradient of the clipped surrogate: -A*ratio/N where the clip is inactive, exactly 0 where it acts."""
    import torch

    from rlhfkit import algos
    from rlhfkit.core.devices import HOST

    c = Check("clip", "PPO clip, eps 0.2, token mean over N = 6: d loss / d log pi_t")
    ratio = [1.1, 1.3, 0.7, 0.9, 0.7, 1.3]
    adv = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
    # clipped where A > 0 and ratio > 1.2 (t=1) or A < 0 and ratio < 0.8 (t=4): gradient 0 there
    want = [-1.1 / 6, 0.0, -0.7 / 6, 0.9 / 6, 0.0, 1.3 / 6]
    logp = torch.tensor([ratio], dtype=torch.float64, device=HOST).log().requires_grad_(True)
    old = torch.zeros_like(logp)
    A = torch.tensor([adv], dtype=torch.float64, device=HOST)
    loss, metrics = algos.ppo_policy_loss(logp, old, A, torch.ones_like(A, dtype=torch.bool), clip_eps=0.2)
    (grad,) = torch.autograd.grad(loss, logp)
    c.lines.append(row("t", "A_t", "ratio_t", "-A*ratio", "-A*clip(r)", "grad (hand)", "grad", ""))
    for t in range(6):
        clipped = min(max(ratio[t], 0.8), 1.2)
        g = float(grad[0, t])
        c.lines.append(row(t, adv[t], ratio[t], -adv[t] * ratio[t], -adv[t] * clipped, want[t], g,
                            c.expect(g, want[t])))
    frac, value = metrics["policy_clip_frac"], loss.item()
    c.lines.append(f"loss = mean of max(-A*ratio, -A*clip(ratio)) = {value:.6f} (by hand: "
                   f"(-1.1 - 1.2 - 0.7 + 0.9 + 0.8 + 1.3) / 6 = 0) {c.expect(value, 0.0)}")
    # a float32 count ratio: 2/6 to ~1e-8, so a float32-sized tolerance
    c.lines.append(f"policy_clip_frac = {frac:.6f} (by hand 2/6: t=1 and t=4) {c.expect(frac, 2 / 6, tol=1e-6)}")
    return c


def check_kl_estimators() -> Check:
    """Exact expectations under pi of k1, k2, k3, |d|: k1 and k3 are unbiased, k2 and |d| are not."""
    import torch

    from rlhfkit import algos
    from rlhfkit.core.devices import HOST

    c = Check("kl", "KL(pi || pi_ref) estimators, exact expectation over actions a ~ pi")
    pi, ref = [0.6, 0.3, 0.1], [0.3, 0.3, 0.4]
    kl = sum(p * math.log(p / q) for p, q in zip(pi, ref))  # 0.6 ln 2 - 0.1 ln 4 = 0.277259
    d = [math.log(q / p) for p, q in zip(pi, ref)]
    by_hand = {"k1": kl, "k3": kl, "k2": sum(p * 0.5 * x * x for p, x in zip(pi, d)),
               "abs": sum(p * abs(x) for p, x in zip(pi, d))}
    logp = torch.tensor([[math.log(p) for p in pi]], dtype=torch.float64, device=HOST)
    ref_logp = torch.tensor([[math.log(q) for q in ref]], dtype=torch.float64, device=HOST)
    w = torch.tensor([pi], dtype=torch.float64, device=HOST)
    c.lines.append(f"pi = {pi}, pi_ref = {ref}: true KL = 0.6 ln 2 - 0.1 ln 4 = {kl:.6f} nats")
    c.lines.append(row("estimator", "E[k] (hand)", "E[k] rlhfkit", "bias", "min over a", "std", ""))
    for kind, fn in (("k1", algos.kl_k1), ("k2", algos.kl_k2), ("k3", algos.kl_k3), ("abs", algos.kl_abs)):
        values = fn(logp, ref_logp)
        mean = float((w * values).sum())
        std = math.sqrt(max(float((w * values**2).sum()) - mean**2, 0.0))
        c.lines.append(row(kind, by_hand[kind], mean, mean - kl, float(values.min()), std,
                            c.expect(mean, by_hand[kind])))
    c.lines.append("k1 and k3 average to the true KL (unbiased); k1 is negative on a = 2, k3 never is; "
                   "k2 and |d| are biased.")
    return c


def check_logprob_offset() -> Check:
    """Sample token by token, then one teacher-forced pass: the slice [P-1, P+R-1) gives ratio 1."""
    import torch

    from rlhfkit.core.devices import HOST
    from rlhfkit.models import policy

    c = Check("offset", "log-prob offset: logits at position P-1+i predict response token i")
    lm = tiny_llama()
    prompt, R = torch.tensor([[5, 17, 9, 30]], device=HOST), 6
    P = prompt.shape[1]
    gen = torch.Generator(device=HOST).manual_seed(0)
    ids, sampled_logp = prompt, []
    with torch.no_grad():
        for _ in range(R):  # the rollout: one forward per new token, as sampling does
            logp = lm(ids).logits[:, -1].float().log_softmax(-1)  # (1, V)
            tok = torch.multinomial(logp.exp(), 1, generator=gen)  # (1, 1)
            sampled_logp.append(logp.gather(-1, tok))
            ids = torch.cat([ids, tok], dim=1)
        old = torch.cat(sampled_logp, dim=1)  # (1, R) log pi(a_t | x_<=t) at sampling time
        response = ids[:, P:]
        actor = policy.ActorCritic(lm, None)  # the trainer's teacher-forced pass: one forward for all R tokens
        new, _, _ = actor(ids, torch.ones_like(ids), R, with_values=False, response_ids=response)
        full = lm(ids).logits.float().log_softmax(-1)  # (1, L, V)
        shifted = full[:, P : P + R].gather(-1, response.unsqueeze(-1)).squeeze(-1)  # off by one
    dev = float((new - old).exp().sub(1).abs().max())
    dev_shifted = float((shifted - old).exp().sub(1).abs().max())
    c.lines.append(f"prompt P = {P} tokens, R = {R} sampled tokens, L = {P + R}")
    c.lines.append(row("t", "log pi sampled", "one pass", "off by one", width=14))
    for t in range(R):
        c.lines.append(row(t, float(old[0, t]), float(new[0, t]), float(shifted[0, t]), width=14))
    ok_dev, ok_shift = dev <= 1e-4, dev_shifted >= 1e-2  # fp32 error is ~1e-6; a wrong slice is O(1)
    c.ok = ok_dev and ok_shift
    c.lines.append(f"max |ratio - 1| with the slice [P-1 : P+R-1]: {dev:.2e} (float error only) "
                   f"{'ok' if ok_dev else 'MISMATCH'}")
    c.lines.append(f"max |ratio - 1| with the slice [P : P+R] (off by one): {dev_shifted:.3f} "
                   f"{'ok (far from 1, as it must be)' if ok_shift else 'MISMATCH (should be far from 1)'}")
    return c


CHECKS: dict[str, Callable[[], Check]] = {
    "gae": check_gae_worked_example,
    "gae-limits": check_gae_lambda_limits,
    "bootstrap": check_bootstrap,
    "clip": check_clip_gradients,
    "kl": check_kl_estimators,
    "offset": check_logprob_offset,
}


def run_checks(names: list[str], table: dict[str, Callable[[], Check]] | None = None) -> list[Check]:
    """Run the named checks (of `table`, default CHECKS) in order; a check that raises counts as
    failed, with the error printed."""
    table = CHECKS if table is None else table
    out = []
    for name in names:
        try:
            out.append(table[name]())
        except Exception as e:  # noqa: BLE001  (a crash in the installed code is a failed check)
            out.append(Check(name, table[name].__doc__ or name, [f"raised {type(e).__name__}: {e}"], ok=False))
    return out


def build_parser() -> argparse.ArgumentParser:
    """The options of `rlhfkit selfcheck`."""
    p = argparse.ArgumentParser(formatter_class=OptionsHelpFormatter, prog="rlhfkit selfcheck", description="Run the worked examples of the learning "
                                "path (docs/learn/) on the installed code and print each with its numbers. "
                                "Exit status 1 when any number disagrees with the one worked out by hand.")
    p.add_argument("names", nargs="*", metavar="CHECK", help=f"checks to run (default: all): {', '.join(CHECKS)}")
    p.add_argument("--list", action="store_true", help="list the checks and the breaks, then exit")
    p.add_argument("--break", dest="breaks", action="append", default=[], metavar="NAME",
                   help="instead of the checks, make one classic bug on purpose and show its symptom in numbers "
                        "and the doctor's finding, next to the right code (repeatable; names: see --list; "
                        "docs/learn/30-break-it-yourself.md). Exit status 1 when a symptom fails to show")
    p.add_argument("--exercise", nargs=2, metavar=("NAME", "FILE"),
                   help="check your own version of one function against rlhfkit's on random tensors (several "
                        "shapes, padding masks and seeds): FILE is a python file defining the function of the "
                        "exercise's stub (names and stub files: see --list; copy a stub from "
                        "rlhfkit/learn/exercises/). Prints PASS, or the first mismatch with a hint; exit status 1 "
                        "on a mismatch, 2 when FILE cannot be loaded")
    return p


def run_exercise(name: str, path: str) -> int:
    """`--exercise NAME FILE`: print PASS or the first mismatch and its hint; 0 on pass, 1 on a mismatch."""
    ex = exercise_check.EXERCISES.get(name)
    if ex is None:
        raise UserError(f"selfcheck: unknown exercise '{name}' (expected one of: "
                        f"{', '.join(exercise_check.EXERCISES)})")
    try:
        fn = exercise_check.load_function(path, ex.function)
    except exercise_check.BadExerciseFile as e:
        raise UserError(f"selfcheck --exercise {name}: {e}") from None
    out = exercise_check.check(ex, fn)
    print(f"exercise {name}: {ex.title}; {ex.function}() from {path}")
    if out.ok:
        print(f"PASS: {out.cases} random cases (seeds, shapes, padding with garbage) agree with rlhfkit's own "
              f"function to {exercise_check.RTOL:g} of the scale")
        return 0
    print(f"FAIL at case {out.cases}: {out.mismatch}")
    print(f"hint: {out.hint}")
    return 1


def main(argv: list[str]) -> int:
    args = parse_command_line(build_parser(), argv)
    from rlhfkit.learn.breaks import BREAKS

    if args.list:
        print("\n".join(f"{n}: {fn.__doc__}" for n, fn in CHECKS.items()))
        print("\nbreaks (--break NAME):\n" + "\n".join(f"{n}: {fn.__doc__}" for n, fn in BREAKS.items()))
        print("\nexercises (--exercise NAME FILE; copy the stub, fill in its function):\n"
              + "\n".join(f"{n}: {e.title}; stub {e.stub_path}" for n, e in exercise_check.EXERCISES.items()))
        return 0
    if args.exercise:
        if args.names or args.breaks:
            raise UserError("selfcheck: give --exercise NAME FILE alone, without check names or --break")
        return run_exercise(*args.exercise)
    if args.breaks and args.names:
        raise UserError("selfcheck: give check names or --break NAME, not both")
    table, kind = (BREAKS, "break") if args.breaks else (CHECKS, "check")
    unknown = [n for n in args.breaks or args.names if n not in table]
    if unknown:
        raise UserError(f"selfcheck: unknown {kind} '{unknown[0]}' (expected one of: {', '.join(table)})")
    t0 = time.perf_counter()
    results = run_checks(args.breaks or args.names or list(CHECKS), table)
    for i, c in enumerate(results, 1):
        print(f"[{i}/{len(results)}] {c.name}: {c.title}  {'PASS' if c.ok else 'FAIL'}")
        print("\n".join(f"    {line}" for line in c.lines), end="\n\n")
    failed = [c.name for c in results if not c.ok]
    done = "breaks showed their symptom" if args.breaks else "checks passed"
    print(f"{len(results) - len(failed)} of {len(results)} {done} in {time.perf_counter() - t0:.1f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
