"""PNG charts for the report, drawn by matplotlib (the optional extra ``plots``).

The HTML report needs nothing: its charts are inline SVG (diagnostics/plot.py). The PNGs beside
it are for slides, papers and issues; without matplotlib the report says how to get them. The
figure is drawn on its own Agg canvas (no pyplot, no global state), the same content as the SVG:
one line per run (broken at non-finite values, which get a red x on the bottom axis), dashed
lines at the iterations where findings were raised, a legend when runs are overlaid.
"""

from __future__ import annotations

import importlib.util
import io
import math
from collections.abc import Sequence

from rlhfkit.diagnostics.plot import SEVERITY_COLOR, Marker, Series

INSTALL_HINT = "pip install 'rlhfkit[plots]'"
NONFINITE_COLOR = "#d62728"


def available() -> bool:
    """True when matplotlib is installed (checked without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def render_png(title: str, series: Sequence[Series], markers: Sequence[Marker] = (), *,
               width: int = 720, height: int = 300, dpi: int = 100) -> bytes:
    """A ``width`` x ``height`` PNG of ``series`` (iteration on x) with the finding ``markers``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs_all = [x for s in series for x, _ in s.points]
    for s in series:
        xs = [x for x, _ in s.points]
        ys = [y if math.isfinite(y) else math.nan for _, y in s.points]  # NaN breaks the line
        ax.plot(xs, ys, color=s.color, label=s.label, linewidth=1.6, marker="." if len(xs) < 30 else None)
        bad = [x for x, y in s.points if not math.isfinite(y)]
        if bad:  # at the bottom of the axes, whatever the y range
            ax.plot(bad, [0.02] * len(bad), "x", color=NONFINITE_COLOR, transform=ax.get_xaxis_transform())
    if xs_all:
        lo, hi = min(xs_all), max(xs_all)
        if lo == hi:  # one iteration: whole-number ticks around it
            ax.set_xlim(lo - 1, hi + 1)
        for m in markers:
            if lo <= m.iteration <= hi:
                color = SEVERITY_COLOR.get(m.severity, "#888888")
                ax.axvline(m.iteration, color=color, linestyle="--", linewidth=1)
    else:
        ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes, color="#777777")
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("iteration", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(color="#e8e8e8")
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.11, right=0.985, top=0.9, bottom=0.15)  # fixed: tight_layout doubles the time
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
