"""Metrics, tables and plots of a benchmark: pure functions of the ledger's rows.

Per run: reached (the target met with worker CPU <= budget: success@budget), C2T (worker CPU-s to the
target), C2T / oracle (against the oracle's C2T at the same scenario and seed), best-so-far held-out
AUC (the area under the best held-out level reached so far against worker CPU, over [0, budget],
divided by the budget: 1.0 = at the top from the start), interventions (swarm: applied
interventions; PBT/PB2: exploits, i.e. restores from another trial; ASHA: trials that ended before
their trainer finished), wasted compute (swarm: worker CPU of the backtest arms of interventions not
kept with a positive measured effect; Tune: CPU of trial segments outside the best trial's lineage).
Aggregates per method and scenario class (failing / mild / healthy): median and IQR.
"""
from __future__ import annotations

import json
import math
import pathlib
import statistics
from typing import Any

CLASSES = ("failing", "mild", "healthy")


def auc(curve: list[list[float]], budget: float) -> float | None:
    """Best-so-far held-out level integrated over worker CPU in [0, budget], divided by budget."""
    if budget <= 0:
        return None
    pts = sorted((c, v) for c, v in curve if c <= budget)
    area, best, last = 0.0, 0.0, 0.0
    for c, v in pts:
        area += best * (c - last)
        best, last = max(best, v), c
    area += best * (budget - last)
    return area / budget


def quantiles(xs: list[float]) -> tuple[float, float, float] | None:
    xs = sorted(x for x in xs if x is not None and math.isfinite(x))
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def fmt_q(q: tuple[float, float, float] | None, nd: int = 0) -> str:
    if q is None:
        return "—"
    lo, med, hi = q
    return f"{med:.{nd}f}" if lo == hi else f"{med:.{nd}f} [{lo:.{nd}f}–{hi:.{nd}f}]"


def enrich(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add C2T / oracle and AUC to each row."""
    oracle = {(r["scenario"], r["seed"]): r for r in rows if r["method"] == "oracle"}
    out = []
    for r in rows:
        r = dict(r)
        o = oracle.get((r["scenario"], r["seed"]))
        r["c2t_over_oracle"] = (r["cpu_to_target"] / o["cpu_to_target"]
                                if r.get("reached") and o and o.get("reached") and o.get("cpu_to_target") else None)
        r["auc"] = auc(r.get("curve") or [], r["budget"])
        out.append(r)
    return out


def aggregate(rows: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    out = []
    for cls in CLASSES:
        for m in methods:
            rs = [r for r in rows if r["method"] == m and r["cls"] == cls]
            if not rs:
                continue
            plain = {(r["scenario"], r["seed"]): r for r in rows if r["method"] == "plain" and r["cls"] == cls}
            cost = [r["cpu_total"] / plain[(r["scenario"], r["seed"])]["cpu_total"] for r in rs
                    if (r["scenario"], r["seed"]) in plain and r.get("cpu_total") and plain[(r["scenario"], r["seed"])].get("cpu_total")]
            out.append({"cls": cls, "method": m, "runs": len(rs), "reached": sum(bool(r.get("reached")) for r in rs),
                        "c2t": quantiles([r["cpu_to_target"] for r in rs if r.get("reached")]),
                        "c2t_over_oracle": quantiles([r["c2t_over_oracle"] for r in rs if r.get("c2t_over_oracle") is not None]),
                        "auc": quantiles([r["auc"] for r in rs if r.get("auc") is not None]),
                        "interventions": quantiles([float(r.get("interventions") or 0) for r in rs]),
                        "wasted": quantiles([float(r.get("wasted_cpu_s") or 0) for r in rs]),
                        "cpu_over_plain": quantiles(cost),
                        "wall": quantiles([r.get("wall_s") for r in rs if r.get("wall_s") is not None])})
    return out


def markdown(meta: dict[str, Any], scenarios: list[dict[str, Any]], rows: list[dict[str, Any]], methods: list[str],
             plots: list[str]) -> str:
    agg = aggregate(rows, methods)
    done = len(rows)
    L = [f"# Benchmark suite `{meta['suite']}`: {', '.join(methods)}", "",
         (f"Command: `{meta['command']}`" if isinstance(meta["command"], str)
          else "Commands: " + "; ".join(f"`{c}`" for c in meta["command"])), "",
         f"Code under test: {meta['src']} (baseline code state `{meta['code_state']['baseline']}`, swarm code state "
         f"`{meta['code_state']['swarm']}`). Machine: {meta['machine']}. Runs in parallel: {meta['parallel']}.", "",
         f"**Progress: {done} of {meta['planned']} planned runs finished** "
         f"({meta.get('calibrated', 0)} of {meta.get('scenarios', 0)} scenarios calibrated). "
         + (f"Median wall per run: {meta['median_wall_s']:.0f} s; the finished runs took {meta['wall_sum_s'] / 60:.0f} min of wall "
            f"in all; the remaining {meta['planned'] - done} runs at that median: ~{(meta['planned'] - done) * meta['median_wall_s'] / 60 / max(1, meta['parallel']):.0f} min "
            f"more at this parallelism; the whole suite ~{meta['planned'] * meta['median_wall_s'] / 3600 / max(1, meta['parallel']):.1f} h "
            "(wall on these cores)." if meta.get("median_wall_s") else ""), "",
         machine_line(meta), "",
         "Budget per scenario: " f"{meta['budget_multiple']:g} x the worker CPU-s a healthy run of the same config needs to reach "
         "the target (calibration); a run that has not reached the target when its worker CPU passes the budget, or at its wall "
         "cap, has failed. Worker CPU = CPU seconds of every trainer process of the method. Scenario class from the plain run at "
         "the calibration seed: **failing** (plain training does not reach the target within the budget), **mild** (it does), "
         "**healthy** (no fault).", ""]
    if meta.get("seed_note"):
        L += [meta["seed_note"], ""]
    if meta.get("take"):
        L += ["Scenarios taken (`--take`): " + ", ".join(f"the first {v} {k}" for k, v in meta["take"].items())
              + " in suite order; calibrated but not taken (their class had its count): "
              + (", ".join(meta.get("not_taken") or []) or "none") + ".", ""]
    if meta.get("duplicates"):
        L += ["Left out as duplicates (they run exactly what an earlier scenario runs): "
              + ", ".join(f"{k} (= {v})" for k, v in meta["duplicates"].items()) + ".", ""]
    L += ["## Per method and scenario class", "",
          "C2T = worker CPU-s to target (reached runs); medians with [IQR] over runs (scenario x seed).", "",
          "| class | method | runs | success@budget | C2T | C2T ÷ oracle | best-so-far AUC | interventions | wasted CPU-s | CPU ÷ plain | wall s |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in agg:
        L.append(f"| {a['cls']} | {a['method']} | {a['runs']} | {a['reached']}/{a['runs']} ({100 * a['reached'] / a['runs']:.0f}%) | "
                 f"{fmt_q(a['c2t'])} | {fmt_q(a['c2t_over_oracle'], 2)} | {fmt_q(a['auc'], 2)} | {fmt_q(a['interventions'])} | "
                 f"{fmt_q(a['wasted'])} | {fmt_q(a['cpu_over_plain'], 2)} | {fmt_q(a['wall'])} |")
    origins = sorted({r.get("origin") for r in rows if r.get("origin") and r["cls"] == "failing"})
    if origins:
        L += ["", "## Failing runs per fault origin", "",
              "The origin (generator v5) is where the fault came from: `config` (the goal's own starting config), `drift` (a "
              "live config changed at a step), `data` (the data stream, no config change), `infra` (the machine, the process "
              "or its files). "
              "The swarm is never told it.", "",
              "| origin | method | runs | success@budget | C2T ÷ oracle | wasted CPU-s |", "|---|---|---|---|---|---|"]
        for o in origins:
            for a in aggregate([r for r in rows if r.get("origin") == o], methods):
                if a["cls"] == "failing":
                    L.append(f"| {o} | {a['method']} | {a['runs']} | {a['reached']}/{a['runs']} "
                             f"({100 * a['reached'] / a['runs']:.0f}%) | {fmt_q(a['c2t_over_oracle'], 2)} | {fmt_q(a['wasted'])} |")
    L += ["", "## Per scenario", "",
          "Cell: reached runs / runs, then the median C2T of the reached ones. `fix in space`: whether the Tune baselines' search "
          "space (lr, temperature, max_new_tokens, curriculum start, kl_coef) can express the fault's fix.", "",
          "| scenario | class | faults | fix in space | target | budget CPU-s | " + " | ".join(methods) + " |",
          "|---|---|---|---|---|---|" + "---|" * len(methods)]
    by = {}
    for r in rows:
        by.setdefault((r["scenario"], r["method"]), []).append(r)
    for s in scenarios:
        cells = []
        for m in methods:
            rs = by.get((s["name"], m), [])
            if not rs:
                cells.append("not run")
                continue
            k = sum(bool(r.get("reached")) for r in rs)
            med = statistics.median([r["cpu_to_target"] for r in rs if r.get("reached")]) if k else None
            cells.append(f"{k}/{len(rs)}" + (f" · {med:.0f}" if med is not None else ""))
        L.append(f"| {s['name']} | {s.get('cls') or 'not calibrated'} | {s['faults']} | {s['fix_in_space']} | "
                 f"{s['target'] if s.get('target') is not None else '—'} | {s['budget'] if s.get('budget') else '—'} | " + " | ".join(cells) + " |")
    errs = [r for r in rows if r.get("log_tail")]
    if errs:
        L += ["", "## Runs that ended with an error", ""]
        for r in errs[:20]:
            L += [f"- {r['method']} {r['scenario']} seed {r['seed']}:", "", "```", str(r["log_tail"]).strip()[-800:], "```", ""]
    if plots:
        L += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(L) + "\n"


def plots(rows: list[dict[str, Any]], methods: list[str], out_dir: pathlib.Path, stem: str) -> list[str]:
    """success@budget curve per method (failing scenarios) and C2T / budget per method and class (SVG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = []
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [i / 100 for i in range(101)]
    for m in methods:
        rs = [r for r in rows if r["method"] == m and r["cls"] == "failing"]
        if not rs:
            continue
        fr = [r["cpu_to_target"] / r["budget"] for r in rs if r.get("reached") and r["budget"]]
        ax.step(xs, [sum(f <= x for f in fr) / len(rs) for x in xs], where="post", label=f"{m} (n={len(rs)})")
    ax.set_xlabel("worker CPU spent (fraction of the budget)")
    ax.set_ylabel("failing runs at target")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_title("success@budget, failing scenarios")
    fig.tight_layout()
    p = out_dir / f"{stem}_success.svg"
    fig.savefig(p, format="svg")
    plt.close(fig)
    names.append(p.name)
    present = [c for c in CLASSES if any(r["cls"] == c for r in rows)]
    if present:
        fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 3.6), squeeze=False)
        for ax, c in zip(axes[0], present):
            for i, m in enumerate(methods):
                ys = [r["cpu_to_target"] / r["budget"] for r in rows if r["method"] == m and r["cls"] == c and r.get("reached") and r["budget"]]
                ax.scatter([i + (j % 5 - 2) * 0.05 for j in range(len(ys))], ys, s=14)
                if ys:
                    ax.hlines(statistics.median(ys), i - 0.3, i + 0.3, color="black", lw=1)
            ax.set_xticks(range(len(methods)), methods, rotation=30, fontsize=8)
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{c}: C2T / budget (reached runs)", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        p = out_dir / f"{stem}_c2t.svg"
        fig.savefig(p, format="svg")
        plt.close(fig)
        names.append(p.name)
    return names


def machine_line(meta: dict[str, Any]) -> str:
    """How the worker CPU-s of the tables compare across sittings (swarmbench.machine)."""
    sittings = meta.get("sittings") or []
    slots = (f"Runs hold the cores their method keeps busy ({meta.get('cores')} cores shared by every bench process "
             "of a sitting), so no run is measured on an oversubscribed machine.")
    if len(sittings) <= 1:
        return "Worker CPU-s as measured: every row comes from one sitting (one machine). " + slots
    lines = [f"Worker CPU-s are those of sitting `{meta.get('base_sitting')}`'s machine. The rows come from "
             f"{len(sittings)} sittings; each one's CPU-s are scaled by a factor fitted to the plain and oracle runs "
             "repeated between sittings (the same scenario, seed and code measured twice is the same work), and by the "
             f"reference workload (`{meta.get('reference')}`) only where no repeated run links a sitting. " + slots, "",
             "| sitting | rows | first – last run | reference CPU-s | factor | from | repeated runs | their misfit |",
             "|---|---|---|---|---|---|---|---|"]
    for x in sittings:
        lines.append(f"| `{x['name']}` | {x['rows']} | {x.get('first') or '—'} – {x.get('last') or '—'} | "
                     f"{x['ref_cpu_s']:.2f} | " if x.get("ref_cpu_s") else
                     f"| `{x['name']}` | {x['rows']} | {x.get('first') or '—'} – {x.get('last') or '—'} | — | ")
        lines[-1] += (f"{x['factor']:.3f} | {x['how']} | {x['anchors']} | "
                      + (f"{100 * x['spread']:.1f}%" if x.get("spread") is not None else "—") + " |")
    return "\n".join(lines)


def write(out_dir: pathlib.Path, stem: str, meta: dict[str, Any], scenarios: list[dict[str, Any]],
          rows: list[dict[str, Any]], methods: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = enrich(rows)
    names = plots(rows, methods, out_dir, stem) if rows else []
    agg = aggregate(rows, methods)
    (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "scenarios": scenarios, "aggregates": agg,
                                                      "runs": rows}, indent=1, default=str))
    (out_dir / f"{stem}.md").write_text(markdown(meta, scenarios, rows, methods, names))
