"""Agent episodes through the OpenAI-compatible server against the built-in multi-turn rollout.

The same work for every row of the table: the first N problems of builtin:arithmetic, the calculator
task at temperature 1, up to 4 model turns of at most --max-new-tokens tokens.

  env=arithmetic-tool        rollout/multiturn.py generate_episodes, all N episodes in lock-step rounds,
                             re-encoding each row's history every turn (as before KV reuse), then reusing it
  agent, C concurrent        rlhfkit.envs.openai_agents:calculator_agent (the real openai client, tools /
                             tool_calls) in C threads against the server on the same model; requests that
                             arrive within the window share one decoding loop

Printed: episodes per minute, its ratio to env=arithmetic-tool (same process), model calls per
episode, context tokens run through the model per episode (prefill), and for the agent rows how
many episodes ended with the right answer (reward 1). The tiny random model
(default) measures the machinery, not the answers: it almost never calls the tool, so its episodes
are mostly one turn. --model smollm2-135m-instruct measures the real one (slow on 2 cores).

    python bench/bench_agents.py [--model tiny] [--episodes 64] [--concurrency 1,8,64] [--agents-only] [--one-round]
                                 [--no-write]
"""

from __future__ import annotations

import argparse
import time

import benchdoc
import torch

from rlhfkit.data.prompts import load_prompts
from rlhfkit.envs import make_env_factory
from rlhfkit.envs.openai_agents import calculator_agent
from rlhfkit.rollout.agent_rollout import AgentSettings, agent_rollout
from rlhfkit.rollout.core import SamplingParams
from rlhfkit.rollout.multiturn import generate_episodes


def load(model: str):
    if model == "tiny":
        from rlhfkit.learn.tiny import build_tiny_model, build_tokenizer

        tok = build_tokenizer()
        return build_tiny_model(len(tok), seed=0).eval(), tok
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer, resolve_dtype

    return load_causal_lm(model, resolve_dtype("auto"), trainable=False), load_tokenizer(model)


def env_run(model, tok, records, params, reuse: bool) -> dict:
    t0 = time.perf_counter()
    ro = generate_episodes(model, tok, make_env_factory("arithmetic-tool", tok), records, params, max_turns=4,
                           max_total_tokens=256, seed=0, reuse_cache=reuse)
    s = time.perf_counter() - t0
    n = len(records)
    return {"s": s, "per_min": 60 * n / s, "prefill": sum(ro.info["prefill_tokens"]) / n,
            "turns": sum(ro.info["turns"]) / n}


def agent_run(model, tok, records, params, concurrency: int) -> dict:
    settings = AgentSettings(fn=calculator_agent, concurrency=concurrency, timeout_s=3600.0, max_calls=8)
    t0 = time.perf_counter()
    _, outcomes, metrics = agent_rollout(model, tok, records, params, settings, max_prompt_tokens=4096, seed=0)
    s = time.perf_counter() - t0
    n = len(records)
    bad = [o for o in outcomes if o.reason != "ok"]
    if bad:
        print(f"  ({len(bad)} episodes failed; first: {bad[0].reason}: {bad[0].detail})")
    right = sum(o.reward == 1.0 for o in outcomes if o.reason == "ok")
    return {"s": s, "per_min": 60 * n / s, "prefill": metrics["agent/prompt_tokens_per_episode"],
            "turns": metrics["agent/calls_per_episode"], "right": f"{right}/{n}"}


def run(model_name: str, episodes: int, concurrency: list[int], max_new_tokens: int, agents_only: bool = False,
        full_rows: bool = True) -> str:
    model, tok = load(model_name)
    torch.manual_seed(0)
    records = load_prompts("builtin:arithmetic", split="train", limit=episodes, seed=0)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    rows = [] if agents_only else [
        ("env=arithmetic-tool, history re-encoded", len(records), env_run(model, tok, records, params, False)),
        ("env=arithmetic-tool, KV reuse", len(records), env_run(model, tok, records, params, True))]
    for c in concurrency:
        subset = records[: max(c, min(len(records), 8))] if c == 1 or not full_rows else records
        rows.append((f"agent, {c} concurrent", len(subset), agent_run(model, tok, subset, params, c)))
        print(rows[-1])
    base = None if agents_only else rows[0][2]["per_min"]
    lines = [f"Model: {model_name}; {episodes} problems of builtin:arithmetic, T=1, up to 4 turns of "
             f"{max_new_tokens} tokens; torch threads {torch.get_num_threads()}; 1-min load average "
             f"{__import__('os').getloadavg()[0]:.1f} (a shared machine: ratios, not absolute times).", "",
             "| rollout | episodes | seconds | episodes/min | vs re-encoding env | model calls per episode | "
             "context tokens run per episode | answers right |", "|---|---|---|---|---|---|---|---|"]
    for name, n, r in rows:
        ratio = "-" if base is None else f"{r['per_min'] / base:.2f}x"
        lines.append(f"| {name} | {n} | {r['s']:.1f} | {r['per_min']:.1f} | {ratio} | "
                     f"{r['turns']:.2f} | {r['prefill']:.0f} | {r.get('right', '-')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny (built in, random) or a model spec")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--agents-only", action="store_true",
                    help="only the agent rows (the env rows of the real model take long on a CPU); its own block")
    ap.add_argument("--one-round", action="store_true",
                    help="a row at C concurrent agents runs max(C, 8) episodes (one round), not all --episodes "
                         "(the real model on a loaded CPU)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    table = run(a.model, a.episodes, [int(c) for c in a.concurrency.split(",")], a.max_new_tokens, a.agents_only,
                not a.one_round)
    print(table)
    if not a.no_write:
        block = "bench_agents" if a.model == "tiny" else "bench_agents_real"  # one block per model kind
        block += "_agents_only" if a.agents_only else ""
        benchdoc.write_block(block, "Agent episodes through the OpenAI-compatible server (bench/bench_agents.py)",
                             table)


if __name__ == "__main__":
    main()
