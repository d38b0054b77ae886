"""PPO's knobs one at a time, over seeds, on the tiny vowel task (docs/learn/ablations.md).

Each run trains minimal_ppo's tiny random Llama (2 layers, hidden 32, one token per character, answers
of 8 tokens; the reward is the share of vowels) with `python -m rlhfkit.learn.tiny`'s settings
(16 answers per rollout, mini-batches of 8, 2 epochs, lr 1e-2, lam 1, no KL penalty, whitened
advantages, value clip 0.2, vf_coef 0.1, gradient norm clipped at 1), but computes every step with
rlhfkit.algos (shape_rewards, gae, masked_whiten, ppo_policy_loss, ppo_value_loss, kl_estimate,
explained_variance), so that each knob below is one argument. A setting changes one knob of that
baseline; each runs for every seed, and the tables give the mean and the spread (sample std) over
seeds.

    python -m rlhfkit.learn.ablations                     # every setting, 5 seeds, 8 iterations
    python -m rlhfkit.learn.ablations --only epochs --seeds 3
    python -m rlhfkit.learn.ablations --json runs.json    # also the per-seed numbers, for the page's tables
    python -m rlhfkit.learn.ablations --tables-from docs/learn/ablations.json   # the page's tables, run nothing

One thread per process (the model is tiny; a second thread only adds synchronisation).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlhfkit import algos
from rlhfkit.learn import minimal_ppo as mp


@dataclass(frozen=True)
class Setting:
    """One run's knobs (the defaults are the baseline: learn.tiny's settings)."""

    rollout: int = 16
    mini_batch: int = 8
    epochs: int = 2
    lr: float = 1e-2
    gamma: float = 1.0
    lam: float = 1.0
    clip_eps: float = 0.2
    value_clip: float | None = 0.2
    vf_coef: float = 0.1
    ent_coef: float = 0.0
    whiten: str = "rollout"  # "rollout", "mini-batch" or "off"
    kl_coef: float = 0.0
    kl_penalty: str = "reward"  # "reward": -kl_coef * k1 in the rewards; "loss": + kl_coef * estimator in the loss
    kl_estimator: str = "k1"
    max_grad_norm: float = 1.0


KL_COEF = 0.1  # the KL rows' coefficient (the baseline has none)
ABLATIONS: dict[str, list[tuple[str, Setting]]] = {
    "whitening": [("per rollout (baseline)", Setting()), ("per mini-batch", Setting(whiten="mini-batch")),
                  ("off", Setting(whiten="off"))],
    "value clip": [("0.2 (baseline)", Setting()), ("off", Setting(value_clip=None))],
    "lambda": [("1.0 (baseline)", Setting()), ("0.95", Setting(lam=0.95))],
    "epochs": [("1", Setting(epochs=1)), ("2 (baseline)", Setting()), ("4", Setting(epochs=4))],
    "mini-batch size": [("4", Setting(mini_batch=4)), ("8 (baseline)", Setting()), ("16", Setting(mini_batch=16))],
    "ent_coef": [("0 (baseline)", Setting()), ("0.01", Setting(ent_coef=0.01)), ("0.1", Setting(ent_coef=0.1))],
    "KL estimator (kl_coef 0.1)": [
        ("k1 in the reward", Setting(kl_coef=KL_COEF)),
        ("k1 in the loss", Setting(kl_coef=KL_COEF, kl_penalty="loss", kl_estimator="k1")),
        ("k2 in the loss", Setting(kl_coef=KL_COEF, kl_penalty="loss", kl_estimator="k2")),
        ("k3 in the loss", Setting(kl_coef=KL_COEF, kl_penalty="loss", kl_estimator="k3")),
    ],
}
COLUMNS = ("score", "gain", "clip_frac", "approx_kl", "explained_var", "kl_ref")
HEADERS = ("final vowel share", "gain", "clip fraction", "approx KL", "explained variance", "KL to ref (nats)")


def forward(agent: mp.Agent, ids: torch.Tensor, prompt_len: int):
    """ids (B, P + T) -> logp, entropy, values, each (B, T), at the answer's positions P - 1 .. P + T - 2."""
    out = agent.lm(input_ids=ids, output_hidden_states=True)
    logp, entropy = algos.logprobs_and_entropy(out.logits[:, prompt_len - 1:-1], ids[:, prompt_len:])
    values = agent.value_head(out.hidden_states[-1][:, prompt_len - 1:-1]).squeeze(-1)
    return logp, entropy, values


@torch.no_grad()
def rollout(agent: mp.Agent, ref: mp.Agent, prompts: torch.Tensor, gen: torch.Generator, s: Setting) -> dict:
    """Sample, score, shape the rewards, GAE; whiten over the rollout unless `s` says otherwise."""
    ids = mp.sample(agent, prompts, gen)
    P = prompts.shape[1]
    scores = mp.vowel_share(ids[:, P:])
    logp, _, values = forward(agent, ids, P)
    ref_logp, _, _ = forward(ref, ids, P)
    mask = torch.ones_like(logp, dtype=torch.bool)
    beta = s.kl_coef if s.kl_penalty == "reward" else 0.0
    rewards, _ = algos.shape_rewards(scores, logp, ref_logp, mask, beta, "k1")
    adv, returns = algos.gae(rewards, values, mask, s.gamma, s.lam)
    if s.whiten == "rollout":
        adv = algos.masked_whiten(adv, mask)
    return dict(ids=ids, mask=mask, logp=logp, ref_logp=ref_logp, values=values, advantages=adv, returns=returns,
                scores=scores, kl=(logp - ref_logp).sum(1).mean().item(),
                explained_var=algos.explained_variance(values, returns, mask).item())


def update(agent: mp.Agent, opt: torch.optim.Optimizer, b: dict, s: Setting, gen: torch.Generator) -> dict:
    """s.epochs passes of shuffled mini-batches, one optimiser step each; the mean clip fraction and approx KL."""
    P, B = b["ids"].shape[1] - mp.ANSWER_LEN, b["ids"].shape[0]
    clip, akl = [], []
    for _ in range(s.epochs):
        for idx in torch.randperm(B, generator=gen, device="cpu").split(s.mini_batch):
            m = b["mask"][idx]
            logp, entropy, values = forward(agent, b["ids"][idx], P)
            adv = b["advantages"][idx]
            if s.whiten == "mini-batch":
                adv = algos.masked_whiten(adv, m)
            pg, pm = algos.ppo_policy_loss(logp, b["logp"][idx], adv, m, clip_eps=s.clip_eps)
            vf, _ = algos.ppo_value_loss(values, b["values"][idx], b["returns"][idx], m, clip_eps=s.value_clip)
            loss = pg + s.vf_coef * vf - s.ent_coef * algos.entropy_loss(entropy, m)
            if s.kl_penalty == "loss":
                kl = algos.kl_estimate(logp, b["ref_logp"][idx], s.kl_estimator)
                loss = loss + s.kl_coef * algos.masked_mean(kl, m)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(agent.parameters(), s.max_grad_norm)
            opt.step()
            clip.append(pm["policy_clip_frac"])
            akl.append(pm["approx_kl"])
    return dict(clip_frac=sum(clip) / len(clip), approx_kl=sum(akl) / len(akl))


def run(s: Setting, seed: int, iterations: int) -> list[dict]:
    """One training run; one dict per iteration: score (rollout mean, before that iteration's update),
    kl_ref, explained_var (the rollout's values against its returns), clip_frac and approx_kl (the update's)."""
    agent = mp.Agent(seed)
    ref = copy.deepcopy(agent).requires_grad_(False)
    opt = torch.optim.Adam(agent.parameters(), lr=s.lr)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prompts, rows = mp.encode(mp.PROMPTS), []
    for _ in range(iterations):
        picked = torch.randperm(len(mp.PROMPTS), generator=gen, device="cpu")[:s.rollout]
        b = rollout(agent, ref, prompts[picked], gen, s)
        u = update(agent, opt, b, s, gen)
        rows.append(dict(score=b["scores"].mean().item(), kl_ref=b["kl"], explained_var=b["explained_var"], **u))
    return rows


def summarise(rows: list[dict], k: int = 3) -> dict:
    """One run's row of the table: final score (mean of the last k iterations), gain over the first k,
    clip fraction and approx KL (mean over every update), explained variance (mean of the last k
    rollouts), KL to the reference (the last rollout)."""
    first = sum(r["score"] for r in rows[:k]) / len(rows[:k])
    last = sum(r["score"] for r in rows[-k:]) / len(rows[-k:])
    ev = [r["explained_var"] for r in rows[-k:] if math.isfinite(r["explained_var"])]
    return dict(score=last, gain=last - first, clip_frac=sum(r["clip_frac"] for r in rows) / len(rows),
                approx_kl=sum(r["approx_kl"] for r in rows) / len(rows),
                explained_var=sum(ev) / len(ev) if ev else float("nan"), kl_ref=rows[-1]["kl_ref"])


def cell(xs: list[float]) -> str:
    """'mean ± sample std' over seeds (3 decimals; 4 for numbers below 0.1 in size)."""
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return "n/a"
    m = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    digits = 4 if abs(m) < 0.1 else 3
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def table(group: str, results: dict[str, list[dict]]) -> str:
    """The markdown table of one ablation group from its per-seed summaries: {label: [summary per seed]}."""
    lines = [f"| {group} | " + " | ".join(HEADERS) + " |", "|---" * (len(HEADERS) + 1) + "|"]
    for label, per_seed in results.items():
        lines.append(f"| {label} | " + " | ".join(cell([r[c] for r in per_seed]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def run_all(groups: list[str], seeds: list[int], iterations: int, log: Callable[[str], None] = print) -> dict:
    """{group: {label: [summary per seed]}}, each (setting, seed) run once even when groups share it."""
    done: dict[tuple[Setting, int], dict] = {}
    out: dict[str, dict[str, list[dict]]] = {}
    for group in groups:
        out[group] = {}
        for label, s in ABLATIONS[group]:
            for seed in seeds:
                if (s, seed) not in done:
                    t0 = time.perf_counter()
                    done[(s, seed)] = summarise(run(s, seed, iterations))
                    log(f"  {group}: {label}, seed {seed}: final {done[(s, seed)]['score']:.3f} "
                        f"({time.perf_counter() - t0:.1f} s)")
            out[group][label] = [done[(s, seed)] for seed in seeds]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlhfkit.learn.ablations", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="seeds per setting, 0 .. N-1 (default 5)")
    p.add_argument("--iterations", type=int, default=8, help="PPO iterations per run (default 8: most settings are still learning there; by 12 the vowel share nears 1 and the settings look alike)")
    p.add_argument("--only", action="append", default=[], metavar="GROUP", choices=list(ABLATIONS),
                   help=f"run only this group (repeatable): {', '.join(ABLATIONS)}")
    p.add_argument("--json", type=Path, default=None, help="also write the settings and per-seed summaries here")
    p.add_argument("--tables-from", type=Path, default=None, metavar="JSON",
                   help="run nothing: print the tables of a file written by --json (docs/learn/ablations.json)")
    args = p.parse_args(argv)
    if args.tables_from is not None:
        try:
            saved = json.loads(args.tables_from.read_text(encoding="utf-8"))
            print("\n\n".join(table(g, saved["results"][g]) for g in args.only or saved["results"]))
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--tables-from: {args.tables_from}: not a file written by --json ({type(e).__name__}: {e})")
        return 0
    if args.seeds < 1 or args.iterations < 4:
        p.error(f"--seeds must be >= 1 and --iterations >= 4, got {args.seeds} and {args.iterations}")
    if args.json is not None and args.json.exists():
        p.error(f"--json: {args.json} exists; give a new file name")
    torch.set_num_threads(1)
    groups, seeds = args.only or list(ABLATIONS), list(range(args.seeds))
    t0 = time.perf_counter()
    results = run_all(groups, seeds, args.iterations)
    print(f"\n{len(seeds)} seeds, {args.iterations} iterations per run, {time.perf_counter() - t0:.0f} s in all\n")
    for group in groups:
        print(table(group, results[group]), end="\n\n")
    if args.json is not None:
        settings = {g: {label: asdict(s) for label, s in ABLATIONS[g]} for g in groups}
        args.json.write_text(json.dumps(dict(seeds=seeds, iterations=args.iterations, settings=settings,
                                             results=results), indent=1) + "\n", encoding="utf-8")
    return 0


def setting(group: str, label: str) -> Setting:
    """The Setting of one row of the page (for a test that re-derives it)."""
    return dict(ABLATIONS[group])[label]


__all__ = ["ABLATIONS", "COLUMNS", "Setting", "cell", "main", "run", "run_all", "setting", "summarise", "table"]


if __name__ == "__main__":
    raise SystemExit(main())
