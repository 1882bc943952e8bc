"""Speed and peak memory of the `kernels` ops against torch eager, torch.compile and Liger-Kernel.

What: one sweep over the four ops of `kernels` (fused_linear_logprobs, fused_linear_grpo_loss,
token_logprobs, rms_norm: headline ops first, so a run cut by the time budget keeps them), each
in two modes, "fwd" (forward under torch.no_grad(), as when computing old / reference
log-probs) and "fwd+bwd" (a training step), for hidden 896 / 2048 / 4096, vocab 32000 / 151936
and tokens 4096 / 16384, bfloat16.
Implementations: "triton" (ours), "eager" (the pure-torch reference in `kernels.reference`),
"compile" (that reference under torch.compile), "liger" (Liger-Kernel's equivalent, when
installed: cross-entropy with reduction="sum" = -sum(logp), LigerFusedLinearCrossEntropyLoss,
the chunked LigerFusedLinearGRPOLoss with loss_type="dapo" (token mean), LigerRMSNorm).

Why: the issue's targets on an H100/H200-class GPU: fused linear log-prob at <= 1/4 of eager's
peak memory at vocab 151k, and speed at or above Liger's equivalent.

How:
    python benchmarks/kernels/bench_kernels.py            # CUDA: the full sweep (budget 5 min)
    python benchmarks/kernels/bench_kernels.py --smoke    # CPU: a tiny config in Triton's interpreter

Time is the median of triton.testing.do_bench after its warm-up (CUDA) or of a few
perf_counter runs (--smoke). Peak memory is torch.cuda.max_memory_allocated() during one call,
minus what was allocated before it (inputs excluded); it is not measured on CPU.
Writes results.json, results.csv, results.md and results.png into --out
(default benchmarks/kernels/results/, or results/smoke/ with --smoke).
Runs that fail (OOM, a missing or incompatible Liger) are recorded with their status, not fatal.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OPS = ("fused_linear_logprobs", "fused_linear_grpo_loss", "token_logprobs", "rms_norm")  # headline ops first
IMPLS = ("triton", "eager", "compile", "liger")
MODES = ("fwd", "fwd+bwd")


@dataclass
class Row:
    op: str
    impl: str
    mode: str
    tokens: int
    hidden: int
    vocab: int
    dtype: str
    ms: float | None = None
    peak_mib: float | None = None
    status: str = "ok"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny CPU run under TRITON_INTERPRET=1 (proves the script)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default results/ or results/smoke/)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="ops to run")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS), help="implementations to run")
    p.add_argument("--tokens", nargs="+", type=int, default=None, help="token counts (default 4096 16384)")
    p.add_argument("--hidden", nargs="+", type=int, default=None, help="hidden sizes (default 896 2048 4096)")
    p.add_argument("--vocab", nargs="+", type=int, default=None, help="vocab sizes (default 32000 151936)")
    p.add_argument("--budget-min", type=float, default=5.0, help="skip the remaining configs past this many minutes")
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench measuring time per case, ms")
    args = p.parse_args(argv)
    small = args.smoke
    args.tokens = args.tokens or ([32] if small else [4096, 16384])
    args.hidden = args.hidden or ([32] if small else [896, 2048, 4096])
    args.vocab = args.vocab or ([500] if small else [32000, 151936])
    args.out = args.out or (HERE / "results" / "smoke" if small else HERE / "results")
    return args


# ------------------------------------------------------------------------------------ measuring

def time_ms(fn, device: torch.device, rep_ms: int) -> float:
    if device.type == "cuda":
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))
    fn()  # warm-up (and compile)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_mib(fn, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def clear_grads(tensors):
    for t in tensors:
        t.grad = None


# ------------------------------------------------------------------------------ implementations
# Each builder returns {impl: callable(inputs) -> scalar to backprop} or raises for "unavailable".

def _compiled(fn):
    return torch.compile(fn, dynamic=True)


def builders(op: str, kernels, reference):
    """Callables per implementation for `op`; each takes the inputs dict, returns a scalar."""
    if op == "token_logprobs":
        ref = lambda d: reference.token_logprobs(d["logits"], d["targets"])[0].sum()  # noqa: E731

        def compiled():
            comp = _compiled(reference.token_logprobs)
            return lambda d: comp(d["logits"], d["targets"])[0].sum()

        def liger():
            from liger_kernel.transformers import LigerCrossEntropyLoss
            ce = LigerCrossEntropyLoss(reduction="sum")
            return lambda d: -ce(d["logits"], d["targets"])

        return {
            "triton": lambda: lambda d: kernels.token_logprobs(d["logits"], d["targets"], "triton")[0].sum(),
            "eager": lambda: ref,
            "compile": compiled,
            "liger": liger,
        }
    if op == "fused_linear_logprobs":
        def compiled():
            comp = _compiled(reference.fused_linear_logprobs)
            return lambda d: comp(d["hidden"], d["weight"], d["targets"])[0].sum()

        def liger():
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
            flce = LigerFusedLinearCrossEntropyLoss(reduction="sum")
            return lambda d: -flce(d["weight"], d["hidden"], d["targets"])

        return {
            "triton": lambda: lambda d: kernels.fused_linear_logprobs(
                d["hidden"], d["weight"], d["targets"], "triton")[0].sum(),
            "eager": lambda: lambda d: reference.fused_linear_logprobs(d["hidden"], d["weight"], d["targets"])[0].sum(),
            "compile": compiled,
            "liger": liger,
        }
    if op == "fused_linear_grpo_loss":
        def ref_loss(d):
            return reference.fused_linear_grpo_loss(d["hidden3"], d["weight"], d["targets2"], d["old"], d["ref"],
                                                    d["adv_tok"], d["mask"], 0.2, 0.04)[0]

        def liger():
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
            loss = LigerFusedLinearGRPOLoss(beta=0.04, use_ref_model=True, epsilon_low=0.2, epsilon_high=0.2,
                                            loss_type="dapo")
            return lambda d: loss(d["hidden3"], d["weight"], d["targets2"], d["mask"], d["adv_seq"],
                                  ref_per_token_logps=d["ref"], old_per_token_logps=d["old"])[0]

        return {
            "triton": lambda: lambda d: kernels.fused_linear_grpo_loss(
                d["hidden3"], d["weight"], d["targets2"], d["old"], d["ref"], d["adv_seq"], d["mask"],
                0.2, 0.04, "triton")[0],
            "eager": lambda: ref_loss,
            "compile": lambda: _compiled(ref_loss),
            "liger": liger,
        }
    if op == "rms_norm":
        def compiled():
            comp = _compiled(reference.rms_norm)
            return lambda d: comp(d["x"], d["w"], 1e-6).float().sum()

        def liger():
            from liger_kernel.transformers import LigerRMSNorm
            norm = LigerRMSNorm(0, eps=1e-6)
            return lambda d: _liger_rms(norm, d)

        return {
            "triton": lambda: lambda d: kernels.rms_norm(d["x"], d["w"], 1e-6, "triton").float().sum(),
            "eager": lambda: lambda d: reference.rms_norm(d["x"], d["w"], 1e-6).float().sum(),
            "compile": compiled,
            "liger": liger,
        }
    raise ValueError(f"unknown op {op!r}")


def _liger_rms(norm, d):
    norm.weight = d["w_param"]  # share the benchmark's weight
    return norm(d["x"]).float().sum()


def make_inputs(op: str, n: int, h: int, v: int, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    targets = torch.randint(0, max(v, 1), (n,), generator=g).to(device)
    if op == "token_logprobs":
        return {"logits": randn(n, v, scale=2.0).requires_grad_(), "targets": targets}, ["logits"]
    if op == "fused_linear_logprobs":
        return {"hidden": randn(n, h).requires_grad_(), "weight": randn(v, h, scale=h ** -0.5).requires_grad_(),
                "targets": targets}, ["hidden", "weight"]
    if op == "fused_linear_grpo_loss":
        b = 16 if n % 16 == 0 else 1
        t = n // b
        lengths = torch.randint(max(1, t // 2), t + 1, (b,), generator=g)
        mask = (torch.arange(t)[None, :] < lengths[:, None]).float().to(device)  # right padding
        old = (torch.randn(b, t, generator=g) * 0.5 - 8).to(device)
        ref = old + 0.1 * torch.randn(b, t, generator=g).to(device)
        adv = torch.randn(b, generator=g).to(device)
        return {"hidden3": randn(b, t, h).requires_grad_(),
                "weight": randn(v, h, scale=h ** -0.5).requires_grad_(),
                "targets2": targets.view(b, t), "old": old, "ref": ref, "mask": mask,
                "adv_seq": adv, "adv_tok": adv[:, None].expand(b, t)}, ["hidden3", "weight"]
    if op == "rms_norm":
        w = torch.nn.Parameter((1 + 0.1 * torch.randn(h, generator=g)).to(device=device, dtype=dtype))
        return {"x": randn(n, h).requires_grad_(), "w": w, "w_param": w}, ["x", "w"]
    raise ValueError(op)


def configs(op: str, args):
    if op == "token_logprobs":
        return [(n, 0, v) for v in args.vocab for n in args.tokens]
    if op == "rms_norm":
        return [(n, h, 0) for h in args.hidden for n in args.tokens]
    return [(n, h, v) for v in args.vocab for h in args.hidden for n in args.tokens]


# -------------------------------------------------------------------------------------- the run

def run(args) -> tuple[list[Row], dict]:
    import kernels
    from kernels import reference

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    meta = environment(device)
    meta["dtype"] = str(dtype).replace("torch.", "")
    meta["skipped_impls"] = {}
    rows: list[Row] = []
    t_start = time.monotonic()
    for op in args.ops:
        impls = {}
        for name, build in builders(op, kernels, reference).items():
            if name not in args.impls:
                continue
            try:
                impls[name] = build()
            except ImportError as exc:
                meta["skipped_impls"][f"{op}/{name}"] = f"not installed ({exc.name or exc})"
        for n, h, v in configs(op, args):
            over = (time.monotonic() - t_start) / 60 > args.budget_min
            inputs, leaves = (None, []) if over else make_inputs(op, n, h, v, dtype, device)
            for name, fn in impls.items():
                for mode in MODES:
                    row = Row(op, name, mode, n, h, v, meta["dtype"])
                    if over:
                        row.status = f"skipped: past the {args.budget_min} min budget"
                    else:
                        measure(row, fn, inputs, leaves, device, args.rep_ms)
                    rows.append(row)
                    print(f"{op:24s} {name:8s} {mode:8s} N={n:<6d} H={h:<5d} V={v:<7d} "
                          f"{fmt(row.ms, '.3f')} ms  {fmt(row.peak_mib, '.1f')} MiB  {row.status}", flush=True)
            del inputs
            if device.type == "cuda":
                torch.cuda.empty_cache()
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    return rows, meta


def measure(row: Row, fn, inputs, leaves, device, rep_ms: int) -> None:
    grads = [inputs[k] for k in leaves]

    def fwd():
        with torch.no_grad():
            fn(inputs)

    def fwd_bwd():
        clear_grads(grads)
        fn(inputs).backward()

    step = fwd if row.mode == "fwd" else fwd_bwd
    try:
        step()  # first call: compile / autotune outside the measurement
        row.peak_mib = peak_mib(step, device)
        row.ms = time_ms(step, device, rep_ms)
    except torch.cuda.OutOfMemoryError:
        row.status = "OOM"
    except Exception as exc:  # boundary: a failing implementation becomes a row, the sweep goes on
        row.status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    finally:
        clear_grads(grads)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def environment(device: torch.device) -> dict:
    import triton
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
    }
    try:
        import liger_kernel  # noqa: F401
        from importlib.metadata import version
        meta["liger_kernel"] = version("liger-kernel")
    except Exception:  # boundary: absent or broken install is recorded, not fatal
        meta["liger_kernel"] = None
    return meta


# -------------------------------------------------------------------------------------- outputs

def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def write_outputs(rows: list[Row], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0]).keys()) if rows else ["op"])
        w.writeheader()
        w.writerows(asdict(r) for r in rows)
    (out / "results.md").write_text(markdown(rows, meta))
    plot(rows, out / "results.png")
    print(f"wrote {out}/results.{{json,csv,md,png}}")


def markdown(rows: list[Row], meta: dict) -> str:
    lines = [f"# Kernel benchmarks: {meta['device']}", "",
             ", ".join(f"{k} {v}" for k, v in meta.items() if k in ("date", "torch", "triton", "liger_kernel", "dtype"))
             + f"; sweep wall time {meta.get('wall_s')} s.", "",
             "Each cell: median ms / peak MiB above the inputs. fwd runs under torch.no_grad(); "
             "fwd+bwd is a training step.", ""]
    if meta.get("skipped_impls"):
        lines += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in meta["skipped_impls"].items()), ""]
    lines += targets(rows)
    for op in OPS:
        op_rows = [r for r in rows if r.op == op]
        if not op_rows:
            continue
        impls = [i for i in IMPLS if any(r.impl == i for r in op_rows)]
        lines += [f"## {op}", "", "| tokens | hidden | vocab | mode | " + " | ".join(impls) + " |",
                  "|---:|---:|---:|---|" + "---:|" * len(impls)]
        keys = sorted({(r.tokens, r.hidden, r.vocab, r.mode) for r in op_rows})
        for key in keys:
            cells = []
            for impl in impls:
                r = next((r for r in op_rows if (r.tokens, r.hidden, r.vocab, r.mode) == key and r.impl == impl), None)
                if r is None:
                    cells.append("")
                elif r.status != "ok":
                    cells.append(r.status.split(":")[0])
                else:
                    cells.append(f"{fmt(r.ms, '.2f')} / {fmt(r.peak_mib, '.0f')}")
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def targets(rows: list[Row]) -> list[str]:
    """The issue's two targets at the largest vocabulary: peak memory vs eager, time vs Liger."""
    def get(op, mode, impl, key):
        return next((r for r in rows if (r.op, r.mode, r.impl) == (op, mode, impl)
                     and (r.tokens, r.hidden, r.vocab) == key and r.status == "ok"), None)
    out = ["## Targets at the largest vocabulary", "",
           "| op | mode | tokens | hidden | vocab | peak vs eager (target <= 0.25) | Liger ms / ours (target >= 1) |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for op in ("fused_linear_logprobs", "fused_linear_grpo_loss"):
        keys = sorted({(r.tokens, r.hidden, r.vocab) for r in rows if r.op == op})
        if not keys:
            continue
        vmax = max(k[2] for k in keys)
        for mode in MODES:
            for key in (k for k in keys if k[2] == vmax):
                ours, eager, liger = (get(op, mode, impl, key) for impl in ("triton", "eager", "liger"))
                mem = (f"{ours.peak_mib / eager.peak_mib:.2f}" if ours and eager and ours.peak_mib
                       and eager.peak_mib else "-")
                speed = f"{liger.ms / ours.ms:.2f}" if ours and liger and ours.ms and liger.ms else "-"
                out.append(f"| {op} | {mode} | {key[0]} | {key[1]} | {key[2]} | {mem} | {speed} |")
    return out + [""] if len(out) > 4 else []


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in ("fused_linear_logprobs", "fused_linear_grpo_loss") if any(r.op == op for r in rows)]
    ops = ops or [op for op in OPS if any(r.op == op for r in rows)][:1]
    fig, axes = plt.subplots(max(1, len(ops)), 2, figsize=(14, 4.5 * max(1, len(ops))), squeeze=False)
    for i, op in enumerate(ops):
        op_rows = [r for r in rows if r.op == op and r.mode == "fwd+bwd"]
        keys = sorted({(r.tokens, r.hidden, r.vocab) for r in op_rows})
        impls = [m for m in IMPLS if any(r.impl == m for r in op_rows)]
        width = 0.8 / max(1, len(impls))
        for col, (field, label) in enumerate((("ms", "fwd+bwd time, ms"), ("peak_mib", "fwd+bwd peak, MiB"))):
            ax = axes[i][col]
            for j, impl in enumerate(impls):
                vals = []
                for key in keys:
                    r = next((r for r in op_rows if r.impl == impl and (r.tokens, r.hidden, r.vocab) == key), None)
                    vals.append(getattr(r, field) if r is not None and getattr(r, field) is not None else 0.0)
                ax.bar([k + j * width for k in range(len(keys))], vals, width, label=impl)
            ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
            ax.set_xticklabels([f"N{n}\nH{h}\nV{v}" for n, h, v in keys], fontsize=7)
            ax.set_title(f"{op}: {label}")
            if any(getattr(r, field) for r in op_rows):
                ax.set_yscale("log")
            else:
                ax.text(0.5, 0.5, "not measured (no CUDA)", ha="center", transform=ax.transAxes)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        if not args.smoke:
            print("bench_kernels: no CUDA device; the benchmark needs a GPU. "
                  "Run with --smoke for a tiny CPU check of the script under Triton's interpreter.", file=sys.stderr)
            return 2
        # Triton reads TRITON_INTERPRET when kernels are decorated, i.e. when kernels.ops is imported.
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    rows, meta = run(args)
    write_outputs(rows, meta, args.out)
    failed = [r for r in rows if r.impl == "triton" and r.status != "ok" and not r.status.startswith("skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
