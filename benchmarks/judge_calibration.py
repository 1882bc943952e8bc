"""How the post-apply judge (swarm.judging.judge) reads a change that did nothing, and one that did
harm: replayed on the held-out curves of the suite's oracle runs (healthy configs, learning towards
their target, no intervention), each pair of evals `--lags` evals apart is judged as if a change had
been applied at the first one, with that eval as the control (the value before applying, its
binomial noise) and the later one as the window's first look; where that look waits for a fall to
be confirmed, the eval `lag` later is its second. A verdict of credible harm there is a false undo;
a credible gain is the run's own learning credited to a change. With `--effects`, the window's evals
are taken down by each amount: a change that did harm, and how often, and at which look, it is undone.

    .venv/bin/python benchmarks/judge_calibration.py                  # every suite_*.json in benchmarks/results
    .venv/bin/python benchmarks/judge_calibration.py --lags 1 2 --effects 0 0.1 0.2 --out benchmarks/results/judge_calibration.md

Pure replay of committed results: no training, seconds of CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from collections import Counter
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.domain import InterventionKind as K  # noqa: E402
from swarm.decisions import rate_var  # noqa: E402
from swarm.judging import Control, Kept, Pending, RolledBack, Window, judge  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def curves(paths: list[pathlib.Path]) -> list[tuple[str, str, float, list[float]]]:
    """(suite, scenario, target, held-out values in eval order) of every oracle run in `paths`."""
    out = []
    for p in paths:
        data = json.loads(p.read_text())
        for r in data.get("runs", []) if isinstance(data, dict) else []:     # a suite's results, not another file
            if r.get("method") == "oracle" and r.get("curve") and isinstance(r.get("target"), (int, float)):
                out.append((p.stem, r["scenario"], float(r["target"]), [float(v) for _, v in r["curve"]]))
    return out


def judged(before: float, after: float, eval_size: int, look: int = 1, fell: bool = False, last: bool = False) -> Any:
    return judge(Window(K.RECIPE_EDIT, after, 100, 100, eval_size=eval_size, look=look, last_look=last, fell=fell),
                 Control(before, math.sqrt(rate_var(before, eval_size)), "the value before applying"))


def verdicts(vals: list[float], k: int, lag: int, eval_size: int, effect: float = 0.0) -> list[str]:
    """What the judge makes of a change applied at eval `k` that moved the held-out rate by
    `-effect`: its first look at eval k+lag, and, where that look waits for a fall to be confirmed,
    its second at k+2*lag (none where the run had stopped: a run at its target is not worse). Also
    `one look`: whether the rule without confirmation (a credible fall undone on one look) undoes it."""
    after = [max(v - effect, 0.0) for v in vals]
    first = judged(vals[k], after[k + lag], eval_size)
    out = []
    once = judged(vals[k], after[k + lag], eval_size, last=True)
    if isinstance(once, RolledBack) and once.undo:
        out.append("one look")
    if isinstance(first, Pending) and first.fell and k + 2 * lag < len(vals):
        second = judged(vals[k], after[k + 2 * lag], eval_size, look=2, fell=True)
        out.append("undone at look 2" if isinstance(second, RolledBack) and second.undo else "pending")
    elif isinstance(first, RolledBack):
        out.append("undone at look 1" if first.undo else "no gain")
    else:
        out.append("kept" if isinstance(first, Kept) else "pending")
    return out


def replay(runs: list[tuple[str, str, float, list[float]]], lag: int, eval_size: int,
           effect: float = 0.0) -> dict[str, Counter]:
    """Verdicts over every pair of evals `lag` apart before the run reached its target, by region:
    `all`, and `moving` (the control between 0.05 and 0.95, where a rate moves from eval to eval).
    `effect`: the change's window evals taken down by this much (a change that did harm)."""
    out = {"all": Counter(), "moving": Counter()}
    for _, _, target, vals in runs:
        reached = next((i for i, v in enumerate(vals) if v >= target), len(vals))
        below = vals[:reached + 1]        # the run stops at the eval that meets its target
        for k in range(reached - lag):    # a look after the target is read only as a second look
            got = verdicts(below, k, lag, eval_size, effect)
            for region in ("all", "moving") if 0.05 <= below[k] <= 0.95 else ("all",):
                out[region].update(got + ["pairs"])
    return out


def write(path: pathlib.Path, runs: list, counts: dict[tuple[int, float], dict[str, Counter]], args: argparse.Namespace,
          cmd: str) -> None:
    L = ["# The judge on changes that did nothing, and on changes that did harm: replayed on the suite's oracle runs", "",
         f"`{cmd}` (`benchmarks/judge_calibration.py`; its docstring has the method).", "",
         f"{len(runs)} oracle runs from {len({s for s, *_ in runs})} suite results; pairs of held-out evals "
         f"`lag` evals apart before each run reached its target, judged as swarm.judging.judge judges a change "
         f"applied at the first with the first as its control (eval size {args.eval_size}): its first look at the "
         "second eval, and where that look waits for a fall to be confirmed, its second `lag` evals later. "
         "`effect`: the window's evals taken down by this much (0: a change that did nothing; then an undo is "
         "a false one, a keep the run's own learning counted for it). `one look`: what the rule without "
         "confirmation (a fall credible at 1 − alpha undone on one look) undoes. `moving`: the control between "
         "0.05 and 0.95.", "",
         "| lag | effect | region | pairs | undone | at look 1 | at look 2 | one-look rule undoes | kept | pending |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for (lag, effect), by in counts.items():
        for region, c in by.items():
            n = c["pairs"] or 1
            undone = c["undone at look 1"] + c["undone at look 2"]
            L.append(f"| {lag} | {effect:g} | {region} | {c['pairs']} | {undone} ({undone / n:.1%}) | {c['undone at look 1']} "
                     f"| {c['undone at look 2']} | {c['one look']} ({c['one look'] / n:.1%}) | {c['kept']} ({c['kept'] / n:.0%}) "
                     f"| {c['pending']} ({c['pending'] / n:.0%}) |")
    L += ["", "A healthy run's held-out accuracy moves between evals by more than one eval's binomial noise: "
          "with `effect` 0 an undo is a change that did nothing judged harmful. The judge's control for an "
          "adopted or backtested change is the arms', not this run's earlier eval: this replay reads the noise of "
          "one run's evals, not those controls."]
    path.write_text("\n".join(L) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lags", type=int, nargs="+", default=[1, 2], help="evals between the control and the window's eval")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--effects", type=float, nargs="+", default=[0.0, 0.1, 0.2],
                    help="falls of the held-out rate a change causes (0: none)")
    ap.add_argument("--out", default=str(RESULTS / "judge_calibration.md"))
    args = ap.parse_args(argv)
    if min(args.lags) < 1 or args.eval_size < 1 or not all(0 <= e <= 1 for e in args.effects):
        print("judge_calibration: --lags and --eval-size must be at least 1, --effects between 0 and 1", file=sys.stderr)
        return 2
    runs = curves(sorted(RESULTS.glob("suite_*.json")))
    counts = {(lag, e): replay(runs, lag, args.eval_size, e) for lag in args.lags for e in args.effects}
    cmd = ("python benchmarks/judge_calibration.py --lags " + " ".join(map(str, args.lags))
           + " --effects " + " ".join(f"{e:g}" for e in args.effects))
    write(pathlib.Path(args.out), runs, counts, args, cmd)
    for key, by in counts.items():
        print(key, {region: dict(c) for region, c in by.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
