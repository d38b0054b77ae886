// rlhfkit labelling: the lead's view. Lists the pairs whose votes point different ways, with
// every vote's reason and ratings, and lets the lead set the final label (kept apart from the
// votes; `rlhfkit label export --resolve` uses it). Texts go in as text nodes or through
// render.js (never as HTML). The lead's secret comes once in ?lead=, leaves the address bar and
// is kept for this tab only (sessionStorage), sent as the X-Lead-Token header.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const R = window.rlhfkitRender;
  const KEY = "rlhfkit-lead-token";
  const SCORE_LABELS = { 2: "A much better", 1: "A slightly better", 0: "same", "-1": "B slightly better",
    "-2": "B much better" };
  const CHOICES = [[1, "A much better"], [2, "A slightly better"], [3, "About the same"],
    [4, "B slightly better"], [5, "B much better"]];
  let token = null;
  let pairs = [];

  async function api(path, body) {
    const init = body === undefined ? { method: "GET" } : {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    };
    init.headers = { ...(init.headers || {}), "X-Lead-Token": token || "" };
    const res = await fetch("api/lead/" + path, { ...init, credentials: "same-origin" });
    let data = null;
    try { data = await res.json(); } catch (_) { data = null; }
    if (!res.ok) {
      const err = new Error((data && data.error) || "HTTP " + res.status);
      err.status = res.status;
      throw err;
    }
    return data;
  }

  function node(tag, text, className) {
    const n = document.createElement(tag);
    if (text !== undefined) n.textContent = text;
    if (className) n.className = className;
    return n;
  }

  function textBox(title, source) {
    const box = node("div", undefined, "card response");
    box.appendChild(node("h2", title));
    const body = node("div", undefined, "text");
    R.show(body, source, $("plain").checked);
    body.classList.remove("collapsed");
    box.appendChild(body);
    return box;
  }

  function renderPair(p) {
    const card = node("article", undefined, "card disputed");
    card.dataset.pair = p.pair_id;
    card.appendChild(node("h2", "Pair " + p.pair_id));
    const prompt = node("div", undefined, "text");
    R.show(prompt, p.prompt, $("plain").checked);
    prompt.classList.remove("collapsed");
    card.appendChild(prompt);
    const both = node("div", undefined, "responses");
    both.append(textBox("Response A", p.response_a), textBox("Response B", p.response_b));
    card.appendChild(both);
    const votes = node("ul", undefined, "votes");
    for (const v of p.votes) {
      let line = v.labeller + ": " + SCORE_LABELS[v.score];
      const rated = Object.entries(v.ratings || {}).map(([k, s]) => k + " " + SCORE_LABELS[s]);
      if (rated.length) line += " (" + rated.join("; ") + ")";
      if (v.reason) line += " — " + v.reason;
      votes.appendChild(node("li", line));
    }
    card.appendChild(votes);
    const final = node("p", p.resolution
      ? "Final label: " + SCORE_LABELS[p.resolution.score] + (p.resolution.note ? " — " + p.resolution.note : "")
      : "No final label yet.", "final");
    card.appendChild(final);
    const row = node("div", undefined, "resolve-row");
    const note = node("input");
    note.maxLength = 2000;
    note.placeholder = "note (optional)";
    row.appendChild(note);
    for (const [choice, label] of CHOICES) {
      const btn = node("button", label);
      btn.type = "button";
      btn.dataset.choice = String(choice);
      btn.addEventListener("click", async () => {
        try {
          await api("resolve", { pair_id: p.pair_id, choice: choice, note: note.value.trim() });
          $("status").textContent = "Final label saved for " + p.pair_id + ".";
          await load();
        } catch (err) {
          $("status").textContent = err.message;
        }
      });
      row.appendChild(btn);
    }
    card.appendChild(row);
    return card;
  }

  function renderAll() {
    const list = $("pairs");
    list.replaceChildren(...pairs.map(renderPair));
    const open = pairs.filter((p) => !p.resolution).length;
    $("summary").textContent = pairs.length + " disputed pair(s), " + open + " without a final label.";
  }

  async function load() {
    try {
      pairs = (await api("disputed")).pairs;
      renderAll();
    } catch (err) {
      if (err.status === 401) $("nokey").hidden = false;
      $("status").textContent = err.message;
    }
  }

  function init() {
    const query = new URLSearchParams(window.location.search);
    if (query.has("lead")) {
      token = query.get("lead");
      try { sessionStorage.setItem(KEY, token); } catch (_) { /* kept in memory only */ }
      query.delete("lead");
      const rest = query.toString();
      window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : ""));
    } else {
      try { token = sessionStorage.getItem(KEY); } catch (_) { token = null; }
    }
    $("plain").addEventListener("change", renderAll);
    load();
  }

  init();
})();
