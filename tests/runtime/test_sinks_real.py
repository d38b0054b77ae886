"""TensorBoard and W&B sinks with the real packages (W&B offline), read back from the files they write.

Both get the same metric names, config and sample table; a resumed run logs no step twice.
"""

from __future__ import annotations

import glob
import json
import struct

import pytest
import yaml

pytest.importorskip("tensorboard")
wandb = pytest.importorskip("wandb")

from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator  # noqa: E402

from rlhfkit.runtime.tracker import Tracker  # noqa: E402

CONFIG = {"model": "tiny", "lr": 0.0001, "prompts": "hf:openai/gsm8k?config=main"}


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def metrics(step: int, tag: float = 0.0) -> dict[str, float]:
    return {"rollout/reward_mean": step + tag, "loss/policy": -step / 10, "params/approx_kl": 0.01 * step}


def run_tracker(run_dir, steps, tag=0.0, history=None):
    """A process of a trainer: a tracker on `run_dir` logging `steps` (after resuming from `history`)."""
    tracker = Tracker(run_dir, total_iterations=10, quiet=True, tensorboard=True, wandb=True)
    if history is not None:
        tracker.resume(history)
    for step in steps:
        tracker.log(step, metrics(step, tag))
        tracker.log_samples(step, [{"prompt": f"p{step}", "completion": f"c{step} | x", "score": step + tag}])
    tracker.close()
    wandb.teardown()  # the W&B service writes its run file asynchronously: flush it, as a process exit does


def tb_tensors(run_dir) -> dict[str, list]:
    """Every tag's events as TensorBoard's server reads them (plugin_event_accumulator: scalars and
    text alike are tensors; events an earlier process wrote at or after a purge_step are dropped)."""
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: acc.Tensors(tag) for tag in acc.Tags()["tensors"]}


def tb_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.util import tensor_util

    return {tag: [(e.step, round(float(tensor_util.make_ndarray(e.tensor_proto)), 6)) for e in events]
            for tag, events in tb_tensors(run_dir).items() if not tag.startswith(("config", "samples"))}


def tb_texts(run_dir) -> dict[str, list[tuple[int, str]]]:
    return {tag.split("/")[0]: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events]
            for tag, events in tb_tensors(run_dir).items() if tag.startswith(("config", "samples"))}


def wandb_records(run_dir) -> list:
    """Every record of every offline W&B run file in run_dir (LevelDB-log framing: 7-byte header,
    32 KiB blocks of chunks with a 7-byte header: crc, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))):
        data, pos, buf = open(path, "rb").read(), 7, b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if left < 7 or (length == 0 and kind == 0):  # block trailer / padding
                pos += left
                continue
            buf, pos = buf + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a full record, or the last chunk of one
                record = pb.Record()
                record.ParseFromString(buf)
                out.append(record)
                buf = b""
    return out


def wandb_history(run_dir) -> list[dict]:
    rows = []
    for r in wandb_records(run_dir):
        if r.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item})
    return rows


def wandb_config(run_dir) -> dict:
    run = next(r.run for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run")
    return {i.key: json.loads(i.value_json) for i in run.config.update if i.key != "_wandb"}


def test_both_sinks_get_the_same_metric_names_config_and_sample_table(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(CONFIG))  # written before the tracker starts
    run_tracker(run_dir, range(3))

    logged = set(metrics(0))
    assert set(tb_scalars(run_dir)) == logged
    history = wandb_history(run_dir)
    assert {k for row in history for k in row if not k.startswith(("_", "samples"))} == logged
    assert [(row["_step"], row["rollout/reward_mean"]) for row in history] == [(0, 0.0), (1, 1.0), (2, 2.0)]

    assert wandb_config(run_dir) == CONFIG
    config_text = dict(tb_texts(run_dir)["config"])[0]
    assert all(f"| {k} | {v} |" in config_text for k, v in CONFIG.items())

    # the samples: the same columns and cells in both (TensorBoard as a markdown table)
    texts = dict(tb_texts(run_dir)["samples"])
    assert texts[2] == "| prompt | completion | score |\n|---|---|---|\n| p2 | c2 \\| x | 2.0 |"
    table_rows = [r for r in history if "samples/path" in r]
    assert [r["_step"] for r in table_rows] == [0, 1, 2]
    (table_file,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "files" / table_rows[2]["samples/path"]))
    table = json.loads(open(table_file).read())
    assert table["columns"] == ["prompt", "completion", "score"] and table["data"] == [["p2", "c2 | x", 2.0]]


def test_a_resumed_run_logs_no_step_twice(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_tracker(run_dir, range(5))  # interrupted after step 4; its checkpoint is at step 3
    run_tracker(run_dir, range(3, 6), tag=0.5, history=[{"iteration": i} for i in range(3)])

    # TensorBoard: steps 3 and 4 of the first process are purged; the resumed values stand
    assert tb_scalars(run_dir)["rollout/reward_mean"] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.5), (4, 4.5), (5, 5.5)]
    assert [s for s, _ in tb_texts(run_dir)["samples"]] == [0, 1, 2, 3, 4, 5]
    # W&B: one run continued; steps only increase, so 3 and 4 keep their first values, 5 is new
    history = sorted(wandb_history(run_dir), key=lambda row: row["_step"])  # two offline files
    assert [(row["_step"], row["rollout/reward_mean"]) for row in history] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.5)]
    assert {r.run.run_id for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run"} == {
        json.loads((run_dir / "wandb" / "rlhfkit.json").read_text())["id"]}


def test_sft_resumed_from_an_older_checkpoint_logs_each_step_once(tmp_path, tiny_model_dir):
    """Through the trainer: 4 steps with checkpoints at 2 and 4; the newest is lost, so --resume
    continues from step 2 and logs steps 2 and 3 again."""
    import shutil

    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.sft import SFTConfig, train

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Review thing {i}.", "response": "Lovely coffee."}) + "\n"
                            for i in range(8)))
    cfg = build_config(SFTConfig, dict(model=str(tiny_model_dir), data=str(data), max_steps=4, batch_size=2,
                                       micro_batch_size=2, max_length=32, save_every=2, keep_checkpoints=2,
                                       eval_every=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="s",
                                       quiet=True, tensorboard=True, wandb=True))
    train(cfg)
    run_dir = tmp_path / "runs" / "s"
    shutil.rmtree(run_dir / "checkpoints" / "step-4")
    train(build_config(SFTConfig, {**vars(cfg), "resume": str(run_dir)}))
    wandb.teardown()

    steps = [json.loads(line)["iteration"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    scalars = tb_scalars(run_dir)
    assert [s for s, _ in scalars["loss/sft"]] == steps
    assert all(len({s for s, _ in ev}) == len(ev) for ev in scalars.values())  # no tag has a step twice
    assert sorted(row["_step"] for row in wandb_history(run_dir) if "loss/sft" in row) == steps
