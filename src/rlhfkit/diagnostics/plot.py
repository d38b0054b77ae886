"""Line charts without a plotting library: one layout, rendered as inline SVG.

`layout_chart` turns series of (iteration, value) points into pixel geometry (ticks, polylines
broken at non-finite values, finding markers); `svg` renders it for the HTML report and
`rlhfkit.diagnostics.png.render_png` draws the same series as a PNG with matplotlib.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
SEVERITY_COLOR = {"info": "#4e79a7", "warning": "#e8a400", "critical": "#d62728"}

Pixel = tuple[float, float]


@dataclass
class Series:
    label: str
    points: list[tuple[int, float]]  # may contain non-finite values (drawn as gaps + markers)
    color: str


@dataclass
class Marker:
    iteration: int
    severity: str
    label: str


@dataclass
class ChartLayout:
    title: str
    width: int
    height: int
    box: tuple[float, float, float, float]  # plot area x0, y0, x1, y1 (y grows downwards)
    xticks: list[tuple[float, str]] = field(default_factory=list)
    yticks: list[tuple[float, str]] = field(default_factory=list)
    lines: list[tuple[str, list[list[Pixel]]]] = field(default_factory=list)  # color, runs of points
    dots: list[tuple[str, float, float]] = field(default_factory=list)
    nonfinite: list[tuple[str, float, str]] = field(default_factory=list)  # color, x, tooltip
    markers: list[tuple[float, str, str]] = field(default_factory=list)  # x, severity, tooltip
    legend: list[tuple[str, str]] = field(default_factory=list)  # color, label
    empty: bool = False


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^k steps)."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = []
    x = start
    while x <= hi + step * 1e-9:
        ticks.append(0.0 if abs(x) < step * 1e-9 else x)
        x += step
    return ticks


def tick_label(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.1e}"
    return f"{v:.6g}"


def decimate(points: list[tuple[int, float]], x_lo: float, x_hi: float, columns: int) -> list[tuple[int, float]]:
    """At most ~2 points per pixel column (its min and max, in order); non-finite points kept.
    Keeps long runs fast to draw and small to embed without hiding spikes."""
    if len(points) <= 2 * columns:
        return points
    buckets: dict[int, list[tuple[int, float]]] = {}
    keep: list[tuple[int, float]] = []
    for p in points:
        if not math.isfinite(p[1]):
            keep.append(p)
            continue
        b = int((p[0] - x_lo) / (x_hi - x_lo) * columns)
        buckets.setdefault(b, []).append(p)
    for pts in buckets.values():
        lo, hi = min(pts, key=lambda p: p[1]), max(pts, key=lambda p: p[1])
        keep += [lo] if lo == hi else [lo, hi]
    return sorted(set(keep), key=lambda p: p[0])


def layout_chart(title: str, series: list[Series], markers: list[Marker] | None = None,
                 width: int = 560, height: int = 230) -> ChartLayout:
    """Pixel geometry of a line chart of ``series`` over iterations."""
    left, right, top, bottom = 62, 12, 30, 28
    if len(series) > 1:
        top += 16  # room for the legend
    box = (float(left), float(top), float(width - right), float(height - bottom))
    out = ChartLayout(title=title, width=width, height=height, box=box)
    out.legend = [(s.color, s.label) for s in series] if len(series) > 1 else []
    finite = [(i, v) for s in series for i, v in s.points if math.isfinite(v)]
    all_x = [i for s in series for i, _ in s.points]
    if not all_x:
        out.empty = True
        return out
    x_lo, x_hi = min(all_x), max(all_x)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if finite:
        y_lo, y_hi = min(v for _, v in finite), max(v for _, v in finite)
    else:
        y_lo, y_hi = 0.0, 1.0
    if y_hi == y_lo:
        pad = abs(y_lo) * 0.1 or 1.0
        y_lo, y_hi = y_lo - pad, y_hi + pad
    pad = (y_hi - y_lo) * 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad
    x0, y0, x1, y1 = box

    def px(i: float) -> float:
        return x0 + (i - x_lo) / (x_hi - x_lo) * (x1 - x0)

    def py(v: float) -> float:
        return y1 - (v - y_lo) / (y_hi - y_lo) * (y1 - y0)

    out.yticks = [(py(v), tick_label(v)) for v in nice_ticks(y_lo, y_hi) if y_lo <= v <= y_hi]
    xt = [v for v in nice_ticks(x_lo, x_hi, 6) if float(v).is_integer()]  # iterations are whole numbers
    out.xticks = [(px(v), tick_label(v)) for v in xt if x_lo <= v <= x_hi]
    for s in series:
        runs: list[list[Pixel]] = [[]]
        for i, v in decimate(s.points, x_lo, x_hi, int(x1 - x0)):
            if math.isfinite(v):
                runs[-1].append((px(i), py(v)))
            else:
                out.nonfinite.append((s.color, px(i), f"{s.label}: {v} at iteration {i}"))
                if runs[-1]:
                    runs.append([])
        runs = [r for r in runs if r]
        out.lines.append((s.color, [r for r in runs if len(r) > 1]))
        n_points = sum(len(r) for r in runs)
        for r in runs:
            if len(r) == 1 or n_points <= 40:
                out.dots += [(s.color, x, y) for x, y in r]
    for m in markers or []:
        if x_lo <= m.iteration <= x_hi:
            out.markers.append((px(m.iteration), m.severity, m.label))
    return out


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def svg(layout: ChartLayout, description: str = "") -> str:
    """The chart as an inline ``<svg>`` element (no external resources)."""
    w, h = layout.width, layout.height
    x0, y0, x1, y1 = layout.box
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
             f'role="img" class="chart"><title>{_e(layout.title)}'
             + (f" - {_e(description)}" if description else "") + "</title>",
             f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff"/>',
             f'<text x="{x0:.1f}" y="16" class="ct">{_e(layout.title)}</text>']
    if layout.empty:
        parts.append(f'<text x="{w / 2:.0f}" y="{h / 2:.0f}" text-anchor="middle" class="tk">no data</text></svg>')
        return "".join(parts)
    for y, label in layout.yticks:
        parts.append(f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" class="grid"/>'
                     f'<text x="{x0 - 5:.1f}" y="{y + 3.5:.1f}" text-anchor="end" class="tk">{_e(label)}</text>')
    for x, label in layout.xticks:
        parts.append(f'<line x1="{x:.1f}" y1="{y1:.1f}" x2="{x:.1f}" y2="{y1 + 4:.1f}" class="axis"/>'
                     f'<text x="{x:.1f}" y="{y1 + 15:.1f}" text-anchor="middle" class="tk">{_e(label)}</text>')
    parts.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" class="frame"/>')
    for x, severity, tip in layout.markers:
        color = SEVERITY_COLOR.get(severity, "#888")
        parts.append(f'<g><title>{_e(tip)}</title><line x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}" '
                     f'stroke="{color}" stroke-dasharray="4 3" stroke-width="1.2"/>'
                     f'<path d="M{x - 5:.1f},{y0:.1f} L{x + 5:.1f},{y0:.1f} L{x:.1f},{y0 + 8:.1f} Z" '
                     f'fill="{color}"/></g>')
    for color, runs in layout.lines:
        for run in runs:
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.8" '
                         'stroke-linejoin="round"/>')
    for color, x, y in layout.dots:
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="{color}"/>')
    for _color, x, tip in layout.nonfinite:
        parts.append(f'<text x="{x:.1f}" y="{y1 - 3:.1f}" text-anchor="middle" class="nf">'
                     f'<title>{_e(tip)}</title>&#215;</text>')
    lx = x0
    for color, label in layout.legend:
        parts.append(f'<rect x="{lx:.1f}" y="24" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14:.1f}" y="33" class="tk">{_e(label)}</text>')
        lx += 24 + 6.5 * len(label)
    parts.append("</svg>")
    return "".join(parts)
