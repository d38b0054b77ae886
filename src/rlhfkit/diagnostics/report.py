"""The HTML run report: related metrics read together on one chart each (OVERLAYS: value vs return,
approx_kl vs clip fraction, score vs KL, with how to read them), every metric plotted over
iterations (runs overlaid), the doctor's findings marked on the charts they concern, sample
completions with their rewards, the config and the summary. One self-contained file (inline SVG
and CSS, no scripts, fonts or network), plus a PNG per chart in ``plots/`` beside it (matplotlib,
the extra ``plots``).

    build_report([load_run("runs/a"), load_run("runs/b")], Path("runs/a/report"))
"""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.diagnostics.findings import SEVERITIES, Finding, summarize
from rlhfkit.diagnostics.glossary import describe, sort_metrics
from rlhfkit.diagnostics.headline import (
    before_after,
    differing_keys,
    key_first,
    paired_samples,
)
from rlhfkit.diagnostics.history import fmt, to_float
from rlhfkit.diagnostics.monitor import diagnose
from rlhfkit.diagnostics.plot import PALETTE, Marker, Series, layout_chart, svg
from rlhfkit.diagnostics.png import INSTALL_HINT, available, render_png
from rlhfkit.diagnostics.rundir import RunData, flatten
from rlhfkit.diagnostics.thresholds import Thresholds

PLOTS_DIR = "plots"

# (run folder, its config) -> (the command that made it, that command's default config) or None
DefaultsOf = Callable[[Path, dict[str, Any]], tuple[str, dict[str, Any]] | None]


@dataclass(frozen=True)
class Overlay:
    """Related metrics drawn on one chart, with how to read them. `scaled`: the metrics have
    different units, so each line is divided by its largest absolute value (named in the legend)."""

    title: str
    metrics: tuple[str, ...]
    scaled: bool
    how_to_read: str


OVERLAYS = (
    Overlay("value vs return", ("rollout/value_mean", "rollout/return_mean"), False,
            "The critic's mean prediction over the response tokens (value) against the mean target it is "
            "fitted to (return = advantage + value, learning path entry 11). The value head starts at zero, so "
            "value starts at 0; a healthy critic closes the gap within a few iterations and then follows the "
            "return. A gap that stays open means every advantage carries the critic's error (entry 8): look at "
            "loss/value and value_head_lr (the value head's own learning rate)."),
    Overlay("approx_kl vs clip fraction", ("params/approx_kl", "params/policy_clip_frac"), True,
            "Two measures of how far one update moved the policy from the one that sampled the rollout: "
            "approx_kl in nats per token (k2), the clip fraction as the share of tokens whose ratio left "
            "[1 - clip_eps, 1 + clip_eps] on the side of their advantage. They rise and fall together; both "
            "high means each update steps too far (lower lr, fewer ppo_epochs, larger mini-batches). The "
            "doctor's limits are in the thresholds below (docs/diagnostics.md)."),
    Overlay("score vs KL", ("rollout/score_mean", "rollout/kl"), True,
            "What the reward gives (score) against how far the policy has moved from the reference (KL, "
            "summed nats per answer). Learning: the score rises while the KL grows slowly. A KL that climbs "
            "with a flat or falling score is drift without gain (raise kl_coef); a score that jumps while the "
            "KL shoots up can be reward hacking: read the sample completions."),
)
SCALED_NOTE = "Each line is divided by its largest absolute value (in the legend): compare shapes, not heights."
MARKER_NOTE = "Dashed lines mark the iterations where the doctor raised a finding (hover for its message)"

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#f6f7f9}
header{background:#1f2937;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#cbd5e1;font-size:13px}main{padding:8px 28px 40px;max-width:1500px}
h2{margin:28px 0 10px;font-size:18px;border-bottom:2px solid #d1d5db;padding-bottom:4px}
h3{margin:18px 0 8px;font-size:15px}nav a{color:#93c5fd;margin-right:14px;font-size:13px}
table{border-collapse:collapse;background:#fff;font-size:13px;margin-bottom:10px}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.diff td{background:#fff7e0}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:11px;font-weight:600}
.critical{background:#d62728}.warning{background:#e8a400}.info{background:#4e79a7}.ok{background:#59a14f}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:12px}
figure{margin:0;background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:6px}
figcaption{font-size:12px;color:#555;padding:2px 4px}figcaption a{color:#2563eb}
svg.chart{max-width:100%;height:auto;display:block}
svg .ct{font:600 13px system-ui,sans-serif;fill:#222}svg .tk{font:11px system-ui,sans-serif;fill:#555}
svg .grid{stroke:#e8e8e8}svg .axis{stroke:#888}svg .frame{fill:none;stroke:#aaa}
svg .nf{font:bold 13px sans-serif;fill:#d62728}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12px ui-monospace,Menlo,Consolas,monospace}
td.action{color:#444;font-size:12px}.muted{color:#777;font-size:12px}
details{background:#fff;border:1px solid #e5e7eb;padding:6px 10px;border-radius:6px}
"""


def e(value: Any) -> str:
    """HTML-escaped text of any value (model output included)."""
    return html.escape(str(value), quote=True)


def png_name(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "__", metric) + ".png"


def metric_names(runs: Sequence[RunData]) -> list[str]:
    names: set[str] = set()
    for run in runs:
        for row in run.metrics:
            names.update(k for k, v in row.items() if k != "iteration" and to_float(v) is not None)
    return sort_metrics(names)


def run_labels(runs: Sequence[RunData]) -> list[str]:
    """Run names, made unique (a/b/run and c/run -> run, run#2)."""
    labels: list[str] = []
    for run in runs:
        label = run.name
        n = 2
        while label in labels:
            label, n = f"{run.name}#{n}", n + 1
        labels.append(label)
    return labels


def choose_iterations(available: Sequence[int], requested: Sequence[int] | None, n: int = 4) -> list[int]:
    """Requested iterations snapped to the nearest available one; by default ``n`` evenly
    spaced ones including the first and the last."""
    avail = sorted(set(available))
    if not avail:
        return []
    if requested:
        return sorted({min(avail, key=lambda a: (abs(a - r), a)) for r in requested})
    if len(avail) <= n:
        return avail
    picks = {avail[round(k * (len(avail) - 1) / (n - 1))] for k in range(n)}
    return sorted(picks)


# ---- sections ----------------------------------------------------------------------------------
def _badge(severity: str) -> str:
    return f'<span class="badge {e(severity)}">{e(severity)}</span>'


def _runs_section(runs: Sequence[RunData], labels: list[str], findings: list[list[Finding]]) -> str:
    rows = []
    for run, label, fs in zip(runs, labels, findings):
        its = [r["iteration"] for r in run.metrics]
        span = f"{its[0]}-{its[-1]} ({len(its)})" if its else "none"
        counts = {s: sum(f.severity == s for f in summarize(fs)) for s in SEVERITIES}
        health = (" ".join(f"{_badge(s)} {counts[s]}" for s in reversed(SEVERITIES) if counts[s])
                  or '<span class="badge ok">healthy</span>')
        status = "finished" if run.finished else "running or stopped (no summary.json)"
        notes = "<br>".join(e(n) for n in run.notes)
        rows.append(f"<tr><td>{e(label)}</td><td><code>{e(run.path)}</code></td><td>{e(span)}</td>"
                    f"<td>{e(processes_text(run.summary))}</td>"
                    f"<td>{e(status)}</td><td>{health}</td><td class='muted'>{notes}</td></tr>")
    return ("<h2 id='runs'>Runs</h2><table><tr><th>run</th><th>folder</th><th>iterations</th><th>processes</th>"
            "<th>status</th><th>findings</th><th>notes</th></tr>" + "".join(rows) + "</table>")


def processes_text(summary: dict | None) -> str:
    """How many processes ran a run and how it was sharded, from its summary.json ("2 on 2 machines,
    ddp"); "?" without one (still running, or written before summary.json recorded it)."""
    if not summary or not isinstance(summary.get("processes"), int):
        return "?"
    machines = summary.get("machines")
    where = f" on {machines} machines" if isinstance(machines, int) and machines > 1 else ""
    return f"{summary['processes']}{where}, {summary.get('sharding', '?')}"


def _findings_section(runs: Sequence[RunData], labels: list[str], findings: list[list[Finding]]) -> str:
    out = ["<h2 id='findings'>Findings</h2>",
           "<p class='muted'>Recomputed from metrics.jsonl with the thresholds below; the worst "
           "occurrence of each problem. Dashed lines in the charts mark when a finding was raised.</p>"]
    for run, label, fs in zip(runs, labels, findings):
        out.append(f"<h3>{e(label)}</h3>")
        summary = summarize(fs)
        if not summary:
            out.append("<p>No findings: every rule is silent.</p>")
        else:
            rows = "".join(
                f"<tr><td>{_badge(f.severity)}</td><td>{e(f.rule)}</td><td class='num'>{f.iteration}</td>"
                f"<td>{e(f.message)}</td><td class='action'>{e(f.action)}</td></tr>" for f in summary)
            out.append("<table><tr><th>severity</th><th>rule</th><th>iteration</th><th>finding</th>"
                       f"<th>suggested action</th></tr>{rows}</table>")
        if run.diagnostics:
            worst = summarize(run.diagnostics)
            out.append(f"<p class='muted'>diagnostics.jsonl (reported during training): "
                       f"{len(run.diagnostics)} findings; worst per rule: "
                       + ", ".join(f"{e(f.rule)} ({e(f.severity)} @ {f.iteration})" for f in worst) + "</p>")
    return "".join(out)


def _markers(metric: str, labels: list[str], findings: list[list[Finding]]) -> list[Marker]:
    out = []
    for label, fs in zip(labels, findings):
        for f in fs:
            if f.evidence.get("metric") == metric:
                out.append(Marker(f.iteration, f.severity, f"{label}: {f.rule} ({f.severity}): {f.message}"))
    return out


def finding_notes(metrics: Sequence[str], findings: Sequence[Finding]) -> list[str]:
    """One line per rule that fired on one of `metrics`: its first iteration and its worst severity,
    e.g. "policy_clip_frac (warning) from iteration 2"."""
    first: dict[str, tuple[int, str]] = {}
    for f in findings:
        if f.evidence.get("metric") in metrics:
            it, sev = first.get(f.rule, (f.iteration, f.severity))
            worst = max(sev, f.severity, key=SEVERITIES.index)
            first[f.rule] = (min(it, f.iteration), worst)
    return [f"{rule} ({sev}) from iteration {it}" for rule, (it, sev) in sorted(first.items(), key=lambda x: x[1])]


def overlay_series(run: RunData, overlay: Overlay) -> list[Series]:
    """One line per metric of `overlay` that `run` logged; under `overlay.scaled` each divided by its
    largest absolute value (1 when that is 0), the divisor in its label."""
    out = []
    for k, metric in enumerate(overlay.metrics):
        pts = [(r["iteration"], to_float(r[metric])) for r in run.metrics if metric in r]
        pts = [(i, v) for i, v in pts if v is not None]
        if not pts:
            continue
        label = metric
        if overlay.scaled:
            scale = max((abs(v) for _, v in pts if math.isfinite(v)), default=0.0) or 1.0
            pts, label = [(i, v / scale) for i, v in pts], f"{metric} / {fmt(scale)}"
        out.append(Series(label, pts, PALETTE[k % len(PALETTE)]))
    return out


def _caption(text: str, metrics: Sequence[str], by_run: Sequence[tuple[str, Sequence[Finding]]]) -> str:
    """A chart's legend: what it shows (`text`), then the findings marked on it. `by_run`: (prefix
    naming the run, or "" for a single run; its findings)."""
    notes = [prefix + note for prefix, fs in by_run for note in finding_notes(metrics, fs)]
    marked = f" {MARKER_NOTE}: {e('; '.join(notes))}." if notes else ""
    return f"{e(text)}{marked}"


def _overlays_section(runs: Sequence[RunData], labels: list[str], findings: list[list[Finding]]) -> str:
    """The OVERLAYS that some run logged: one chart per overlay and run, its legend under it."""
    parts = []
    for overlay in OVERLAYS:
        for run, label, fs in zip(runs, labels, findings):
            series = overlay_series(run, overlay)
            if len(series) < 2:
                continue
            markers = [m for metric in overlay.metrics for m in _markers(metric, [label], [fs])]
            title = overlay.title + (f" ({label})" if len(runs) > 1 else "")
            text = overlay.how_to_read + (" " + SCALED_NOTE if overlay.scaled else "")
            parts.append(f"<figure class='overlay'>{svg(layout_chart(title, series, markers), overlay.title)}"
                         f"<figcaption>{_caption(text, overlay.metrics, [('', fs)])}</figcaption></figure>")
    if not parts:
        return ""
    return ("<h2 id='together'>Read together</h2><p class='muted'>Related metrics on one chart, each with how to "
            "read it.</p><div class='charts'>" + "".join(parts) + "</div>")


def _series(runs: Sequence[RunData], labels: list[str], metric: str) -> list[Series]:
    out = []
    for k, (run, label) in enumerate(zip(runs, labels)):
        pts = [(r["iteration"], to_float(r[metric])) for r in run.metrics if metric in r]
        pts = [(i, v) for i, v in pts if v is not None]
        if pts:
            out.append(Series(label, pts, PALETTE[k % len(PALETTE)]))
    return out


def _metrics_section(runs: Sequence[RunData], labels: list[str], findings: list[list[Finding]],
                     out_dir: Path, png: bool) -> tuple[str, list[str]]:
    names = metric_names(runs)
    written: list[str] = []
    parts = ["<h2 id='metrics'>Metrics</h2>"]
    if len(runs) > 1:
        legend = " ".join(f"<span style='color:{PALETTE[k % len(PALETTE)]}'>&#9632;</span> {e(lb)}"
                          for k, lb in enumerate(labels))
        parts.append(f"<p>{legend}</p>")
    for title, section in key_first(names):  # the key charts first, timing and throughput last
        parts.append(f"<h3>{e(title)}</h3><div class='charts'>")
        parts += [_chart(runs, labels, findings, metric, out_dir, png, written) for metric in section]
        parts.append("</div>")
    if not names:
        parts.append("<p>No metrics logged yet.</p>")
    return "".join(parts), written


def _chart(runs: Sequence[RunData], labels: list[str], findings: list[list[Finding]], metric: str, out_dir: Path,
           png: bool, written: list[str]) -> str:
    """One metric's figure (inline SVG, a PNG beside it when `png`; its path joins `written`)."""
    series = _series(runs, labels, metric)
    markers = _markers(metric, labels, findings)
    chart = svg(layout_chart(metric, series, markers), describe(metric))
    link = ""
    if png:
        (out_dir / PLOTS_DIR).mkdir(parents=True, exist_ok=True)
        name = png_name(metric)
        (out_dir / PLOTS_DIR / name).write_bytes(render_png(metric, series, markers))
        written.append(f"{PLOTS_DIR}/{name}")
        link = f" <a href='{e(PLOTS_DIR)}/{e(name)}'>png</a>"
    prefixes = [f"{label}: " if len(labels) > 1 else "" for label in labels]
    caption = _caption(describe(metric), [metric], list(zip(prefixes, findings)))
    return f"<figure id='m-{e(png_name(metric)[:-4])}'>{chart}<figcaption>{caption}{link}</figcaption></figure>"


def _value(v: Any) -> str:
    """A cell: floats compact, None as "-", everything else as text (escaped)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return e(fmt(v))
    return e(v)


def _samples_section(runs: Sequence[RunData], labels: list[str], requested: Sequence[int] | None,
                     per_iteration: int) -> str:
    out = ["<h2 id='samples'>Sample completions</h2>"]
    for run, label in zip(runs, labels):
        out.append(f"<h3>{e(label)}</h3>")
        by_it: dict[int, list[dict[str, Any]]] = {}
        for row in run.samples:
            it = row.get("iteration")
            if isinstance(it, (int, float)) and not isinstance(it, bool) and math.isfinite(it):
                by_it.setdefault(int(it), []).append(row)
        chosen = choose_iterations(list(by_it), requested)
        if not chosen:
            out.append("<p>No samples.jsonl rows.</p>")
            continue
        rows = []
        for it in chosen:
            for row in by_it[it][:per_iteration]:
                rows.append(f"<tr><td class='num'>{it}</td><td><pre>{e(row.get('prompt', ''))}</pre></td>"
                            f"<td><pre>{e(row.get('completion', ''))}</pre></td>"
                            f"<td class='num'>{_value(row.get('reward'))}</td>"
                            f"<td class='num'>{_value(row.get('score'))}</td></tr>")
        out.append("<table><tr><th>iteration</th><th>prompt</th><th>completion</th><th>reward</th>"
                   "<th>score</th></tr>" + "".join(rows) + "</table>")
    return "".join(out)


def _headline_section(runs: Sequence[RunData], labels: list[str]) -> str:
    """Before / after training, each number named by what it measures (headline.before_after)."""
    rows = []
    for run, label in zip(runs, labels):
        for name, b, a in before_after(run.summary or {}, run.config):
            rows.append(f"<tr><td>{e(label)}</td><td>{e(name)}</td><td class='num'>{_value(b)}</td>"
                        f"<td class='num'><b>{_value(a)}</b></td><td class='num'>{e(f'{a - b:+.4g}')}</td></tr>")
    if not rows:
        return ("<section id='headline'><h2>Before / after training</h2><p>No evaluation before and after "
                "training in summary.json.</p></section>")
    return ("<section id='headline'><h2>Before / after training</h2><table><tr><th>run</th><th>metric</th>"
            "<th>before</th><th>after</th><th>change</th></tr>" + "".join(rows) + "</table></section>")


def _paired_samples_section(runs: Sequence[RunData], labels: list[str]) -> str:
    """The evaluation's samples before and after training, side by side (same prompts, same seed)."""
    out = []
    for run, label in zip(runs, labels):
        pairs = paired_samples(run.summary or {})
        if not pairs:
            continue
        rows = "".join(f"<tr><td><pre>{e(prompt)}</pre></td><td><pre>{e(b.get('completion', ''))}</pre></td>"
                       f"<td class='num'>{_value(b.get('score'))}</td><td><pre>{e(a.get('completion', ''))}</pre></td>"
                       f"<td class='num'>{_value(a.get('score'))}</td></tr>" for prompt, b, a in pairs)
        out.append(f"<h3>{e(label)}: held-out samples before and after training</h3><table><tr><th>prompt</th>"
                   "<th>before</th><th>score</th><th>after</th><th>score</th></tr>" + rows + "</table>")
    return "".join(out)


def _config_section(runs: Sequence[RunData], labels: list[str], config_defaults: DefaultsOf | None) -> str:
    """The keys that differ (between runs, or from the command's defaults), then the whole config."""
    configs = [r.config for r in runs]
    found = (config_defaults(runs[0].path, configs[0])
             if config_defaults is not None and len(runs) == 1 and configs[0] else None)
    command, defaults = found if found else (None, None)
    keys = differing_keys(configs, defaults)
    head = "".join(f"<th>{e(lb)}</th>" for lb in labels) + ("<th>default</th>" if defaults else "")
    rows = "".join(f"<tr><td><code>{e(k)}</code></td>" + "".join(f"<td>{_value(c.get(k))}</td>" for c in configs)
                   + (f"<td class='muted'>{_value(defaults.get(k))}</td>" if defaults else "") + "</tr>" for k in keys)
    against = f"the defaults of <code>rlhfkit {e(command)}</code>" if command else "each other"
    differs = (f"<h3>Keys that differ from {against}</h3><table><tr><th>key</th>{head}</tr>{rows}</table>" if keys
               else f"<p>Every key has the value of {against}.</p>" if (command or len(runs) > 1) else "")
    full = _table_by_run("Config", "config", configs, labels, "No config.yaml.")
    title_end = full.index("</h2>") + len("</h2>")
    return full[:title_end] + differs + "<details><summary>every key</summary>" + full[title_end:] + "</details>"


def _table_by_run(title: str, anchor: str, dicts: list[dict[str, Any]], labels: list[str], empty: str) -> str:
    flat = [flatten(d) for d in dicts]
    keys = sorted({k for d in flat for k in d})
    if not keys:
        return f"<h2 id='{anchor}'>{e(title)}</h2><p>{e(empty)}</p>"
    head = "".join(f"<th>{e(lb)}</th>" for lb in labels)
    rows = []
    for k in keys:
        vals = [d.get(k, "") for d in flat]
        cls = " class='diff'" if len(flat) > 1 and len({repr(v) for v in vals}) > 1 else ""
        rows.append(f"<tr{cls}><td><code>{e(k)}</code></td>" + "".join(f"<td>{_value(v)}</td>" for v in vals) + "</tr>")
    note = "<p class='muted'>Highlighted rows differ between runs.</p>" if len(flat) > 1 else ""
    return f"<h2 id='{anchor}'>{e(title)}</h2>{note}<table><tr><th>key</th>{head}</tr>{''.join(rows)}</table>"


def _thresholds_section(t: Thresholds) -> str:
    rows = "".join(f"<tr><td><code>{e(k)}</code></td><td class='num'>{e(v)}</td></tr>" for k, v in t.to_dict().items())
    return ("<h2 id='thresholds'>Thresholds</h2><details><summary>Diagnostic thresholds used "
            "(docs/diagnostics.md explains each)</summary><table>" + rows + "</table></details>")


def _without_samples(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json without its sample lists (shown as a table of their own, not as Python text)."""
    return {k: (_without_samples(v) if isinstance(v, dict) else v) for k, v in summary.items() if k != "samples"}


def png_note(path: Path) -> str:
    """What `rlhfkit report` adds after "wrote report.html": where the PNGs are, or how to get them."""
    if available():
        return f" and {path.parent / PLOTS_DIR}/*.png"
    return f" (PNG charts need matplotlib: {INSTALL_HINT}; the HTML has the same charts)"


# ---- entry point ---------------------------------------------------------------------------------
def build_report(runs: Sequence[RunData], out_dir: str | Path, *, iterations: Sequence[int] | None = None,
                 samples_per_iteration: int = 4, png: bool = True, thresholds: Thresholds | None = None,
                 title: str | None = None, config_defaults: DefaultsOf | None = None) -> Path:
    """Write ``out_dir/report.html`` (and ``out_dir/plots/*.png`` unless ``png=False`` or matplotlib is
    not installed); return its path. ``config_defaults(run_dir, config)`` -> (command, its default
    config) or None: the commands' defaults (rlhfkit.commands.runs), to show what a run changed."""
    png = png and available()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    thresholds = thresholds or Thresholds()
    labels = run_labels(runs)
    findings = [diagnose(run.metrics, thresholds, defaults=run.defaults) for run in runs]
    title = title or "rlhfkit report: " + ", ".join(labels)
    metrics_html, _ = _metrics_section(runs, labels, findings, out_dir, png)
    nav = "".join(f"<a href='#{a}'>{t}</a>" for a, t in (
        ("headline", "before/after"), ("runs", "runs"), ("findings", "findings"), ("together", "read together"),
        ("metrics", "metrics"),
        ("samples", "samples"),
        ("summary", "summary"), ("config", "config"), ("thresholds", "thresholds")))
    body = [
        f"<header><h1>{e(title)}</h1><p>generated {e(time.strftime('%Y-%m-%d %H:%M:%S'))} by "
        f"rlhfkit report; self-contained, opens offline</p><nav>{nav}</nav></header><main>",
        _headline_section(runs, labels),
        _runs_section(runs, labels, findings),
        _findings_section(runs, labels, findings),
        _overlays_section(runs, labels, findings),
        metrics_html,
        _samples_section(runs, labels, iterations, samples_per_iteration) + _paired_samples_section(runs, labels),
        _table_by_run("Summary (before / after)", "summary", [_without_samples(r.summary or {}) for r in runs],
                      labels, "No summary.json (the run may still be running)."),
        _config_section(runs, labels, config_defaults),
        _thresholds_section(thresholds),
        "</main>",
    ]
    doc = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
           f"<meta name='viewport' content='width=device-width,initial-scale=1'><style>{CSS}</style></head>"
           f"<body>{''.join(body)}</body></html>")
    path = out_dir / "report.html"
    path.write_text(doc, encoding="utf-8")
    return path
