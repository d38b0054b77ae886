"""Where one `rlhfkit trpo` iteration spends its time, on the default model and settings.

One process: builds the run as `rlhfkit trpo` does (SmolLM2-135M-Instruct, LoRA on the top 12
layers, 16 prompts x 48 new tokens, micro-batch 8), samples and scores one rollout and runs the
log-prob pass (both timed), then, on that same rollout and from the same weights (restored after
each measurement), one of:

  --vs-ppo K      K rounds of PPO's update at its defaults, then the TRPO update (policy step +
                  critic) of each --variant: the update ratio TRPO / PPO measured back to back; the
                  rollout and log-prob pass are the same in both trainers
  --components K  K rounds of the pieces: a forward, a gradient, the Fisher-vector product's setup
                  and one product for each fvp_mode on 8 and 4 rows, and the two modes' agreement
  (neither)       the whole policy step of each --variant with timers around the gradient, each
                  Fisher-vector product and each line-search candidate

Variants are TRPOConfig fields, `--variant KEY=VALUE,...`. The machine may be loaded: compare
ratios within one run, never seconds across runs.

    python bench/trpo_profile.py --vs-ppo 1 --variant fvp_fraction=1 --variant fvp_fraction=0.25
    python bench/trpo_profile.py --components 2
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import defaultdict
from contextlib import contextmanager

import benchdoc


def parse_variant(text: str) -> dict:
    out = {}
    for kv in filter(None, text.split(",")):
        k, v = kv.split("=", 1)
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v  # a plain string
    return out


class Timers:
    """Named wall-clock totals and counts."""

    def __init__(self):
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.total[name] += time.perf_counter() - t0
            self.count[name] += 1

    def wrap(self, name: str, fn):
        def timed(*a, **k):
            with self(name):
                return fn(*a, **k)
        return timed


def instrument(timers: Timers):
    """Wrap the policy step's pieces in `rlhfkit.trainers.trpo` with timers (module attributes)."""
    import rlhfkit.trainers.trpo as T

    orig = {k: getattr(T, k) for k in ("summed_flat_grad", "fisher_vector_product", "line_search_evaluator")}

    def fvp_factory(*a, **k):
        with timers("fvp setup (graph cache)"):
            fvp = orig["fisher_vector_product"](*a, **k)
        return timers.wrap("fvp (each product)", fvp)

    def evaluator(*a, **k):
        return timers.wrap("line search (each candidate)", orig["line_search_evaluator"](*a, **k))

    T.summed_flat_grad = timers.wrap("gradient", orig["summed_flat_grad"])
    T.fisher_vector_product = fvp_factory
    T.line_search_evaluator = evaluator


def vs_ppo(rl, params, rollout, base: dict, variants: list[dict], repeats: int) -> None:
    """Update seconds of PPO (its update step at PPOConfig's defaults) and of TRPO (policy_step + critic_update)
    for each variant, alternating, every update from the same weights (restored after each)."""
    import functools

    import torch

    import rlhfkit.trainers.trpo as T
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import micro_batch_loss
    from rlhfkit.trainers.ppo_config import PPOConfig
    from rlhfkit.trainers.trpo_config import TRPOConfig

    keep = {k: v.detach().clone() for k, v in rl.model.state_dict().items()}
    ppo_cfg = build_config(PPOConfig, {k: v for k, v in base.items() if k in PPOConfig.__dataclass_fields__})
    for r in range(repeats):
        t0 = time.perf_counter()
        loss_fn = functools.partial(micro_batch_loss, rl.model, cfg=ppo_cfg, kl_coef=ppo_cfg.kl_coef, device=rl.device)
        rl.update(rollout, loss_fn, ppo_cfg.ppo_epochs, ppo_cfg.mini_batch_size, torch.arange(ppo_cfg.rollout_batch_size))
        print("PPO " + json.dumps({"round": r, "update_s": round(time.perf_counter() - t0, 2)}), flush=True)
        rl.model.load_state_dict(keep)
        for var in variants:
            cfg = build_config(TRPOConfig, {**base, **var})
            t0 = time.perf_counter()
            m = T.policy_step(rl.model, params, rollout, cfg, rl.device, rl.generator)
            t1 = time.perf_counter()
            T.critic_update(rl, params, rollout, cfg)
            t2 = time.perf_counter()
            print("TRPO " + json.dumps({"round": r, "variant": var, "update_s": round(t2 - t0, 2),
                                        "policy_step_s": round(t1 - t0, 2), "critic_s": round(t2 - t1, 2),
                                        **{k: m[k] for k in ("trpo/cg_residual", "trpo/line_search_steps",
                                                             "trpo/step_accepted", "trpo/kl_after_step")}}),
                  flush=True)
            rl.model.load_state_dict(keep)


def components(rl, params, rollout, base: dict, repeats: int) -> None:
    """Seconds of each piece of the policy step on micro-batches of the rollout, K alternating rounds;
    prints one line per piece (median) and the CG direction agreement of the FVP variants."""
    import statistics

    import torch

    import rlhfkit.trainers.trpo as T
    from rlhfkit.algos.trpo import line_search_evaluator
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.trpo_config import TRPOConfig

    device = rl.device
    cfg = build_config(TRPOConfig, base)
    mb8 = T.micro_batches(rollout, torch.arange(8), 8)
    P = sum(p.numel() for p in params)
    v = torch.randn(P, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = defaultdict(list)

    def timed(name, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        times[name].append(time.perf_counter() - t0)
        print(f"  {name}: {times[name][-1]:.2f} s", flush=True)
        return out

    products = {}
    for r in range(repeats):
        with torch.no_grad():
            timed("forward, 8 rows, no grad", lambda: T.response_logits(rl.model, mb8[0], cfg.temperature))
        timed("gradient (fwd+bwd), 8 rows", lambda: T.response_logits(rl.model, mb8[0], cfg.temperature)
              .logsumexp(-1).mean().backward())
        for p in params:
            p.grad = None
        theta = T.flat_params(params)
        ev = line_search_evaluator(params, [lambda: (torch.zeros(()), torch.zeros(()))])
        timed("set+restore params", ev, torch.zeros_like(theta))
        for mode in ("double-backward", "gauss-newton"):
            for frac in (0.5, 0.25):  # 8 and 4 rows of 16
                c = build_config(TRPOConfig, {**base, "fvp_mode": mode, "fvp_fraction": frac})
                fvp = timed(f"FVP setup, {mode}, {int(frac * 16)} rows", T.fisher_product, rl.model, params,
                            rollout, c, device)
                products[(mode, frac)] = timed(f"FVP product, {mode}, {int(frac * 16)} rows", fvp, v)
                fvp = None  # frees the cached graphs before the next variant
        print(f"round {r}: " + json.dumps({k: round(x[-1], 2) for k, x in times.items()}), flush=True)
    for k, x in times.items():
        print(f"{k}: median {statistics.median(x):.2f} s over {len(x)}", flush=True)
    for frac in (0.5, 0.25):
        a, b = products[("double-backward", frac)], products[("gauss-newton", frac)]
        print(f"rows {int(frac * 16)}: |Fv_gn - Fv_db| / |Fv_db| = {float((a - b).norm() / b.norm().clamp(min=1e-30)):.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], help="TRPOConfig overrides, KEY=VALUE,KEY=VALUE")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the variants")
    ap.add_argument("--critic", action="store_true", help="also time the critic update (once)")
    ap.add_argument("--components", type=int, default=0, metavar="K",
                    help="time the pieces separately instead (K repeats each, alternating): forward, gradient, "
                         "FVP setup and one product per mode and number of rows, one line-search candidate")
    ap.add_argument("--vs-ppo", type=int, default=0, metavar="K",
                    help="K alternating rounds of PPO's update (its defaults) and the TRPO update (policy step + "
                         "critic) of each --variant, on the same rollout from the same weights")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="base TRPOConfig override")
    a = ap.parse_args()

    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.build import build_actor_critic
    from rlhfkit.trainers.rl import RLRun
    from rlhfkit.trainers.trpo_config import TRPOConfig

    base = {"num_eval_prompts": 0, "iterations": 1, "output_dir": benchdoc.scratch_dir(), "run_name": "profile",
            "quiet": True, "tensorboard": False, **parse_variant(",".join(a.set))}
    cfg = build_config(TRPOConfig, base)
    timers = Timers()
    with timers("build"):
        rl = RLRun(cfg, "trpo", build_actor_critic)
    with rl:  # the run folder, its lock and the signal handlers released however the profile ends
        profile(a, rl, cfg, base, timers)


def profile(a: argparse.Namespace, rl, cfg, base: dict, timers: Timers) -> None:
    """The profile of `main`'s options on the built run `rl`."""
    import torch

    import rlhfkit.trainers.trpo as T
    from rlhfkit.algos.trpo import flat_params, set_flat_params_
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import compute_advantages
    from rlhfkit.trainers.trpo_config import TRPOConfig

    policy_params = [p for p in rl.core.policy.parameters() if p.requires_grad]
    records = rl.stream.next(cfg.rollout_batch_size)
    with timers("rollout (generate + reward)"):
        rollout = rl.sample(records, 0)
    with timers("log-prob pass"):
        rollout = rl.logprob_pass(rollout, torch.arange(cfg.rollout_batch_size))
    rollout, _ = compute_advantages(rollout, cfg, cfg.kl_coef)
    print(f"P = {sum(p.numel() for p in policy_params)} trainable policy parameters; rollout "
          f"{tuple(rollout.response_ids.shape)}, {int(rollout.response_mask.sum())} response tokens", flush=True)
    for k in ("build", "rollout (generate + reward)", "log-prob pass"):
        print(f"{k}: {timers.total[k]:.1f} s", flush=True)

    if a.vs_ppo:
        vs_ppo(rl, policy_params, rollout, base, [parse_variant(v) for v in a.variant] or [{}], a.vs_ppo)
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB", flush=True)
        return
    if a.components:
        components(rl, policy_params, rollout, base, a.components)
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB", flush=True)
        return
    instrument(timers)
    theta_old = flat_params(policy_params)
    variants = [parse_variant(v) for v in a.variant] or [{}]
    results = defaultdict(list)
    for r in range(a.repeats):
        for i, var in enumerate(variants):
            vcfg = build_config(TRPOConfig, {**base, **var})
            step_timers = Timers()
            instrument(step_timers)
            t0 = time.perf_counter()
            m = T.policy_step(rl.model, policy_params, rollout, vcfg, rl.device)
            total = time.perf_counter() - t0
            set_flat_params_(policy_params, theta_old)
            row = {"variant": var, "round": r, "policy_step_s": round(total, 2),
                   **{f"{k} s": round(v, 2) for k, v in step_timers.total.items()},
                   **{f"{k} n": c for k, c in step_timers.count.items()},
                   **{k: m[k] for k in ("trpo/cg_residual", "trpo/cg_iterations", "trpo/line_search_steps",
                                        "trpo/step_accepted", "trpo/kl_after_step", "trpo/surrogate_improvement",
                                        "trpo/expected_improvement", "trpo/step_norm")}}
            results[i].append(row)
            print("ROW " + json.dumps(row), flush=True)
    if a.critic:
        with timers("critic"):
            T.critic_update(rl, policy_params, rollout, cfg)
        print(f"critic: {timers.total['critic']:.1f} s", flush=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB", flush=True)


if __name__ == "__main__":
    main()
