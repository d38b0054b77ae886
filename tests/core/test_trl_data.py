"""TRL's data keys: `datasets:` mixtures, dataset_config / dataset_train_split, train_dataset /
eval_dataset, and a TRL CLI config run unchanged by `rlhfkit sft`."""

from __future__ import annotations

import json

import pytest

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.data.sets import load_split
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.sft_config import SFTConfig


def _rows(path, n, tag):
    path.write_text("\n".join(json.dumps({"prompt": f"{tag}{i}", "completion": "c"}) for i in range(n)))
    return str(path)


def test_a_datasets_mixture_reads_as_trl_reads_it(tmp_path):
    a, b = _rows(tmp_path / "a.jsonl", 10, "a"), _rows(tmp_path / "b.jsonl", 4, "b")
    mixture = [{"path": "json", "data_files": a, "split": "train"}, {"path": "json", "data_files": b}]
    cfg = build_config(SFTConfig, {"datasets": mixture})
    assert cfg.data == f"{a} + {b}"
    assert [r["prompt"] for r in load_split(cfg.data, None)] == [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(4)]
    # fractions as TRL's get_dataset: weights 0.5/0.5; T = min(10 / 0.5, 4 / 0.5) = 8; round(0.5 x 8) = 4 of each
    weighted = [{**mixture[0], "fraction": 1.0}, {**mixture[1], "fraction": 1.0}]
    records = load_split(build_config(SFTConfig, {"datasets": weighted}).data, None)
    assert [r["prompt"] for r in records] == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    assert records.where(5) == f"{b}:2"  # each record keeps its own file and line
    # one entry, the same keys, is the command's own data option
    assert build_config(GRPOConfig, {"datasets": [{"path": a}]}).prompts == f"{a}?split=train"
    assert build_config(DPOConfig, {"datasets": [{"path": "org/prefs", "name": "main", "split": "train_prefs"}]}
                        ).prefs == "org/prefs?config=main&split=train_prefs"


def test_trl_dataset_keys_and_their_errors(tmp_path):
    cfg = build_config(SFTConfig, {"dataset_name": "org/set", "dataset_config": "main",
                                   "dataset_train_split": "train_sft", "dataset_test_split": "test_sft"})
    assert (cfg.data, cfg.eval_split) == ("org/set?config=main&split=train_sft", "test_sft")
    assert build_config(SFTConfig, {"train_dataset": "t.jsonl", "eval_dataset": "e.jsonl"}).eval_data == "e.jsonl"
    assert build_config(GRPOConfig, {"eval_dataset": "e.jsonl"}).eval_prompts == "e.jsonl"
    assert build_config(SFTConfig, {"datasets": [{"path": "json", "data_files": "a.jsonl"}],
                                    "test_split_size": 0.25}).eval_fraction == 0.25
    with pytest.raises(ConfigError, match=r"datasets\[0\]: unknown key\(s\) weight"):
        build_config(SFTConfig, {"datasets": [{"path": "json", "data_files": "a.jsonl", "weight": 1}]})
    with pytest.raises(ConfigError, match="datasets and data: give one"):
        build_config(SFTConfig, {"datasets": [{"path": "x.jsonl"}], "data": "y.jsonl"})
    a = _rows(tmp_path / "a.jsonl", 3, "a")
    with pytest.raises(Exception, match="fraction must be set for every dataset of the mixture or for none"):
        load_split(f"{a}?fraction=1 + {a}", None)


def test_rlhfkit_sft_runs_a_trl_cli_config_unchanged(tmp_path, tiny_model_dir, capsys):
    from rlhfkit.cli import main as rlhfkit_main

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": f"Say {w}"}],
                                          "completion": [{"role": "assistant", "content": w}]})
                              for w in ["yes", "no", "maybe", "sure", "ok", "fine", "good", "bad"]))
    config = tmp_path / "sft.yaml"
    config.write_text(f"""# trl sft --config sft.yaml
model_name_or_path: {tiny_model_dir}
datasets:
  - path: json
    data_files: {data}
    split: train
output_dir: {tmp_path / "out"}
learning_rate: 2.0e-4
lr_scheduler_type: cosine
warmup_ratio: 0.1
num_train_epochs: 1
max_steps: 2
per_device_train_batch_size: 2
gradient_accumulation_steps: 2
max_length: 64
seed: 42
use_peft: true
lora_r: 8
lora_alpha: 16
lora_dropout: 0.05
gradient_checkpointing: false
""")
    cfg = parse_args(SFTConfig, [str(config)], "rlhfkit sft")
    assert (cfg.data, cfg.batch_size, cfg.micro_batch_size, cfg.lr, cfg.warmup_ratio, cfg.lora_r) == (
        str(data), 2 * 2, 2, 2e-4, 0.1, 8)
    assert rlhfkit_main(["sft", str(config), "dtype=fp32", "quiet=true", "tensorboard=false"]) == 0
    err = capsys.readouterr()
    text = err.out + err.err
    assert "each optimiser step trains on 4 examples (2 per forward/backward x 2 accumulated)" in text
    assert "8 training examples (the data has no held-out split; eval_dataset= or eval_split= to give one)" in text
    runs = list((tmp_path / "out").iterdir())
    assert len(runs) == 1 and (runs[0] / "final" / "adapter_config.json").is_file()


def test_columns_of_a_datasets_entry_keep_only_those_columns(tmp_path):
    """TRL's `columns: [prompt, answer]` is `select_columns` on the loaded split: the extra `id` and
    `note` columns are gone (a reward function would otherwise get them as keywords); a column the
    data lacks is a one-line error naming the file, the line and the columns it has."""
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": str(i), "id": i, "note": "x",
                                          "split": "test" if i == 2 else "train"}) for i in range(3)))
    entry = {"path": "json", "data_files": str(path), "columns": ["prompt", "answer"]}
    cfg = build_config(GRPOConfig, {"datasets": [entry]})
    assert cfg.prompts == f"{path}?keep=prompt,answer"
    assert list(load_split(cfg.prompts, "train")) == [{"prompt": "q0", "answer": "0"}, {"prompt": "q1", "answer": "1"}]
    assert list(load_split(cfg.prompts, "test")) == [{"prompt": "q2", "answer": "2"}]
    lacking = build_config(GRPOConfig, {"datasets": [{**entry, "columns": ["prompt", "solution"]}]})
    with pytest.raises(Exception, match=rf"^{path}:1: keep=prompt,solution: missing field 'solution'; found: "
                                        r"prompt, answer, id, note$"):
        load_split(lacking.prompts, "train")
    with pytest.raises(ConfigError, match=r"datasets\[0\]: columns expects a list of column names, got \[1\]"):
        build_config(GRPOConfig, {"datasets": [{**entry, "columns": [1]}]})
