"""50 simultaneous submitters on a live loopback server: every vote stored exactly once."""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rlhfkit.label.app import create_app
from rlhfkit.label.store import LabelStore

N_LABELLERS = 50
N_PAIRS = 30
VOTES_PER_PAIR = 2  # capacity 60 >= 50 labellers, so everyone gets a first pair


def run_together(n: int, fn: Callable[[int], object]) -> list[object]:
    """Run fn(0..n-1) in n threads released at the same instant by a barrier; re-raise errors."""
    barrier = threading.Barrier(n, timeout=30)
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.fixture
def server(tmp_path: Path, lab):
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=VOTES_PER_PAIR)
    store.import_pairs(lab.make_pairs(N_PAIRS))
    with lab.LiveServer(create_app(store)) as srv:
        srv.store = store
        yield srv
    store.close()


def shared_client(url: str) -> httpx.Client:
    """A client whose pool lets 100 threads each hold a connection (one client: one TLS setup)."""
    limits = httpx.Limits(max_connections=2 * N_LABELLERS, max_keepalive_connections=2 * N_LABELLERS)
    return httpx.Client(base_url=url, timeout=30, limits=limits)


def name(i: int) -> str:
    return f"labeller-{i:02d}"


def test_fifty_simultaneous_submitters(server) -> None:
    # One thread-safe client with a pool big enough for every thread to hold its own connection.
    client = shared_client(server.url)

    def post(i: int, path: str, body: dict) -> httpx.Response:
        return client.post(path, json=body)

    # 1. Everyone registers and asks for a pair at the same moment.
    run_together(N_LABELLERS, lambda i: post(i, "/api/labellers", {"labeller": name(i)}).raise_for_status())
    first = run_together(N_LABELLERS, lambda i: post(i, "/api/next", {"labeller": name(i)}).json()["pair"])
    holders = Counter(p["pair_id"] for p in first)
    assert all(p is not None for p in first)
    assert max(holders.values()) <= VOTES_PER_PAIR  # the N-labellers cap held under the race

    # 2. Each labeller's vote is sent twice at once (same request id): stored once, one replay.
    def submit(k: int) -> tuple[int, int, bool]:
        i = k % N_LABELLERS
        body = {"labeller": name(i), "pair_id": first[i]["pair_id"], "choice": i % 5 + 1,
                "request_id": f"first-vote-{i:04d}"}
        r = post(k, "/api/votes", body)
        return i, r.status_code, r.json().get("duplicate", False)

    results = run_together(2 * N_LABELLERS, submit)
    by_labeller = Counter()
    for i, status, duplicate in results:
        assert (status, duplicate) in ((201, False), (200, True))
        by_labeller[(i, status)] += 1
    assert all(by_labeller[(i, 201)] == 1 and by_labeller[(i, 200)] == 1 for i in range(N_LABELLERS))
    votes = server.store.votes()
    assert len(votes) == N_LABELLERS
    assert {(v.labeller, v.pair_id, v.choice) for v in votes} == {
        (name(i), first[i]["pair_id"], i % 5 + 1) for i in range(N_LABELLERS)}

    # 3. Everyone keeps labelling concurrently until nothing is left.
    def label_until_done(i: int) -> list[str]:
        done = []
        for step in range(N_PAIRS + 2):  # bounded
            pair = post(i, "/api/next", {"labeller": name(i)}).json()["pair"]
            if pair is None:
                return done
            r = post(i, "/api/votes", {"labeller": name(i), "pair_id": pair["pair_id"], "choice": 3,
                                       "request_id": f"{name(i)}-{step:04d}"})
            assert r.status_code == 201, r.text
            done.append(pair["pair_id"])
        raise AssertionError("labelling did not finish")

    later = run_together(N_LABELLERS, label_until_done)
    client.close()

    con = sqlite3.connect(server.store.path)
    rows = con.execute("SELECT labeller_id, pair_id FROM votes").fetchall()
    assert len(rows) == len(set(rows)) == N_PAIRS * VOTES_PER_PAIR  # every pair filled, nothing twice
    assert len(rows) == N_LABELLERS + sum(len(x) for x in later)  # each 201 is exactly one row
    per_pair = Counter(p for _, p in rows)
    assert set(per_pair.values()) == {VOTES_PER_PAIR}
    assert con.execute("SELECT COUNT(*) FROM assignments WHERE status = 'open'").fetchone()[0] == 0


def test_one_labeller_many_tabs_gets_one_pair_at_a_time(server) -> None:
    """20 simultaneous 'next' calls for one labeller hand out one pair, not 20."""
    with shared_client(server.url) as c:
        c.post("/api/labellers", json={"labeller": "solo"}).raise_for_status()
        got = run_together(20, lambda i: c.post("/api/next", json={"labeller": "solo"}).json()["pair"]["pair_id"])
    assert len(set(got)) == 1
    assert server.store.progress("solo").remaining == N_PAIRS
