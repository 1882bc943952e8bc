"""RMSNorm forward + backward on CPU: the torch expression vs the fused C kernel (kernels/cpu.py),
with PyTorch's fused LayerNorm as a yardstick, one torch thread, arms interleaved per round.

Shapes: the addition example's activations (batch 128 x 13 tokens x 128 features) and a wider
one. Claims are ratios of medians over rounds (the machine is shared).

    python benchmarks/rmsnorm_cpu.py [--rounds 7 --iters 200]

Writes benchmarks/results/rmsnorm_cpu.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from kernels import cpu, reference  # noqa: E402


def time_arm(f, x, w, g, iters: int) -> float:
    for _ in range(10):
        f(x, w).backward(g)
    t = time.perf_counter()
    for _ in range(iters):
        f(x, w).backward(g)
    return (time.perf_counter() - t) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ok, reason = cpu.available()
    if not ok:
        raise SystemExit(f"the C kernel is not available here: {reason}")
    arms = {"torch expression": lambda x, w: reference.rms_norm(x, w, 1e-6),
            "fused C kernel": lambda x, w: cpu.rms_norm(x, w, 1e-6),
            "LayerNorm (torch, fused)": lambda x, w: F.layer_norm(x, (x.shape[-1],), w, None, 1e-6)}
    out = {"commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip(),
           "kernel": reason, "torch": torch.__version__, "shapes": {}}
    for shape in [(128, 13, 128), (64, 128, 512)]:
        g0 = torch.Generator().manual_seed(0)
        x = torch.randn(*shape, generator=g0).requires_grad_()
        w = (1 + 0.1 * torch.randn(shape[-1], generator=g0)).requires_grad_()
        g = torch.randn(*shape, generator=g0)
        res: dict[str, list[float]] = {k: [] for k in arms}
        for r in range(a.rounds):
            for k in (list(arms) if r % 2 == 0 else list(reversed(arms))):
                res[k].append(time_arm(arms[k], x, w, g, a.iters))
        med = {k: statistics.median(v) for k, v in res.items()}
        out["shapes"]["x".join(map(str, shape))] = {"ms": {k: 1e3 * v for k, v in med.items()},
                                                    "speedup_vs_torch": med["torch expression"] / med["fused C kernel"]}
        print(json.dumps(out["shapes"]["x".join(map(str, shape))]), flush=True)
    rdir = HERE / "results"
    (rdir / "rmsnorm_cpu.json").write_text(json.dumps(out, indent=1))
    lines = ["# RMSNorm forward + backward on CPU (one torch thread)", "",
             f"Command: `python benchmarks/rmsnorm_cpu.py --rounds {a.rounds} --iters {a.iters}` at {out['commit'][:10]}; "
             f"torch {out['torch']}; {reason}. Median over rounds of the mean time per call; arms interleaved, order "
             "alternating per round.", "",
             "| x shape | torch expression ms | fused C kernel ms | LayerNorm ms | C kernel speed-up |", "|---|---:|---:|---:|---:|"]
    for s, v in out["shapes"].items():
        ms = v["ms"]
        lines.append(f"| {s} | {ms['torch expression']:.3f} | {ms['fused C kernel']:.3f} | {ms['LayerNorm (torch, fused)']:.3f} | "
                     f"**{v['speedup_vs_torch']:.2f}×** |")
    (rdir / "rmsnorm_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
