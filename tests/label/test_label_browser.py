"""A real Chromium (Debian's, headless, via Playwright) labels three pairs, then we export.

Skipped when /usr/bin/chromium is not installed (`apt-get install -y chromium`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlhfkit.label import cli
from rlhfkit.label.app import create_app
from rlhfkit.label.pairs import Pair
from rlhfkit.label.security import LOOPBACK_HOSTS
from rlhfkit.label.store import LabelStore

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install chromium)"),
]


def test_label_three_pairs_with_keys_and_mouse_then_export(tmp_path: Path, lab) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    pairs = [
        Pair("xss", "Which reply is nicer? " + lab.XSS, lab.XSS, "A calm, plain answer."),
        Pair("two", "Describe the sea.", "It is blue and wide.", "Salty."),
        Pair("three", "Say hello.", "Hello!", "Hi there, friend."),
    ]
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(pairs)
    by_prompt = {p.prompt: p for p in pairs}
    shown: dict[str, tuple[str, str]] = {}  # prompt -> (left text, right text) as displayed

    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS)) as srv, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(10_000)
        page_errors: list[str] = []
        page.on("pageerror", lambda e: page_errors.append(str(e)))
        page.goto(srv.url + "/")

        def record() -> None:
            shown[page.text_content("#prompt")] = (page.text_content("#left"), page.text_content("#right"))

        # Sign in with a name.
        page.fill("#name", "alice")
        page.press("#name", "Enter")
        progress = page.locator("#progress-text")
        expect(progress).to_have_text("1 of 3")

        # Pair 1: the markup in the prompt and a response is shown as text, never run or parsed.
        record()
        assert page.text_content("#prompt") == "Which reply is nicer? " + lab.XSS
        assert lab.XSS in shown[page.text_content("#prompt")]
        assert page.evaluate("document.querySelectorAll('#prompt *, #left *, #right *').length") == 0
        assert page.evaluate("typeof window.__pwned") == "undefined"
        page.keyboard.press("1")  # left is significantly better (keyboard)
        expect(progress).to_have_text("2 of 3")

        # Pair 2: the mouse.
        record()
        page.click("button[data-choice='4']")  # right is slightly better
        expect(progress).to_have_text("3 of 3")

        # Pair 3: skip with 's', undo with 'u', then choose with '5'.
        record()
        page.keyboard.press("s")
        expect(page.locator("#done")).to_be_visible()
        expect(page.locator("#done-text")).to_contain_text("skipped 1")
        page.keyboard.press("u")
        expect(page.locator("#task")).to_be_visible()  # the pair is back (progress reads 3 of 3 throughout)
        expect(progress).to_have_text("3 of 3")
        assert (page.text_content("#left"), page.text_content("#right")) == shown["Say hello."]  # same sides
        page.keyboard.press("5")  # right is significantly better
        expect(page.locator("#done-text")).to_contain_text("voted on 3 pair(s) and skipped 0")
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert page_errors == []
        browser.close()

    out = tmp_path / "prefs.jsonl"
    assert cli.main(["export", "--db", str(store.path), "--out", str(out)]) == 0
    rows = {r["prompt"]: r for r in lab.read_jsonl(out)}
    assert len(rows) == 3
    expected = {  # prompt -> (which displayed side won, strength)
        "Which reply is nicer? " + lab.XSS: ("left", 1.0),
        "Describe the sea.": ("right", 0.5),
        "Say hello.": ("right", 1.0),
    }
    for prompt, (side, strength) in expected.items():
        left, right = shown[prompt]
        winner, loser = (left, right) if side == "left" else (right, left)
        row = rows[prompt]
        assert (row["chosen"], row["rejected"]) == (winner, loser)
        assert {row["chosen"], row["rejected"]} == {by_prompt[prompt].response_a, by_prompt[prompt].response_b}
        assert (row["strength"], row["margin"], row["labeller"], row["votes"]) == (strength, strength, "alice", 1)
    store.close()
