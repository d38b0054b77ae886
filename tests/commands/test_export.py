"""`rlhfkit export`: a tiny PPO run exported as an adapter and as merged weights, loaded back by plain
transformers / peft, its model card, and `--push-to-hub` against a local stand-in for the Hub API."""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
import yaml

from rlhfkit.cli import main as cli_main
from rlhfkit.commands.export import export_run
from rlhfkit.errors import UserError

TEXT = "<|im_start|>user\nWrite a review of thing number 3.<|im_end|>\n<|im_start|>assistant\nIt was great, lovely"


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory, tiny_model_dir):
    """One PPO iteration with LoRA and a value head on the tiny model (lr high enough to move the adapter)."""
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    tmp = tmp_path_factory.mktemp("export")
    (tmp / "prompts.txt").write_text("\n".join(f"Write a review of thing number {i}." for i in range(16)))
    train(build_config(PPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(tmp / "prompts.txt"), reward="length:3", iterations=1,
        rollout_batch_size=8, mini_batch_size=4, micro_batch_size=4, max_new_tokens=6, num_eval_prompts=2, lr=5e-2,
        warmup_steps=0, dtype="fp32", output_dir=str(tmp / "runs"), run_name="ppo-tiny", quiet=True, tensorboard=False)))
    return tmp / "runs" / "ppo-tiny"


def logprobs(model, tok) -> torch.Tensor:
    """Log-probs of TEXT's tokens after the first under `model` (fp32, eval). (T-1,)"""
    ids = tok(TEXT, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


def run_policy(run_dir: Path, tiny_model_dir: Path):
    """The run's policy as trained: the base with the saved adapter active (not merged)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, run_dir / "final")


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    scale = max(1.0, b.abs().max().item())  # log-probs of a near-uniform tiny model: ~|5.8|
    assert (a - b).abs().max().item() <= 1e-5 * scale


def test_merged_export_gives_the_runs_log_probs_with_plain_transformers(ppo_run, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = export_run(ppo_run, tmp_path / "merged", merged=True)
    tok = AutoTokenizer.from_pretrained(out)
    exported = logprobs(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), tok)
    assert_close(exported, logprobs(run_policy(ppo_run, tiny_model_dir), tok))
    base = logprobs(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), tok)
    assert (exported - base).abs().max() > 1e-3  # the adapter was trained: the check has teeth

    # what vLLM reads: one weights file in the root, the value head apart, stop and pad ids
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert (out / "value_head" / "value_head.safetensors").is_file() and not (out / "adapter_config.json").exists()
    gen = GenerationConfig.from_pretrained(out)
    assert (gen.eos_token_id, gen.pad_token_id) == (2, 2)  # <|im_end|>, as the run stopped and padded
    assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)


def test_adapter_export_loads_with_plain_peft(ppo_run, tiny_model_dir, tmp_path):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    out = export_run(ppo_run, tmp_path / "adapter")
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model_dir)
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["adapter_model.safetensors"]
    tok = AutoTokenizer.from_pretrained(out)
    loaded = AutoPeftModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert_close(logprobs(loaded, tok), logprobs(run_policy(ppo_run, tiny_model_dir), tok))


def test_model_card_states_base_data_method_settings_and_evaluation(ppo_run, tmp_path):
    out = export_run(ppo_run, tmp_path / "card", merged=True)
    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta == {"library_name": "transformers", "pipeline_tag": "text-generation", "tags": ["rlhfkit", "ppo"]}
    summary = json.loads((ppo_run / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    # the evaluation names its metric (it said "mean")
    # prompts.txt has no held-out split: the card says the evaluation ran on training prompts
    assert f"| mean training-prompt reward (reward=length:3) | {before['mean']:.4g} | {after['mean']:.4g} |" in card
    assert f"| samples | {before['n']} | {after['n']} |" in card and f"| eval_change | {summary['eval_change']:.4g} |" in card
    assert "`rlhfkit ppo`, LoRA r=16, alpha=32" in card and "| `kl_coef` | 0.06 |" in card
    assert f"| prompts | `{ppo_run.parent.parent / 'prompts.txt'}` |" in card and "| reward | `length:3` |" in card
    assert "[report/report.html](report/report.html)" in card and (out / "report" / "report.html").is_file()
    # the card's own loading code runs on the folder
    (snippet,) = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    exec(snippet.replace('"ppo-tiny"', repr(str(out))), {})


def test_hub_ids_of_base_and_data_go_into_the_card_metadata(ppo_run, tmp_path):
    from rlhfkit.commands.export import base_model_id, read_run
    from rlhfkit.commands.export_card import front_matter

    info = read_run(ppo_run)
    info.config = {**info.config, "model": "smollm2-135m-instruct", "prompts": "hf:openai/gsm8k?config=main",
                   "eval_prompts": "openai/gsm8k?split=test"}
    base = base_model_id(info.config)
    assert base == "HuggingFaceTB/SmolLM2-135M-Instruct"
    meta = yaml.safe_load(front_matter(info, False, base).split("---\n")[1])
    assert meta["base_model"] == base and meta["datasets"] == ["openai/gsm8k"] and meta["library_name"] == "peft"


def test_full_fine_tuning_run_exports_its_weights_with_the_value_head_apart(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    (tmp_path / "p.txt").write_text("\n".join(f"Write a review of thing number {i}." for i in range(8)))
    train(build_config(PPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(tmp_path / "p.txt"), reward="length:3", iterations=1, lora=False,
        rollout_batch_size=4, mini_batch_size=4, micro_batch_size=4, max_new_tokens=4, num_eval_prompts=0, lr=1e-2,
        dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="full", quiet=True, tensorboard=False)))
    run = tmp_path / "runs" / "full"
    assert (run / "final" / "value_head.safetensors").is_file()  # beside the weights in final/: vLLM would see it
    out = export_run(run, tmp_path / "out")
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert (out / "value_head" / "value_head.safetensors").is_file()
    tok = AutoTokenizer.from_pretrained(out)
    assert torch.equal(logprobs(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), tok),
                       logprobs(AutoModelForCausalLM.from_pretrained(run / "final", dtype=torch.float32), tok))
    assert "library_name: transformers" in (out / "README.md").read_text()


# --------------------------------------------------------------------------- --push-to-hub


class HubStandIn:
    """The Hub API calls `HfApi.create_repo` + `upload_folder` make, served on 127.0.0.1: repos are
    created, README metadata is validated as YAML, every file is 'regular' (inline in the commit),
    and each call is recorded with its headers and body."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict, bytes]] = []
        self.repos: set[str] = set()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.handle_call("GET")

            def do_POST(self):
                self.handle_call("POST")

            def reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_call(self, method):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.calls.append((method, self.path, dict(self.headers), body))
                self.reply(*hub.answer(method, self.path, body))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        if (method, path) == ("POST", "/api/repos/create"):
            req = json.loads(body)
            self.repos.add(f"{req['organization']}/{req['name']}")
            return 200, {"url": f"{self.url}/{req['organization']}/{req['name']}"}
        if (method, path) == ("POST", "/api/validate-yaml"):
            text = json.loads(body)["content"]
            meta = yaml.safe_load(text.split("---\n")[1]) if text.startswith("---\n") else None
            return (200, {"errors": []}) if isinstance(meta, dict) else (400, {"errors": [{"message": "bad YAML"}]})
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit)/main", path)
        if method == "POST" and m and m[1] in self.repos:
            if m[2] == "preupload":
                files = json.loads(body)["files"]
                return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                       for f in files]}
            return 200, {"commitUrl": f"{self.url}/{m[1]}/commit/{'a' * 40}", "commitOid": "a" * 40}
        return 404, {"error": f"no route {method} {path}"}

    def committed(self) -> dict[str, bytes]:
        """path -> bytes of every file in the commits received."""
        files = {}
        for _, path, _, body in self.calls:
            if path.endswith("/commit/main"):
                for line in body.decode().splitlines():
                    item = json.loads(line)
                    if item["key"] == "file":
                        files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        return files

    def close(self):
        self.server.shutdown()


@pytest.fixture()
def hub(monkeypatch, tmp_path):
    import huggingface_hub.constants

    stand_in = HubStandIn()
    monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
    monkeypatch.setenv("HF_TOKEN", "hf_standin_token")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs with it set
    yield stand_in
    stand_in.close()


def test_push_to_hub_uploads_every_exported_file(ppo_run, tmp_path, hub, capsys):
    out = tmp_path / "pushed"
    assert cli_main(["export", str(ppo_run), "--out", str(out), "--push-to-hub", "me/tiny-ppo", "--private"]) == 0
    assert f"uploaded to me/tiny-ppo: {hub.url}/me/tiny-ppo/commit/{'a' * 40}" in capsys.readouterr().out
    create = next(json.loads(b) for m, p, _, b in hub.calls if p == "/api/repos/create")
    assert create == {"name": "tiny-ppo", "organization": "me", "visibility": "private"}
    local = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert hub.committed() == local and "README.md" in local and "value_head/value_head.safetensors" in local
    assert all(h.get("authorization") == "Bearer hf_standin_token" for m, p, h, _ in hub.calls if p.startswith("/api/models"))


def test_push_failure_is_one_line_and_keeps_the_folder(ppo_run, tmp_path, hub, capsys):
    hub.answer = lambda method, path, body: (403, {"error": "You don't have the rights to create a model under me"})
    out = tmp_path / "denied"
    assert cli_main(["export", str(ppo_run), "--out", str(out), "--push-to-hub", "me/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlhfkit: error: --push-to-hub me/x: ") and "\n" not in err
    assert (out / "README.md").is_file()


# --------------------------------------------------------------------------- errors


def test_bad_run_folders_and_outputs_are_one_line_errors(ppo_run, tmp_path):
    with pytest.raises(UserError, match=r": not a run folder \(no config.yaml\)$"):
        export_run(tmp_path, tmp_path / "o")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text("model: x\n")
    with pytest.raises(UserError, match=r"no final/ folder \(the run has not finished"):
        export_run(unfinished, tmp_path / "o")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="exists and is not empty; pass --force to replace it"):
        export_run(ppo_run, busy)
    assert (busy / "keep.txt").read_text() == "mine"
    with pytest.raises(UserError, match="inside its final/ folder"):
        export_run(ppo_run, ppo_run / "final" / "x")
    assert not list(tmp_path.glob(".*.tmp-*"))  # nothing half-written
