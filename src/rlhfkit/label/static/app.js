// rlhfkit labelling page. Plain JavaScript, no dependencies, works offline.
// Model text is only ever inserted as text nodes (render.js builds Markdown's elements itself,
// never as HTML), so a response that contains markup such as <script> is shown as text.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  // auth: "open" (type a name) or "invite" (signed in by a personal link; the server knows who).
  const state = { auth: "open", labeller: null, pair: null, busy: false, invite: null, criteria: [] };
  const R = window.rlhfkitRender;
  const PLAIN_KEY = "rlhfkit-plain-text";

  // ---------------------------------------------------------------- helpers

  /** A random id for a vote, so a retried submit is stored once (works without HTTPS). */
  function requestId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  /** POST JSON to /api/PATH (GET when body is null); throws Error(message) with .status on 4xx/5xx. */
  async function api(path, body, retries = 0) {
    let res;
    try {
      const init = body === null ? { method: "GET" } : {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      };
      res = await fetch("api/" + path, { ...init, credentials: "same-origin" });
    } catch (err) {
      // Network failure: safe to retry because votes carry an idempotency key.
      if (retries > 0) {
        await new Promise((r) => setTimeout(r, 500));
        return api(path, body, retries - 1);
      }
      throw new Error("cannot reach the labelling server");
    }
    let data = null;
    try { data = await res.json(); } catch (_) { data = null; }
    if (!res.ok) {
      const err = new Error((data && data.error) || "HTTP " + res.status);
      err.status = res.status;
      throw err;
    }
    return data;
  }

  /** Who acts: the typed name in open mode; nothing in invite mode (the cookie says who). */
  function who(extra = {}) {
    return state.auth === "open" ? { labeller: state.labeller, ...extra } : extra;
  }

  function setStatus(text, isError = false) {
    const el = $("status");
    el.textContent = text;
    el.classList.toggle("error", isError);
    if (isError) for (const btn of document.querySelectorAll("button.picked")) btn.classList.remove("picked");
  }

  function showOnly(id) {
    for (const s of ["login", "signin", "confirm", "task", "done", "history"]) $(s).hidden = s !== id;
    $("who").hidden = id === "login" || id === "signin" || id === "confirm";
    $("switch").hidden = state.auth !== "open";
  }

  // ---------------------------------------------------------------- rendering

  function renderProgress(data) {
    const p = data.progress;
    const current = data.pair ? Math.min(p.done + 1, p.total) : p.done;
    $("progress-text").textContent = current + " of " + p.total;
    $("progress-bar").value = p.total ? p.done / p.total : 1;
    const o = data.overall;
    $("overall-text").textContent = o.votes + " of " + o.target + " votes collected";
  }

  function render(data) {
    state.pair = data.pair;
    renderProgress(data);
    if (!data.pair) {
      const p = data.progress;
      $("done-text").textContent =
        "Nothing left for you to label. You voted on " + p.voted + " pair(s) and skipped " + p.skipped + ".";
      showOnly("done");
      return;
    }
    showTexts();
    for (const id of ["prompt", "left", "right"]) $(id).scrollTop = 0;
    for (const btn of document.querySelectorAll("button.picked")) btn.classList.remove("picked");
    clearRationale();
    showOnly("task");
  }

  /** The pair's texts as Markdown (or plain), long ones collapsed behind "show all". */
  function showTexts() {
    if (!state.pair) return;
    const plain = $("plain").checked;
    for (const id of ["prompt", "left", "right"]) {
      $(id).classList.remove("expanded");
      const collapsed = R.show($(id), state.pair[id], plain);
      document.querySelector('button.show-all[data-for="' + id + '"]').hidden = !collapsed;
    }
  }

  function clearRationale() {
    $("reason").value = "";
    for (const select of document.querySelectorAll("#criteria select")) select.value = "";
  }

  /** One select per criterion, on the vote's scale (left/right as shown). */
  function buildCriteria(names) {
    const box = $("criteria");
    box.replaceChildren();
    box.hidden = names.length === 0;
    if (names.length) {
      const head = document.createElement("div");
      head.className = "muted";
      head.textContent = "Rate by criterion (optional):";
      box.appendChild(head);
    }
    const options = [["", "—"], ["1", "left much better"], ["2", "left slightly better"], ["3", "same"],
      ["4", "right slightly better"], ["5", "right much better"]];
    for (const name of names) {
      const label = document.createElement("label");
      label.className = "criterion";
      const title = document.createElement("span");
      title.textContent = name;
      const select = document.createElement("select");
      select.dataset.criterion = name;
      for (const [value, text] of options) {
        const option = document.createElement("option");
        option.value = value;
        option.textContent = text;
        select.appendChild(option);
      }
      label.append(title, select);
      box.appendChild(label);
    }
  }

  /** The reason and ratings typed for the current pair, as the vote's extra fields. */
  function rationale() {
    const extra = {};
    const reason = $("reason").value.trim();
    if (reason) extra.reason = reason;
    const ratings = {};
    for (const select of document.querySelectorAll("#criteria select")) {
      if (select.value) ratings[select.dataset.criterion] = Number(select.value);
    }
    if (Object.keys(ratings).length) extra.ratings = ratings;
    return extra;
  }

  async function showHistory() {
    const data = await api("history", who());
    const list = $("history-list");
    list.replaceChildren();
    for (const v of data.votes) {
      const li = document.createElement("li");
      const prompt = document.createElement("div");
      prompt.className = "history-prompt";
      prompt.textContent = v.prompt.length > 200 ? v.prompt.slice(0, 200) + "…" : v.prompt;
      const choice = document.createElement("div");
      choice.textContent = v.choice_label + " · " + v.at.slice(0, 16).replace("T", " ") + " UTC";
      li.append(prompt, choice);
      if (v.reason) {
        const reason = document.createElement("div");
        reason.className = "muted history-reason";
        reason.textContent = "Why: " + v.reason;
        li.appendChild(reason);
      }
      list.appendChild(li);
    }
    if (!data.votes.length) {
      const li = document.createElement("li");
      li.textContent = "No votes yet.";
      list.appendChild(li);
    }
    showOnly("history");
  }

  // ---------------------------------------------------------------- actions

  /** Run one action at a time; ignore keys and clicks while a request is in flight. */
  async function act(fn) {
    if (state.busy) return;
    state.busy = true;
    document.body.classList.add("busy");
    try {
      await fn();
    } catch (err) {
      setStatus(err.message, true);
    } finally {
      state.busy = false;
      document.body.classList.remove("busy");
    }
  }

  async function loadNext() {
    render(await api("next", who()));
  }

  /** A vote or skip the server refused because the pair moved on (409): show why, move on. */
  async function recover(err) {
    if (err.status !== 409) throw err;
    await loadNext();
    setStatus(err.message, true);
  }

  function choose(choice) {
    if (!state.pair) return;
    const pair = state.pair;
    if (state.busy) return;
    const btn = document.querySelector('button[data-choice="' + choice + '"]');
    if (btn) btn.classList.add("picked");
    return act(async () => {
      setStatus("Saving…");
      const body = who({ pair_id: pair.pair_id, choice: choice, request_id: requestId(), ...rationale() });
      try {
        await api("votes", body, 2);
      } catch (err) {
        return recover(err);
      }
      setStatus("Saved.");
      await loadNext();
    });
  }

  function skip() {
    if (!state.pair) return;
    const pair = state.pair;
    return act(async () => {
      try {
        await api("skip", who({ pair_id: pair.pair_id }), 2);
      } catch (err) {
        return recover(err);
      }
      setStatus("Skipped.");
      await loadNext();
    });
  }

  function undo() {
    return act(async () => {
      const data = await api("undo", who());
      if (!data.undone) setStatus("Nothing to undo.");
      else if (data.reopened) setStatus("Undone: that pair is back.");
      else setStatus("Skip undone, but that pair has meanwhile got all its votes from others.");
      await loadNext();
    });
  }

  function start(name) {
    return act(async () => {
      const data = await api("labellers", state.auth === "open" ? { labeller: name } : {});
      state.labeller = data.labeller;
      $("who-name").textContent = data.labeller;
      if (state.auth === "open") {
        try { localStorage.setItem("rlhfkit-labeller", data.labeller); } catch (_) { /* private mode */ }
      }
      setStatus("");
      await loadNext();
    });
  }

  /** An invitation link was opened: show whose it is and sign in only when the labeller
   *  clicks (a link alone, e.g. from another site, never replaces who is signed in). */
  async function offerSignIn(current) {
    const data = await api("invitation", { invite: state.invite });
    $("confirm-name").textContent = data.labeller;
    $("confirm-button-name").textContent = data.labeller;
    $("confirm-current").textContent = current && current !== data.labeller
      ? "You are signed in as " + current + " in this browser; signing in replaces that." : "";
    showOnly("confirm");
    $("confirm-signin").focus();
  }

  function confirmSignIn() {
    return act(async () => {
      await api("signin", { invite: state.invite });
      state.invite = null;
    }).then(() => { if (state.invite === null) begin(); });
  }

  /** Ask the server how labellers are identified, then show the name form, the sign-in
   *  question, the task or the "open your link" note. */
  async function begin() {
    let session;
    try {
      session = await api("session", null);
      const config = await api("config", null);
      state.criteria = config.criteria || [];
      buildCriteria(state.criteria);
      $("guidelines-pane").hidden = !config.guidelines;
      if (config.guidelines) R.show($("guidelines"), config.guidelines, false);
      $("guidelines").classList.remove("collapsed");
      state.auth = session.auth;
      if (state.invite !== null && state.auth === "invite") return await offerSignIn(session.labeller);
    } catch (err) {
      setStatus(err.message, true);
      if (state.invite !== null) showOnly("signin");
      return;
    }
    if (state.auth === "open") {
      showOnly("login");
      $("name").focus();
    } else if (session.labeller) {
      start(session.labeller);
    } else {
      showOnly("signin");
    }
  }

  // ---------------------------------------------------------------- wiring

  function onKey(event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const tag = (event.target && event.target.tagName) || "";
    if (tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT") return;
    if (!$("task").hidden && /^[1-5]$/.test(event.key)) {
      event.preventDefault();
      choose(Number(event.key));
    } else if (!$("task").hidden && event.key.toLowerCase() === "s") {
      event.preventDefault();
      skip();
    } else if (state.labeller && event.key.toLowerCase() === "u") {
      event.preventDefault();
      undo();
    }
  }

  function init() {
    const query = new URLSearchParams(window.location.search);
    if (query.has("invite")) {
      state.invite = query.get("invite");
      query.delete("invite");  // the secret leaves the address bar (and the history)
      const rest = query.toString();
      window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : ""));
    }
    $("confirm-signin").addEventListener("click", confirmSignIn);
    try { $("name").value = localStorage.getItem("rlhfkit-labeller") || ""; } catch (_) { /* ignore */ }
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const name = $("name").value.trim();
      if (name) start(name);
    });
    for (const btn of document.querySelectorAll("button[data-choice]")) {
      btn.addEventListener("click", () => choose(Number(btn.dataset.choice)));
    }
    $("skip").addEventListener("click", skip);
    try { $("plain").checked = localStorage.getItem(PLAIN_KEY) === "1"; } catch (_) { /* private mode */ }
    $("plain").addEventListener("change", () => {
      try { localStorage.setItem(PLAIN_KEY, $("plain").checked ? "1" : "0"); } catch (_) { /* ignore */ }
      showTexts();
    });
    for (const btn of document.querySelectorAll("button.show-all")) {
      btn.addEventListener("click", () => {
        $(btn.dataset.for).classList.replace("collapsed", "expanded");
        btn.hidden = true;
      });
    }
    $("history-open").addEventListener("click", () => act(showHistory));
    $("history-close").addEventListener("click", () => act(loadNext));
    $("undo").addEventListener("click", undo);
    $("undo-done").addEventListener("click", undo);
    $("switch").addEventListener("click", () => {
      state.labeller = null;
      state.pair = null;
      setStatus("");
      showOnly("login");
      $("name").focus();
    });
    document.addEventListener("keydown", onKey);
    begin();
  }

  init();
})();
