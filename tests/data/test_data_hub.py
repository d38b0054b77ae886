"""Hub dataset ids, loaded offline (HF_HUB_OFFLINE=1) from a datasets cache built in the test.

`hub_cache` writes what `load_dataset("org/name", config)` leaves in HF_DATASETS_CACHE after a
download (`org___name/CONFIG/0.0.0/COMMIT/name-SPLIT.arrow` + dataset_info.json), by running the
same parquet builder on local files; rlhfkit then loads it through datasets' own offline path.
"""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")

from rlhfkit.data import load_preferences, load_prompts, load_sft_examples, read_records  # noqa: E402
from rlhfkit.data.hub import choose_splits  # noqa: E402
from rlhfkit.data.splits import train_eval_split  # noqa: E402
from rlhfkit.errors import DataError  # noqa: E402

GSM8K = {"train": [{"question": f"Q{i}: what is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
                   for i in range(6)],
         "test": [{"question": "T: what is 9 + 1?", "answer": "9 + 1 = 10\n#### 10"}]}


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    """build(repo_id, config, {split: rows}): a prepared datasets cache for a Hub id, offline."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet, ParquetConfig

    cache = tmp_path / "hf-datasets"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)

    def build(repo_id: str, config: str, splits: dict[str, list[dict]]) -> None:
        org, name = repo_id.split("/")
        files = {}
        for split, rows in splits.items():
            f = tmp_path / f"{name}-{config}-{split}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), f)
            files[split] = [str(f)]

        class Hub(Parquet):  # the config a Hub repo's README declares
            BUILDER_CONFIGS = [ParquetConfig(name=config, data_files=DataFilesDict.from_patterns(files))]

        staging = tmp_path / "staging"
        Hub(cache_dir=str(staging), dataset_name=name, config_name=config, hash="0123abcd").download_and_prepare()
        (cache / f"{org}___{name}").parent.mkdir(parents=True, exist_ok=True)
        (staging / name).rename(cache / f"{org}___{name}")  # a download names the folder org___name

    return build


def test_gsm8k_by_hub_id_offline_with_config_splits_and_columns(hub_cache):
    hub_cache("openai/gsm8k", "main", GSM8K)
    train = load_prompts("hf:openai/gsm8k?config=main")
    assert [r["prompt"] for r in train] == [r["question"] for r in GSM8K["train"]]
    assert train[2]["answer"] == "2 + 1 = 3\n#### 3"  # kept for reward=arithmetic
    assert load_prompts("openai/gsm8k?config=main", split="test") == [
        {"prompt": "T: what is 9 + 1?", "answer": "9 + 1 = 10\n#### 10"}]
    mapped = load_prompts("hf:openai/gsm8k?config=main&split=test&columns=prompt:answer,question:question")
    assert mapped[0]["prompt"] == "9 + 1 = 10\n#### 10"
    assert load_sft_examples("hf:openai/gsm8k?config=main&take=2") == [
        {"prompt": r["question"], "response": r["answer"]} for r in GSM8K["train"][:2]]


def test_streaming_reads_the_first_rows_like_take(hub_cache):
    hub_cache("openai/gsm8k", "main", GSM8K)
    streamed = load_prompts("hf:openai/gsm8k?config=main&streaming=true&take=3")
    assert streamed == load_prompts("hf:openai/gsm8k?config=main&take=3")
    assert [r["prompt"] for r in streamed] == [r["question"] for r in GSM8K["train"][:3]]


def test_split_none_holds_out_the_hub_test_split(hub_cache):
    hub_cache("openai/gsm8k", "main", GSM8K)
    train, held = train_eval_split(load_sft_examples, "hf:openai/gsm8k?config=main", None, 0.5, 0)
    assert len(train) == 6 and [r["prompt"] for r in held] == ["T: what is 9 + 1?"]


def test_ultrafeedback_binarized_splits_must_be_named(hub_cache):
    q = "What is the capital of France?"
    row = {"prompt": q, "prompt_id": "0", "chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": "Paris."}],
           "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": "Lyon."}],
           "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "Paris."}],
           "score_chosen": 9.0, "score_rejected": 2.0}
    hub_cache("HuggingFaceH4/ultrafeedback_binarized", "default",
              {"train_prefs": [row], "test_prefs": [row], "train_sft": [row]})
    spec = "HuggingFaceH4/ultrafeedback_binarized"
    pair = load_preferences(f"{spec}?split=train_prefs")[0]
    assert (pair["prompt"], pair["messages"], pair["chosen"], pair["rejected"]) == (
        q, [{"role": "user", "content": q}], "Paris.", "Lyon.")
    assert load_sft_examples(f"hf:{spec}?split=train_sft")[0]["response"] == "Paris."
    with pytest.raises(DataError) as err:
        load_preferences(spec, split="train")
    assert str(err.value) == (f"{spec}: no split 'train'; choose one with ?split=NAME "
                              "(found: train_prefs, test_prefs, train_sft)")


def test_missing_column_config_and_cache_give_one_line_errors(hub_cache):
    hub_cache("openai/gsm8k", "main", GSM8K)
    with pytest.raises(DataError) as err:
        load_prompts("hf:openai/gsm8k?config=main&columns=prompt:query")
    assert str(err.value) == ("hf:openai/gsm8k?config=main&columns=prompt:query [train]: row 1: columns=prompt:query: "
                              "missing field 'query'; found: question, answer")
    with pytest.raises(DataError, match=r"^hf:openai/gsm8k\?config=socratic: Couldn't find cache for openai/gsm8k "
                                        r"for config 'socratic'$"):
        load_prompts("hf:openai/gsm8k?config=socratic")
    with pytest.raises(DataError) as err:
        load_prompts("nobody/nothing")
    assert str(err.value) == ("nobody/nothing: no such local file, and as a Hub dataset: not in the local datasets "
                              "cache and the Hub cannot be reached (offline, e.g. HF_HUB_OFFLINE=1); load it once "
                              "with network access, or give a local file")


def test_choose_splits_rules():
    assert choose_splits(["train", "test"], None, None, "s") == ["train", "test"]
    assert choose_splits(["train", "validation"], None, None, "s") == ["train"]
    assert choose_splits(["only"], None, "train", "s") == ["only"]
    assert choose_splits(["train", "test"], "test[:5]", "train", "s") == ["test[:5]"]
    with pytest.raises(DataError, match=r"^s: no split 'dev' \(found: train, test\)$"):
        choose_splits(["train", "test"], "dev", "train", "s")
    with pytest.raises(DataError, match=r"^s: no split 'test'; choose one with \?split=NAME \(found: only\)$"):
        choose_splits(["only"], None, "test", "s")


def test_from_list_and_save_to_disk_round_trip_rlhfkit_records(tmp_path):
    """datasets once crashed in Dataset.from_list (a pickling error); this pins the shapes rlhfkit
    reads: strings, message lists, nested scores and missing keys (filled with None)."""
    rows = [{"prompt": [{"role": "user", "content": "Hi"}], "chosen": "a", "rejected": "b",
             "scores": {"chosen": 1.0, "rejected": 0.0}},
            {"prompt": [{"role": "user", "content": "Yo"}], "chosen": "c", "rejected": "d"}]
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "saved"))
    loaded = read_records(tmp_path / "saved")
    assert loaded[0] == rows[0] and loaded[1] == {**rows[1], "scores": None}
    pairs = load_preferences(str(tmp_path / "saved"))
    assert [(p["prompt"], p["chosen"]) for p in pairs] == [("Hi", "a"), ("Yo", "c")]
    assert json.dumps(pairs[0]["scores"]) == '{"chosen": 1.0, "rejected": 0.0}'


def test_grpo_trains_on_a_hub_dataset_offline(hub_cache, tiny_model_dir, tmp_path):
    """End to end: `rlhfkit grpo prompts=hf:openai/gsm8k?config=main reward=arithmetic` from the cache."""
    from rlhfkit.cli import main

    hub_cache("openai/gsm8k", "main", GSM8K)
    rc = main(["grpo", f"model={tiny_model_dir}", "prompts=hf:openai/gsm8k?config=main", "reward=arithmetic",
               "iterations=1", "rollout_batch_size=4", "group_size=2", "mini_batch_size=4", "micro_batch_size=2",
               "max_new_tokens=4", "num_eval_prompts=1", "dtype=fp32", f"output_dir={tmp_path / 'runs'}",
               "run_name=g", "quiet=true", "tensorboard=false"])
    assert rc == 0
    run = tmp_path / "runs" / "g"
    questions = {r["question"] for r in GSM8K["train"]}
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"] in questions for s in samples)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_before"]["samples"][0]["prompt"] == "T: what is 9 + 1?"  # the Hub test split
