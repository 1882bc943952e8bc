"""GRPO improves held-out accuracy where SFT alone plateaus: countdown on the built-in model.

Phase 1 trains by SFT on constructed solutions until the curve flattens. From the same final
checkpoint (fork_mode=full: weights, optimiser, data cursor and RNG), two branches run for the
same number of steps: the control keeps doing SFT, the treatment switches to GRPO (any expression
that reaches the target is rewarded, not only the constructed one). Held-out accuracy (greedy,
the task's own verifier, a fixed held-out set) is plotted for the three segments.

    python benchmarks/grpo_after_sft.py [--sft-steps 1500] [--branch-steps 300]

Writes benchmarks/results/grpo_after_sft.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]  # benchmarks/kernels must not shadow kernels

from trainer.config import RunConfig  # noqa: E402
from trainer.loop import Trainer  # noqa: E402
from trainer.runlog import read_jsonl  # noqa: E402

BASE = {
    "seed": 0,
    "task": {"name": "countdown"},
    "model": {"kind": "builtin", "d_model": 128, "n_layers": 4, "n_heads": 4, "max_seq_len": 48},
    "harness": {"template": "{question}:", "answer": {"stop": "\n"},
                "sampling": {"temperature": 1.0, "max_new_tokens": 20}, "curriculum": {"start": 3}},
    "checkpoint": {"interval": 0, "keep_last": 1},
    "threads": 1,
    "samples_per_step": 2,
}


def run(out: pathlib.Path, name: str, recipe: dict, fork: str | None = None) -> tuple[list[dict], float]:
    cfg = RunConfig.parse({**BASE, "name": name, "out_dir": str(out), "recipe": recipe,
                           **({"fork_from": fork} if fork else {})})
    t0 = time.perf_counter()
    Trainer(cfg).run()
    rows = [r for r in read_jsonl(cfg.run_dir / "metrics.jsonl") if "heldout_acc" in r]
    return rows, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sft-steps", type=int, default=1500)
    ap.add_argument("--branch-steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--grpo-lr", type=float, default=2e-4)
    ap.add_argument("--grpo-batch", type=int, default=32)
    a = ap.parse_args()
    out = pathlib.Path(tempfile.mkdtemp(prefix="grpo_after_sft_"))
    common = {"eval_interval": a.eval_every, "eval_size": 300, "schedule": "constant", "warmup_steps": 0}
    sft = {**common, "algorithm": "sft", "lr": 3e-3, "batch_size": 128}
    total = a.sft_steps + a.branch_steps
    phase1, t1 = run(out, "sft", {**sft, "steps": a.sft_steps})
    ckpt = str(sorted((out / "sft" / "checkpoints").glob("*.pt"))[-1])
    control, t2 = run(out, "sft_more", {**sft, "steps": total}, fork=ckpt)
    grpo = {**common, "algorithm": "grpo", "lr": a.grpo_lr, "batch_size": a.grpo_batch, "group_size": 8,
            "kl_coef": 0.0, "steps": total, "eval_interval": max(1, a.eval_every // 4)}
    treat, t3 = run(out, "grpo", grpo, fork=ckpt)
    res = {
        "task": "countdown difficulty 3", "grpo": {"lr": a.grpo_lr, "batch_size": a.grpo_batch, "group_size": 8}, "sft_steps": a.sft_steps, "branch_steps": a.branch_steps,
        "phase1": [(r["step"], r["heldout_acc"]) for r in phase1],
        "control_sft": [(r["step"], r["heldout_acc"]) for r in control],
        "grpo_curve": [(r["step"], r["heldout_acc"]) for r in treat],
        "wall_s": {"sft": t1, "control_sft": t2, "grpo": t3},
    }
    res["final"] = {"sft_plateau": res["phase1"][-1][1], "control_sft": res["control_sft"][-1][1], "grpo": res["grpo_curve"][-1][1]}
    rdir = HERE / "results"
    rdir.mkdir(exist_ok=True)
    (rdir / "grpo_after_sft.json").write_text(json.dumps(res, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("phase1", "SFT"), ("control_sft", "SFT continued (control)"), ("grpo_curve", "GRPO from the SFT checkpoint")):
        xs, ys = zip(*res[key])
        ax.plot(xs, ys, marker=".", label=label)
    ax.axvline(a.sft_steps, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("countdown (3 numbers), built-in 0.8M model, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(rdir / "grpo_after_sft.png", dpi=120)
    f = res["final"]
    (rdir / "grpo_after_sft.md").write_text(
        f"# GRPO after SFT on countdown\n\nCommand: `python benchmarks/grpo_after_sft.py --sft-steps {a.sft_steps} "
        f"--branch-steps {a.branch_steps} --grpo-lr {a.grpo_lr} --grpo-batch {a.grpo_batch}`\n\n| segment | held-out accuracy at the end |\n|---|---|\n"
        f"| SFT, {a.sft_steps} steps | {f['sft_plateau']:.3f} |\n| + {a.branch_steps} more SFT steps (control) | {f['control_sft']:.3f} |\n"
        f"| + {a.branch_steps} GRPO steps | {f['grpo']:.3f} |\n\nWall time (s): " + json.dumps({k: round(v) for k, v in res["wall_s"].items()})
        + "\n\n![curves](grpo_after_sft.png)\n")
    print(json.dumps(res["final"]))


if __name__ == "__main__":
    main()
