"""A real Chromium (Debian's, headless, via Playwright): one labeller labels three pairs and we
export; two labellers sign in with their own invitation links (the page asks before it signs
anyone in) and cannot touch each other's votes.

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
        # Markdown gives paragraphs at most: no element the text named (script, img) exists.
        assert page.evaluate("[...document.querySelectorAll('#prompt *, #left *, #right *')]"
                             ".every(e => e.tagName === 'P')")
        assert page.evaluate("document.querySelectorAll('script:not([src]), img').length") == 0
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
        assert (row["strength"], row["margin"], row["labellers"], row["votes"]) == (strength, strength, ["alice"], 1)
    store.close()


def test_invitation_links_sign_labellers_in_and_keep_their_votes_apart(tmp_path: Path, lab) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=2)
    store.import_pairs([Pair("one", "Describe the sea.", "It is blue and wide.", "Salty."),
                        Pair("two", "Say hello.", "Hello!", "Hi there, friend.")])
    links = {name: store.invite(name)[1] for name in ("alice", "bob")}

    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS, auth="invite")) as srv, \
            sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        errors: list[str] = []

        def open_page(path: str):  # each labeller in a separate browser profile (own cookies)
            page = browser.new_context().new_page()
            page.set_default_timeout(10_000)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(srv.url + path)
            return page

        # No link: a note to use one, and no name form to type someone else's name into.
        stranger = open_page("/")
        expect(stranger.locator("#signin")).to_be_visible()
        expect(stranger.locator("#login")).to_be_hidden()

        # Alice opens her own link: the page asks first (a link alone signs nobody in), the secret
        # is gone from the address bar; she clicks and is signed in as alice.
        alice = open_page(f"/?invite={links['alice']}")
        expect(alice.locator("#confirm-name")).to_have_text("alice")
        assert alice.url == srv.url + "/"
        assert alice.evaluate("fetch('api/session').then(r => r.json())")["labeller"] is None
        alice.click("#confirm-signin")
        expect(alice.locator("#who-name")).to_have_text("alice")
        expect(alice.locator("#switch")).to_be_hidden()
        expect(alice.locator("#progress-text")).to_have_text("1 of 2")
        alice.keyboard.press("1")  # "one": left is significantly better
        expect(alice.locator("#progress-text")).to_have_text("2 of 2")
        alice.reload()  # the cookie keeps her signed in
        expect(alice.locator("#who-name")).to_have_text("alice")

        # Bob opens his link; his undo has nothing of his to take back.
        bob = open_page(f"/?invite={links['bob']}")
        bob.click("#confirm-signin")
        expect(bob.locator("#who-name")).to_have_text("bob")
        expect(bob.locator("#prompt")).to_have_text("Describe the sea.")
        bob.keyboard.press("u")
        expect(bob.locator("#status")).to_have_text("Nothing to undo.")
        # From his page, bob forges requests in alice's name: refused.
        statuses = bob.evaluate("""async () => {
            const post = (path, body) => fetch("api/" + path, {method: "POST",
                headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)}).then(r => r.status);
            return [await post("undo", {labeller: "alice"}),
                    await post("votes", {labeller: "alice", pair_id: "one", choice: 5, request_id: "forged-0001"}),
                    await post("labellers", {labeller: "ALICE"})];
        }""")
        assert statuses == [403, 403, 403]
        bob.keyboard.press("5")  # his own vote on "one"
        expect(bob.locator("#progress-text")).to_have_text("2 of 2")

        # Alice's undo takes back her vote only.
        alice.keyboard.press("u")
        expect(alice.locator("#status")).to_have_text("Undone: that pair is back.")
        expect(alice.locator("#prompt")).to_have_text("Describe the sea.")
        assert errors == []
        browser.close()

    assert [(v.labeller, v.pair_id, v.choice) for v in store.votes()] == [("bob", "one", 5)]
    store.close()


def test_an_unbreakable_response_cannot_hide_the_other_one(tmp_path: Path, lab) -> None:
    """`"ok " + "\\u0489" * 300` (combining enclosing marks: one unbreakable cluster) widened its
    column to 2893 px in a 1200 px window; the other response became a strip or went off-screen."""
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    wide = "ok " + "\u0489" * 300
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs([Pair("wide", "Which is better?", wide, "A short, plain answer.")])
    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS)) as srv, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.set_default_timeout(10_000)
        page.goto(srv.url + "/")
        page.fill("#name", "alice")
        page.press("#name", "Enter")
        expect(page.locator("#progress-text")).to_have_text("1 of 1")
        boxes = [page.locator(f"#{side}").bounding_box() for side in ("left", "right")]
        page_width = page.evaluate("document.documentElement.scrollWidth")
        inner_width = page.evaluate("window.innerWidth")
        browser.close()
    store.close()
    (left, right) = boxes
    assert abs(left["width"] - right["width"]) <= 1, boxes  # equal columns
    assert right["x"] + right["width"] <= inner_width and left["width"] >= 300, boxes  # both fully on screen
    assert page_width <= inner_width  # nothing scrolls the page sideways


MARKDOWN = """## Plan

Use **bold** and `inline <code>` here:

```python
print("<b>not bold</b>")
```

- first item
- second [a link](javascript:window.__pwned=3)

<script>window.__pwned = 1</script>"""


def test_markdown_is_rendered_safely_and_a_rationale_is_saved_and_exported(tmp_path: Path, lab) -> None:
    """A code block becomes <pre><code>, a <script> in a response is shown as text and never runs,
    a link is text; the plain-text toggle shows the response as written; a long response is
    collapsed until "show all"; the guidelines pane renders its file; a reason and a criterion
    rating typed in the page are stored with the vote and exported."""
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    long_text = "\n\n".join(f"Paragraph {i}: " + "words " * 30 for i in range(40))
    pairs = [Pair("md", "Explain *briefly*.", MARKDOWN, "A short answer."),
             Pair("long", "Write a lot.", long_text, "Short.")]
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(pairs)
    guidelines = "# Guidelines\n\nPrefer **honest** answers.\n\n```\n<img src=x onerror=alert(1)>\n```"
    app = create_app(store, allowed_hosts=LOOPBACK_HOSTS, criteria=("helpfulness", "honesty"), guidelines=guidelines)
    reason = 'The left one has the code; <img src=x onerror="window.__pwned = 4">'
    with lab.LiveServer(app) as srv, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.set_default_timeout(10_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(srv.url + "/")
        page.fill("#name", "alice")
        page.press("#name", "Enter")
        expect(page.locator("#progress-text")).to_have_text("1 of 2")
        side = "left" if "Plan" in page.text_content("#left") else "right"
        box = page.locator(f"#{side}")

        # Rendered: heading, strong, inline code, a code block as <pre><code>, a list; the link is text.
        assert box.locator("h4").text_content() == "Plan"
        assert box.locator("strong").text_content() == "bold"
        assert box.locator(":not(pre) > code").text_content() == "inline <code>"
        assert box.locator("pre > code").text_content() == 'print("<b>not bold</b>")'
        assert box.locator("li").count() == 2 and box.locator("a, b, img, script, iframe").count() == 0
        assert "javascript:window.__pwned=3" in box.locator("li").nth(1).text_content()
        # The <script> line is a paragraph of text, and nothing ran.
        assert box.locator("p").last.text_content() == "<script>window.__pwned = 1</script>"
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert page.locator("#prompt em").text_content() == "briefly"

        # Plain text: exactly as written, no elements; the choice is remembered for the next pair.
        page.check("#plain")
        assert box.text_content() == MARKDOWN and box.locator("*").count() == 0
        page.uncheck("#plain")
        expect(box.locator("pre > code")).to_have_count(1)

        # The guidelines pane renders its file the same way.
        page.click("#guidelines-pane summary")
        expect(page.locator("#guidelines strong")).to_have_text("honest")
        assert page.locator("#guidelines pre > code").text_content() == "<img src=x onerror=alert(1)>"

        # A reason and one criterion rating, then the vote for the Markdown side (mouse).
        page.fill("#reason", reason)
        page.press("#reason", "1")  # typing in the box is not a vote
        assert page.input_value("#reason") == reason + "1"
        page.fill("#reason", reason)
        page.select_option("select[data-criterion='honesty']", "1" if side == "left" else "5")
        page.click(f"button[data-choice='{1 if side == 'left' else 5}']")
        expect(page.locator("#progress-text")).to_have_text("2 of 2")
        assert page.input_value("#reason") == ""  # cleared for the next pair

        # A long response is collapsed until "show all".
        long_side = "left" if page.text_content("#left").startswith("Paragraph 0") else "right"
        long_box = page.locator(f"#{long_side}")
        show_all = page.locator(f"button.show-all[data-for='{long_side}']")
        expect(show_all).to_be_visible()
        collapsed = long_box.evaluate("e => e.clientHeight")
        show_all.click()
        expect(show_all).to_be_hidden()
        assert long_box.evaluate("e => e.clientHeight") > 2 * collapsed
        assert long_box.evaluate("e => e.scrollHeight <= e.clientHeight + 1")  # all of it shown
        expect(page.locator(f"button.show-all[data-for='{'right' if long_side == 'left' else 'left'}']")).to_be_hidden()

        # My votes: the history lists the vote with its reason, as text.
        page.click("#history-open")
        expect(page.locator("#history")).to_be_visible()
        expect(page.locator("#history-list li")).to_have_count(1)
        assert reason in page.locator("#history-list li").text_content()
        assert page.locator("#history-list img").count() == 0
        page.click("#history-close")
        expect(page.locator("#task")).to_be_visible()
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert errors == []
        browser.close()

    out = tmp_path / "prefs.jsonl"
    assert cli.main(["export", "--db", str(store.path), "--out", str(out)]) == 0
    (row,) = lab.read_jsonl(out)
    assert row["pair_id"] == "md" and row["chosen"] == MARKDOWN  # the rendered side won
    assert row["reasons"] == [{"labeller": "alice", "reason": reason}]
    assert row["criteria"] == {"honesty": {"mean": 2.0, "n": 1}}  # chosen much better on honesty
    store.close()


def test_the_lead_sets_a_final_label_in_the_browser(tmp_path: Path, lab) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=2)
    store.import_pairs([Pair("one", "Say hi.", "Hi " + lab.XSS, "Hello.")])
    for name, choice in (("alice", 1), ("bob", 5)):  # opposite sides as shown: a dispute if the sides match
        store.register(name)
        shown = store.next_pair(name)
        left_is_a = shown.left.startswith("Hi")
        store.submit_vote(name, "one", choice if left_is_a else 6 - choice, f"req-{name}-01", reason=f"{name} <i>says</i>")
    lead = "lead-secret-0123"
    app = create_app(store, allowed_hosts=LOOPBACK_HOSTS, lead_token=lead)
    with lab.LiveServer(app) as srv, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(10_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{srv.url}/lead?lead={lead}")
        expect(page.locator("#summary")).to_have_text("1 disputed pair(s), 1 without a final label.")
        assert page.url == srv.url + "/lead"  # the secret left the address bar
        card = page.locator("article.disputed")
        expect(card.locator(".votes li")).to_have_count(2)
        assert "alice <i>says</i>" in card.locator(".votes li").first.text_content()
        assert card.locator("i, img, script").count() == 0
        card.locator("input").fill("Hello is kinder")
        card.locator("button[data-choice='5']").click()  # B much better
        expect(page.locator("#summary")).to_have_text("1 disputed pair(s), 0 without a final label.")
        expect(page.locator("article.disputed .final")).to_contain_text("B much better")
        page.reload()  # the lead token stays for this tab
        expect(page.locator("#summary")).to_have_text("1 disputed pair(s), 0 without a final label.")
        assert page.evaluate("typeof window.__pwned") == "undefined" and errors == []
        browser.close()
    r = store.resolutions()["one"]
    assert (r.score, r.note) == (-2, "Hello is kinder")
    assert len(store.votes()) == 2
    store.close()
