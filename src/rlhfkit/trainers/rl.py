"""What the on-policy RL trainers (PPO, GRPO, RLOO) share on top of the run harness
(runtime/run.py): prompts and reward, the sampled rollout, the log-prob pass, the update, the
per-iteration log and the held-out reward before and after training.

A trainer's loop then reads:

    with RLRun(cfg, "ppo", build_actor_critic) as rl:   # a Run (runtime/run.py), complete when built
        rl.resume(kl_ctl=kl_ctl)
        with rl.evaluating():
            for it in rl.steps():
                rollout = rl.logprob_pass(rl.sample(rl.stream.next(n), it), order)
                rollout, metrics = ... the method's advantages ...
                stats = rl.update(rollout, functools.partial(micro_batch_loss, ...), ...)
                rl.log_iteration(it, rollout, metrics, times)
        return rl.finish()
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Protocol

import torch

from rlhfkit import envs
from rlhfkit.core.allocator import trim_heap
from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.core.seeding import EVAL_SEED_OFFSET, sampling_seed
from rlhfkit.data.chat import format_prompts
from rlhfkit.data.prompts import info_columns, info_lists, load_prompts
from rlhfkit.data.sets import builtin_name, load_split
from rlhfkit.data.spec import parse_spec
from rlhfkit.data.splits import eval_phrase
from rlhfkit.data.stream import PromptStream
from rlhfkit.errors import UserError
from rlhfkit.estimate.memory import check_rollout_fits
from rlhfkit.models.loading import resolve_model_path
from rlhfkit.rewards import check_reward_call, get_rewards
from rlhfkit.rewards.scoring import mean_std, reward_name
from rlhfkit.rollout import Rollout, SamplingParams
from rlhfkit.rollout.backends import HFBackend, make_backend
from rlhfkit.rollout.core import generate_ids
from rlhfkit.rollout.logprobs import logprob_pass
from rlhfkit.rollout.multiturn import generate_episodes
from rlhfkit.rollout.prompt_fit import enforce_prompt_limit, prompt_token_limit
from rlhfkit.rollout.score import score_rollout
from rlhfkit.rollout.texts import sample_and_score
from rlhfkit.runtime.batch_plan import micro_batch_of_run
from rlhfkit.runtime.distributed import mean_over_processes
from rlhfkit.runtime.final_folder import actor_saver
from rlhfkit.runtime.optim import optimizer_for
from rlhfkit.runtime.run import Launch, Run
from rlhfkit.trainers.reward_options import reward_options
from rlhfkit.trainers.rl_update import LossFn, env_rates, update_policy

# ----------------------------------------------------------------------------- the config contract


class RLConfig(Protocol):
    """What this module reads of an on-policy trainer's config beyond the option groups (ModelArgs,
    SamplingArgs, GenerationArgs, OptimizerArgs, RunArgs). A config without one of these options
    declares it as a ClassVar with the value it always has (e.g. online-dpo's `env = ""`), so
    --help and config.yaml list only real options; tests/trainers/test_config_contract.py checks
    every RL config."""

    iterations: int
    optimiser_steps_per_iteration: int  # update epochs x mini-batches per rollout (the lr schedule's unit)
    env: str  # "" = single-turn rollouts
    reward: object  # a reward spec or, in Python, a callable or a list
    reward_weights: list[float] | None
    prompts: str
    eval_prompts: str | None
    eval_split: str
    num_eval_prompts: int
    eval_samples_per_prompt: int  # held-out completions per prompt
    trunk_cache_mb: float  # 0: never keep the frozen trunk's output for the update
    prompts_per_generate: int
    max_new_tokens: int


# ----------------------------------------------------------------------------- inputs


def env_prompts(cfg: RLConfig, make_env=None) -> str:
    """The prompt spec of a run: `prompts`, or with `env` set and `prompts` left at its default the
    environment's own problems (its factory's `prompts` attribute, rlhfkit.envs.make_env_factory)."""
    default = {f.name: f.default for f in dataclasses.fields(cfg)}.get("prompts")
    if not cfg.env or cfg.prompts != default:
        return cfg.prompts
    return getattr(make_env, "prompts", None) or cfg.prompts


def prepare_data(cfg: RLConfig, make_env=None) -> tuple:
    """(reward_fn, train records, evaluation records, what they are: "held-out" or "training",
    data/splits.eval_phrase). With `env` the environment rewards: reward_fn is None."""
    reward_fn = None if cfg.env else get_rewards(cfg.reward, cfg.reward_weights, options=reward_options(cfg))
    prompts = env_prompts(cfg, make_env)
    train = load_prompts(prompts, split="train", seed=cfg.seed)
    if not train:
        raise UserError(f"prompts: '{prompts}' has no training prompts")
    if reward_fn is not None:  # before any model loads: a signature that cannot take the call stops here
        check_reward_call(reward_fn, info_columns(train))
    held_out: list[dict] = []
    source = "held-out"
    if cfg.num_eval_prompts > 0:
        spec = cfg.eval_prompts or prompts
        try:
            held_out = load_prompts(spec, split=cfg.eval_split, limit=cfg.num_eval_prompts, seed=cfg.seed)
        except UserError:
            held_out = []
        if held_out and not cfg.eval_prompts and not has_eval_split(spec):
            held_out = []  # a file without split fields gives every record for any split: its training prompts
        if not held_out:  # no evaluation split: hold out nothing, evaluate on a fixed sample, and say so
            held_out = load_prompts(spec, split="train", limit=cfg.num_eval_prompts, seed=cfg.seed + 1)
            source = "held-out" if cfg.eval_prompts else "training"
    return reward_fn, train, held_out, source


def has_eval_split(spec) -> bool:
    """Whether `spec` names data with an evaluation split of its own: a built-in set or a Hub dataset
    (their splits), or records carrying a `split` field."""
    if isinstance(spec, str) and (builtin_name(spec) is not None or parse_spec(spec).kind == "hub"):
        return True
    if hasattr(spec, "keys") and hasattr(spec, "column_names"):  # a DatasetDict: its splits
        return True
    return any("split" in r for r in load_split(spec, None))


def prompt_limit(cfg, tok, model, *record_sets) -> int | None:
    """The token limit of rollout prompts (SamplingArgs.max_prompt_length, else the context window
    minus max_new_tokens); longer prompts get one warning or, with prompt_overflow=error, a DataError."""
    limit, how = prompt_token_limit(model, cfg.max_new_tokens, cfg.max_prompt_length)
    groups = [(format_prompts(tok, [r["prompt"] for r in records], cfg), getattr(records, "where", None))
              for records in record_sets]
    enforce_prompt_limit(tok, groups, limit, cfg.prompt_overflow, how)
    return limit


def planned_optimizer_steps(cfg: RLConfig) -> int:
    """The optimiser steps an RL run plans (the length of a linear/cosine lr schedule): per iteration,
    every update epoch's mini-batches. Groups dropped for a zero reward spread make fewer."""
    return cfg.iterations * cfg.optimiser_steps_per_iteration


def rollout_rows(cfg, world: int) -> tuple[str, int, int]:
    """(the option that sizes an iteration's rollout, its value, rollout rows per process):
    rollout_batch_size over the processes, or online-dpo's two completions per prompt."""
    if hasattr(cfg, "rollout_batch_size"):
        return "rollout_batch_size", cfg.rollout_batch_size, math.ceil(cfg.rollout_batch_size / world)
    return "prompts_per_iteration", cfg.prompts_per_iteration, 2 * cfg.prompts_per_iteration


def check_stop_ids(stop_ids: list[int] | None, vocab: int) -> None:
    """Stop ids the model can emit (an id past the vocabulary would never end a response)."""
    if stop_ids and max(stop_ids) >= vocab:
        raise UserError(f"stop_ids ({stop_ids}) must be token ids of the model's vocabulary (0 .. {vocab - 1})")


# ----------------------------------------------------------------------------- sampling


def sample_rollout(actor, tok, records, cfg, params: SamplingParams, seed: int, reward_fn, device,
                   backend=None, make_env=None) -> Rollout:
    """Sample one response per record and score it with the reward. `backend`
    (rollout/backends.py) samples; the default is HF's left-padded, KV-cached generate on the policy.
    `make_env`: one multi-turn episode per record instead (rollout/multiturn.py), scored by the env."""
    if make_env is not None:
        return sample_episodes(actor, tok, records, cfg, params, seed, device, make_env, backend)
    t0 = time.perf_counter()
    formatted = format_prompts(tok, [r["prompt"] for r in records], cfg)
    with autocast(cfg.dtype, device):
        rollout = (backend or HFBackend()).generate(actor.policy, tok, formatted, params, seed, cfg.prompts_per_generate,
                                                    share_prompts=actor.share_prompts, share_prefix=actor.share_prefix)
    t1 = time.perf_counter()
    rollout = score_rollout(dataclasses.replace(rollout, prompts=[str(r["prompt"]) for r in records],
                                                info=info_lists(records)), records, reward_fn)
    return dataclasses.replace(rollout, timings={"timing/generate_s": t1 - t0,
                                                 "timing/reward_s": time.perf_counter() - t1, **rollout.timings})


def sample_episodes(actor, tok, records, cfg, params: SamplingParams, seed: int, device, make_env,
                    backend=None) -> Rollout:
    """One multi-turn episode per record (rollout/multiturn.py); scores = each episode's summed rewards.
    Each turn is sampled by `backend`'s `generate_ids` (HF generate or the lean loop; None: HF), or, with
    the default backend (hf), by the KV-reusing loop (rollout/multiturn.py `cached_turns`) when sampling
    the full vocabulary."""
    t0 = time.perf_counter()
    with autocast(cfg.dtype, device):
        rollout = generate_episodes(actor.policy, tok, make_env, records, params, cfg.max_turns, cfg.max_total_tokens,
                                    seed=seed, batch_size=cfg.prompts_per_generate,
                                    share_prompts=actor.share_prompts, share_prefix=actor.share_prefix, fmt=cfg,
                                    sample_ids=getattr(backend, "generate_ids", generate_ids),
                                    reuse_cache=getattr(backend, "name", "hf") == "hf")
    return dataclasses.replace(rollout, prompts=[str(r["prompt"]) for r in records],
                               info={**info_lists(records), **rollout.info},
                               timings={"timing/generate_s": time.perf_counter() - t0, "timing/reward_s": 0.0})


# ----------------------------------------------------------------------------- held-out reward


def evaluate_episodes(model, tok, records, make_env, cfg: RLConfig, params: SamplingParams, seed: int) -> dict:
    """evaluate_reward with an environment: mean/std of the episode rewards (accuracy for
    arithmetic-tool) and the tool-call rate, `cfg.eval_samples_per_prompt` episodes per record."""
    k = cfg.eval_samples_per_prompt
    records = [r for r in records for _ in range(k)]
    device = next(model.parameters()).device
    with autocast(cfg.dtype, device):
        ro = generate_episodes(model, tok, make_env, records, params, cfg.max_turns, cfg.max_total_tokens, seed=seed,
                               batch_size=cfg.prompts_per_generate * k, fmt=cfg, reuse_cache=True)
    scores = ro.scores.tolist()
    mean, std = mean_std(scores)
    return {"mean": mean, "std": std, "n": len(scores), **env_rates(ro.info),
            "samples": [{"prompt": r["prompt"], "completion": c, "score": x, "turns": t}
                        for r, c, x, t in list(zip(records, ro.completions, scores, ro.info["turns"]))[:8]]}


def evaluate_reward(model, tok, records, reward_fn, cfg: RLConfig, params: SamplingParams, seed: int) -> dict:
    """Mean/std of the reward of sampled completions on `records` (`cfg.eval_samples_per_prompt` each,
    1 where the config has no such option: more samples per prompt make the before/after change less noisy)."""
    k = cfg.eval_samples_per_prompt
    records = [r for r in records for _ in range(k)]
    formatted = format_prompts(tok, [r["prompt"] for r in records], cfg)
    # k x the rollout's generation batch: as many generate() calls as with one sample, whose fixed
    # per-token cost (small ops, the cache) dominates CPU decoding
    completions, scores = sample_and_score(model, tok, records, formatted, reward_fn, params, seed,
                                           cfg.prompts_per_generate * k, cfg.dtype)
    mean, std = mean_std(scores)
    return {"mean": mean, "std": std, "n": len(scores),
            "samples": [{"prompt": r["prompt"], "completion": c, "score": x}
                        for r, c, x in list(zip(records, completions, scores))[:8]]}


# ----------------------------------------------------------------------------- the RL run


class RLRun(Run):
    """The run harness (runtime/run.py `Run`) plus the RL parts, complete when built by
    `RLRun(cfg, command, build_models)` with `build_models(cfg) -> (actor, reference | None, tokenizer)`:
    data, reward, models and prompt lengths checked before the run folder exists (bad input stops with
    one line and leaves nothing behind), then the run opened and the actor prepared."""

    def __init__(self, cfg, command: str, build_models: Callable):
        launch = Launch(cfg)
        self.make_env = None
        if cfg.env:  # the env's factory takes the tokenizer (tool-call format) and names its data
            actor, self.reference, self.tok = build_models(cfg)
            self.make_env = envs.make_env_factory(cfg.env, self.tok, timeout_s=cfg.env_timeout)
            self.reward_fn, train_records, self.eval_records, self.eval_from = prepare_data(cfg, self.make_env)
        else:
            self.reward_fn, train_records, self.eval_records, self.eval_from = prepare_data(cfg)
            actor, self.reference, self.tok = build_models(cfg)
        max_prompt_length = prompt_limit(cfg, self.tok, actor, train_records, self.eval_records)
        name, value, rows = rollout_rows(cfg, launch.world)
        check_rollout_fits(rows, max_prompt_length or 0, cfg.max_new_tokens, option=(name, value))
        check_stop_ids(cfg.stop_ids, actor.policy.get_input_embeddings().num_embeddings)
        self.micro_batch_size, planned = micro_batch_of_run(cfg, command, actor, self.tok, train_records,
                                                            max_prompt_length, launch)
        optimizer, scheduler = optimizer_for(actor.parameter_groups(), cfg, planned_optimizer_steps(cfg))
        self.stream = PromptStream(train_records, cfg.seed, launch.rank, launch.world)
        self.generator = torch.Generator(device=HOST).manual_seed(cfg.seed)  # the update's shuffles
        if self.reference is not None:  # the frozen copy is not prepared; offloaded: stays in CPU memory
            self.reference.to(launch.device)
        plan = {} if planned is None else {"micro_batch_size": {"size": self.micro_batch_size, "reason": planned}}
        super().__init__(launch, command, cfg.iterations, actor, optimizer, scheduler, self.micro_batch_size,
                         summary=plan, reference=self.reference, stream=self.stream, generator=self.generator)
        try:
            if planned is not None:
                self.print(f"micro-batch {self.micro_batch_size} ({planned})")
            self.backend = make_backend(cfg, resolve_model_path(cfg.model), self.world, self.print)
        except BaseException as e:
            self.close(e)
            raise
        stop_ids = tuple(cfg.stop_ids or [self.tok.eos_token_id])
        self.params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, stop_ids,
                                     max_prompt_length)
        self.iteration = 0
        self.evaluator: Callable | None = None  # (records, seed) -> held-out result; replaces the reward's (agents)
        self.eval_source = ""  # what the evaluator scores with, for the change line

    # ---- one iteration --------------------------------------------------------------------
    def sample(self, records: list[dict], iteration: int, draw: int = 0) -> Rollout:
        """Sampled responses, scored by the reward; no log-probs yet. `draw` > 0: a further draw in
        the same iteration (GRPO's dynamic sampling) with a seed of its own."""
        self.iteration = iteration
        seed = sampling_seed(self.cfg.seed, self.rank, iteration) + draw * 104_729
        with self.tracker.phase("rollout", None), self.full_weights():
            if self.backend is not None:
                self.backend.sync(self.core.policy)  # vLLM: this iteration's weights
            return sample_rollout(self.core, self.tok, records, self.cfg, self.params, seed, self.reward_fn,
                                  self.device, self.backend, self.make_env)

    def logprob_pass(self, rollout: Rollout, order: torch.Tensor) -> Rollout:
        """One teacher-forced pass: log-probs, values, entropy and reference log-probs of the
        sampled tokens, in micro-batches grouped by `order` (the first update epoch's shuffle, so
        the update's first micro-batch repeats it exactly and its ratio is 1)."""
        t0 = time.perf_counter()
        with self.tracker.phase("log-probs", None), autocast(self.cfg.dtype, self.device):
            rollout = logprob_pass(self.core, self.reference, rollout, self.cfg.temperature, self.micro_batch_size,
                                   order, keep_trunk_mb=self.cfg.trunk_cache_mb, chunk_budget=self.cfg.cpu_chunk_positions)
        return dataclasses.replace(rollout, timings={**rollout.timings, "timing/logprobs_s": time.perf_counter() - t0})

    def update(self, rollout: Rollout, loss_fn: LossFn, epochs: int, mini_batch_size: int,
               first_perm: torch.Tensor, group_size: int = 1) -> dict[str, float]:
        cfg = self.cfg
        trim_heap()  # sampling's freed blocks: the update's shapes would not reuse them (core/allocator.py)
        with self.tracker.phase("update", None), contextlib.ExitStack() as after:
            after.callback(trim_heap)  # and the update's, before the next sampling or evaluation
            return update_policy(self.model, self.optimizer, self.scheduler, self.accelerator, rollout, loss_fn,
                                 epochs=epochs, mini_batch_size=mini_batch_size,
                                 micro_batch_size=self.micro_batch_size, max_grad_norm=cfg.max_grad_norm,
                                 ratio_check_tol=cfg.ratio_check_tol, generator=self.generator,
                                 first_perm=first_perm, guard=self.guard, where=f"iteration {self.iteration}, ",
                                 group_size=group_size, chunk_budget=cfg.cpu_chunk_positions)

    def log_iteration(self, iteration: int, rollout: Rollout, metrics: dict[str, float],
                      times: tuple[float, float, float],
                      extra_sample_fields: dict[str, list] | None = None) -> dict[str, float]:
        """Add lr/timing/throughput to `metrics`, log them (averaged over processes, the one place
        they are: each process has its own rollout; throughput summed) and a few samples of the
        main process's rollout. Returns the metrics as logged."""
        t0, t1, t2 = times
        metrics.update({"params/lr": self.scheduler.get_last_lr()[0], "params/max_grad_norm": self.cfg.max_grad_norm,
                        "timing/rollout_s": t1 - t0, "timing/update_s": t2 - t1,
                        "throughput/tokens_per_s": rollout.response_mask.sum().item() / max(t2 - t0, 1e-9)})
        parts = rollout.reward_parts
        texts = {k: v for k, v in parts.items() if v and isinstance(v[0], str)}  # notes for samples.jsonl
        metrics.update({f"reward/{k}": sum(v) / max(len(v), 1) for k, v in parts.items() if k not in texts})
        metrics = mean_over_processes(self.accelerator, metrics)
        metrics["throughput/tokens_per_s"] *= self.world
        self.log(iteration, metrics)
        per_seq = (rollout.rewards * rollout.response_mask).sum(1)
        extra = {**texts, **(extra_sample_fields or {})}
        rows = [{"prompt": rollout.prompts[i], "completion": rollout.completions[i],
                 "score": float(rollout.scores[i]), "reward": float(per_seq[i]), **{k: v[i] for k, v in extra.items()}}
                for i in range(min(self.cfg.log_samples, len(rollout.completions)))]
        self.tracker.log_samples(iteration, rows)
        return metrics

    # ---- before and after -----------------------------------------------------------------
    @contextlib.contextmanager
    def evaluating(self):
        """The held-out reward before and after the wrapped training, with the same sampling seed
        (the comparison sees the same noise). A resumed run reuses the before-training result."""
        if not self.eval_records:
            yield
            return
        cfg = self.cfg
        seed = cfg.seed + EVAL_SEED_OFFSET

        def evaluate() -> dict:
            if self.evaluator is not None:
                return self.evaluator(self.eval_records, seed)
            with self.full_weights():
                if self.make_env is not None:
                    return evaluate_episodes(self.core.policy, self.tok, self.eval_records, self.make_env, cfg,
                                             self.params, seed)
                return evaluate_reward(self.core.policy, self.tok, self.eval_records, self.reward_fn, cfg,
                                       self.params, seed)

        def line(when: str, r: dict) -> str:
            tools = f", tool-call rate {r['tool_call_rate']:.1%}" if "tool_call_rate" in r else ""
            return f"[eval] {when} mean reward {r['mean']:.3f} (sd {r['std']:.3f}, n={r['n']}){tools}"

        def evaluate_shown(step: int) -> dict:  # a bar while it samples; the mean to TensorBoard / W&B
            with self.evaluation("before" if step == 0 else "after"), self.tracker.phase("evaluation", None):
                result = self.once("eval_before", evaluate) if step == 0 else evaluate()
            self.tracker.log_sinks(step, {f"eval/reward_{k}": result[k] for k in ("mean", "std")})
            return result

        before = evaluate_shown(0)
        self.print(line("before training:", before))
        yield
        after = evaluate_shown(self.total)
        self.print(line("after training: ", after))
        source = f"env={cfg.env}" if self.make_env is not None else f"reward={reward_name(self.reward_fn)}"
        source = self.eval_source or source
        self.print(f"[eval] change: {after['mean'] - before['mean']:+.3f} on "
                   f"{eval_phrase(len(self.eval_records), 'prompts', self.eval_from)}, "
                   f"{after['n']} samples ({source}, T={cfg.temperature})")
        self.summary.update({"eval_after": after, "eval_change": after["mean"] - before["mean"],
                             "eval_on": self.eval_from})

    def finish(self, save: Callable | None = None) -> dict:
        """RUN/final by `save(folder, state)` (Run.finish), by default the policy (adapter or full weights),
        value head, tokenizer; merged weights on request (not when sharded: the adapter merges with `peft`
        after training)."""
        return super().finish(save or actor_saver(self, self.core, self.tok))
