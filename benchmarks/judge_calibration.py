"""How the post-apply judge (swarm.judging.judge) reads a change that did nothing: replayed on the
held-out curves of the suite's oracle runs (healthy configs, learning towards their target, no
intervention), each pair of evals `--lags` evals apart is judged as if a change had been applied at
the first one, with that eval as the control (the value before applying, its binomial noise) and the
later one as the window's. A verdict of credible harm there is a false undo; a credible gain is
the run's own learning credited to a change.

    .venv/bin/python benchmarks/judge_calibration.py                  # every suite_*.json in benchmarks/results
    .venv/bin/python benchmarks/judge_calibration.py --lags 1 2 --eval-size 200 --out benchmarks/results/judge_calibration.md

Pure replay of committed results: no training, seconds of CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from collections import Counter

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


def verdict(before: float, after: float, eval_size: int) -> str:
    got = judge(Window(K.RECIPE_EDIT, after, 100, 100, eval_size=eval_size, look=1, last_look=False),
                Control(before, math.sqrt(rate_var(before, eval_size)), "the value before applying"))
    if isinstance(got, RolledBack):
        return "undone" if got.undo else "no gain"
    return "kept" if isinstance(got, Kept) else "pending" if isinstance(got, Pending) else type(got).__name__


def replay(runs: list[tuple[str, str, float, list[float]]], lag: int, eval_size: int) -> dict[str, Counter]:
    """Verdicts over every pair of evals `lag` apart before the run reached its target, by region:
    `all`, and `moving` (the control between 0.05 and 0.95, where a rate moves from eval to eval)."""
    out = {"all": Counter(), "moving": Counter()}
    for _, _, target, vals in runs:
        reached = next((i for i, v in enumerate(vals) if v >= target), len(vals))
        below = vals[:reached]                  # the run stops at the eval that meets its target
        for k in range(len(below) - lag):
            v = verdict(below[k], below[k + lag], eval_size)
            out["all"][v] += 1
            if 0.05 <= below[k] <= 0.95:
                out["moving"][v] += 1
    return out


def write(path: pathlib.Path, runs: list, counts: dict[int, dict[str, Counter]], args: argparse.Namespace,
          cmd: str) -> None:
    L = ["# The judge on changes that did nothing: replayed on the suite's oracle runs", "",
         f"`{cmd}` (`benchmarks/judge_calibration.py`; its docstring has the method).", "",
         f"{len(runs)} oracle runs from {len({s for s, *_ in runs})} suite results; pairs of held-out evals "
         f"`lag` evals apart before each run reached its target, judged as swarm.judging.judge judges a change "
         f"applied at the first with the first as its control (eval size {args.eval_size}, first look). `moving`: "
         "the control between 0.05 and 0.95.", "",
         "| lag | region | pairs | undone (credible harm) | kept (credible gain) | pending | no gain |",
         "|---|---|---|---|---|---|---|"]
    for lag, by in counts.items():
        for region, c in by.items():
            n = sum(c.values()) or 1
            L.append(f"| {lag} | {region} | {sum(c.values())} | {c['undone']} ({c['undone'] / n:.1%}) | {c['kept']} "
                     f"({c['kept'] / n:.0%}) | {c['pending']} ({c['pending'] / n:.0%}) | {c['no gain']} |")
    L += ["", "A healthy run's held-out accuracy moves between evals by more than one eval's binomial noise: "
          "an undo here is a change that did nothing judged harmful, and a keep is the run's own learning "
          "counted for it (the judge's control for an adopted or backtested change is the arms', not this run's "
          "earlier eval: this replay reads the noise of one run's evals, not those controls)."]
    path.write_text("\n".join(L) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lags", type=int, nargs="+", default=[1, 2], help="evals between the control and the window's eval")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--out", default=str(RESULTS / "judge_calibration.md"))
    args = ap.parse_args(argv)
    if min(args.lags) < 1 or args.eval_size < 1:
        print("judge_calibration: --lags and --eval-size must be at least 1", file=sys.stderr)
        return 2
    runs = curves(sorted(RESULTS.glob("suite_*.json")))
    counts = {lag: replay(runs, lag, args.eval_size) for lag in args.lags}
    cmd = "python benchmarks/judge_calibration.py --lags " + " ".join(map(str, args.lags))
    write(pathlib.Path(args.out), runs, counts, args, cmd)
    for lag, by in counts.items():
        print(lag, {region: dict(c) for region, c in by.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
