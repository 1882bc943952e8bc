"""How often a run the controller calls "on course to the target" gets there: the outlook rule
(`swarm.decisions.outlook`, which holds a fix back when the run's own trend reaches the target in
fewer steps than verifying the fix would train) replayed on the benchmark suite's finished runs.

    python benchmarks/outlook_calibration.py benchmarks/results/suite_headline_v4*/ledger.jsonl \
        [--out benchmarks/results/outlook_calibration]

Input: bench ledgers (`swarm bench` writes one per suite). Each run row has its held-out curve as
(worker CPU-s, held-out value) points, one per eval, its target, budget and whether it reached the
target. Replayed: runs of methods `plain` and `oracle` (no intervention changes their course, so
what the trend said at an eval is what the run then did). At every eval from the second on, the
outlook is drawn through the last four evals exactly as the controller draws it, with worker CPU
in place of steps (one config per run: CPU per step is near constant), and kept when it projects
the target within the budget left (the controller's `steps_left` check). Each such projection is
one "on course" call; it is right when the run reached the target within its budget.

Reported for two sets — runs that were not failing (the oracle's, and plain runs of healthy and
mild scenarios: whatever their trend said, they went on to the target) and plain runs of failing
scenarios (a fault in the goal's config, or one that arrived later, stopped them) — per bin of the
projected remaining CPU as a share of the budget left (the controller holds a fix back only when
the projection is shorter than verifying it, a small share): calls, share reached, and the median
and 90th percentile of actual / projected remaining CPU among the reached ones. The median of the
first bin on the set that was not failing is `swarm.decisions.OUTLOOK_SLACK`, the factor the
controller stretches a projection by. Results: `<out>.json` and `<out>.md`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from swarm.decisions import outlook  # noqa: E402

BINS = ((0.0, 0.1), (0.1, 0.25), (0.25, 0.5), (0.5, 1.0))
METHODS = ("plain", "oracle")


def calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The on-course calls an outlook makes along one run's curve."""
    curve = [(float(x), float(y)) for x, y in row.get("curve") or []]
    pts: list[tuple[float, float]] = []
    for x, y in curve:                       # the last point repeats the final eval at the run's end
        if not pts or x > pts[-1][0]:
            pts.append((x, y))
    target, budget = float(row["target"]), float(row["budget"])
    reached_at = row.get("cpu_to_target") if row.get("reached") else None
    out = []
    for i in range(1, len(pts)):
        cpu_now, val = pts[i]
        if val >= target or (reached_at is not None and cpu_now >= reached_at):
            break                            # there: nothing left to call
        view = outlook(pts[: i + 1], target, True)
        left = budget - cpu_now
        if view.steps_to_target is None or left <= 0 or view.steps_to_target > left:
            continue
        actual = (float(reached_at) - cpu_now) if reached_at is not None else None
        out.append({"scenario": row["scenario"], "method": row["method"], "seed": row["seed"], "cls": row.get("cls"),
                    "at_cpu": cpu_now, "projected": view.steps_to_target, "share_of_left": view.steps_to_target / left,
                    "reached": reached_at is not None, "actual": actual})
    return out


def summarise(all_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for lo, hi in BINS:
        b = [c for c in all_calls if lo < c["share_of_left"] <= hi or (lo == 0.0 and c["share_of_left"] == 0.0)]
        ratios = sorted(c["actual"] / c["projected"] for c in b if c["reached"] and c["projected"] > 0)
        rows.append({"bin": f"{lo:g}-{hi:g}", "calls": len(b), "runs": len({(c['scenario'], c['method'], c['seed']) for c in b}),
                     "reached": sum(c["reached"] for c in b),
                     "share_reached": (sum(c["reached"] for c in b) / len(b)) if b else None,
                     "median_actual_over_projected": statistics.median(ratios) if ratios else None,
                     "p90_actual_over_projected": ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))] if ratios else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ledgers", nargs="+", help="bench ledger.jsonl files")
    ap.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    a = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for p in a.ledgers:
        path = pathlib.Path(p)
        if not path.is_file():
            print(f"error: {p}: no such ledger", file=sys.stderr)
            return 2
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue                     # a line cut by an interrupted bench
            if r.get("method") in METHODS and r.get("curve") and r.get("target") is not None:
                rows.append(r)
    seen: set[str] = set()
    runs = [r for r in rows if not (r["key"] in seen or seen.add(r["key"]))]
    sets = {"not failing": [r for r in runs if r["method"] == "oracle" or r.get("cls") in ("healthy", "mild")],
            "failing (plain)": [r for r in runs if r["method"] == "plain" and r.get("cls") == "failing"]}
    result: dict[str, Any] = {"ledgers": a.ledgers, "runs": len(runs), "sets": {}}
    lines = ["# Outlook calibration: how often \"on course to the target\" got there", "",
             f"Command: `python benchmarks/outlook_calibration.py {' '.join(a.ledgers)}`", "",
             "Each call: at one held-out eval of a plain or oracle run, a line through the last four evals "
             "(`swarm.decisions.outlook`) projected the target within the budget left. Actual ÷ projected: the "
             "worker CPU the run then needed ÷ the projection, over the calls of runs that got there.", ""]
    for name, group in sets.items():
        all_calls = [c for r in group for c in calls(r)]
        table = summarise(all_calls)
        wrong = sorted({(c["scenario"], c["method"], c["seed"]) for c in all_calls if not c["reached"]})
        called = len({(c['scenario'], c['method'], c['seed']) for c in all_calls})
        result["sets"][name] = {"runs": len(group), "runs_with_calls": called, "calls": len(all_calls), "bins": table,
                                "runs_called_on_course_that_missed": [list(w) for w in wrong]}
        lines += [f"## {name}: {len(group)} runs, {called} called on course at least once ({len(all_calls)} calls)", "",
                  "| projected CPU to target ÷ budget left | calls | runs | reached | actual ÷ projected (median) | (90th pct) |",
                  "|---|---|---|---|---|---|"]
        for t in table:
            share = f"{t['reached']}/{t['calls']} ({t['share_reached']:.0%})" if t["calls"] else "–"
            med = f"{t['median_actual_over_projected']:.2f}" if t["median_actual_over_projected"] is not None else "–"
            p90 = f"{t['p90_actual_over_projected']:.2f}" if t["p90_actual_over_projected"] is not None else "–"
            lines.append(f"| {t['bin']} | {t['calls']} | {t['runs']} | {share} | {med} | {p90} |")
        lines += ["", f"Runs of this set called on course that missed the target: {len(wrong)}.", ""]
    slack = result["sets"]["not failing"]["bins"][0]["median_actual_over_projected"]
    result["outlook_slack"] = slack
    if slack is not None:
        lines += [f"Short projections (under a tenth of the budget left: where a fix is held back) were optimistic: the runs "
                  f"that got there needed a median **{slack:.2f}x** the projected CPU. The controller stretches a "
                  f"projection by this factor before it holds a fix back (`swarm.decisions.OUTLOOK_SLACK`)."]
    text = "\n".join(lines).rstrip() + "\n"
    print(text)
    if a.out:
        pathlib.Path(a.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        pathlib.Path(a.out + ".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
