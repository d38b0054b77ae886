"""Definitions of every logged metric: the one source of truth.

The report's chart tooltips read `METRICS`, and docs/diagnostics.md's glossary table is generated
from it (`python -m rlhfkit.diagnostics.glossary --write docs/diagnostics.md`); a test fails when
the two differ or when a trainer logs a metric that has no entry here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

METRICS: dict[str, str] = {
    # ---- rollout: PPO, GRPO, RLOO
    "rollout/reward_mean": "Mean over the rollout's sequences of the total reward the advantages see, summed over "
    "the sequence's tokens: the score (after score_clip and no_stop_penalty) plus, in PPO with kl_penalty=reward, "
    "the per-token KL penalty -kl_coef * KL_t. GRPO/RLOO: the score alone (their KL term is in the loss).",
    "rollout/reward_std": "Standard deviation (population, /N) of that per-sequence reward across the rollout.",
    "rollout/score_mean": "Mean raw score of the reward function or reward model per sequence, before score_clip "
    "and no_stop_penalty.",
    "rollout/score_std": "Standard deviation (population) of the raw scores across the rollout.",
    "reward/code_pass_rate": "reward=code: share of the iteration's completions whose program passed every test.",
    "reward/code_timeout_rate": "reward=code: share of completions whose first failed test ran out of CPU time or "
    "wall-clock time (the program was killed).",
    "reward/code_error_rate": "reward=code: share of completions whose first failed test raised an error other than "
    "a failed assert or MemoryError (syntax errors, exits before the tests, crashes, output past the size limit).",
    "reward/code_memory_rate": "reward=code: share of completions whose first failed test ran out of memory "
    "(MemoryError at the code_memory_mb address-space limit).",
    "rollout/kl": "Mean over sequences of the summed per-token k1 KL estimate log pi(a) - log pi_ref(a) to the "
    "reference (nats per sequence); negative only by sampling noise. GRPO/RLOO: only with beta > 0.",
    "rollout/non_score_reward": "PPO: mean over sequences of the summed KL part of the reward, sum_t -kl_coef * "
    "KL_t (KL_t from kl_estimator); 0 with kl_penalty=loss. rollout/reward_mean minus this is the mean score added.",
    "rollout/advantage_mean_raw": "PPO: token mean of the GAE advantages before whitening (whitened ones average "
    "0). Positive: returns exceed the critic's values, as they do early on with a zero-initialised value head.",
    "rollout/return_mean": "PPO: token mean of the value targets R_t = A_t + V(s_t) (GAE returns, formed before "
    "the advantages are whitened).",
    "rollout/value_mean": "PPO: token mean of the critic's values V(s_t) at rollout time; it approaches "
    "rollout/return_mean as the critic learns.",
    "rollout/explained_variance": "PPO: how much of the returns' variance the critic's rollout-time values "
    "explain, 1 - Var(R - V) / Var(R) over the valid tokens (rlhfkit.algos.explained_variance): 0 with a "
    "zero-initialised value head, towards 1 as the critic learns, below 0 when it predicts worse than the "
    "returns' mean. Not logged when the returns do not vary.",
    "rollout/response_length": "Mean number of response tokens per sequence, up to and including the first stop "
    "token.",
    "rollout/stop_fraction": "Fraction of responses that ended with a stop token before max_new_tokens.",
    "rollout/turns_mean": "Multi-turn (env=...): mean number of model turns per episode.",
    "rollout/tool_call_rate": "Multi-turn (env=...): fraction of episodes with at least one tool call (as the "
    "environment reports it in its step info).",
    "rollout/judge_unparsed_rate": "reward=judge:URL: fraction of the judge's replies with no score in them "
    "(neither 'N/10' nor a JSON object with judge_score_field); each scored 0 (judge_unparsed=zero).",
    "rollout/tool_error_rate": "Multi-turn (env=...): fraction of tool calls that failed (0 when there were none).",
    "rollout/env_tokens_mean": "Multi-turn (env=...): mean number of environment tokens per episode (observations "
    "and chat-template headers): in the context, outside the loss, KL and entropy.",
    "rollout/entropy": "Mean per-token entropy (nats) of the policy over response tokens, from temperature-scaled "
    "logits of the teacher-forced pass (of the update's forward when an exactly on-policy GRPO/RLOO update skips "
    "that pass).",
    "rollout/group_reward_std": "GRPO/RLOO: mean over prompts of the unbiased (/(G-1)) standard deviation of the "
    "rewards within the prompt's group of G completions (0 = no learning signal).",
    "rollout/zero_std_group_fraction": "GRPO/RLOO: fraction of prompts whose G completions all got the same "
    "reward, so their group-relative advantages are 0.",
    "rollout/solved_fraction": "GRPO/RLOO: fraction of sampled completions whose score is >= solved_threshold "
    "(verifiable tasks such as arithmetic: correct answers).",
    "rollout/advantage_abs_mean": "GRPO/RLOO: mean |A| over the rollout's completions (one group-relative "
    "advantage per completion).",
    "rollout/update_fraction": "GRPO/RLOO: fraction of the rollout's rows the update uses (drop_zero_std_groups "
    "leaves out groups whose rewards all agree; else 1).",
    "rollout/sampling_rounds": "GRPO with dynamic_sampling: rounds of rollout_batch_size completions sampled this "
    "iteration to fill the batch with groups that have a reward spread (at most max_sampling_rounds).",
    "rollout/kept_groups": "GRPO with dynamic_sampling: groups with a reward spread in the batch the update uses.",
    "rollout/extra_samples": "GRPO with dynamic_sampling: completions sampled beyond the first round, "
    "(rounds - 1) * rollout_batch_size: the cost of dynamic sampling.",
    "rollout/overlong_filtered": "GRPO with overlong_filter: fraction of completions cut at max_new_tokens (no stop "
    "token) whose tokens are left out of the loss.",
    "rollout/greedy_reward_mean": "ReMax: mean reward of the greedy completions that serve as the baseline.",
    "rollout/kl_penalty": "REINFORCE++: mean over sequences of the summed per-token KL penalty "
    "-reward_kl_coef * KL_t folded into the rewards.",
    "rollout/is_weight_mean": "GRPO with tis_cap: mean truncated importance weight min(pi_train / pi_sampler, "
    "tis_cap) over the sampled tokens (1 when sampler and trainer agree).",
    "rollout/is_clip_frac": "GRPO with tis_cap: fraction of sampled tokens whose pi_train / pi_sampler is strictly "
    "above tis_cap.",
    "rollout/mismatch_kl": "GRPO with tis_cap: per-token k3 estimate of KL(pi_sampler || pi_train), the mismatch "
    "between the sampler's and the trainer's log-probs of the same tokens.",
    "rollout/pairs": "Online DPO: preference pairs kept this iteration (pairs the judge scored equal are dropped).",
    "rollout/tie_fraction": "Online DPO: fraction of sampled pairs the judge scored equal (dropped).",
    "rollout/judge_margin": "Online DPO: mean judge score of the chosen minus the rejected answer over the kept "
    "pairs.",
    # ---- losses
    "loss/policy": "Clipped-surrogate policy loss max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)) aggregated "
    "over tokens (loss_agg), mean over the iteration's optimiser steps; minimised. With whitened advantages it "
    "starts near 0 and its sign follows the advantages: it does not measure progress.",
    "loss/value": "PPO: value loss 0.5 * max((V - R)^2, (V_clip - R)^2) against the GAE returns R (0.5 * (V - R)^2 "
    "with value_clip_eps=None), aggregated like the policy loss; loss/total weighs it by vf_coef.",
    "loss/entropy": "PPO: mean token entropy (nats) of the policy during the update, aggregated like the losses "
    "(a positive number); loss/total subtracts ent_coef times it, a bonus. Logged even when ent_coef=0.",
    "loss/total": "The loss minimised: loss/policy + vf_coef * loss/value - ent_coef * loss/entropy (+ kl_coef * "
    "k3 KL to the reference with kl_penalty=loss); GRPO/RLOO: loss/policy + beta * loss/kl.",
    "loss/kl": "GRPO/RLOO: k3 KL estimate to the reference, aggregated over tokens like the policy loss "
    "(beta > 0 only).",
    "loss/distill": "distill: the distillation loss minimised, averaged over the iteration's optimiser steps. "
    "loss=reverse-kl: the token mean of (log p_student - log p_teacher) x ratio on the student's samples (its value "
    "on-policy is the k1 estimate of the per-token reverse KL); loss=jsd: the token mean of GKD's JSD_beta. "
    "GRPO with distill_coef: the same term, added to the loss times distill_coef.",
    "distill/reverse_kl": "distill (on-policy iterations) and GRPO with distill_coef: token mean of the k1 "
    "estimate log p_student(y) - log p_teacher(y) over the student's sampled tokens y, from the scoring pass "
    "before the update (nats per token); falls as the student approaches its teacher, negative only by sampling "
    "noise.",
    "distill/jsd": "distill with loss=jsd: token mean of GKD's generalised JSD_beta between the student's and the "
    "teacher's next-token distributions (over the teacher's top distill_topk tokens when set), during the update "
    "(nats per token).",
    "rollout/on_policy": "distill: 1 when the student sampled this iteration's sequences (probability lmbda), 0 "
    "when they came from off_policy_data (the teacher's samples or the dataset's completions).",
    # ---- update statistics
    "params/policy_clip_frac": "Fraction of response tokens where the clipped surrogate term is strictly greater "
    "(>) than the unclipped one, i.e. the clip is active and changes the loss (A > 0 and ratio > 1 + eps, or "
    "A < 0 and ratio < 1 - eps); token-weighted mean over the update's micro-batches.",
    "params/value_clip_frac": "PPO: fraction of response tokens where the clipped value error (V_clip - R)^2 is "
    "strictly greater than the unclipped one, so the clipped term sets the loss; token-weighted over micro-batches.",
    "params/approx_kl": "Per-token KL estimate between the rollout policy and the policy being updated: mean of "
    "0.5 * (log pi - log pi_old)^2 (k2 estimator, nats), token-weighted over micro-batches.",
    "params/ratio_mean": "Token mean of the ratio pi / pi_old over the update's micro-batches (exactly 1 before "
    "the first optimiser step).",
    "params/ratio_first_microbatch_maxdev": "Max |pi/pi_old - 1| on the first micro-batch of the rollout, before "
    "any update: must be ~0 (float error); exactly 0 when an exactly on-policy GRPO/RLOO update skips the "
    "log-prob pass (pi_old is then the update's own log-prob, detached).",
    "params/grad_norm": "Global L2 norm of the gradients before clipping to max_grad_norm (RL trainers: mean over "
    "the iteration's optimiser steps).",
    "params/max_grad_norm": "The gradient-clipping threshold (the max_grad_norm option). A history without it is "
    "judged against the run's config.yaml, else 1.0.",
    "params/kl_coef": "PPO: coefficient of the per-token KL penalty (adaptive or fixed).",
    "params/beta": "GRPO/RLOO: coefficient of the k3 KL term in the loss.",
    "params/lr": "Learning rate at the end of the iteration.",
    "params/skipped_steps": "Optimiser steps of the iteration skipped because the loss or the gradient norm was "
    "NaN/inf (nothing applied); the run stops after max_nonfinite_steps in a row.",
    "params/epoch": "DPO: passes over the preference pairs completed after this optimiser step (fractional).",
    "params/seq_ratio_mean": "GRPO/RLOO with sequence-level ratios (GSPO): mean over completions of the sequence "
    "ratio s_i = exp(token mean of log pi - log pi_old).",
    "params/kl_reference_point": "KTO: z_0, the batch's reference point: the mean log pi - log pi_ref of "
    "mismatched (prompt, answer) pairs over all processes, clamped at 0 (an estimate of KL(pi || pi_ref)).",
    # ---- preference learning
    "rewards/chosen": "DPO: implicit reward of chosen answers, beta * (log pi - log pi_ref), mean (KTO: of the "
    "desirable answers).",
    "rewards/rejected": "DPO: implicit reward of rejected answers, mean (KTO: of the undesirable answers).",
    "rewards/accuracy": "DPO: fraction of pairs whose chosen implicit reward is strictly greater than the "
    "rejected one.",
    "rewards/margin": "DPO: mean of rewards/chosen - rewards/rejected.",
    "logps/chosen": "DPO: mean summed log-prob of the chosen answers under the policy (nats).",
    "logps/rejected": "DPO: mean summed log-prob of the rejected answers under the policy (nats).",
    "loss/dpo": "DPO loss (sigmoid, IPO, cDPO, hinge or robust by loss_type), mean over the optimiser step's pairs.",
    "loss/chosen_nll": "rpo_alpha > 0: the chosen responses' negative log-likelihood per token, the term added to the "
                       "pair loss with weight rpo_alpha (RPO); it should fall as the policy learns the chosen texts.",
    "loss/kto": "KTO loss lambda_y - v(x, y), with v = lambda_D sigmoid(beta (r - z_0)) for desirable answers and "
    "lambda_U sigmoid(beta (z_0 - r)) for undesirable ones, r = log pi - log pi_ref; mean over the step's examples.",
    "data/desirable_fraction": "KTO: fraction of the optimiser step's examples labelled desirable.",
    "rm/accuracy": "Reward model: fraction of pairs scored chosen > rejected.",
    "rm/margin": "Reward model: mean score difference chosen - rejected.",
    "rm/chosen_mean": "Reward model: mean score of chosen answers.",
    "rm/rejected_mean": "Reward model: mean score of rejected answers.",
    "loss/rm": "Pairwise (Bradley-Terry) loss -log sigmoid(score_chosen - score_rejected), mean over pairs.",
    # ---- supervised fine-tuning and held-out evaluations
    "loss/sft": "SFT: token-mean cross-entropy on the training targets of the optimiser step.",
    "eval/loss": "SFT: token-mean cross-entropy on the held-out set (every eval_every steps and at the end).",
    "eval/perplexity": "SFT: exp(eval/loss).",
    "eval/rm_loss": "Reward model: pairwise loss on the held-out pairs (every eval_every steps and at the end).",
    "eval/rm_accuracy": "Reward model: held-out fraction of pairs scored chosen > rejected.",
    "eval/rm_margin": "Reward model: held-out mean score difference chosen - rejected.",
    "tokens": "SFT: target (unmasked response) tokens in the optimiser step's batch, all processes.",
    "eval/rouge_1": "SFT: ROUGE-1 F1 (rouge-score, stemmed) of greedy responses to held-out prompts against "
    "their reference responses, mean over the rouge_examples pairs (after training; before: summary.json).",
    "eval/rouge_2": "SFT: ROUGE-2 F1 of the same greedy responses.",
    "eval/rouge_l": "SFT: ROUGE-L (longest common subsequence) F1 of the same greedy responses.",
    # ---- TRPO (one natural-gradient policy step per iteration; params/approx_kl is trpo/kl_after_step)
    "trpo/kl_after_step": "TRPO: exact mean token KL(pi_old || pi) of the full next-token distributions over the "
    "rollout's response tokens after the accepted step (<= max_kl; 0 when no step was accepted).",
    "trpo/line_search_steps": "TRPO: candidate steps the backtracking line search evaluated (1 = the full step).",
    "trpo/cg_residual": "TRPO: ||g - (F + damping I) x|| / ||g|| after the conjugate-gradient iterations.",
    "trpo/cg_iterations": "TRPO: Fisher-vector products the conjugate gradient used.",
    "trpo/surrogate_improvement": "TRPO: rise of the surrogate advantage (token mean of ratio x advantage) by the "
    "accepted step (0: no step).",
    "trpo/expected_improvement": "TRPO: first-order predicted rise g . s of the full step.",
    "trpo/step_accepted": "TRPO: 1 when the line search accepted a step, else 0 (no update this iteration).",
    "trpo/step_fraction": "TRPO: the accepted fraction of the full step (backtrack_coef ** k; 0: none).",
    "trpo/step_scale": "TRPO: sqrt(2 max_kl / x^T F x), the factor that puts the full step on the trust-region "
    "boundary of the quadratic KL model.",
    "trpo/step_norm": "TRPO: L2 norm of the full step in parameter space.",
    "trpo/kl_last_tried": "TRPO: mean token KL of the last candidate the line search evaluated.",
    "trpo/ratio_mean": "rlhfkit.algos.trpo.surrogate_advantage: mean ratio pi / pi_old over the call's valid "
    "tokens (a per-call statistic of the maths function; the trainer does not log it).",
    "trpo/kl_max": "rlhfkit.algos.trpo.token_kl: the largest single-token KL of the call (a per-call statistic of "
    "the maths function; the trainer does not log it).",
    "trpo/policy_grad_norm": "TRPO: L2 norm of the surrogate's gradient g (the policy gradient).",
    # ---- time
    "timing/rollout_s": "Seconds of the iteration before the update: sampling, reward, the teacher-forced pass "
    "(and GAE in PPO).",
    "timing/update_s": "Seconds of the optimisation phase (every epoch, mini-batch and micro-batch).",
    "timing/generate_s": "Seconds spent sampling the responses.",
    "timing/reward_s": "Seconds spent in the reward function or reward model.",
    "timing/reward_remote_s": "reward=http(s)://... or judge:URL: wall seconds the iteration's scoring waited on "
    "reward servers and judges (all requests, retries and back-off included; concurrent requests count once; "
    "part of timing/reward_s). Logged only with such a reward.",
    "timing/logprobs_s": "Seconds of the teacher-forced pass (log-probs, values, entropy, reference log-probs); 0 "
    "when an exactly on-policy GRPO/RLOO update skips it.",
    "timing/step_s": "SFT, RM, DPO: seconds of one optimiser step, batch to update.",
    "throughput/tokens_per_s": "Valid generated response tokens per second of wall time over the whole "
    "iteration (rollout + update), summed over processes.",
    # ---- one-step-off-policy rollouts (GRPO family, one_step_off_policy)
    "rollout/policy_lag": "GRPO with one_step_off_policy: policy updates between the weights that sampled the "
    "batch and the trainer's (0: sampled on-policy, the first iteration and the first after a resume; 1: by the "
    "sampler copy, before the previous update).",
    "timing/sampler_wait_s": "GRPO with one_step_off_policy: seconds the trainer waited after its update for the "
    "background sampler to finish the next batch (0 when sampling was fully hidden behind the update).",
    "timing/sampler_logprobs_s": "GRPO with one_step_off_policy: seconds of the sampler's own teacher-forced pass "
    "over its tokens (its log-probs for the importance weights), run in the background thread; 0 on-policy.",
    # ---- agent episodes (GRPO family, agent=python:FILE:FN; rollout/agent.py)
    "agent/error_rate": "agent=...: fraction of the iteration's episodes dropped (the sum of the agent/*_rate "
    "reasons below); dropped episodes train nothing and leave their group's baseline.",
    "agent/raised_rate": "agent=...: fraction of episodes whose FN raised an exception.",
    "agent/rejected_rate": "agent=...: fraction of episodes with a request the server refused (a model name other "
    "than agent_model, an unsupported parameter such as stream or top_p < 1, a prompt over the context window, "
    "more than agent_max_calls requests), counted even when FN caught the error.",
    "agent/timeout_rate": "agent=...: fraction of episodes that took longer than agent_timeout seconds.",
    "agent/no_call_rate": "agent=...: fraction of episodes whose FN returned without one reply from the model.",
    "agent/bad_reward_rate": "agent=...: fraction of episodes whose FN returned no finite number (None, NaN, a "
    "string) or a per-turn list whose length is not the number of model replies.",
    "agent/calls_per_episode": "agent=...: mean number of requests the server answered per episode (all episodes).",
    "agent/rows_per_episode": "agent=...: mean number of training rows per kept episode: 1 when the agent only "
    "appends to its conversation; more when it edits or re-orders it between calls, or asks for n > 1.",
    "agent/episode_s": "agent=...: mean wall-clock seconds of an episode (FN's whole run, tools included).",
    "agent/prompt_tokens_per_episode": "agent=...: prompt tokens the server ran through the model (prefill) per "
    "episode, over every request: the context recomputed at each turn.",
}

GROUP_ORDER = ("rollout", "agent", "loss", "params", "rewards", "logps", "rm", "data", "eval", "trpo", "timing",
               "throughput")
BEGIN = "<!-- glossary: generated from src/rlhfkit/diagnostics/glossary.py by `python -m rlhfkit.diagnostics.glossary --write docs/diagnostics.md`; edit the code, not this table -->"  # noqa: E501
END = "<!-- end of generated glossary -->"


PER_REWARD = ("Batch mean of one of several rewards (reward=a,b), before its weight (reward_weights); "
              "rollout/score_mean is their weighted sum")


def describe(metric: str) -> str:
    """The metric's definition, or "" when it is not in the glossary. `reward/NAME`: one of several rewards."""
    if metric not in METRICS and metric.startswith("reward/"):
        return PER_REWARD
    return METRICS.get(metric, "")


def sort_metrics(names: set[str] | list[str]) -> list[str]:
    """Glossary order first (grouped by prefix), then the rest alphabetically within groups."""
    order = {name: i for i, name in enumerate(METRICS)}

    def key(name: str) -> tuple[int, int, str]:
        group = name.split("/", 1)[0] if "/" in name else ""
        g = GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)
        return (g, order.get(name, len(order)), name)

    return sorted(names, key=key)


def render_markdown() -> str:
    """The glossary as the Markdown table docs/diagnostics.md carries, between BEGIN and END."""
    escaped = {name: text.replace("|", "\\|") for name, text in METRICS.items()}  # a | would split the cell
    rows = [f"| `{name}` | {escaped[name]} |" for name in sort_metrics(list(METRICS))]
    return "\n".join([BEGIN, "| metric | definition |", "|---|---|", *rows, END])


def replace_block(text: str) -> str:
    """`text` with its generated block (BEGIN ... END) replaced by the current glossary."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError("no generated glossary block (BEGIN ... END markers) in the text")
    return pattern.sub(lambda _: render_markdown(), text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlhfkit.diagnostics.glossary",
                                description="Print the metric glossary as Markdown, or rewrite it in a file.")
    p.add_argument("--write", metavar="FILE", help="replace the generated block in FILE (docs/diagnostics.md)")
    args = p.parse_args(argv)
    if not args.write:
        print(render_markdown())
        return 0
    path = Path(args.write)
    path.write_text(replace_block(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the glossary ({len(METRICS)} metrics) to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
