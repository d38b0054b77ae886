// rlhfkit labelling: a small, safe Markdown renderer (no dependencies, works offline).
//
// It builds DOM nodes itself and puts every piece of text in with createTextNode: nothing is
// ever parsed as HTML, so markup in a response (<script>, <img onerror>) is shown as text. The subset: paragraphs, headings, *emphasis* / **strong**, `inline code`,
// fenced code blocks (``` or ~~~) as <pre><code>, bulleted and numbered lists, block quotes.
// Links are shown as text followed by their address in brackets, never as a link (no
// javascript: URL can be followed). Inline markup is looked for in paragraphs of at most
// INLINE_LIMIT characters; a longer one is shown as it is, so the work stays bounded.
"use strict";

(() => {
  const INLINE_LIMIT = 5000;
  const MAX_DEPTH = 3;  // emphasis inside emphasis ...
  const LONG_CHARS = 1500;  // longer (or more lines) than this: collapsed with a "show all"
  const LONG_LINES = 30;

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([A-Za-z0-9_+.#-]{0,30})[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$/;
  const ITEM = /^ {0,3}([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
  const QUOTE = /^ {0,3}>[ \t]?(.*)$/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  // One inline token: `code`, **strong**, __strong__, *em*, _em_, [text](address).
  const INLINE = new RegExp([
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",
    "(?<![\\w_])__(?=\\S)([\\s\\S]*?\\S)__(?![\\w_])",
    "\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*(?!\\*)",
    "(?<![\\w_])_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?![\\w_])",
    "\\[([^\\]\\n]{1,500})\\]\\(([^()\\s]{1,2000})\\)",
  ].join("|"), "g");

  function el(tag, className) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    return node;
  }

  function text(parent, s) {
    if (s) parent.appendChild(document.createTextNode(s));
  }

  /** Inline markup of one paragraph into ``parent`` (text nodes and em/strong/code/span only). */
  function inline(parent, s, depth = 0) {
    if (depth >= MAX_DEPTH || s.length > INLINE_LIMIT) {
      text(parent, s);
      return;
    }
    const re = new RegExp(INLINE.source, "g");
    let last = 0;
    let m;
    while ((m = re.exec(s)) !== null) {
      text(parent, s.slice(last, m.index));
      last = re.lastIndex;
      if (m[1] !== undefined) {
        const code = el("code");
        code.textContent = m[2];
        parent.appendChild(code);
      } else if (m[3] !== undefined || m[4] !== undefined) {
        const strong = el("strong");
        inline(strong, m[3] !== undefined ? m[3] : m[4], depth + 1);
        parent.appendChild(strong);
      } else if (m[5] !== undefined || m[6] !== undefined) {
        const em = el("em");
        inline(em, m[5] !== undefined ? m[5] : m[6], depth + 1);
        parent.appendChild(em);
      } else {
        const link = el("span", "md-link");
        link.textContent = m[7];
        parent.appendChild(link);
        const address = el("span", "md-url");
        address.textContent = " (" + m[8] + ")";
        parent.appendChild(address);
      }
    }
    text(parent, s.slice(last));
  }

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || ITEM.test(line) || QUOTE.test(line) || RULE.test(line);
  }

  /** Markdown ``source`` -> a DocumentFragment of safe nodes. */
  function markdown(source) {
    const out = document.createDocumentFragment();
    const lines = String(source).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (line.trim() === "") {
        i += 1;
      } else if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const body = [];
        i += 1;
        while (i < lines.length && !new RegExp("^ {0,3}" + fence[0] + "{" + fence.length + ",}\\s*$").test(lines[i])) {
          body.push(lines[i]);
          i += 1;
        }
        i += 1;  // the closing fence (or the end)
        const pre = el("pre");
        const code = el("code");
        if (m[2]) code.dataset.lang = m[2];
        code.textContent = body.join("\n");
        pre.appendChild(code);
        out.appendChild(pre);
      } else if ((m = HEADING.exec(line))) {
        const h = el("h" + Math.min(m[1].length + 2, 6), "md-h");
        inline(h, m[2]);
        out.appendChild(h);
        i += 1;
      } else if (RULE.test(line)) {
        out.appendChild(el("hr"));
        i += 1;
      } else if ((m = ITEM.exec(line))) {
        const ordered = /\d/.test(m[1]);
        const list = el(ordered ? "ol" : "ul");
        if (ordered && parseInt(m[1], 10) !== 1) list.start = Math.min(parseInt(m[1], 10), 1e9);
        while (i < lines.length && (m = ITEM.exec(lines[i])) && /\d/.test(m[1]) === ordered) {
          const item = [m[2]];
          i += 1;
          while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !ITEM.test(lines[i])) {
            item.push(lines[i].trim());
            i += 1;
          }
          const li = el("li");
          inline(li, item.join("\n"));
          list.appendChild(li);
        }
        out.appendChild(list);
      } else if (QUOTE.test(line)) {
        const quoted = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
          quoted.push(m[1]);
          i += 1;
        }
        const quote = el("blockquote");
        quote.appendChild(markdownOnce(quoted.join("\n")));
        out.appendChild(quote);
      } else {
        const para = [line];
        i += 1;
        while (i < lines.length && lines[i].trim() !== "" && !startsBlock(lines[i])) {
          para.push(lines[i]);
          i += 1;
        }
        const p = el("p");
        inline(p, para.join("\n"));
        out.appendChild(p);
      }
    }
    return out;
  }

  /** A block quote's inside: paragraphs and inline markup only (no quotes in quotes). */
  function markdownOnce(source) {
    const out = document.createDocumentFragment();
    for (const chunk of source.split(/\n\s*\n/)) {
      if (!chunk.trim()) continue;
      const p = el("p");
      inline(p, chunk);
      out.appendChild(p);
    }
    return out;
  }

  function isLong(s) {
    return s.length > LONG_CHARS || s.split("\n").length > LONG_LINES;
  }

  /** Show ``source`` in ``target``: as Markdown, or exactly as written when ``plain``. The box
   *  gets class "plain" or "md"; a long text is collapsed ("collapsed") until ``expand``. */
  function show(target, source, plain) {
    target.replaceChildren();
    target.classList.toggle("plain", !!plain);
    target.classList.toggle("md", !plain);
    if (plain) target.textContent = source;
    else target.appendChild(markdown(source));
    target.classList.toggle("collapsed", isLong(source));
    return target.classList.contains("collapsed");
  }

  window.rlhfkitRender = Object.freeze({ markdown, show, isLong });
})();
