"""How noisy a pilot rung's measurements are from one run to the next: the spread, over seeds, of a
candidate's held-out accuracy and of its mean training loss over the rung's last steps, against
what one run measures of its own noise (the binomial error of its accuracy; the standard error of
its loss tail). The pilot's ranking (swarm/pilot_search.py) adds the spread beyond those to its
`acc_level` / `loss_level` tests; this is where ACC_OVERDISPERSION and LOSS_SPREAD come from.

    python benchmarks/pilot_noise.py --goals addition sort --candidates d128-L3-lr0.003 d192-L4-lr0.003 \
        --steps 112 84 --seeds 5 [--workdir DIR] [--out benchmarks/results/pilot_noise]

For each goal (examples/goals/minimal/<goal>.yaml) the pilot runs once (`swarm.pilot.pilot`, seed
0, its own schedule) to write each candidate's config; then each named candidate trains again from
scratch to the goal's `--steps` with seeds 0..N-1, one process, one torch thread, each scored as a
pilot rung is (`swarm.pilot._run`'s measurements: the evaluation's held-out accuracy over the
pilot's EVAL_SIZE examples, the mean and standard error of the last LOSS_TAIL training losses).
Reported per candidate: the seeds' values, their standard deviation, the median standard error one
run reports, and the spread beyond it (sqrt(sd^2 - se^2), 0 when negative); for the loss also as a
share of the mean loss.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def measure(config: pathlib.Path, steps: int, seeds: int, out_dir: pathlib.Path) -> list[dict[str, float]]:
    """Train the candidate of `config` to `steps` once per seed; each run's rung measurements."""
    import yaml

    from swarm.pilot import EVAL_SIZE
    from swarm.pilot_search import LOSS_TAIL
    from trainer.config import RunConfig
    from trainer.loop import Trainer
    from trainer.runlog import read_jsonl

    base = yaml.safe_load(config.read_text())
    out = []
    for seed in range(seeds):
        cfg = RunConfig.parse({**base, "seed": seed, "name": f"s{seed}", "out_dir": str(out_dir),
                               "recipe": {**base["recipe"], "eval_size": EVAL_SIZE}})
        summary = Trainer(cfg).run(until=steps)
        rows = [r for r in read_jsonl(cfg.run_dir / "metrics.jsonl") if not r.get("final") and "loss" in r]
        tail = [float(r["loss"]) for r in rows[-LOSS_TAIL:]]
        out.append({"seed": seed, "heldout": float(summary.get("heldout_acc", 0.0)), "loss": statistics.mean(tail),
                    "loss_se": statistics.stdev(tail) / math.sqrt(len(tail))})
    return out


def spread(values: list[float], own_se: float) -> tuple[float, float]:
    """(sd over seeds, the part beyond one run's own error)."""
    sd = statistics.stdev(values)
    return sd, math.sqrt(max(0.0, sd ** 2 - own_se ** 2))


def summarize(goal: str, cand: str, steps: int, runs: list[dict[str, float]], eval_size: int) -> dict[str, object]:
    acc = [r["heldout"] for r in runs]
    p = statistics.mean(acc)
    acc_sd, acc_beyond = spread(acc, math.sqrt(p * (1 - p) / eval_size))
    loss = [r["loss"] for r in runs]
    se = statistics.median(r["loss_se"] for r in runs)
    loss_sd, loss_beyond = spread(loss, se)
    return {"goal": goal, "candidate": cand, "steps": steps, "runs": runs, "acc_mean": p, "acc_sd": acc_sd,
            "acc_binomial_se": math.sqrt(p * (1 - p) / eval_size), "acc_beyond": acc_beyond,
            "loss_mean": statistics.mean(loss), "loss_sd": loss_sd, "loss_se_median": se, "loss_beyond": loss_beyond,
            "loss_beyond_share": loss_beyond / statistics.mean(loss)}


def markdown(res: dict[str, object]) -> str:
    L = ["# Pilot noise: one rung's measurements from run to run", "",
         "Command: `" + str(res["command"]) + "`", "",
         f"Code: `{str(res['commit'])[:10]}`. Machine: {res['machine']}. Method: benchmarks/pilot_noise.py's docstring.", "",
         "| goal | candidate | steps | held-out per seed | sd | binomial se | beyond | loss per seed | sd | a run's se (median) "
         "| beyond | beyond ÷ loss |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:  # type: ignore[union-attr]
        acc = ", ".join(f"{x['heldout']:.2f}" for x in r["runs"])
        loss = ", ".join(f"{x['loss']:.3f}" for x in r["runs"])
        L.append(f"| {r['goal']} | {r['candidate']} | {r['steps']} | {acc} | {r['acc_sd']:.3f} | {r['acc_binomial_se']:.3f} "
                 f"| {r['acc_beyond']:.3f} | {loss} | {r['loss_sd']:.4f} | {r['loss_se_median']:.4f} | "
                 f"{r['loss_beyond']:.4f} | {r['loss_beyond_share']:.3f} |")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--goals", nargs="+", required=True, help="names under examples/goals/minimal/")
    ap.add_argument("--candidates", nargs="+", required=True, help="pilot candidate names, e.g. d128-L3-lr0.003")
    ap.add_argument("--steps", nargs="+", type=int, required=True, help="steps per goal (one per --goals)")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pilot_noise"))
    a = ap.parse_args(argv)
    if len(a.steps) != len(a.goals) or a.seeds < 2 or min(a.steps) < 1:
        print("error: --steps needs one positive count per goal, and --seeds at least 2", file=sys.stderr)
        return 2
    from swarm.goal import Goal
    from swarm.pilot import EVAL_SIZE, pilot

    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="pilot-noise-"))
    rows = []
    for goal_name, steps in zip(a.goals, a.steps):
        path = ROOT / "examples" / "goals" / "minimal" / f"{goal_name}.yaml"
        if not path.is_file():
            print(f"error: --goals {goal_name}: no {path}", file=sys.stderr)
            return 2
        t0 = time.time()
        res = pilot(Goal.load(path), work_dir=work / goal_name / "pilot")
        names = {c.name for c in res.candidates}
        for cand in a.candidates:
            if cand not in names:
                print(f"error: --candidates {cand}: not a candidate of {goal_name}'s pilot ({', '.join(sorted(names))})",
                      file=sys.stderr)
                return 2
            runs = measure(work / goal_name / "pilot" / cand / "config.yaml", steps, a.seeds, work / goal_name / cand)
            rows.append(summarize(goal_name, cand, steps, runs, EVAL_SIZE))
            print(f"[{time.time() - t0:.0f}s] {goal_name} {cand}: held-out {[r['heldout'] for r in runs]}, "
                  f"loss {[round(r['loss'], 3) for r in runs]}", flush=True)
    res = {"command": "python benchmarks/pilot_noise.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "commit": commit(), "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python "
           f"{platform.python_version()}", "rows": rows}
    out = pathlib.Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(markdown(res))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
