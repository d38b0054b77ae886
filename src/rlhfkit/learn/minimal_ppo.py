"""PPO for a language model in one file, to read top to bottom (docs/learn/README.md, before entry 0).

torch and transformers only: nothing of rlhfkit is imported, so every step of one PPO iteration is
here in a few lines. The task is the one `python -m rlhfkit.learn.tiny` trains (entry 0): a tiny
random Llama (2 layers, hidden size 32) learns to use vowels, the reward being the share of a, e, i,
o, u among an answer's characters. To need no tokenizer, the vocabulary here is one token per
character (tiny.py trains a byte-level BPE); every prompt has the same length and every answer
exactly ANSWER_LEN tokens, so no token is padding and no mask is needed (rlhfkit's functions take a
mask for the general case; tests/learn/test_minimal_ppo.py checks these against them).

One iteration:  sample -> score -> per-token KL reward -> GAE -> clipped policy and value losses -> update

    python -m rlhfkit.learn.minimal_ppo                  # 20 iterations, the vowel share per iteration
    python -m rlhfkit.learn.minimal_ppo --iterations 10 --seed 1
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CHARS = "abcdefghijklmnopqrstuvwxyz .,:!?0123456789"  # token id i is the character CHARS[i]
VOWELS = frozenset("aeiou")
ANSWER_LEN = 8  # T: tokens per answer
PROMPTS = [f"Review thing {i:02d}:" for i in range(32)]  # all of one length P
CPU = torch.device("cpu")


def encode(texts: list[str]) -> torch.Tensor:
    """(B, P) token ids of equally long texts."""
    return torch.tensor([[CHARS.index(c) for c in t.lower()] for t in texts], dtype=torch.long, device=CPU)


def vowel_share(answers: torch.Tensor) -> torch.Tensor:
    """The score: (B, T) answer tokens -> (B,) share of vowels among their characters."""
    is_vowel = torch.tensor([c in VOWELS for c in CHARS], dtype=torch.float32, device=answers.device)
    return is_vowel[answers].mean(dim=1)


class Agent(torch.nn.Module):
    """The policy (a causal LM) and the critic: a linear value head on the same hidden states."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.lm = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(CHARS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True))
        self.value_head = torch.nn.Linear(32, 1)
        torch.nn.init.zeros_(self.value_head.weight)  # V = 0 at first: advantages start as the raw rewards
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, ids: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, P + T) -> (logp (B, T) of the answer tokens, values (B, T) of the states before them).
        Position p - 1 predicts token p, so the answer's logits sit at positions P - 1 .. P + T - 2."""
        out = self.lm(input_ids=ids, output_hidden_states=True)
        logits = out.logits[:, prompt_len - 1:-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)
        values = self.value_head(out.hidden_states[-1][:, prompt_len - 1:-1]).squeeze(-1)
        return logp, values


@torch.no_grad()
def sample(agent: Agent, prompts: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """(B, P) prompts -> (B, P + T) prompts and sampled answers, token by token at temperature 1."""
    ids = prompts
    for _ in range(ANSWER_LEN):
        probs = torch.softmax(agent.lm(input_ids=ids).logits[:, -1].float(), dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return ids


def kl_rewards(scores: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Per-token rewards (B, T): -kl_coef * (logp - ref_logp) on every token (the k1 estimate of the
    KL to the reference), plus the score (B,) on the last token."""
    rewards = -kl_coef * (logp - ref_logp)
    rewards[:, -1] += scores
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, backwards over (B, T): delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = delta_t + gamma lam A_{t+1}, with V = 0 after the last token (the answer ended there).
    Returns (advantages, returns = advantages + values), both (B, T)."""
    advantages = torch.zeros_like(rewards)
    next_value = next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = advantages[:, t] = delta + gamma * lam * next_adv
        next_value = values[:, t]
    return advantages, advantages + values


def whiten(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """x shifted to mean 0 and scaled to variance 1 (population variance) over all its elements."""
    return (x - x.mean()) * torch.rsqrt(x.var(unbiased=False) + eps)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """Clipped surrogate as a loss: mean over tokens of max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps))."""
    ratio = torch.exp(logp - old_logp)
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_eps, 1 + clip_eps)).mean()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """Clipped value loss: mean over tokens of 0.5 max((V - R)^2, (V_old + clip(V - V_old, +-eps) - R)^2)."""
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2).mean()


@torch.no_grad()
def rollout(agent: Agent, ref: Agent, prompts: torch.Tensor, gen: torch.Generator, cfg: dict) -> dict:
    """Sample, score, and turn the scores into advantages and returns: everything the update needs."""
    ids = sample(agent, prompts, gen)
    P = prompts.shape[1]
    scores = vowel_share(ids[:, P:])
    logp, values = agent(ids, P)  # the old log-probs: the same teacher-forced pass the update runs
    ref_logp, _ = ref(ids, P)
    rewards = kl_rewards(scores, logp, ref_logp, cfg["kl_coef"])
    advantages, returns = gae(rewards, values, cfg["gamma"], cfg["lam"])
    return dict(ids=ids, logp=logp, values=values, advantages=whiten(advantages), returns=returns,
                scores=scores, kl=(logp - ref_logp).sum(1).mean())


def update(agent: Agent, opt: torch.optim.Optimizer, batch: dict, cfg: dict, gen: torch.Generator) -> dict:
    """cfg["epochs"] passes over the rollout in shuffled mini-batches, one optimiser step each."""
    P, B = batch["ids"].shape[1] - ANSWER_LEN, batch["ids"].shape[0]
    for _ in range(cfg["epochs"]):
        for idx in torch.randperm(B, generator=gen, device=CPU).split(cfg["mini_batch"]):
            logp, values = agent(batch["ids"][idx], P)
            pg = policy_loss(logp, batch["logp"][idx], batch["advantages"][idx], cfg["clip_eps"])
            vf = value_loss(values, batch["values"][idx], batch["returns"][idx], cfg["clip_eps"])
            opt.zero_grad()
            (pg + cfg["vf_coef"] * vf).backward()
            torch.nn.utils.clip_grad_norm_(agent.parameters(), cfg["max_grad_norm"])
            opt.step()
    return dict(policy_loss=pg.item(), value_loss=vf.item())


CONFIG = dict(batch=32, mini_batch=16, epochs=4, lr=3e-3, kl_coef=0.01, gamma=1.0, lam=0.95,
              clip_eps=0.2, vf_coef=0.5, max_grad_norm=1.0)


def train(iterations: int = 20, seed: int = 0, cfg: dict | None = None, log=print) -> list[float]:
    """Run PPO; return the mean score of each iteration's rollout (before that iteration's update)."""
    cfg = {**CONFIG, **(cfg or {})}
    agent = Agent(seed)
    ref = copy.deepcopy(agent).requires_grad_(False)  # the frozen reference the KL is measured to
    opt = torch.optim.Adam(agent.parameters(), lr=cfg["lr"])
    gen = torch.Generator(device=CPU).manual_seed(seed)
    prompts, means = encode(PROMPTS), []
    for it in range(iterations):
        rows = torch.randperm(len(PROMPTS), generator=gen, device=CPU)[:cfg["batch"]]
        batch = rollout(agent, ref, prompts[rows], gen, cfg)
        losses = update(agent, opt, batch, cfg, gen)
        means.append(batch["scores"].mean().item())
        log(f"{it:9d}  {means[-1]:.3f}        {batch['kl'].item():6.3f}  {losses['value_loss']:.4f}")
    return means


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhfkit.learn.minimal_ppo", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20, help="PPO iterations (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model, the prompts' order and sampling")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error(f"--iterations: expected an integer >= 1, got {args.iterations}")
    # One thread: the model is so small that a second one only adds synchronisation (measured on a
    # loaded 2-core CPU: 0.5 s per iteration with one thread, 15 s with two).
    torch.set_num_threads(1)
    start = time.perf_counter()
    print("iteration  vowel share  KL (nats)  value loss")
    means = train(args.iterations, args.seed)
    print(f"before {means[0]:.3f}, after {means[-1]:.3f} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
