"""Run curves: what `curves` decides to draw, and the SVG and PNG renderers of it."""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from swarm.plots import curves, nice_ticks, to_png, to_svg

NS = "{http://www.w3.org/2000/svg}"


def rows() -> list[dict]:
    out = [{"step": s, "segment": 0, "loss": 2.0 / (s + 1), "reward_mean": s / 40} for s in range(40)]
    out[25]["loss"] = "nan"
    out += [{"step": s, "segment": 0, "heldout_acc": s / 40} for s in (10, 20, 30)]
    out += [{"step": s, "segment": 1, "loss": 0.5} for s in (20, 21, 22)]   # after a rollback to step 20
    out.append({"step": 22, "segment": 1, "final": True, "heldout_acc": 0.9})
    return out


def test_curves_split_segments_and_keep_nonfinite_values_apart():
    ch = curves(rows(), marks=[(20, "iv-1 rollback")], target=("heldout_acc", 0.8))
    loss = ch.panels[0].series[0]
    assert [len(xs) for xs, _ in loss.lines] == [39, 3]            # one line per segment, the nan left out
    assert loss.nonfinite == [25] and not loss.markers
    held = ch.panels[2].series[0]
    assert held.markers and held.lines == [([10, 20, 30], [0.25, 0.5, 0.75])]   # the final row is not a point
    assert ch.panels[2].target == 0.8 and ch.panels[0].target is None
    assert [s.label for s in ch.panels[1].series] == ["reward_mean"]          # no pass_rate column: no series
    assert not ch.panels[0].log and not ch.empty


def test_a_diverging_loss_gets_a_log_axis():
    r = [{"step": s, "loss": 1.0 if s < 10 else 1e6} for s in range(20)]
    ch = curves(r)
    assert ch.panels[0].log
    svg = ET.fromstring(to_svg(ch))
    labels = {t.text for t in svg.iter(NS + "text")}
    assert {"1", "10", "100", "1000"} <= labels   # decades on the y axis


def test_svg_draws_what_the_chart_says():
    ch = curves(rows(), marks=[(20, "iv-1 <rollback>")], target=("heldout_acc", 0.8), title="a & b")
    svg = ET.fromstring(to_svg(ch))                  # well-formed XML: labels are escaped
    polylines = list(svg.iter(NS + "polyline"))
    assert len(polylines) == 2 + 1 + 1               # loss × 2 segments, reward_mean, heldout_acc
    assert len(list(svg.iter(NS + "circle"))) == 3   # held-out evals are dots
    texts = [t.text for t in svg.iter(NS + "text")]
    assert "iv-1 <rollback>" in texts and "a & b" in texts and "×" in texts and "target 0.8" in texts
    dashed = [ln for ln in svg.iter(NS + "line") if ln.get("stroke") == "green"]
    assert len(dashed) == 2                          # the target line and its legend swatch
    marks = [ln for ln in svg.iter(NS + "line") if ln.get("stroke") == "purple"]
    assert len(marks) == 3                           # the mark crosses every panel
    # the loss line's y coordinates fall inside the first panel (y axis not inverted or escaped)
    frame = [r for r in svg.iter(NS + "rect") if r.get("y") is not None][0]
    top, h = float(frame.get("y")), float(frame.get("height"))
    ys = [float(p.split(",")[1]) for p in polylines[0].get("points").split()]
    assert all(top <= y <= top + h for y in ys) and ys[0] < ys[-1]   # loss falls: the line goes down


def test_empty_chart_says_so_in_both_renderers():
    ch = curves([])
    assert ch.empty
    assert b"no metrics recorded yet" in to_svg(ch)
    assert to_png(ch).startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize("lo,hi,n,want", [(0, 1, 5, [0, 0.2, 0.4, 0.6, 0.8, 1.0]), (0, 800, 5, [0, 200, 400, 600, 800]),
                                          (-0.05, 1.05, 2, [0, 1.0]), (-0.05, 1.05, 6, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
                                          (3, 3, 5, [3])])
def test_nice_ticks(lo, hi, n, want):
    assert nice_ticks(lo, hi, n) == pytest.approx(want)


def test_the_final_report_needs_no_plotting_library():
    code = ("import sys; from swarm.report import final_report; "
            "md, files = final_report({'goal': 'g', 'target': {'metric': 'heldout_acc', 'op': '>=', 'threshold': 0.9}}, [], [], "
            "[{'step': 1, 'loss': 1.0, 'heldout_acc': 0.5}], {}); "
            "assert list(files) == ['curves.svg'], files; "
            "print(sorted(m for m in ('matplotlib', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_svg_survives_degenerate_values():
    """Equal values (to float noise), values near the float limit and a non-finite target give
    finite coordinates and no repeated tick labels."""
    import math
    import re

    cases = [([3.0, 3.0 + 1e-15, 3.0], None), ([-1e308, 1e308], None), ([0.5, 0.6], float("inf"))]
    for ys, tgt in cases:
        rows = [{"step": i, "heldout_acc": y} for i, y in enumerate(ys)]
        svg = to_svg(curves(rows, target=("heldout_acc", tgt) if tgt is not None else None)).decode()
        ET.fromstring(svg)
        nums = [float(x) for x in re.findall(r'(?:x|y|x1|x2|y1|y2|cx|cy)="(-?[\d.e+-]+)"', svg)]
        assert nums and all(math.isfinite(v) for v in nums), ys
    assert nice_ticks(3.0, 3.0 + 4e-15) == [3.0]             # below float resolution: one tick, not repeats
    assert nice_ticks(-1e308, 1e308) == [-1e308]             # beyond float range: no overflow
