"""Worker for tests/scale/test_ddp.py, run under `accelerate launch` (N processes) or plain python.

    python ddp_worker.py steps MODEL_DIR OUT_DIR   one optimiser step of each trainer's update on a
                                                   fixed global batch (each process takes its share),
                                                   then prompt sharding and sampling seeds per process
    python ddp_worker.py cli MODEL_DIR OUT_DIR     every trainer's CLI for one tiny iteration (OUT_DIR/runs)
    python ddp_worker.py all MODEL_DIR OUT_DIR     both (one launch: its start-up costs ~12 s on 2 cores)

Every update uses SGD(lr=1) without clipping, so a parameter's change IS minus its gradient: a
wrong global normalisation (AdamW's first step would hide a uniform scale) shows up directly.
Rank 0 writes OUT_DIR/<name>-<processes>.pt with the changes of all trainable parameters.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

B = 4  # rows per process with 2 processes; the single process takes all 2 * B rows

SFT_EXAMPLES = [
    {"prompt": "Write a short review of the new cafe, please, with some detail.", "response": "It was great, lovely "
     "coffee, kind staff and a quiet corner to read in for the whole afternoon."},
    {"prompt": "What is 3 + 4?", "response": "7."},
    {"prompt": "Continue this story about a lighthouse keeper.", "response": "At night the keeper sang to the sea."},
    {"prompt": "Hi", "response": "Hello."},
    {"prompt": "Describe the film.", "response": "The film was terrible and boring. I hated the ending but loved "
     "the music, which carried every scene."},
    {"prompt": "Name a fruit.", "response": "Apple."},
    {"prompt": "What is the answer?", "response": "The answer is seven, as the sum of three and four."},
    {"prompt": "Say yes.", "response": "Yes."},
]
PAIRS = [{"prompt": f"Write a review of thing number {i}.", "chosen": ["aa ee", "oo aa ee ii", "ee"][i % 3],
          "rejected": ["th strct grd", "brr", "xyz rhythm grr psst"][i % 3]} for i in range(2 * B)]


def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def sgd(params):
    opt = torch.optim.SGD([p for p in params if p.requires_grad], lr=1.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def save_change(acc, name: str, before: dict, model, stats: dict, out: Path) -> None:
    if acc.is_main_process:
        after = dict(model.named_parameters())
        change = {n: (before[n] - after[n].detach()).cpu() for n in before}
        torch.save({"change": change, "stats": stats}, out / f"{name}-{acc.num_processes}.pt")


def my_rows(acc, n_global: int) -> torch.Tensor:
    """Contiguous shares: rank 0 gets the first (long) rows, rank 1 the short ones."""
    per = n_global // acc.num_processes
    return torch.arange(acc.process_index * per, (acc.process_index + 1) * per)


# ----------------------------------------------------------------------------- policy update (PPO / GRPO)


def global_rollout(vocab: int):
    """2B rows with very different prompt and response lengths; advantages and returns fixed."""
    from rlhfkit.rollout import Rollout

    g = torch.Generator().manual_seed(0)
    P, R = 9, 12
    q_len = torch.tensor([9, 8, 9, 7, 3, 2, 4, 2])
    r_len = torch.tensor([12, 11, 12, 10, 2, 1, 3, 2])  # the first half is long, the second short
    q_ids = torch.randint(3, vocab, (2 * B, P), generator=g)
    q_mask = (torch.arange(P)[None] >= P - q_len[:, None]).long()
    q_ids = q_ids.masked_fill(q_mask == 0, 2)
    r_mask = (torch.arange(R)[None] < r_len[:, None]).float()
    r_ids = torch.randint(3, vocab, (2 * B, R), generator=g).masked_fill(r_mask == 0, 2)
    rollout = Rollout(query_ids=q_ids, query_mask=q_mask, response_ids=r_ids, response_mask=r_mask,
                      stopped=torch.zeros(2 * B, dtype=torch.bool))
    rollout = dataclasses.replace(rollout, advantages=torch.randn(2 * B, R, generator=g) * r_mask)
    rollout = dataclasses.replace(rollout, returns=torch.randn(2 * B, R, generator=g) * r_mask)
    return rollout


def policy_step(model_dir: str, out: Path, agg: str) -> None:
    """One PPO-loss optimiser step through `update_policy` (what PPO and GRPO run)."""
    from rlhfkit.core.config import build_config
    from rlhfkit.models import load_causal_lm
    from rlhfkit.models.lora import add_lora
    from rlhfkit.models.policy import ActorCritic, ValueHead
    from rlhfkit.rollout import logprob_pass
    from rlhfkit.trainers.ppo import micro_batch_loss
    from rlhfkit.trainers.ppo_config import PPOConfig
    from rlhfkit.trainers.rl_update import update_policy

    acc = accelerator()
    torch.manual_seed(0)
    policy = add_lora(load_causal_lm(model_dir), 4, 8, 0.0, None)
    actor = ActorCritic(policy, ValueHead(policy.config.hidden_size))
    rows = my_rows(acc, 2 * B)
    n = len(rows)
    cfg = build_config(PPOConfig, {"model": model_dir, "dtype": "fp32", "rollout_batch_size": n, "mini_batch_size": n,
                                   "micro_batch_size": 2, "loss_agg": agg, "kl_coef": 0.0, "vf_coef": 0.5})
    rollout = global_rollout(policy.config.vocab_size).select(rows)  # with its advantages and returns
    order = torch.arange(n)
    rollout = logprob_pass(actor, None, rollout, 1.0, cfg.micro_batch_size, order)
    opt, sched = sgd(actor.parameters())
    model, opt, sched = acc.prepare(actor, opt, sched)
    before = snapshot(actor)

    def loss_fn(mb, n_tokens, n_seqs):
        return micro_batch_loss(model, mb, cfg, 0.0, n_tokens, acc.device, n_seqs)

    stats = update_policy(model, opt, sched, acc, rollout, loss_fn, epochs=1, mini_batch_size=n,
                          micro_batch_size=cfg.micro_batch_size, max_grad_norm=1e9, ratio_check_tol=1e-3,
                          generator=torch.Generator().manual_seed(0), first_perm=order)
    save_change(acc, f"policy-{agg}", before, actor, stats, out)


# ----------------------------------------------------------------------------- SFT, RM, DPO


def sft_step(model_dir: str, out: Path) -> None:
    from rlhfkit.core.config import build_config
    from rlhfkit.data.sft import tokenize_examples
    from rlhfkit.models import load_tokenizer
    from rlhfkit.runtime.optim import optimizer_step
    from rlhfkit.trainers.build import build_policy
    from rlhfkit.trainers.sft import ResponseNLL, SFTConfig, sft_gradients

    acc = accelerator()
    cfg = build_config(SFTConfig, {"model": model_dir, "dtype": "fp32", "batch_size": 2 * B, "micro_batch_size": 2,
                                   "lora_r": 4, "lora_dropout": 0.0, "max_grad_norm": 1e9})
    torch.manual_seed(0)
    model, _ = build_policy(cfg)
    tok = load_tokenizer(model_dir)
    examples, _ = tokenize_examples(tok, SFT_EXAMPLES, cfg, 512)
    batch = examples[acc.process_index :: acc.num_processes]  # as `rlhfkit sft` shares a batch
    module = ResponseNLL(model)
    opt, sched = sgd(model.parameters())
    module, opt, sched = acc.prepare(module, opt, sched)
    before = snapshot(model)
    stats = sft_gradients(module, acc, batch, tok.pad_token_id, cfg)
    stats.update(optimizer_step(module.parameters(), opt, sched, acc, cfg.max_grad_norm, stats["loss/sft"]))
    save_change(acc, "sft", before, model, stats, out)


def rm_step(model_dir: str, out: Path) -> None:
    from rlhfkit.core.config import build_config
    from rlhfkit.runtime.optim import optimizer_step
    from rlhfkit.trainers.rm import RMConfig, build_reward_model, rm_gradients

    acc = accelerator()
    cfg = build_config(RMConfig, {"model": model_dir, "data": "unused", "dtype": "fp32", "batch_size": 2 * B,
                                  "micro_batch_size": 2, "lora_r": 4, "max_grad_norm": 1e9})
    torch.manual_seed(0)
    model, tok, info = build_reward_model(cfg)
    batch = PAIRS[acc.process_index :: acc.num_processes]
    opt, sched = sgd(model.parameters())
    wrapped, opt, sched = acc.prepare(model, opt, sched)
    before = snapshot(model)
    stats = rm_gradients(wrapped, acc, tok, batch, info, cfg, len(batch) / cfg.batch_size)
    stats.update(optimizer_step(wrapped.parameters(), opt, sched, acc, cfg.max_grad_norm, stats["loss/rm"]))
    save_change(acc, "rm", before, model, stats, out)


def dpo_step(model_dir: str, out: Path) -> None:
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.dpo import build_models, encode_pairs, precompute_reference, train_step
    from rlhfkit.trainers.dpo_config import DPOConfig

    acc = accelerator()
    cfg = build_config(DPOConfig, {"model": model_dir, "dtype": "fp32", "batch_size": 2 * B, "micro_batch_size": 2,
                                   "lora_r": 4, "beta": 0.5, "num_eval_prompts": 0})
    torch.manual_seed(0)
    model, reference, tok = build_models(cfg)
    data = encode_pairs(tok, PAIRS, cfg)
    batch = torch.arange(2 * B)
    # The reference log-probs, then one step with the adapters moved off zero (else the loss is flat).
    table = precompute_reference(reference, data, [batch], cfg, acc.device, acc.num_processes)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    opt, sched = sgd(model.parameters())
    wrapped, opt, sched = acc.prepare(model, opt, sched)
    before = snapshot(model)
    stats = train_step(wrapped, data, batch, table, reference, cfg, acc)
    opt.step()
    save_change(acc, "dpo", before, model, stats, out)


# ----------------------------------------------------------------------------- sharding and the CLIs


def shard(out: Path) -> None:
    """Which prompts and sampling seeds each process gets."""
    from rlhfkit.core.seeding import sampling_seed
    from rlhfkit.data.stream import PromptStream

    acc = accelerator()
    records = [{"prompt": f"p{i}"} for i in range(10)]
    stream = PromptStream(records, seed=3, rank=acc.process_index, world=acc.num_processes)
    mine = [[r["prompt"] for r in stream.next(3)] for _ in range(3)]  # 3 iterations, crossing an epoch
    seeds = [sampling_seed(0, acc.process_index, it) for it in range(3)]
    gathered = acc.gather_for_metrics([{"rank": acc.process_index, "prompts": mine, "seeds": seeds}],
                                      use_gather_object=True)
    if acc.is_main_process:
        (out / "shard.json").write_text(json.dumps(gathered))


def cli(model_dir: str, out: Path) -> None:
    """One tiny iteration of every trainer, through the command line entry point."""
    from rlhfkit.cli import main
    from rlhfkit.trainers.dpo import resolve_prefs

    common = [f"model={model_dir}", "dtype=fp32", f"output_dir={out}", "quiet=true", "tensorboard=false"]
    prefs = resolve_prefs("builtin:prefs_reviews")
    commands = {
        "ppo": ["rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2", "max_new_tokens=6",
                "num_eval_prompts=0", "iterations=1", "reward=length:3"],
        "grpo": ["rollout_batch_size=4", "group_size=2", "mini_batch_size=4", "micro_batch_size=2", "max_new_tokens=4",
                 "num_eval_prompts=0", "iterations=1", "beta=0.05"],
        "sft": ["max_steps=1", "batch_size=4", "micro_batch_size=2", "max_eval_examples=2", "max_length=64"],
        "rm": [f"data={prefs}", "max_steps=1", "batch_size=4", "micro_batch_size=2", "max_eval_pairs=2",
               "stats_pairs=4", "max_length=64"],
        "dpo": ["max_steps=1", "batch_size=4", "micro_batch_size=2", "num_eval_prompts=0", "max_response_length=16"],
        # dynamic sampling draws rounds until every process holds enough varied groups: processes must agree
        # on when to stop, or one waits forever in a collective the other never enters
        "dapo": ["rollout_batch_size=4", "group_size=2", "mini_batch_size=4", "micro_batch_size=2",
                 "max_new_tokens=6", "overlong_buffer=2", "num_eval_prompts=0", "iterations=2", "reward=length:3",
                 "max_sampling_rounds=4"],
        # rloo's defaults are an exactly on-policy update: no log-prob pass, decided alike on both processes
        "rloo": ["rollout_batch_size=4", "group_size=2", "micro_batch_size=2", "max_new_tokens=4",
                 "num_eval_prompts=0", "iterations=2", "reward=length:3"],
        "kto": ["max_steps=1", "batch_size=4", "micro_batch_size=2", "num_eval_prompts=0", "max_response_length=16"],
        "online-dpo": ["prompts_per_iteration=2", "iterations=1", "max_new_tokens=6", "micro_batch_size=2",
                       "prompts_per_generate=4", "num_eval_prompts=0", "judge=length:3"],
    }
    for name, args in commands.items():
        code = main([name, *common, f"run_name={name}", *args])
        assert code == 0, f"rlhfkit {name} exited with {code}"
    # No run_name: the folder is COMMAND-DATE-TIME. Process 1's clock says another second, as when
    # the processes reach that line a second apart: they must still share the main process's folder.
    if os.environ.get("RANK") == "1":
        time.strftime = lambda fmt, *a: "19990101-000000"
    unnamed = [f"model={model_dir}", "dtype=fp32", f"output_dir={out.parent / 'unnamed'}", "quiet=true",
               "tensorboard=false", *commands["sft"]]
    assert main(["sft", *unnamed]) == 0


if __name__ == "__main__":
    mode, model_dir, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if mode not in ("steps", "cli", "all"):
        raise SystemExit(f"unknown mode {mode}")
    if mode in ("steps", "all"):
        for agg in ("token-mean", "seq-mean"):
            policy_step(model_dir, out_dir, agg)
        sft_step(model_dir, out_dir)
        rm_step(model_dir, out_dir)
        dpo_step(model_dir, out_dir)
        shard(out_dir)
    if mode in ("cli", "all"):
        cli(model_dir, out_dir / "runs")
    # Every run is done and written: end as the rlhfkit program ends in a launch, without the interpreter's
    # finalisation, where a gloo thread releasing a finished collective can abort the process (SIGABRT,
    # "terminate called without an active exception"; rlhfkit.cli.end_process, tests/scale/test_process_exit.py).
    from rlhfkit.cli import end_process

    end_process(0)
