"""The trainer side of the example agents: an agent program trained through the policy endpoint.

Shared by `openai_agent.py` (a plain `openai`-SDK chat loop) and `langgraph_agent.py` (a LangGraph
graph). An agent is any function

    agent(client, question, tools, run_tool, episode, max_turns) -> final answer text | None

that talks to the policy only through `client` (an `openai.OpenAI` pointed at the endpoint),
passes `episode` as the request's `user`, and runs tools with `run_tool(name, arguments) ->
observation`. It knows nothing of token ids or training. `train` does the rest:

    warm-up        SFT on demonstrations in-process (`AgentTrainer.warm_up`), so the policy
                   succeeds sometimes and GRPO has a signal
    serve          the policy behind `trainer.endpoint.EndpointServer` (127.0.0.1, bearer token),
                   every call logged with its exact prompt and completion ids
    per step       the agent plays `group_size` episodes of each of `prompts` train questions
                   (episode id = the `user` field); the grader scores each answer with the
                   environment's verifier and posts the reward to the endpoint; the trainer reads
                   the endpoint's log and takes one multi-turn GRPO step from it
                   (`AgentTrainer.update_from_records`: the calls of an episode merged on exact ids,
                   episodes grouped by their first prompt); the weight version moves on

Nothing listens beyond 127.0.0.1 and nothing is fetched. A run writes OUT/NAME/ (the trainer's
run format) and OUT/NAME/trajectories.jsonl (the endpoint's log).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any, Callable

import httpx
import openai

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:   # run from anywhere in the repository
    sys.path.insert(0, str(ROOT))

from trainer.agent_rollout import PolicyGenerator  # noqa: E402
from trainer.agent_train import AgentTrainConfig, AgentTrainer  # noqa: E402
from trainer.endpoint import EndpointServer, read_log  # noqa: E402

ToolRunner = Callable[[str, dict[str, Any]], str]
Agent = Callable[[openai.OpenAI, str, list[dict[str, Any]], ToolRunner, str, int], str | None]


def openai_tools(env: Any) -> list[dict[str, Any]]:
    """The environment's tools in the OpenAI format."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in env.tool_specs()]


def endpoint_rounds(trainer: AgentTrainer, steps: int, agent: Agent) -> list[dict[str, Any]]:
    """`steps` GRPO steps of `trainer`'s policy, each from episodes `agent` plays through the
    endpoint; returns the steps' metrics rows (also written to the run)."""
    cfg, env, harness = trainer.cfg, trainer.env, trainer.harness
    log_path = cfg.run_dir / "trajectories.jsonl"
    tools = openai_tools(env)
    g = cfg.grpo
    history = []
    with EndpointServer(PolicyGenerator(trainer.policy, generator=trainer.rng), harness, log_path,
                        weight_version=f"step-{trainer.step}") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=120)
        auth = {"Authorization": f"Bearer {srv.token}"}
        for i in range(steps):
            t0 = time.perf_counter()
            seen = len(read_log(log_path)) if log_path.exists() else 0
            for ex in trainer.next_train(g.prompts):
                for k in range(g.group_size):
                    episode = f"s{i}-{ex.uid.replace('/', '.')}-{k}"   # no "/": it is a path segment
                    answer = agent(client, ex.question, tools,
                                   lambda name, args, ex=ex: env.call(ex, name, args, harness).observation,
                                   episode, harness.max_turns)
                    result = env.verify(ex, harness.answer.extract(answer or ""))
                    httpx.post(f"{srv.url}/v1/episodes/{episode}/reward", json={"reward": result.reward},
                               headers=auth, timeout=30).raise_for_status()
            records = read_log(log_path)[seen:]
            stats = trainer.update_from_records(records, i)
            trainer.step += 1
            srv.weight_version = f"step-{trainer.step}"
            calls = [r for r in records if r["type"] == "call"]
            row = {**trainer.row_base("grpo_endpoint"), **stats, "calls": float(len(calls)),
                   "retokenized_assistant": float(sum(r["retokenized_assistant"] for r in calls)),
                   "step_time": time.perf_counter() - t0}
            trainer.write_row(row)
            history.append(row)
    return history


def train(cfg: AgentTrainConfig, steps: int, agent: Agent, printer: Any = print) -> dict[str, Any]:
    """Warm-up, `steps` endpoint rounds of `agent`, a held-out eval; the run's summary."""
    trainer = AgentTrainer(cfg, printer=printer)
    trainer.start()
    warm = trainer.warm_up()
    history = endpoint_rounds(trainer, steps, agent)
    ev = trainer.evaluate()
    trainer.write_row({**trainer.row_base("eval"), "step_time": 0.0, **ev})
    summary = trainer.finish()
    return {**summary, "heldout_acc_warm": warm, "history": history}


def config_from_args(a: argparse.Namespace) -> AgentTrainConfig:
    return AgentTrainConfig.parse({
        "env": a.env, "seed": a.seed, "out_dir": a.out, "name": a.name, "threads": a.threads,
        "system_prompt": a.system_prompt, "eval_size": a.eval_size, "log_every": 50,
        "sft": {"steps": a.sft_steps, "lr": 3e-3}, "grpo": {"prompts": a.prompts, "group_size": a.group_size,
                                                         "steps": 0}})


def main(agent: Agent, name: str, description: str, argv: list[str] | None = None) -> int:
    """The examples' command line: train `agent`, print the run's summary as one JSON line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--env", default="lookup")
    ap.add_argument("--steps", type=int, default=5, help="GRPO steps through the endpoint")
    ap.add_argument("--sft-steps", type=int, default=200, help="in-process warm-up steps on demonstrations")
    ap.add_argument("--prompts", type=int, default=4, help="train questions per step")
    ap.add_argument("--group-size", type=int, default=4, help="episodes per question")
    ap.add_argument("--eval-size", type=int, default=32)
    ap.add_argument("--system-prompt", default="{tools}", help="the harness's system prompt ({tools}: the tool list)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs")
    ap.add_argument("--name", default=name)
    a = ap.parse_args(argv)
    s = train(config_from_args(a), a.steps, agent)
    print(json.dumps({k: v for k, v in s.items() if k != "history"}))
    return 0
