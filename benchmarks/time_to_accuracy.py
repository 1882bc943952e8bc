"""Time-to-accuracy: the trainer vs a minimal plain-torch loop on 3-digit addition, side by side.

Both train ~0.8M-parameter decoder-only transformers from scratch on CPU with the same data
distribution (operands 100..999, answers with reversed digits), batch, learning rate and eval
cadence (500 held-out problems, greedy, every 100 steps), until held-out exact match >= 0.95.
The trainer runs `examples/addition_sft.yaml` with all of its machinery on (metrics and samples
every step, heartbeat, periodic checkpoints, control-channel polling). The two are interleaved
per seed (who goes first alternates) so machine noise hits both; the claim is the ratio of their
median wall times to target over the seeds. Steps to target vary a lot from seed to seed (a
small transformer learns the carry in a sudden drop), so one or two seeds say little: the
default is five. The wall-time ratio splits into a per-step cost ratio (the machinery: metrics,
samples, checkpoints, control; and the model's ops) and a steps-to-target ratio (how fast each
architecture and data format learns).

    python benchmarks/time_to_accuracy.py [--seeds 0 1 2 3 4]
    python benchmarks/time_to_accuracy.py --per-step [--steps 300 --reps 3]

`--per-step` measures the cost of a training step alone (no held-out evaluation), three arms
interleaved: the minimal loop; the trainer with its machinery off (no sample rollouts, no periodic
checkpoints, no control channel; metrics still written); the trainer as configured, with
checkpoints every 100 steps (5x the example's rate). Full / bare is what the machinery costs;
bare / minimal is the model (RoPE/SwiGLU/RMSNorm vs the loop's GPT) and the data pipeline.
Writes benchmarks/results/time_per_step.{json,md}.

Writes benchmarks/results/time_to_accuracy.{json,md}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import platform
import sys
import tempfile
import statistics
import subprocess
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
# Python puts this script's folder first on sys.path, where benchmarks/kernels would shadow the
# project's kernels package: drop it, and load the baseline by path.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("minimal_loop", HERE / "minimal_loop.py")
minimal_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(minimal_loop)

from trainer.config import RunConfig  # noqa: E402
from trainer.loop import Trainer  # noqa: E402
from trainer.runlog import read_jsonl  # noqa: E402


EXAMPLE = RunConfig.from_yaml(HERE.parent / "examples" / "addition_sft.yaml")


def run_trainer(seed: int, out: pathlib.Path) -> dict:
    cfg = RunConfig.parse({**EXAMPLE.model_dump(mode="json"), "seed": seed, "out_dir": str(out), "name": f"tta-{seed}"})
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    params = sum(p.numel() for p in trainer.params)
    summary = trainer.run()
    wall = time.perf_counter() - t0
    steps, t_first = step_rows(cfg.run_dir)
    curve = [(r["step"], r["time"] - t_first, r["heldout_acc"]) for r in steps if "heldout_acc" in r]
    return {"steps": summary["step"], "wall_s": wall, "tokens": sum(r["tokens"] for r in steps),
            "heldout_acc": summary.get("heldout_acc"), "status": summary["status"], "params": params,
            "curve": curve}


def step_rows(run_dir: pathlib.Path) -> tuple[list[dict], float]:
    """A run's training-step metric rows and the time its first step began."""
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r]
    return steps, (steps[0]["time"] - steps[0]["step_time"] if steps else 0.0)


def train_wall(run_dir: pathlib.Path) -> tuple[int, float]:
    """Steps and wall seconds of the training steps of a run (end-of-run evaluation excluded)."""
    steps, t_first = step_rows(run_dir)
    return len(steps), steps[-1]["time"] - t_first


def per_step(n_steps: int, reps: int) -> None:
    out = pathlib.Path(tempfile.mkdtemp(prefix="tps_"))
    base = EXAMPLE.model_dump(mode="json")
    base["recipe"].update(eval_interval=0, steps=n_steps, stop_at_heldout=None)

    def trainer(name: str, machinery: bool, rep: int) -> float:
        d = {**base, "out_dir": str(out), "name": f"{name}-{rep}", "seed": rep,
             "samples_per_step": base["samples_per_step"] if machinery else 0,
             "checkpoint": {**base["checkpoint"], "interval": 100 if machinery else 0}}
        tr = Trainer(RunConfig.parse(d))
        if not machinery:
            tr.inbox = None
        tr.run()
        n, wall = train_wall(tr.run_dir)
        return wall / n

    def minimal(rep: int) -> float:
        m = minimal_loop.main(target=2.0, batch=128, lr=EXAMPLE.recipe.lr, max_steps=n_steps, eval_every=n_steps + 1,
                              seed=rep, threads=1)
        return m["wall_s"] / m["steps"]

    arms = {"minimal": minimal, "trainer_bare": lambda r: trainer("bare", False, r),
            "trainer": lambda r: trainer("full", True, r)}
    res: dict[str, list[float]] = {k: [] for k in arms}
    for rep in range(reps):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))
        for k in order:
            res[k].append(arms[k](rep))
        print(json.dumps({k: v[-1] for k, v in res.items()}), flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    summary = {"steps": n_steps, "reps": reps, "s_per_step": res, "median": med,
               "machinery": med["trainer"] / med["trainer_bare"], "model_and_data": med["trainer_bare"] / med["minimal"],
               "total": med["trainer"] / med["minimal"]}
    rdir = HERE / "results"
    (rdir / "time_per_step.json").write_text(json.dumps(summary, indent=1))
    lines = ["# Cost of one SFT training step: trainer vs minimal loop (3-digit addition, batch 128, 1 torch thread)", "",
             f"Command: `python benchmarks/time_to_accuracy.py --per-step --steps {n_steps} --reps {reps}` "
             "(arms interleaved, order alternating per repetition; training steps only, no held-out evaluation).", "",
             "| arm | what runs | median s/step | vs minimal |", "|---|---|---:|---:|",
             f"| minimal | GPT loop, nothing else | {med['minimal']:.4f} | 1.00× |",
             f"| trainer, machinery off | built-in model, data pipeline, metrics row and heartbeat per step | {med['trainer_bare']:.4f} | {summary['model_and_data']:.2f}× |",
             f"| trainer | + 4 greedy sample rollouts per step, heartbeat, checkpoint every 100 steps, control polling | {med['trainer']:.4f} | {summary['total']:.2f}× |",
             "", f"The machinery (trainer / trainer with it off): **{summary['machinery']:.2f}×** per step."]
    (rdir / "time_per_step.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: summary[k] for k in ("machinery", "model_and_data", "total")}))


def plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        for arm, colour in (("minimal", "tab:blue"), ("trainer", "tab:orange")):
            c = r[arm]["curve"]
            ax.plot([x[1] for x in c], [x[2] for x in c], color=colour, alpha=0.7,
                    label=arm if r is results[0] else None)
    ax.axhline(0.95, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("wall seconds (1 torch thread)")
    ax.set_ylabel("held-out exact match")
    ax.set_title("3-digit addition: one line per seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--per-step", action="store_true", help="measure the cost of a training step instead")
    ap.add_argument("--steps", type=int, default=300, help="--per-step: steps per arm")
    ap.add_argument("--reps", type=int, default=3, help="--per-step: repetitions per arm")
    ap.add_argument("--merge", action="store_true", help="add these seeds to the runs already in the results "
                                                          "(same code: the commit is checked) instead of replacing them")
    a = ap.parse_args()
    if a.per_step:
        return per_step(a.steps, a.reps)
    out = pathlib.Path(tempfile.mkdtemp(prefix="tta_"))
    results = []
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    prev_wall = 0.0
    if a.merge:
        prev = json.loads((HERE / "results" / "time_to_accuracy.json").read_text())
        # the code both arms run must be the same as for the runs already there
        code = ["trainer", "kernels", "harness", "benchmarks/minimal_loop.py", "examples/addition_sft.yaml"]
        same = prev.get("commit") and subprocess.run(["git", "diff", "--quiet", prev["commit"], "--", *code], cwd=HERE.parent).returncode == 0
        if not same:
            raise SystemExit(f"--merge: the trainer or the minimal loop changed since the results' commit "
                             f"{prev.get('commit')}: run all seeds again")
        results = [r for r in prev["runs"] if r["seed"] not in a.seeds]
        prev_wall = prev.get("bench_wall_s", 0.0)
    t_all = time.perf_counter()
    for i, seed in enumerate(a.seeds, start=len(results)):
        arms = {"minimal": lambda: minimal_loop.main(target=0.95, batch=128, lr=EXAMPLE.recipe.lr, max_steps=5000,
                                                     eval_every=100, seed=seed, threads=1),
                "trainer": lambda: run_trainer(seed, out)}
        order = ["minimal", "trainer"] if i % 2 == 0 else ["trainer", "minimal"]
        r = {"seed": seed, "first": order[0], **{k: arms[k]() for k in order}}
        for k in ("minimal", "trainer"):
            r[k]["s_per_step"] = r[k]["wall_s"] / r[k]["steps"]
        r["ratio_wall"] = r["trainer"]["wall_s"] / r["minimal"]["wall_s"]
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("minimal", "trainer")}
                         | {k: {f: r[k][f] for f in ("steps", "wall_s", "heldout_acc")} for k in ("minimal", "trainer")}),
              flush=True)
    med = {k: {f: statistics.median(r[k][f] for r in results) for f in ("wall_s", "steps", "s_per_step")}
           for k in ("minimal", "trainer")}
    reached = {k: sum(r[k]["heldout_acc"] >= 0.95 for r in results) for k in ("minimal", "trainer")}
    summary = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads available, torch {torch.__version__}",
        "target": 0.95, "runs": results, "median": med, "reached": reached,
        "ratio_of_median_wall": med["trainer"]["wall_s"] / med["minimal"]["wall_s"],
        "median_paired_ratio_wall": statistics.median(r["ratio_wall"] for r in results),
        "ratio_median_s_per_step": med["trainer"]["s_per_step"] / med["minimal"]["s_per_step"],
        "ratio_median_steps": med["trainer"]["steps"] / med["minimal"]["steps"],
        "bench_wall_s": prev_wall + time.perf_counter() - t_all, "commit": commit,
    }
    rdir = HERE / "results"
    rdir.mkdir(exist_ok=True)
    (rdir / "time_to_accuracy.json").write_text(json.dumps(summary, indent=1))
    plot(results, rdir / "time_to_accuracy.png")
    n = len(results)
    lines = ["# Time to 95% held-out exact match, 3-digit addition, CPU (1 torch thread each)", "",
             f"Command: `python benchmarks/time_to_accuracy.py --seeds {' '.join(str(r['seed']) for r in results)}` "
             f"(at {commit[:10]}{'; seeds added with --merge' if a.merge else ''}) "
             f"({summary['bench_wall_s'] / 60:.0f} min; {summary['machine']}; machine shared with other jobs, "
             "so absolute seconds are inflated — the arms are interleaved per seed and the claims are ratios).", "",
             "Minimal = `benchmarks/minimal_loop.py` (GPT: learned positions, LayerNorm, GELU; zero-padded fixed-width "
             "answers; nothing but the loop). Trainer = `examples/addition_sft.yaml` through `trainer.loop.Trainer` "
             "with everything on: built-in model (RMSNorm, rotary, SwiGLU; learned positions; `model.init: torch`), metrics and 4 greedy sample rollouts "
             "every step, heartbeat, checkpoints every 500 steps, control-channel polling. Both evaluate 500 "
             "held-out problems greedily every 100 steps and stop at ≥ 0.95. Both: batch 128, constant lr "
             f"{EXAMPLE.recipe.lr:g}, AdamW (0.9, 0.95), one torch thread.", "",
             "| seed | ran first | loop | steps | wall s | s/step | tokens | held-out acc | params |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for k in ("minimal", "trainer"):
            x = r[k]
            lines.append(f"| {r['seed']} | {r['first']} | {k} | {x['steps']} | {x['wall_s']:.0f} | {x['s_per_step']:.3f} | "
                         f"{int(x['tokens']):,} | {x['heldout_acc']:.3f} | {x['params']:,} |")
    lines += ["", f"Medians over {n} seeds (reached the target: minimal {reached['minimal']}/{n}, trainer {reached['trainer']}/{n}):", "",
              "| | minimal | trainer | trainer / minimal |", "|---|---:|---:|---:|",
              f"| wall s to target | {med['minimal']['wall_s']:.0f} | {med['trainer']['wall_s']:.0f} | **{summary['ratio_of_median_wall']:.2f}×** (target ≤ 1.5×) |",
              f"| steps to target | {med['minimal']['steps']:.0f} | {med['trainer']['steps']:.0f} | {summary['ratio_median_steps']:.2f}× |",
              f"| s per step | {med['minimal']['s_per_step']:.3f} | {med['trainer']['s_per_step']:.3f} | {summary['ratio_median_s_per_step']:.2f}× |",
              "", f"Median of the per-seed wall-time ratios: {summary['median_paired_ratio_wall']:.2f}×.", "",
              "![held-out accuracy against wall time](time_to_accuracy.png)"]
    (rdir / "time_to_accuracy.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: summary[k] for k in ("ratio_of_median_wall", "median_paired_ratio_wall",
                                              "ratio_median_s_per_step", "ratio_median_steps")}))


if __name__ == "__main__":
    main()
