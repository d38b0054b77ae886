"""Multi-turn rollouts (rollout/multiturn.py): mask arithmetic, reward placement, GAE across a turn
boundary, token-in token-out sampling, environment errors, and env tokens staying out of every loss."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlhfkit.core.config import build_config
from rlhfkit.envs import Step
from rlhfkit.errors import UserError
from rlhfkit.models.policy import ActorCritic, ValueHead
from rlhfkit.rollout import Rollout, SamplingParams, generate, logprob_pass
from rlhfkit.rollout.core import generate_ids, trim, trim_rows
from rlhfkit.rollout.multiturn import env_text, generate_episodes, render
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.ppo import compute_advantages
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.rl_update import rollout_metrics

from tiny_lm import build_tiny_model, build_tokenizer

RECORDS = [{"prompt": f"What is {i} + 4?", "answer": str(i + 4)} for i in range(4)]


class ScriptedEnv:
    """Answers every model turn with "obs N" (N = model turns so far), rewards 0.5 per turn and ends
    after `turns` model turns; row i of a batch gets turns = `plan[i]` (one env per row, in order)."""

    made = 0

    def __init__(self, turns: int = 2, tool_every: int = 1):
        self.turns, self.tool_every = turns, tool_every
        self.seen: list[tuple[list[dict], str]] = []

    def reset(self, record):
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, history, model_turn):
        self.seen.append((history, model_turn))
        n = len(self.seen)
        return Step([{"role": "user", "content": f"obs {n}"}], 0.5, n >= self.turns,
                    {"tool_call": "calc" if n % self.tool_every == 0 else None})


def planned(plan):
    """make_env for rows whose episodes last plan[i] model turns."""
    it = iter(plan)
    return lambda: ScriptedEnv(next(it))


@pytest.fixture()
def tiny():
    tok = build_tokenizer()
    tok.padding_side = "left"
    return build_tiny_model(len(tok), seed=1), tok


def model_segments(mask_row):
    """[(start, end)] runs of 1 in a 0/1 row."""
    runs, start = [], None
    for t, v in enumerate(mask_row.tolist() + [0]):
        if v and start is None:
            start = t
        elif not v and start is not None:
            runs.append((start, t))
            start = None
    return runs


# ----------------------------------------------------------------------------- hand-built two-turn rollout


def two_turn_rollout(values_at_env=0.0, lp_at_env=0.0):
    """One row: model turn 1 = positions 0-1, env tokens 2-4, model turn 2 = 5-6, padding 7.
    Turn rewards 1.0 (turn 1) and 2.0 (turn 2) on each turn's last model token."""
    model = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0]], dtype=torch.float32)
    context = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.float32)
    turn_rewards = torch.tensor([[0, 1.0, 0, 0, 0, 0, 2.0, 0]])
    env = (context - model).bool()
    values = torch.tensor([[0.5, 0.2, 0, 0, 0, 0.1, 0.4, 0]]).masked_fill(env, values_at_env)
    logprobs = torch.tensor([[-1.0, -2.0, 0, 0, 0, -0.5, -1.5, 0]]).masked_fill(env, lp_at_env)
    ref = torch.tensor([[-1.5, -2.0, 0, 0, 0, -0.5, -1.0, 0]])
    return Rollout(query_ids=torch.ones(1, 3, dtype=torch.long), query_mask=torch.ones(1, 3, dtype=torch.long),
                   response_ids=torch.arange(8)[None], response_mask=model, stopped=torch.tensor([True]),
                   logprobs=logprobs, ref_logprobs=ref, values=values, scores=torch.tensor([3.0]),
                   context_mask=context, turn_rewards=turn_rewards)


def ppo_cfg(**kw):
    base = {"gamma": 0.9, "lam": 0.8, "whiten_advantages": False, "rollout_batch_size": 8, "mini_batch_size": 8}
    return build_config(PPOConfig, {**base, **kw})


def test_two_turn_rewards_sit_on_each_turns_last_model_token_with_the_kl_on_model_tokens():
    ro = two_turn_rollout(lp_at_env=50.0)  # garbage log-probs at env tokens must not reach any reward
    ro, _ = compute_advantages(ro, ppo_cfg(), kl_coef=0.1)
    # k1 KL = logp - ref: 0.5, 0, -, -, -, 0, -0.5 -> -0.1 * KL; + 1.0 at 1, + 2.0 at 6
    expected = torch.tensor([[-0.05, 1.0, 0, 0, 0, 0, 2.0 + 0.05, 0]])
    torch.testing.assert_close(ro.rewards, expected)
    assert ro.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]]  # env tokens attended, padding not


def test_turn_rewards_are_clipped_each_and_replaced_by_the_no_stop_penalty():
    from rlhfkit.algos.rewards import shape_turn_rewards

    ro = two_turn_rollout()
    same = torch.zeros(1, 8)
    rewards, m = shape_turn_rewards(ro.turn_rewards, same, same, ro.response_mask, 0.1, score_clip=1.5)
    assert rewards.tolist() == [[0, 1.0, 0, 0, 0, 0, 1.5, 0]] and m["score_mean"] == 2.5
    rewards, m = shape_turn_rewards(ro.turn_rewards, same, same, ro.response_mask, 0.1,
                                    stopped=torch.tensor([False]), no_stop_penalty=-1.0)
    assert rewards.tolist() == [[0, 0, 0, 0, 0, 0, -1.0, 0]] and m["score_mean"] == -1.0
    rewards, _ = shape_turn_rewards(ro.turn_rewards, same, same, ro.response_mask, 0.1,
                                    stopped=torch.tensor([True]), no_stop_penalty=-1.0)
    assert rewards.tolist() == [[0, 1.0, 0, 0, 0, 0, 2.0, 0]]


def test_gae_runs_across_the_turn_boundary_over_model_tokens_only():
    ro = two_turn_rollout(values_at_env=1e6)  # a value at an env token must never leak into an advantage
    ro, _ = compute_advantages(ro, ppo_cfg(), kl_coef=0.0)
    # Model steps 0, 1, 5, 6 with r = 0, 1, 0, 2 and V = 0.5, 0.2, 0.1, 0.4; gamma 0.9, lam 0.8 (gamma*lam 0.72):
    # A6 = 2 - 0.4 = 1.6
    # A5 = (0 + 0.9*0.4 - 0.1) + 0.72*1.6 = 0.26 + 1.152 = 1.412
    # A1 = (1 + 0.9*0.1 - 0.2) + 0.72*1.412 = 0.89 + 1.01664 = 1.90664   (the next state is position 5)
    # A0 = (0 + 0.9*0.2 - 0.5) + 0.72*1.90664 = -0.32 + 1.3727808 = 1.0527808
    adv = torch.tensor([[1.0527808, 1.90664, 0, 0, 0, 1.412, 1.6, 0]])
    torch.testing.assert_close(ro.advantages, adv)
    torch.testing.assert_close(ro.returns, adv + torch.tensor([[0.5, 0.2, 0, 0, 0, 0.1, 0.4, 0]]))
    other = two_turn_rollout(values_at_env=-3.0)
    other, _ = compute_advantages(other, ppo_cfg(), kl_coef=0.0)
    assert torch.equal(other.advantages, ro.advantages)


def test_grpo_sequence_score_lands_on_the_last_model_token_only():
    from rlhfkit.trainers.grpo import compute_advantages as grpo_advantages

    ro = two_turn_rollout()
    twin = two_turn_rollout()
    twin = dataclasses.replace(twin, scores=torch.tensor([0.0]))
    both = Rollout(**{k: torch.cat([getattr(ro, k), getattr(twin, k)]) for k in
                      ("query_ids", "query_mask", "response_ids", "response_mask", "stopped", "scores",
                       "context_mask", "turn_rewards")})
    both, _ = grpo_advantages(both, build_config(GRPOConfig, {"rollout_batch_size": 2, "group_size": 2, "mini_batch_size": 2,
                                                    "micro_batch_size": 2}))
    assert both.rewards[0].tolist() == [0, 0, 0, 0, 0, 0, 3.0, 0]
    # scores 3 and 0: mean 1.5, unbiased std 2.1213: +-0.7071 on model tokens, 0 on env tokens and padding
    a = 1.5 / (2.0 ** 0.5 * 1.5 + 1e-6)
    torch.testing.assert_close(both.advantages[0], a * torch.tensor([1.0, 1, 0, 0, 0, 1, 1, 0]))


def test_trim_keeps_env_tokens_and_metrics_count_them():
    ro = two_turn_rollout()
    ro.response_mask[0, 6] = 0  # even if the last real token were not the model's, trim keeps the context
    assert trim(ro).response_ids.shape[1] == 7
    ro = two_turn_rollout()
    ro = dataclasses.replace(ro, rewards=torch.zeros(1, 8))
    ro = dataclasses.replace(ro, info={"turns": [2], "tool_calls": [1], "tool_errors": [1]})
    m = rollout_metrics(ro)
    assert (m["rollout/turns_mean"], m["rollout/env_tokens_mean"], m["rollout/response_length"]) == (2.0, 3.0, 4.0)
    assert (m["rollout/tool_call_rate"], m["rollout/tool_error_rate"]) == (1.0, 1.0)


# ----------------------------------------------------------------------------- env text from the template


def test_env_tokens_are_the_template_difference_after_the_sampled_stop_token():
    tok = build_tokenizer()
    history = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "call calc"}]
    obs = [{"role": "tool", "content": "4"}]
    without = tok.apply_chat_template(history, tokenize=False)
    with_obs = tok.apply_chat_template(history + obs, tokenize=False, add_generation_prompt=True)
    diff = with_obs[len(without):]
    assert diff == "<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"
    # the model sampled "...<|im_end|>": the template's "\n" after it belongs to the env tokens
    assert env_text(tok, history, obs, "<|im_end|>") == "\n" + diff
    # a turn cut without a stop token: the template closes it
    assert env_text(tok, history, obs, "") == "<|im_end|>\n" + diff
    # a template that leaves earlier assistant turns out cannot carry a multi-turn context
    forgetful = build_tokenizer()
    forgetful.chat_template = tok.chat_template.replace("{% for m in messages %}",
                                                        "{% for m in messages if m['role'] != 'assistant' %}")
    with pytest.raises(UserError, match="chat template drops earlier assistant turns"):
        env_text(forgetful, history, obs, "<|im_end|>")
    # no template: the plain format's blocks
    assert env_text(tok, history, obs, "<|im_end|>", fmt=type("F", (), {"chat_template": False})()) == (
        "\n\nTool: 4\n\nAssistant: ")


@pytest.mark.slow
def test_env_text_with_the_default_smollm2_tokenizer():
    """SmolLM2's template adds a default system message when there is none: only the tail counts."""
    from rlhfkit.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    history = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "x"}]
    assert env_text(tok, history, [{"role": "tool", "content": "4"}], "<|im_end|>") == (
        "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n")
    assert render(tok, history[:1]).startswith("<|im_start|>system\n")


# ----------------------------------------------------------------------------- generate_episodes


def spy_generate(model):
    """Record (input rows, output sequences) of every model.generate call."""
    calls = []
    orig = model.generate

    def wrapped(*a, **kw):
        out = orig(*a, **kw)
        calls.append((kw["input_ids"].shape[0], out[:, kw["input_ids"].shape[1]:].clone()))
        return out

    model.generate = wrapped
    return calls


def test_model_tokens_are_the_sampled_ids_and_env_tokens_the_template_text(tiny):
    model, tok = tiny
    calls = spy_generate(model)
    envs = []

    def make():
        envs.append(ScriptedEnv(turns=3))
        return envs[-1]

    ro = generate_episodes(model, tok, make, RECORDS, SamplingParams(max_new_tokens=5), max_turns=3,
                           max_total_tokens=200, seed=0)
    assert ro.info["turns"] == [3, 3, 3, 3] and ro.scores.tolist() == [1.5] * 4
    for b in range(4):
        segs = model_segments(ro.response_mask[b])
        assert len(segs) == 3
        for k, (s, e) in enumerate(segs):
            sampled = calls[k][1][b]  # all rows run all turns, so row b is row b of each call
            assert ro.response_ids[b, s:e].tolist() == sampled[: e - s].tolist()
            stopped = sampled[e - s - 1].item() == tok.eos_token_id
            assert stopped or e - s == 5  # cut at a stop token or at max_new_tokens
            assert ro.turn_rewards[b, e - 1] == 0.5  # each turn's reward on its last model token
            if k < 2:  # env tokens: the template text after the turn
                history = envs[b].seen[k][0]
                text = env_text(tok, history, [{"role": "user", "content": f"obs {k + 1}"}],
                                "<|im_end|>" if stopped else "")
                nxt = segs[k + 1][0]
                assert ro.response_ids[b, e:nxt].tolist() == tok(text, add_special_tokens=False)["input_ids"]
        assert ro.turn_rewards[b].sum() == 1.5 and (ro.turn_rewards[b] * (1 - ro.response_mask[b])).abs().sum() == 0
        # the env saw every message so far, its model turn last, and the text of the sampled ids
        history, turn = envs[b].seen[-1]
        assert history[-1] == {"role": "assistant", "content": turn}
        assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    # the context the model continued from in turn 2 is the query followed by the response region so far
    assert ro.context_mask.sum(1).tolist() == [len(ro.response_ids[b][ro.context_mask[b].bool()]) for b in range(4)]


def test_finished_rows_are_not_generated_for_again(tiny):
    model, tok = tiny
    calls = spy_generate(model)
    ro = generate_episodes(model, tok, planned([1, 3, 2, 3]), RECORDS, SamplingParams(max_new_tokens=4),
                           max_turns=5, max_total_tokens=200, seed=0)
    assert [n for n, _ in calls] == [4, 3, 2]
    assert ro.info["turns"] == [1, 3, 2, 3]
    assert [len(model_segments(m)) for m in ro.response_mask] == [1, 3, 2, 3]


def test_max_turns_and_max_total_tokens_end_episodes(tiny):
    model, tok = tiny
    ro = generate_episodes(model, tok, planned([9] * 4), RECORDS, SamplingParams(max_new_tokens=4), max_turns=2,
                           max_total_tokens=200, seed=0)
    assert ro.info["turns"] == [2] * 4
    ro = generate_episodes(model, tok, planned([9] * 4), RECORDS, SamplingParams(max_new_tokens=4, stop_ids=(9999,)),
                           max_turns=50, max_total_tokens=30, seed=0)
    assert (ro.context_mask.sum(1) <= 30).all() and not ro.stopped.any()
    assert ro.response_ids.shape[1] <= 30


def test_every_env_is_closed_once_when_its_episode_ends(tiny):
    """An environment's optional close() (a server session it holds) runs once per episode, however
    the episode ended: done, max_turns or max_total_tokens."""
    model, tok = tiny
    made = []

    class ClosingEnv(ScriptedEnv):
        closed = 0

        def close(self):
            self.closed += 1

    def make():
        made.append(ClosingEnv([1, 9, 9, 9][len(made)]))
        return made[-1]

    generate_episodes(model, tok, make, RECORDS, SamplingParams(max_new_tokens=4), max_turns=3, max_total_tokens=200,
                      seed=0)
    assert [e.closed for e in made] == [1, 1, 1, 1] and [len(e.seen) for e in made] == [1, 3, 3, 3]


@pytest.mark.parametrize("loop", ["hf", "lean"])
def test_one_turn_env_reproduces_the_single_turn_rollout(tiny, loop):
    """Sampled (T = 1): the episode's one turn draws the same tokens as single-turn sampling with the
    seed, through HF generate or the lean loop (`sample_ids`, generation_backend=lean)."""
    from rlhfkit.data.chat import format_prompt
    from rlhfkit.rollout.decode import lean_generate, lean_generate_ids

    single_turn, sample_ids = (generate, generate_ids) if loop == "hf" else (lean_generate, lean_generate_ids)
    model, tok = tiny
    params = SamplingParams(max_new_tokens=8)
    torch.manual_seed(3)
    single = single_turn(model, tok, [format_prompt(tok, r["prompt"]) for r in RECORDS], params, batch_size=3)
    multi = generate_episodes(model, tok, planned([1] * 4), RECORDS, params, max_turns=4, max_total_tokens=64,
                              seed=3, batch_size=3, sample_ids=sample_ids)
    for k in ("query_ids", "query_mask", "response_ids", "response_mask", "stopped"):
        assert torch.equal(getattr(multi, k), getattr(single, k)), k
    assert torch.equal(multi.context_mask, single.response_mask) and multi.completions == single.completions


def test_lean_turns_give_the_hf_episodes_when_greedy(tiny):
    """`sample_ids=lean_generate_ids` (generation_backend=lean) runs each turn through the lean
    loop: greedy, the same episodes as HF generate's turns, rows finishing at different turns."""
    from rlhfkit.rollout.decode import lean_generate_ids

    model, tok = tiny
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    hf, lean = (generate_episodes(model, tok, planned([1, 3, 2, 3]), RECORDS, params, max_turns=5,
                                  max_total_tokens=200, seed=0, sample_ids=fn)
                for fn in (generate_ids, lean_generate_ids))
    for k in ("query_ids", "response_ids", "response_mask", "context_mask", "turn_rewards", "stopped"):
        assert torch.equal(getattr(lean, k), getattr(hf, k)), k
    assert lean.info["turns"] == [1, 3, 2, 3] and lean.completions == hf.completions


def test_environment_and_tool_errors_become_observations(tiny):
    model, tok = tiny

    class Flaky(ScriptedEnv):
        def step(self, history, model_turn):
            self.seen.append((history, model_turn))
            if len(self.seen) == 1:
                raise ValueError("calculator exploded")
            return Step(None, 1.0, True, {"tool_call": "calc", "tool_error": True})

    with pytest.warns(UserWarning, match="calculator exploded"):
        ro = generate_episodes(model, tok, Flaky, RECORDS[:2], SamplingParams(max_new_tokens=3), max_turns=3,
                               max_total_tokens=200, seed=0)
    assert ro.info["env_errors"] == [1, 1] and ro.info["tool_errors"] == [1, 1] and ro.info["turns"] == [2, 2]
    env = (ro.context_mask - ro.response_mask).bool()
    assert "Error: ValueError: calculator exploded" in tok.decode(ro.response_ids[0][env[0]])
    assert ro.scores.tolist() == [1.0, 1.0]


# ----------------------------------------------------------------------------- the teacher-forced pass and losses


@pytest.fixture()
def scored_episodes(tiny):
    model, tok = tiny
    actor = ActorCritic(model, ValueHead(32))
    with torch.no_grad():
        actor.value_head.summary.weight.normal_(0, 1.0)
    ro = generate_episodes(model, tok, planned([3, 1, 2, 3]), RECORDS, SamplingParams(max_new_tokens=4),
                           max_turns=3, max_total_tokens=200, seed=0)
    order = torch.tensor([2, 0, 3, 1])
    ro = logprob_pass(actor, None, ro, 1.0, micro_batch_size=2, order=order)
    ro = dataclasses.replace(ro, ref_logprobs=ro.logprobs - 0.1 * ro.response_mask)
    return actor, tok, ro, order


def test_teacher_forced_logprobs_equal_one_unpadded_forward_per_row(scored_episodes):
    """Loop-vs-batched: each row alone, no padding, env tokens in the context: same log-probs at the
    model's tokens (attention and positions through left padding and env tokens are right)."""
    actor, _, ro, _ = scored_episodes
    for b in range(4):
        q = ro.query_ids[b][ro.query_mask[b].bool()]
        n = int(ro.context_mask[b].sum())
        ids = torch.cat([q, ro.response_ids[b, :n]])[None]
        with torch.no_grad():
            logits = actor.policy(input_ids=ids).logits[0, len(q) - 1 : -1]
        lp = torch.log_softmax(logits.float(), -1).gather(1, ro.response_ids[b, :n, None]).squeeze(1)
        m = ro.response_mask[b, :n].bool()
        torch.testing.assert_close(ro.logprobs[b, :n][m], lp[m], rtol=1e-4, atol=1e-4)
        assert (ro.logprobs[b, :n][~m] == 0).all() and (ro.values[b, :n][~m] == 0).all()


def test_first_micro_batch_ratio_is_one_on_multi_turn_rollouts(scored_episodes):
    from rlhfkit.trainers.ppo import micro_batch_loss

    actor, _, ro, order = scored_episodes
    cfg = ppo_cfg(micro_batch_size=2, mini_batch_size=4, rollout_batch_size=4, dtype="fp32")
    ro, _ = compute_advantages(ro, cfg, kl_coef=0.05)
    mb = trim_rows(ro, order[:2])
    _, st = micro_batch_loss(actor, mb, cfg, 0.05, mb.response_mask.sum().item(), torch.device("cpu"), 2.0)
    assert st["ratio_dev"] < 1e-5


@pytest.mark.parametrize("trainer", ["ppo", "grpo"])
def test_env_tokens_change_nothing_in_the_policy_value_kl_and_entropy_losses(scored_episodes, trainer):
    actor, _, ro, _ = scored_episodes
    env = (ro.context_mask - ro.response_mask).bool()
    assert env.any()
    if trainer == "ppo":
        from rlhfkit.trainers.ppo import micro_batch_loss

        cfg = ppo_cfg(micro_batch_size=4, mini_batch_size=4, rollout_batch_size=4, dtype="fp32", ent_coef=0.01,
                      kl_penalty="loss")
        ro, _ = compute_advantages(ro, cfg, kl_coef=0.05)

        def loss(r):
            return micro_batch_loss(actor, r, cfg, 0.05, r.response_mask.sum().item(), torch.device("cpu"), 4.0)
    else:
        from rlhfkit.trainers.grpo import compute_advantages as grpo_advantages
        from rlhfkit.trainers.grpo import micro_batch_loss

        cfg = build_config(GRPOConfig, {"rollout_batch_size": 4, "group_size": 2, "mini_batch_size": 4,
                                        "micro_batch_size": 4, "beta": 0.1, "dtype": "fp32"})
        ro = dataclasses.replace(ro, scores=torch.tensor([1.0, 0.0, 0.5, 2.0]))
        ro, _ = grpo_advantages(ro, cfg)

        def loss(r):
            return micro_batch_loss(actor, r, cfg, r.response_mask.sum().item(), 4.0, torch.device("cpu"))

    with torch.no_grad():  # move the policy off pi_old so ratios, clipping and KL are all non-trivial
        for p in actor.policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    base, base_stats = loss(ro)
    perturbed = dataclasses.replace(ro, **{name: t.masked_fill(env, 7.5) for name in (
        "logprobs", "ref_logprobs", "values", "returns", "advantages", "entropy") if (t := getattr(ro, name)) is not None})
    other, other_stats = loss(perturbed)
    assert other.item() == base.item()
    assert other_stats == base_stats
