"""Run curves for the reports: one chart description, two renderers.

    chart = curves(metrics_rows, marks=[(300, "iv-1 recipe_edit")], target=("heldout_acc", 0.9))
    png = to_png(chart)    # matplotlib's Agg canvas (intervention PRs)
    svg = to_svg(chart)    # plain SVG text, no plotting library (the final report)

`curves` decides what is drawn (panels, one line per run segment, non-finite values, a log scale
for a diverging loss, the target, intervention marks); the renderers only draw it. The SVG
renderer exists so that a run's final report needs neither matplotlib nor numpy (importing and
drawing with them cost the controller ~0.9 CPU-s at the end of every run) and so that curves
committed to the workspace diff as text.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

from agents.evidence import as_number

PANELS: list[tuple[str, tuple[str, ...]]] = [
    ("loss", ("loss",)),
    ("train reward", ("reward_mean", "pass_rate")),
    ("held-out", ("heldout_acc",)),
]
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")   # matplotlib's C0..C3


def segments(rows: list[dict[str, Any]], key: str) -> list[tuple[list[int], list[float]]]:
    """(steps, values) per run segment: after a resume or rollback the step counter repeats, and a
    line drawn across that jump would be a lie."""
    out: dict[int, tuple[list[int], list[float]]] = {}
    for r in rows:
        if r.get("final"):
            continue
        v, step = as_number(r.get(key)), r.get("step")
        if v is None or not isinstance(step, int):
            continue
        xs, ys = out.setdefault(int(r.get("segment", 0) or 0), ([], []))
        xs.append(step)
        ys.append(v)
    return [out[k] for k in sorted(out)]


@dataclass
class Series:
    label: str
    color: str
    lines: list[tuple[list[int], list[float]]]   # finite points, one list per segment
    markers: bool                                 # dots on the points (sparse series: evals)
    nonfinite: list[int]                          # steps whose value was nan/inf


@dataclass
class Panel:
    name: str
    series: list[Series] = field(default_factory=list)
    log: bool = False
    target: float | None = None


@dataclass
class Chart:
    panels: list[Panel]
    marks: list[tuple[int, str]]
    title: str = ""

    @property
    def empty(self) -> bool:
        return not any(s.lines or s.nonfinite for p in self.panels for s in p.series)


def curves(rows: list[dict[str, Any]], marks: list[tuple[int, str]] | None = None,
           target: tuple[str, float] | None = None, title: str = "") -> Chart:
    """Loss, train reward and held-out accuracy against step. `marks`: (step, label) vertical
    lines (interventions); `target`: (metric, threshold), a horizontal line on the panel holding
    that metric."""
    panels = []
    for name, keys in PANELS:
        p = Panel(name)
        for ki, key in enumerate(keys):
            segs = segments(rows, key)
            lines = []
            bad: list[int] = []
            for xs, ys in segs:
                fin = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
                bad += [x for x, y in zip(xs, ys) if not math.isfinite(y)]
                if fin:
                    lines.append(([x for x, _ in fin], [y for _, y in fin]))
            if lines or bad:
                n = sum(len(xs) for xs, _ in lines)
                p.series.append(Series(key, COLORS[ki % len(COLORS)], lines,
                                       markers=key.startswith("heldout") or n == 1, nonfinite=bad))
        vals = [y for s in p.series for _, ys in s.lines for y in ys]
        # a diverging run would flatten everything else to a line at zero
        p.log = name == "loss" and bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 1e3
        if target and target[0] in keys:
            p.target = float(target[1])
        panels.append(p)
    return Chart(panels, list(marks or []), title)


# ---- PNG (matplotlib) -----------------------------------------------------------------------------
def to_png(chart: Chart, dpi: int = 90) -> bytes:
    """The chart drawn with matplotlib's Agg canvas directly (no pyplot global state: safe in any
    thread); imported here, so a run that never draws a PNG never loads matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 7.5))
    axes = fig.subplots(len(chart.panels), 1, sharex=True)
    for ax, p in zip(axes, chart.panels):
        for s in p.series:
            for si, (xs, ys) in enumerate(s.lines):
                ax.plot(xs, ys, color=s.color, marker="o" if s.markers else None, ms=3, lw=1.2,
                        label=s.label if si == 0 else None)
            if s.nonfinite:
                ax.plot(s.nonfinite, [1.0] * len(s.nonfinite), "x", color="red", transform=ax.get_xaxis_transform(),
                        clip_on=False, label=f"{s.label} non-finite")
        if p.log:
            ax.set_yscale("log")
        if p.target is not None:
            ax.axhline(p.target, color="green", ls="--", lw=1, label=f"target {p.target:g}")
        for step, label in chart.marks:
            ax.axvline(step, color="purple", ls=":", lw=1.2)
            if ax is axes[0]:
                ax.annotate(label, (step, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                            va="top", ha="right", fontsize=7, color="purple")
        ax.set_ylabel(p.name)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=7)
    axes[-1].set_xlabel("step")
    if chart.empty:
        axes[0].text(0.5, 0.5, "no metrics recorded yet", transform=axes[0].transAxes, ha="center")
    if chart.title:
        fig.suptitle(chart.title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ---- SVG (no plotting library) --------------------------------------------------------------------
def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values (1, 2 or 5 × 10^k apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(n, 1)
    if not math.isfinite(raw) or raw <= 1e-12 * max(1.0, abs(lo), abs(hi)):   # beyond float range, or float noise
        return [lo]
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out, k = [], 0
    while first + k * step <= hi + 1e-9 * step:
        t = round(first + k * step, 12)
        if not out or t != out[-1]:
            out.append(t)
        k += 1
    return out


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.0e}"


def to_svg(chart: Chart, width: int = 800, panel_h: int = 210) -> bytes:
    """The chart as a standalone SVG document: the same panels, lines, markers, log scale,
    target and intervention marks as `to_png`, drawn as text."""
    left, right, top, gap, bottom = 70, 20, 34 if chart.title else 14, 16, 40
    H = top + len(chart.panels) * panel_h + (len(chart.panels) - 1) * gap + bottom
    pw = width - left - right
    xs_all = [x for p in chart.panels for s in p.series for xs, _ in s.lines for x in xs] + \
             [x for p in chart.panels for s in p.series for x in s.nonfinite] + [m[0] for m in chart.marks]
    x0, x1 = (min(xs_all), max(xs_all)) if xs_all else (0, 1)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    sx = lambda x: left + (x - x0) / (x1 - x0) * pw   # noqa: E731
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" viewBox="0 0 {width} {H}" '
         'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
         f'<rect width="{width}" height="{H}" fill="white"/>']
    if chart.title:
        o.append(f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="13">{escape(chart.title)}</text>')
    for i, p in enumerate(chart.panels):
        py = top + i * (panel_h + gap)
        vals = [y for s in p.series for _, ys in s.lines for y in ys] + ([p.target] if p.target is not None else [])
        tf = (lambda v: math.log10(v)) if p.log else (lambda v: max(-1e300, min(1e300, v)))   # noqa: E731
        tv = [tf(v) for v in vals if math.isfinite(v) and (not p.log or v > 0)]
        y0, y1 = (min(tv), max(tv)) if tv else (0.0, 1.0)
        span = y1 - y0
        if not math.isfinite(span):
            y0, y1, span = y0 / 2, y1 / 2, y1 / 2 - y0 / 2   # values near the float limit: halve the axis
            tf = (lambda v: max(-1e300, min(1e300, v)) / 2)   # noqa: E731
        if span <= 1e-9 * max(1.0, abs(y0), abs(y1)):   # all equal (to float noise): a band around them
            span = 0.0
        pad = span * 0.05 or (abs(y0) * 0.1 or 0.5)
        y0, y1 = y0 - pad, y1 + pad
        sy = lambda v: py + panel_h - (tf(v) - y0) / (y1 - y0) * panel_h   # noqa: E731
        o.append(f'<rect x="{left}" y="{py}" width="{pw}" height="{panel_h}" fill="none" stroke="#444"/>')
        ticks = ([10.0 ** e for e in range(math.ceil(y0), math.floor(y1) + 1)] if p.log else nice_ticks(y0, y1, 6))
        for t in ticks:
            y = sy(t)
            o.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        for t in nice_ticks(x0, x1, 8):
            x = sx(t)
            o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{py}" y2="{py + panel_h}" stroke="#eee"/>')
            if i == len(chart.panels) - 1:
                o.append(f'<text x="{x:.1f}" y="{py + panel_h + 15}" text-anchor="middle">{_fmt(t)}</text>')
        o.append(f'<text transform="translate(16 {py + panel_h / 2:.0f}) rotate(-90)" text-anchor="middle" '
                 f'font-size="12">{escape(p.name)}</text>')
        legend: list[tuple[str, str, str]] = []   # (label, colour, dash)
        for s in p.series:
            for xs, ys in s.lines:
                pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys) if not p.log or y > 0)
                o.append(f'<polyline points="{pts}" fill="none" stroke="{s.color}" stroke-width="1.4"/>')
                if s.markers:
                    o += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{s.color}"/>'
                          for x, y in zip(xs, ys) if not p.log or y > 0]
            if s.lines:
                legend.append((s.label, s.color, ""))
            if s.nonfinite:
                o += [f'<text x="{sx(x):.1f}" y="{py + 10}" text-anchor="middle" fill="red" font-size="12">×</text>'
                      for x in s.nonfinite]
                legend.append((f"{s.label} non-finite", "red", "2,2"))
        if p.target is not None and math.isfinite(p.target) and (not p.log or p.target > 0):
            y = sy(p.target)
            o.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="green" stroke-dasharray="6,3"/>')
            legend.append((f"target {p.target:g}", "green", "6,3"))
        for step, label in chart.marks:
            x = sx(step)
            o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{py}" y2="{py + panel_h}" stroke="purple" stroke-dasharray="2,3" stroke-width="1.3"/>')
            if i == 0:
                o.append(f'<text transform="translate({x - 3:.1f} {py + 4}) rotate(-90)" text-anchor="end" font-size="9" '
                         f'fill="purple">{escape(label)}</text>')
        if legend:
            o.append(f'<rect x="{left + pw - 156}" y="{py + 3}" width="152" height="{14 * len(legend) + 6}" '
                     'fill="white" fill-opacity="0.85" stroke="#ccc"/>')
        for j, (label, colour, dash) in enumerate(legend):
            ly = py + 18 + 14 * j
            lx = left + pw - 150
            o.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"'
                     + (f' stroke-dasharray="{dash}"' if dash else "") + f'/><text x="{lx + 23}" y="{ly}">{escape(label)}</text>')
    if chart.empty:
        o.append(f'<text x="{left + pw / 2:.0f}" y="{top + panel_h / 2:.0f}" text-anchor="middle">no metrics recorded yet</text>')
    o.append(f'<text x="{left + pw / 2:.0f}" y="{H - 8}" text-anchor="middle" font-size="12">step</text>')
    o.append("</svg>")
    return ("\n".join(o) + "\n").encode()
