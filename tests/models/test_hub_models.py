"""Hub ids (`org/name[@revision]`) load from a Hugging Face cache built here, with the network off.

The cache has the Hub layout huggingface_hub reads: `models--ORG--NAME/snapshots/<commit>/...`
plus `refs/<branch>` files naming a commit. Two snapshots hold different weights so a test can tell
which one was loaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from rlhfkit.cli import main
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError, UserError
from rlhfkit.models import loading
from rlhfkit.models.reward_model import RewardModel, ScoreHead, load_reward_scorer, save_reward_model
from rlhfkit.trainers.ppo import train
from rlhfkit.trainers.ppo_config import PPOConfig

from tiny_lm import build_tiny_model, build_tokenizer

REPO = "tiny-org/tiny-llama"
MAIN_COMMIT, V2_COMMIT = "a" * 40, "b" * 40


def add_snapshot(cache: Path, repo_id: str, commit: str, source: Path, refs: tuple[str, ...]) -> Path:
    """Copy `source` into the cache as snapshot `commit` of `repo_id`, with each ref pointing at it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    shutil.copytree(source, snap)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    """HF_HOME/hub with REPO at main (seed-0 weights) and v2 (seed-1 weights); offline."""
    tok = build_tokenizer()
    for seed in (0, 1):
        build_tiny_model(len(tok), seed=seed).save_pretrained(tmp_path / f"src{seed}")
        tok.save_pretrained(tmp_path / f"src{seed}")
    home = tmp_path / "hf"
    add_snapshot(home / "hub", REPO, MAIN_COMMIT, tmp_path / "src0", ("main",))
    add_snapshot(home / "hub", REPO, V2_COMMIT, tmp_path / "src1", ("v2",))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # relative names below are not local folders
    return home / "hub"


def _first_weight(model) -> torch.Tensor:
    return model.get_input_embeddings().weight.detach()


def test_hub_reference_tells_hub_ids_from_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert loading.hub_reference("Qwen/Qwen2.5-0.5B-Instruct") == ("Qwen/Qwen2.5-0.5B-Instruct", None)
    assert loading.hub_reference("org/name@v1.0") == ("org/name", "v1.0")
    for not_hub in (loading.DEFAULT_MODEL, "/abs/org/name", "./org/name", "name", "a/b/c", "org/name@", "../x"):
        assert loading.hub_reference(not_hub) is None, not_hub
    (tmp_path / "org" / "name").mkdir(parents=True)  # an existing local folder wins, as in transformers
    assert loading.hub_reference("org/name") is None
    assert loading.hub_reference("org/name@v1") is None
    with pytest.raises(UserError, match="a revision .* applies to Hub ids only"):
        loading.resolve_model_path("org/name@v1")


def test_load_model_and_tokenizer_by_hub_id_offline(hub_cache):
    tok = build_tokenizer()
    model = loading.load_causal_lm(REPO, trainable=False)
    assert torch.equal(_first_weight(model), _first_weight(build_tiny_model(len(tok), seed=0)))
    loaded_tok = loading.load_tokenizer(REPO)
    assert loaded_tok.get_vocab() == tok.get_vocab() and loaded_tok.padding_side == "left"
    assert loading.resolve_model_path(REPO) == hub_cache / "models--tiny-org--tiny-llama" / "snapshots" / MAIN_COMMIT


def test_a_pinned_revision_loads_its_own_snapshot(hub_cache):
    seed1 = _first_weight(build_tiny_model(len(build_tokenizer()), seed=1))
    assert not torch.equal(seed1, _first_weight(loading.load_causal_lm(REPO)))  # main is another snapshot
    for spec in (f"{REPO}@v2", f"{REPO}@{V2_COMMIT}"):  # a branch and a commit hash
        assert torch.equal(_first_weight(loading.load_causal_lm(spec)), seed1), spec


def test_model_revision_option_is_folded_into_model(tmp_path):
    base = dict(prompts=str(tmp_path / "p.txt"), output_dir=str(tmp_path / "runs"))
    cfg = build_config(PPOConfig, {**base, "model": REPO, "model_revision": "v2"})
    assert cfg.model == f"{REPO}@v2"
    again = build_config(PPOConfig, {**base, "model": cfg.model, "model_revision": "v2"})  # a saved config
    assert again.model == f"{REPO}@v2"
    with pytest.raises(ConfigError, match="model_revision"):
        build_config(PPOConfig, {**base, "model": f"{REPO}@main", "model_revision": "v2"})


def test_ppo_runs_one_iteration_on_a_hub_model(hub_cache, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Write a review of thing number {i}." for i in range(16)))
    cfg = build_config(PPOConfig, dict(
        model=REPO, model_revision="v2", prompts=str(prompts), reward="length:3", iterations=1,
        rollout_batch_size=8, mini_batch_size=4, micro_batch_size=2, max_new_tokens=8, num_eval_prompts=0,
        dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False))
    train(cfg)
    run = tmp_path / "runs" / "t"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0]
    assert rows[0]["params/ratio_first_microbatch_maxdev"] == 0.0
    assert yaml.safe_load((run / "config.yaml").read_text())["model"] == f"{REPO}@v2"
    base = json.loads((run / "final" / "adapter_config.json").read_text())["base_model_name_or_path"]
    adapter = json.loads((run / "final" / "adapter_config.json").read_text())
    assert (base, adapter["revision"]) == (REPO, "v2")  # a Hub id and its revision: loads from any directory


def test_reward_model_by_hub_id_scores_like_its_folder(hub_cache, tmp_path):
    tok = build_tokenizer()
    backbone = build_tiny_model(len(tok), seed=2).model
    torch.manual_seed(0)
    rm = RewardModel(backbone, ScoreHead(backbone.config.hidden_size))
    folder = save_reward_model(rm, tok, tmp_path / "rm", {"base_model": "unused", "dtype": "fp32"})
    add_snapshot(hub_cache, "tiny-org/tiny-rm", "c" * 40, folder, ("main",))
    prompts, completions = ["a b", "c"], ["d e f", "g"]
    expected = load_reward_scorer(str(folder), device="cpu")(prompts, completions)
    got = load_reward_scorer("tiny-org/tiny-rm", device="cpu")(prompts, completions)
    assert got == pytest.approx(expected, abs=1e-6) and expected[0] != expected[1]


def test_uncached_hub_id_offline_is_one_line_with_exit_2(hub_cache, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\nthree\nfour\n")
    rc = main(["ppo", "model=nobody/missing-model", f"prompts={prompts}", "reward=length:3", "iterations=1",
               f"output_dir={tmp_path / 'runs'}", "run_name=x", "tensorboard=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "model: 'nobody/missing-model' is not in the Hugging Face cache" in err
    assert f"HF_HOME={hub_cache.parent}" in err and "HF_HUB_OFFLINE=1" in err
    assert "`hf download nobody/missing-model`" in err  # the installed huggingface_hub has `hf`, not huggingface-cli
    assert not (tmp_path / "runs" / "x").exists()  # nothing left behind


def test_uncached_revision_names_it_in_the_download_hint(hub_cache):
    with pytest.raises(UserError, match=r"`hf download tiny-org/tiny-llama --revision v9`"):
        loading.load_causal_lm(f"{REPO}@v9")


def test_reference_and_critic_by_hub_id_with_revision(hub_cache, tmp_path):
    from rlhfkit.trainers.build import build_actor, build_actor_critic
    from rlhfkit.trainers.dpo_config import DPOConfig

    seed1 = _first_weight(build_tiny_model(len(build_tokenizer()), seed=1))
    common = dict(model=REPO, lora=False, dtype="fp32", output_dir=str(tmp_path / "runs"))
    dpo = build_config(DPOConfig, {**common, "reference_model": f"{REPO}@v2"})
    actor, reference, _ = build_actor(dpo, with_reference=True, reference_model=dpo.reference_model)
    assert torch.equal(_first_weight(reference.frozen), seed1)
    assert not torch.equal(_first_weight(actor.policy), seed1)  # the policy is main's snapshot
    ppo = build_config(PPOConfig, {**common, "critic_model": f"{REPO}@{V2_COMMIT}", "kl_coef": 0.0})
    actor, _, _ = build_actor_critic(ppo)
    assert torch.equal(_first_weight(actor.critic), seed1)


def test_reward_model_and_export_record_a_hub_base_as_its_id(hub_cache, tmp_path):
    """A Hub-id base is written down as the id (with its revision), which loads on any machine with
    the cache, not as this machine's snapshot path; a local folder is written as its path."""
    from rlhfkit.commands.export import base_model_id
    from rlhfkit.models.reward_model import load_backbone
    from rlhfkit.trainers.rm import build_reward_model
    from rlhfkit.trainers.rm_config import RMConfig

    spec = f"{REPO}@v2"
    _, _, info = build_reward_model(build_config(RMConfig, {"data": "x.jsonl", "model": spec, "dtype": "fp32"}))
    assert info["base_model"] == spec
    backbone, causal = load_backbone(info["base_model"])
    v2 = loading.load_causal_lm(spec, trainable=False)
    assert causal and torch.equal(backbone.get_input_embeddings().weight, _first_weight(v2))
    folder = hub_cache / ("models--" + REPO.replace("/", "--")) / "snapshots" / MAIN_COMMIT
    _, _, local = build_reward_model(build_config(RMConfig, {"data": "x.jsonl", "model": str(folder), "dtype": "fp32"}))
    assert local["base_model"] == str(folder.resolve())
    assert base_model_id({"model": spec}) == REPO and base_model_id({"model": REPO}) == REPO
    assert base_model_id({"model": str(folder)}) is None


def test_estimate_memory_reads_the_config_of_a_cached_hub_id(hub_cache):
    from rlhfkit.estimate.shape import ModelShape, resolve_shape

    config = json.loads((hub_cache / ("models--" + REPO.replace("/", "--")) / "snapshots" / MAIN_COMMIT
                         / "config.json").read_text())
    assert resolve_shape(REPO) == resolve_shape(f"{REPO}@v2") == ModelShape.from_config(config)
    with pytest.raises(UserError, match=r"model='tiny-org/not-cached': .*Hub id"):
        resolve_shape("tiny-org/not-cached")


def test_a_sequence_classification_reward_model_by_hub_id_from_the_cache(hub_cache, tmp_path):
    """TRL's and the Hub's reward models: any AutoModelForSequenceClassification, named by its Hub id."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rlhfkit.rewards import get_rewards, score_batch

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1, pad_token_id=0)).eval()
    model.save_pretrained(tmp_path / "rm-src")
    tok.save_pretrained(tmp_path / "rm-src")
    add_snapshot(hub_cache, "tiny-org/tiny-rm", MAIN_COMMIT, tmp_path / "rm-src", ("main",))
    by_id = score_batch(get_rewards("model:tiny-org/tiny-rm"), ["Say hi."], ["Hi there."])
    by_folder = score_batch(get_rewards(f"model:{tmp_path / 'rm-src'}"), ["Say hi."], ["Hi there."])
    assert by_id == by_folder and by_id[0] != 0.0
