"""Memory retrieval benchmark: a real ChromaStore with the offline MiniLM embedder holding a
library of 1,000 skills and 10,000 episodes.

Measures
- build: insert throughput (records/s) for skills (`index_skills`) and episodes
  (`record_episodes`: log append + embed + chroma upsert), and how much of it is embedding;
- reopen: `Memory.open` on the built root (the integrity check reads every id back);
- latency of `search_skills(text, n=5)` and `similar_episodes(text, n=5, where={"task": ...})`
  (and, for the filter's cost, `similar_episodes(text, n=5)`) over `--queries` queries after a
  warm-up: median and p95, and the embedding share (the time inside the embedder divided by the
  call's time, per query, then the median).

Texts are synthetic but varied: templates over 15 diagnosis names x 6 intervention kinds x their
config fields x numbers x 8 tasks; queries are phrased differently from the stored documents.

    nice .venv/bin/python benchmarks/memory/bench_retrieval.py             # results/<date>-<n>cpu.{json,csv}
    nice .venv/bin/python benchmarks/memory/bench_retrieval.py --root /tmp/benchmem   # keep the index...
    nice .venv/bin/python benchmarks/memory/bench_retrieval.py --root /tmp/benchmem   # ...queries only: -queries.json
    .venv/bin/python benchmarks/memory/bench_retrieval.py --skills 100 --episodes 500 --queries 20

Results are committed in benchmarks/memory/results/ with a summary in results.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path = [p for p in sys.path if Path(p).resolve() != Path(__file__).parent.resolve()]
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from memory import Episode, Memory, minilm_embedder  # noqa: E402
from memory.episodes import signature  # noqa: E402

HERE = Path(__file__).resolve().parent

# diagnosis -> (symptom phrasings, the metric it shows in)
DIAGNOSES: dict[str, tuple[list[str], str]] = {
    "truncation": (["answers cut off at the token limit", "completions end mid-answer",
                    "truncation_rate {x:.2f} of samples hit max_new_tokens"], "truncation_rate"),
    "loss_spike": (["loss jumped {r}x within a few steps", "training loss spiked at step {s}"], "loss"),
    "not_learning": (["held-out accuracy flat at {x:.2f} for {s} steps", "loss not decreasing"], "heldout_acc"),
    "overfitting": (["train accuracy {x:.2f} but held-out stalls", "gap between train and eval grows"], "gap"),
    "reward_hacking": (["reward rises while accuracy falls", "policy exploits the format reward"], "reward"),
    "format_errors": (["{p}% of answers unparseable", "answers miss the required format"], "parse_rate"),
    "entropy_collapse": (["policy entropy fell to {x:.2f}", "samples in a group are identical"], "entropy"),
    "grad_explosion": (["gradient norm {r}00 and rising", "grad_norm spikes before NaN"], "grad_norm"),
    "nan_loss": (["loss became NaN at step {s}", "non-finite loss"], "loss"),
    "slow_throughput": (["{r} samples/s, below budget", "steps take {r}x longer than baseline"], "throughput"),
    "kl_blowup": (["KL to reference {x:.2f} and climbing", "policy drifts from the reference"], "kl"),
    "curriculum_stall": (["stuck at difficulty {r} for {s} steps", "curriculum never advances"], "difficulty"),
    "eval_noise": (["held-out accuracy swings ±{x:.2f} between evals", "eval too small to trust"], "heldout_acc"),
    "memory_pressure": (["RSS at {p}% of the limit", "out-of-memory kills at batch {b}"], "rss"),
    "reward_sparse": (["{p}% of groups get zero reward", "no signal in most groups"], "reward"),
}
KINDS: dict[str, list[tuple[str, list[Any]]]] = {
    "harness_edit": [("harness.sampling.max_new_tokens", [8, 12, 16, 24, 32, 64]),
                     ("harness.sampling.temperature", [0.6, 0.8, 1.0, 1.2]),
                     ("harness.curriculum.start", [2, 3, 4]), ("harness.answer.reverse_digits", [True, False])],
    "recipe_edit": [("recipe.lr", [1e-4, 3e-4, 1e-3, 3e-3]), ("recipe.batch_size", [16, 32, 64, 128]),
                    ("recipe.warmup_steps", [0, 10, 50, 100]), ("recipe.group_size", [4, 8, 16]),
                    ("recipe.kl_coef", [0.0, 0.01, 0.05, 0.1]), ("recipe.grad_clip", [0.5, 1.0, 5.0])],
    "model_edit": [("model.d_model", [64, 128, 256]), ("model.n_layers", [2, 4, 6]), ("model.dropout", [0.0, 0.1, 0.2])],
    "data_edit": [("task.difficulty", [2, 3, 4, 5]), ("task.mix.reverse", [0.1, 0.25, 0.5]), ("eval.size", [64, 256, 1024])],
    "reward_edit": [("reward.format_weight", [0.0, 0.1, 0.5]), ("reward.partial_credit", [True, False])],
    "infra_edit": [("threads", [1, 2, 4]), ("checkpoint.interval", [50, 100, 500]), ("samples_per_step", [0, 4, 16])],
}
TASKS = ["addition", "reverse", "countdown", "code", "sort", "multiplication", "gsm_symbolic", "parity"]
OPERATORS = ["diagnostics", "recipe_tuner", "harness_tuner", "curriculum", "infra"]
VERBS = ["raise", "lower", "set", "switch", "tune", "reset"]
QUERY_FORMS = [
    "what fixed {symptom} on {task}?", "{symptom} — which {field} change helped?",
    "past interventions for {diag} with {field}", "how to handle {symptom} when training {task}",
    "{task}: {symptom}; should I change {field}?",
]


def fill(template: str, rng: random.Random) -> str:
    return template.format(x=rng.random(), r=rng.randint(2, 60), s=rng.randint(10, 5000),
                           p=rng.randint(5, 95), b=rng.choice([8, 16, 32, 64]))


def make_skill(i: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    diag = rng.choice(list(DIAGNOSES))
    kind = rng.choice(list(KINDS))
    field, values = rng.choice(KINDS[kind])
    symptom = fill(rng.choice(DIAGNOSES[diag][0]), rng)
    task = rng.choice(TASKS)
    name = f"{rng.choice(VERBS)}-{field.rsplit('.', 1)[-1].replace('_', '-')}-for-{diag.replace('_', '-')}-{i}"
    doc = (f"# {name}\nWhen {symptom} ({diag}) on {task}-like tasks, {rng.choice(VERBS)} {field} "
           f"to {rng.choice(values)} via a {kind}. Check {DIAGNOSES[diag][1]} after {rng.randint(20, 400)} steps; "
           f"roll back if it does not improve by {rng.uniform(0.01, 0.2):.2f}.")
    return name, doc, {"diagnosis": diag, "kind": kind, "uses": rng.randint(0, 50), "task": task}


def make_episode(i: int, rng: random.Random) -> Episode:
    diag = rng.choice(list(DIAGNOSES))
    kind = rng.choice(list(KINDS))
    fields = rng.sample(KINDS[kind], k=rng.randint(1, min(2, len(KINDS[kind]))))
    changes = {f: rng.choice(v) for f, v in fields}
    outcome = rng.choice(["kept", "rolled_back", "rejected"])
    effect = None if rng.random() < 0.1 else round(rng.gauss(0.02 if outcome == "kept" else -0.01, 0.05), 4)
    ws = f"ws{rng.randint(0, 49)}"
    metric = DIAGNOSES[diag][1]
    return Episode(
        id=f"{ws}/iv-{i}", workspace=ws, task=rng.choice(TASKS), operator=rng.choice(OPERATORS),
        policy=rng.choice(["builtin", "llm"]), diagnosis=diag,
        diagnosis_summary=fill(rng.choice(DIAGNOSES[diag][0]), rng), kind=kind, changes=changes,
        signature=signature(diag, kind, changes), outcome=outcome, effect=effect,
        p_value=None if effect is None else round(rng.random(), 3),
        window={"rows": [{"step": s, metric: rng.random()} for s in range(0, 50, 10)]},
        step=rng.randint(0, 5000), time=1.7e9 + i)


def make_query(rng: random.Random) -> tuple[str, str]:
    diag = rng.choice(list(DIAGNOSES))
    kind = rng.choice(list(KINDS))
    field = rng.choice(KINDS[kind])[0]
    task = rng.choice(TASKS)
    text = rng.choice(QUERY_FORMS).format(symptom=fill(rng.choice(DIAGNOSES[diag][0]), rng), task=task,
                                          field=field, diag=diag.replace("_", " "))
    return text, task


class TimedEmbedder:
    """The MiniLM embedder, with the seconds spent inside it counted."""

    def __init__(self) -> None:
        self.inner = minilm_embedder()
        self.name = self.inner.name
        self.seconds = 0.0
        self.texts = 0

    def __call__(self, texts: list[str]) -> list[list[float]]:
        t0 = time.perf_counter()
        out = self.inner(texts)
        self.seconds += time.perf_counter() - t0
        self.texts += len(texts)
        return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def progress(label: str, done: int, total: int, t0: float) -> None:
    rate = done / max(time.perf_counter() - t0, 1e-9)
    end = "\n" if done == total else ""
    print(f"\r{label}: {done}/{total} ({rate:.0f}/s)", end=end, flush=True)


def timed_queries(fn, queries: list[tuple[str, str]], emb: TimedEmbedder) -> list[dict[str, float]]:
    rows = []
    for text, task in queries:
        e0 = emb.seconds
        t0 = time.perf_counter()
        out = fn(text, task)
        dt = time.perf_counter() - t0
        assert out, f"no results for {text!r}"
        rows.append({"latency_ms": dt * 1e3, "embed_ms": (emb.seconds - e0) * 1e3})
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    lat = [r["latency_ms"] for r in rows]
    share = [r["embed_ms"] / r["latency_ms"] for r in rows]
    return {"median_ms": round(statistics.median(lat), 2), "p95_ms": round(pct(lat, 0.95), 2),
            "mean_ms": round(statistics.fmean(lat), 2),
            "embed_median_ms": round(statistics.median(r["embed_ms"] for r in rows), 2),
            "embed_share_median": round(statistics.median(share), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skills", type=int, default=1000)
    ap.add_argument("--episodes", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=500, help="episodes per record_episodes call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default=None, help="memory root (default: a temp dir, removed after); "
                    "if it already holds this benchmark's library, the build is skipped (query phase only)")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch threads for the embedder (0: torch's default)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()

    rng = random.Random(args.seed)
    skills = [make_skill(i, rng) for i in range(args.skills)]
    episodes = [make_episode(i, rng) for i in range(args.episodes)]
    queries = [make_query(rng) for _ in range(args.warmup + args.queries)]
    tmp = None if args.root else tempfile.mkdtemp(prefix="bench-memory-")
    root = Path(args.root or tmp) / "memory"
    load_avg_before = os.getloadavg()

    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    emb = TimedEmbedder()
    t0 = time.perf_counter()
    emb(["load the model"])
    model_load_s = time.perf_counter() - t0
    print(f"model loaded in {model_load_s:.1f} s; memory root {root}")

    mem = Memory.open(root, embedder=emb)
    reuse = (mem.store.count("skills") == len(skills) and len(mem.episodes()) == len(episodes)
             and mem.episode(episodes[-1].id) is not None)
    build: dict[str, Any] = {"reused": str(root)} if reuse else {}
    if not reuse:
        e0, t0 = emb.seconds, time.perf_counter()
        for s in range(0, len(skills), args.chunk):
            mem.index_skills(skills[s:s + args.chunk])
            progress("skills", min(s + args.chunk, len(skills)), len(skills), t0)
        skills_s, skills_embed_s = time.perf_counter() - t0, emb.seconds - e0
        e0, t0 = emb.seconds, time.perf_counter()
        for s in range(0, len(episodes), args.chunk):
            mem.record_episodes(episodes[s:s + args.chunk])
            progress("episodes", min(s + args.chunk, len(episodes)), len(episodes), t0)
        eps_s, eps_embed_s = time.perf_counter() - t0, emb.seconds - e0
        build = {
            "skills": {"n": len(skills), "seconds": round(skills_s, 2), "per_s": round(len(skills) / skills_s, 1),
                       "embed_share": round(skills_embed_s / skills_s, 3)},
            "episodes": {"n": len(episodes), "seconds": round(eps_s, 2), "per_s": round(len(episodes) / eps_s, 1),
                         "embed_share": round(eps_embed_s / eps_s, 3)},
        }
    mem.close()

    t0 = time.perf_counter()
    mem = Memory.open(root, embedder=emb)
    reopen_s = time.perf_counter() - t0
    assert mem.rebuilt is None, mem.rebuilt
    assert mem.store.count("episodes") == len(episodes) and mem.store.count("skills") == len(skills)

    def skills_q(text: str, task: str) -> list:
        return mem.search_skills(text, n=5)

    def episodes_q(text: str, task: str) -> list:
        return mem.similar_episodes(text, n=5, where={"task": task})

    def episodes_all_q(text: str, task: str) -> list:
        return mem.similar_episodes(text, n=5)

    warm, timed = queries[:args.warmup], queries[args.warmup:]
    for fn in (skills_q, episodes_q, episodes_all_q):
        timed_queries(fn, warm, emb)
    rows_s = timed_queries(skills_q, timed, emb)
    rows_e = timed_queries(episodes_q, timed, emb)
    rows_a = timed_queries(episodes_all_q, timed, emb)
    mem.close()
    index_mb = sum(f.stat().st_size for f in (root / "chroma").rglob("*") if f.is_file()) / 2**20
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)

    import chromadb

    result = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
                    "chromadb": chromadb.__version__, "load_avg_before": [round(x, 2) for x in load_avg_before],
                    "load_avg_after": [round(x, 2) for x in os.getloadavg()]},
        "config": vars(args),
        "model_load_s": round(model_load_s, 2),
        "build": build,
        "reopen_s": round(reopen_s, 3),
        "index_mb": round(index_mb, 1),
        "search_skills_n5": summary(rows_s),
        "similar_episodes_n5_where_task": summary(rows_e),
        "similar_episodes_n5_no_filter": summary(rows_a),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{datetime.date.today().isoformat()}-{os.cpu_count()}cpu" + ("-queries" if reuse else "")
    if args.torch_threads:
        tag += f"-t{args.torch_threads}"
    (out / f"{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    with (out / f"{tag}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["call", "query", "task", "latency_ms", "embed_ms"])
        for call, rows in (("search_skills", rows_s), ("similar_episodes_where_task", rows_e),
                           ("similar_episodes", rows_a)):
            for (text, task), r in zip(timed, rows):
                w.writerow([call, text, task, round(r["latency_ms"], 3), round(r["embed_ms"], 3)])
    print(json.dumps(result, indent=2))
    print(f"wrote {out / tag}.json and .csv")


if __name__ == "__main__":
    main()
