"""Shared fixtures for the labelling tests: pairs files, stores, a live uvicorn server."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlhfkit.label.pairs import Pair
from rlhfkit.label.server import Limits, make_server
from rlhfkit.label.store import LabelStore

XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def make_pairs(n: int) -> list[Pair]:
    """n distinct pairs; response_a always says "alpha", response_b says "beta"."""
    return [Pair(f"p{i:03d}", f"Prompt number {i}?", f"alpha answer {i}", f"beta answer {i}", "m1", "m2") for i in range(n)]


def write_pairs_file(path: Path, pairs: list[Pair]) -> Path:
    path.write_text("".join(p.to_json() + "\n" for p in pairs), encoding="utf-8")
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LabelStore]:
    s = LabelStore(tmp_path / "labels.sqlite", votes_per_pair=2)
    s.import_pairs(make_pairs(5))
    yield s
    s.close()


def voted_db(tmp_path: Path) -> tuple[Path, Path]:
    """A pairs file (2 pairs) and its default database with one vote by alice."""
    from rlhfkit.label.options import default_db

    pairs = write_pairs_file(tmp_path / "pairs.jsonl", make_pairs(2))
    store = LabelStore(default_db(pairs))
    store.import_pairs(make_pairs(2))
    store.register("alice")
    store.submit_vote("alice", store.next_pair("alice").pair_id, 1, "req-0001")
    store.close()
    return pairs, default_db(pairs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """Run an ASGI app on a free loopback port in a background thread, with the server and
    the connection limits `rlhfkit label serve` uses (``limits``: other ones)."""

    def __init__(self, app, limits: Limits | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(app, limits, host="127.0.0.1", port=self.port)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail instead of serving forever if a command gets as far as starting the server."""
    import uvicorn

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the server was started")

    monkeypatch.setattr(uvicorn, "run", refuse)
    monkeypatch.setattr(uvicorn.Server, "run", refuse)


@pytest.fixture
def fake_models(monkeypatch: pytest.MonkeyPatch) -> list:
    """Replace the prompt loader and the sampler (no real model in tests)."""
    calls: list = []

    def load_prompts(spec, split="train", limit=None, seed=0):
        calls.append(("load", spec, split, limit, seed))
        return [{"prompt": f"Review {i}:"} for i in range(limit or 4)]

    def sample_texts(model, prompts, num_samples, max_new_tokens=64, temperature=1.0, seed=0):
        calls.append(("sample", model, num_samples, max_new_tokens, temperature, seed))
        return [[f"{model} says {k} to {p}" for k in range(num_samples)] for p in prompts]

    monkeypatch.setitem(sys.modules, "rlhfkit.data.prompts", types.SimpleNamespace(load_prompts=load_prompts))
    monkeypatch.setitem(sys.modules, "rlhfkit.rollout.texts", types.SimpleNamespace(sample_texts=sample_texts))
    return calls


@pytest.fixture
def lab() -> SimpleNamespace:
    """Helpers for the tests (a fixture, so no test imports conftest by module name)."""
    return SimpleNamespace(
        make_pairs=make_pairs,
        write_pairs_file=write_pairs_file,
        LiveServer=LiveServer,
        read_jsonl=read_jsonl,
        voted_db=voted_db,
        free_port=free_port,
        XSS=XSS,
    )
