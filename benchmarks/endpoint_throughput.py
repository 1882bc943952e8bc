"""Policy endpoint throughput: generated tokens/s through HTTP vs in-process generation, same batch.

Issue 30's target: tokens/s through the OpenAI-compatible endpoint (`trainer.endpoint.EndpointServer`)
≥ 0.8× in-process generation on the same batch. The batch is `--batch` first-turn prompts of the
agent environment (`--env`, default lookup; the example agents' harness, system prompt
"Tools: get(key)."), the policy the agent trainer's built-in model (optionally after `--sft-steps`
of warm-up, so its turns look like an agent's), sampled under the harness's sampling (temperature,
`max_new_tokens`) on both sides, one torch thread.

    in-process   one `Policy.generate` over the batch (what the trainer's batched rollout,
                 `trainer.agent_batching`, does for episodes waiting together), stop strings cut
    HTTP         one `POST /v1/chat/completions` per prompt, all sent at once from an
                 `openai.AsyncOpenAI` client (as concurrent agents make them), bearer token,
                 loopback; the endpoint renders, generates, computes the completion's log-probs
                 (it records them) and appends a log line per call

The prompts of the in-process side are the ids the endpoint rendered for those requests (read back
from its log), so both sides generate from the same ids. Generated tokens are counted after the
stop-string cut on both sides (the endpoint's `usage.completion_tokens`).

Rounds are interleaved (A B, B A, A B, ...: the side that goes first alternates), after one
uncounted round of each. A round's ratio is HTTP tokens/s over in-process tokens/s, in wall time
and in this process's CPU time (`time.process_time`: every thread here, clients included; the other
tenants of a shared machine disturb it less than wall time). The report gives the median ratio, its
min–max and interquartile range over rounds, the verdict against 0.8×, and where the endpoint's time
goes (its own generate / log-prob timers when it has them).

    .venv/bin/python benchmarks/endpoint_throughput.py                     # 16 prompts, 7 rounds
    .venv/bin/python benchmarks/endpoint_throughput.py --batch 8 --rounds 3 --out /tmp/ep.md
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from examples.agents.endpoint_training import openai_tools  # noqa: E402
from trainer.agent_rollout import PolicyGenerator, cut_at_stop  # noqa: E402
from trainer.agent_train import AgentTrainConfig, AgentTrainer  # noqa: E402
from trainer.endpoint import EndpointServer, read_log  # noqa: E402

TARGET = 0.8


def in_process(gen: PolicyGenerator, prompts: list[list[int]], max_new: int, temperature: float,
               stop: list[str]) -> int:
    """One batched generation of `prompts`; generated tokens after the stop-string cut."""
    singles = {ids[0] for ids in (gen.tok.encode(s) for s in stop) if len(ids) == 1}
    comps, _ = gen.policy.generate(prompts, max_new, temperature=temperature, top_p=gen.top_p, stop_ids=singles,
                                   generator=gen.rng)
    return sum(len(cut_at_stop(gen.tok, c, stop)[0]) for c in comps)


class HttpClients:
    """One `openai.AsyncOpenAI` client and one event loop for the whole benchmark, as a running agent
    holds its client (a new client costs tens of ms: it loads the CA bundle and opens connections)."""

    def __init__(self, url: str, token: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = self.loop.run_until_complete(self._make(url, token))

    @staticmethod
    async def _make(url: str, token: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=600)

    def send(self, requests: list[dict[str, Any]]) -> int:
        async def all_at_once() -> int:
            rs = await asyncio.gather(*(self.client.chat.completions.create(**r) for r in requests))
            return sum(r.usage.completion_tokens for r in rs)

        return self.loop.run_until_complete(all_at_once())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


def over_http(clients: HttpClients, questions: list[str], tools: list[dict[str, Any]], tag: str) -> int:
    """One request per question, all at once; generated tokens (the endpoint's usage)."""
    return clients.send([{"model": "policy", "messages": [{"role": "user", "content": q}], "tools": tools,
                          "user": f"{tag}-{i}"} for i, q in enumerate(questions)])


def timed(fn: Any) -> tuple[int, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    n = fn()
    return n, time.perf_counter() - w0, time.process_time() - c0


def spread(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "q1": q[0], "q3": q[2]}


def run(a: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(a.threads)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="endpoint-throughput-"))
    cfg = AgentTrainConfig.parse({"env": a.env, "seed": a.seed, "out_dir": str(tmp), "name": "bench",
                                  "threads": a.threads, "system_prompt": "Tools: get(key).",
                                  "sft": {"steps": a.sft_steps, "lr": 3e-3}, "grpo": {"steps": 0}})
    tr = AgentTrainer(cfg, printer=None)
    for i in range(a.sft_steps):
        tr.sft_step(i)
    h = tr.harness
    gen = PolicyGenerator(tr.policy, generator=torch.Generator().manual_seed(a.seed))
    questions = [tr.env.episode("train", i, cfg.difficulty).question for i in range(a.batch)]
    tools = openai_tools(tr.env)
    max_new, temperature, stop = h.sampling.max_new_tokens, h.sampling.temperature, list(h.stop)
    log = tmp / "trajectories.jsonl"
    rounds: list[dict[str, float]] = []
    with EndpointServer(gen, h, log) as srv, \
            EndpointServer(gen, h, tmp / "unbatched.jsonl", max_batch=1, batch_window_s=0.0) as one:
        clients, clients_one = HttpClients(srv.url, srv.token), HttpClients(one.url, one.token)
        over_http(clients, questions, tools, "setup")    # the prompts as the endpoint renders them
        prompts = [r["prompt_ids"] for r in read_log(log) if r["type"] == "call"]
        assert len(prompts) == a.batch, f"{len(prompts)} prompts logged for {a.batch} requests"

        def repeat(fn: Any) -> Any:
            return lambda: sum(fn(k) for k in range(a.reps))

        sides = {"in_process": repeat(lambda k: in_process(gen, prompts, max_new, temperature, stop)),
                 "http": repeat(lambda k: over_http(clients, questions, tools, f"r{len(rounds)}.{k}")),
                 "http_unbatched": repeat(lambda k: over_http(clients_one, questions, tools, f"r{len(rounds)}.{k}"))}
        for side in sides.values():                      # warm-up, uncounted
            timed(side)
        stats0 = dict(srv.stats)
        for r in range(a.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            got: dict[str, float] = {}
            for name in order:
                n, wall, cpu = timed(sides[name])
                got.update({f"{name}_tokens": n, f"{name}_wall_s": wall, f"{name}_cpu_s": cpu})
            for side in ("http", "http_unbatched"):
                for k in ("wall", "cpu"):
                    got[f"{side}_ratio_{k}"] = (got[f"{side}_tokens"] / got[f"{side}_{k}_s"]) / \
                        (got["in_process_tokens"] / got[f"in_process_{k}_s"])
            rounds.append(got)
            print(f"round {r}: in-process {got['in_process_tokens'] / got['in_process_wall_s']:.0f} tok/s, "
                  f"http {got['http_tokens'] / got['http_wall_s']:.0f} tok/s, ratio {got['http_ratio_wall']:.3f} "
                  f"(cpu {got['http_ratio_cpu']:.3f}); unbatched ratio {got['http_unbatched_ratio_wall']:.3f}",
                  flush=True)
        stats1 = dict(srv.stats)
        clients.close()
        clients_one.close()
    endpoint = {k: stats1[k] - stats0.get(k, 0) for k in stats1}
    ratio = spread([r["http_ratio_wall"] for r in rounds])
    return {
        "command": "python benchmarks/endpoint_throughput.py " + " ".join(sys.argv[1:]),
        "machine": machine(), "settings": {"env": a.env, "batch": a.batch, "rounds": a.rounds, "threads": a.threads,
                                           "sft_steps": a.sft_steps, "max_new_tokens": max_new, "reps": a.reps,
                                           "temperature": temperature, "seed": a.seed,
                                           "prompt_tokens": [len(p) for p in prompts][:1] + [max(len(p) for p in prompts)]},
        "rounds": rounds, "ratio_wall": ratio, "ratio_cpu": spread([r["http_ratio_cpu"] for r in rounds]),
        "unbatched_ratio_wall": spread([r["http_unbatched_ratio_wall"] for r in rounds]),
        "unbatched_ratio_cpu": spread([r["http_unbatched_ratio_cpu"] for r in rounds]),
        "in_process_tok_s": spread([r["in_process_tokens"] / r["in_process_wall_s"] for r in rounds]),
        "http_tok_s": spread([r["http_tokens"] / r["http_wall_s"] for r in rounds]),
        "endpoint_timers": endpoint, "target": TARGET, "meets_target": ratio["median"] >= TARGET,
    }


def machine() -> str:
    try:
        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                     platform.processor())
    except OSError:
        model = platform.processor()
    try:
        load = " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        load = "?"
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return (f"{platform.machine()}, {torch.get_num_threads()} torch thread(s) of {__import__('os').cpu_count()} logical "
            f"CPUs ({model}), Python {platform.python_version()}, torch {torch.__version__}; load average at the end "
            f"{load}; code {rev[:12]} plus uncommitted changes")


def report(res: dict[str, Any]) -> str:
    r, c, u, s = res["ratio_wall"], res["ratio_cpu"], res["unbatched_ratio_wall"], res["settings"]
    verdict = "meets it" if res["meets_target"] else \
        f"misses it by {TARGET - r['median']:.2f} (the endpoint reaches {r['median'] / TARGET:.0%} of the target)"
    rows = res["rounds"]
    t = res["endpoint_timers"]
    http_wall = sum(x["http_wall_s"] for x in rows)
    inproc_wall = sum(x["in_process_wall_s"] for x in rows)
    lines = [
        "# Policy endpoint throughput: HTTP vs in-process generation",
        "",
        f"Command: `{res['command']}`.  ",
        f"Machine: {res['machine']}.",
        "",
        f"Batch: {s['batch']} first-turn prompts of `{s['env']}` ({s['prompt_tokens'][-1]} tokens), temperature "
        f"{s['temperature']}, max_new_tokens {s['max_new_tokens']}, the agent trainer's built-in model (d_model 64, "
        f"2 layers) after {s['sft_steps']} SFT steps, one torch thread. {s['rounds']} interleaved rounds (the order "
        f"of the sides reverses every round) after an uncounted one of each; a side's time in a round is "
        f"{s['reps']} batches back to back. In-process: one `Policy.generate` over the batch. HTTP: one request per "
        "prompt, all at once, from one `openai.AsyncOpenAI` client in this process (loopback, bearer token); the "
        "endpoint batches concurrent requests and also computes and logs every completion's log-probs. "
        "HTTP unbatched: the same endpoint with `max_batch=1` (one request generated at a time, as before batching).",
        "",
        f"**HTTP / in-process tokens/s: {r['median']:.2f}× (median over rounds, wall time; min {r['min']:.2f}, "
        f"max {r['max']:.2f}, IQR {r['q1']:.2f}–{r['q3']:.2f}); in CPU time {c['median']:.2f}× (min {c['min']:.2f}, "
        f"max {c['max']:.2f}). Target ≥ {TARGET}×: {verdict}.** Unbatched endpoint: {u['median']:.2f}× "
        f"(min {u['min']:.2f}, max {u['max']:.2f}).",
        "",
        "| round | in-process tok/s | HTTP tok/s | ratio (wall) | ratio (CPU) | unbatched tok/s | unbatched ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, x in enumerate(rows):
        lines.append(f"| {i} | {x['in_process_tokens'] / x['in_process_wall_s']:.0f} | "
                     f"{x['http_tokens'] / x['http_wall_s']:.0f} | {x['http_ratio_wall']:.3f} | "
                     f"{x['http_ratio_cpu']:.3f} | {x['http_unbatched_tokens'] / x['http_unbatched_wall_s']:.0f} | "
                     f"{x['http_unbatched_ratio_wall']:.3f} |")
    if t:
        rest = http_wall - t["generate_s"] - t["logprobs_s"]
        lines += ["", f"Where the batched endpoint's time goes (counted rounds, wall): {http_wall:.2f} s in all for "
                  f"{t['rows']} requests in {t['batches']} batches; generating {t['generate_s']:.2f} s "
                  f"(in-process, the same rows: {inproc_wall:.2f} s), log-probs {t['logprobs_s']:.2f} s, the rest "
                  f"{rest:.2f} s ({rest / http_wall:.0%}): the client SDK, HTTP, rendering, the batching window, "
                  "parsing and the log, all in this one process."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="lookup")
    ap.add_argument("--batch", type=int, default=16, help="prompts per round (HTTP: one request each)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3, help="batches per side per round (timed together)")
    ap.add_argument("--sft-steps", type=int, default=100, help="warm-up steps before measuring")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "endpoint_throughput.md"))
    a = ap.parse_args(argv)
    res = run(a)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(res))
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    print(f"ratio {res['ratio_wall']['median']:.3f} (wall), {res['ratio_cpu']['median']:.3f} (cpu); wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
