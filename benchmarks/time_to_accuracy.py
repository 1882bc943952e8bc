"""Time-to-accuracy: the trainer vs a minimal plain-torch loop on 3-digit addition, side by side.

Both train ~0.8M-parameter decoder-only transformers from scratch on CPU with the same data
distribution (operands 100..999, answers with reversed digits), batch, learning rate and eval
cadence (500 held-out problems, greedy, every 100 steps), until held-out exact match >= 0.95.
The trainer runs `examples/addition_sft.yaml` with all of its machinery on (metrics and samples
every step, heartbeat, periodic checkpoints, control-channel polling). The two are interleaved
per seed so machine noise hits both; the claim is the ratio of their wall times.

    python benchmarks/time_to_accuracy.py [--seeds 0 1]

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


def run_trainer(seed: int, out: pathlib.Path) -> dict:
    cfg = RunConfig.from_yaml(HERE.parent / "examples" / "addition_sft.yaml")
    cfg = RunConfig.parse({**cfg.model_dump(mode="json"), "seed": seed, "out_dir": str(out), "name": f"tta-{seed}"})
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    params = sum(p.numel() for p in trainer.params)
    summary = trainer.run()
    wall = time.perf_counter() - t0
    rows = [r for r in read_jsonl(cfg.run_dir / "metrics.jsonl") if "loss" in r]
    return {"steps": summary["step"], "wall_s": wall, "tokens": sum(r["tokens"] for r in rows),
            "heldout_acc": summary.get("heldout_acc"), "status": summary["status"], "params": params}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = ap.parse_args()
    out = pathlib.Path(tempfile.mkdtemp(prefix="tta_"))
    results = []
    for seed in a.seeds:
        m = minimal_loop.main(target=0.95, batch=128, lr=3e-3, max_steps=5000, eval_every=100, seed=seed, threads=1)
        t = run_trainer(seed, out)
        results.append({"seed": seed, "minimal": m, "trainer": t, "ratio_wall": t["wall_s"] / m["wall_s"]})
        print(json.dumps(results[-1]), flush=True)
    summary = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads available, torch {torch.__version__}",
        "target": 0.95, "runs": results,
        "median_ratio_wall": sorted(r["ratio_wall"] for r in results)[len(results) // 2],
    }
    rdir = HERE / "results"
    rdir.mkdir(exist_ok=True)
    (rdir / "time_to_accuracy.json").write_text(json.dumps(summary, indent=1))
    lines = ["# Time to 95% held-out exact match, 3-digit addition, CPU (1 torch thread each)", "",
             f"Command: `python benchmarks/time_to_accuracy.py --seeds {' '.join(map(str, a.seeds))}`", "",
             "| seed | loop | steps | wall s | tokens | held-out acc | params |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for k in ("minimal", "trainer"):
            x = r[k]
            lines.append(f"| {r['seed']} | {k} | {x['steps']} | {x['wall_s']:.0f} | {x['tokens']:,} | {x['heldout_acc']:.3f} | {x['params']:,} |")
    lines += ["", f"Trainer / minimal wall-time ratio (median over seeds): **{summary['median_ratio_wall']:.2f}×** (target ≤ 1.5×)."]
    (rdir / "time_to_accuracy.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({"median_ratio_wall": summary["median_ratio_wall"]}))


if __name__ == "__main__":
    main()
