"""`rlhfkit serve MODEL` as a real process on 127.0.0.1, driven by the real openai client."""

from __future__ import annotations

import subprocess
import sys

import pytest
from serve_helpers import serving

openai = pytest.importorskip("openai")


def test_serve_answers_the_openai_client(tiny_model_dir):
    with serving(tiny_model_dir, "--name", "tiny", "--max-tokens", "8") as (url, name):
        assert name == "tiny"
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                              max_tokens=100)
        assert len(chat.choices) == 2
        assert all(c.finish_reason in ("stop", "length") for c in chat.choices)
        assert chat.usage.completion_tokens <= 2 * 8  # max_tokens capped at --max-tokens
        text = client.completions.create(model="tiny", prompt="The film", max_tokens=3, temperature=0)
        assert text.usage.completion_tokens <= 3
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])


def test_serve_with_a_token_refuses_other_keys(tiny_model_dir):
    with serving(tiny_model_dir, "--token", "s3cret-token") as (url, name):
        bad = openai.OpenAI(base_url=url, api_key="wrong-key", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=url, api_key="s3cret-token", max_retries=0, timeout=60)
        assert [m.id for m in good.models.list().data] == [name]


def test_serve_off_loopback_without_a_token_is_one_line_exit_2(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("RLHFKIT_SERVE_TOKEN", raising=False)
    r = subprocess.run([sys.executable, "-m", "rlhfkit.cli", "serve", str(tiny_model_dir), "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--token" in r.stderr and len(r.stderr.strip().splitlines()) == 1
