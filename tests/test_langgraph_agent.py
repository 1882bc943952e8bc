"""examples/agents/langgraph_agent.py: a LangGraph agent acting through the real policy endpoint on
loopback. The graph's routing on a table of states; the turn limit with a scripted policy that
never answers; and two GRPO steps after an in-process warm-up, checked in the endpoint's log (every
turn's exact ids, no assistant turn re-tokenized, the first prompt the one the in-process rollout
builds), the rewards, the weight versions, and every trainable parameter changed."""
from __future__ import annotations

import json
import pathlib
import sys
import types

import openai
import pytest
import torch

from test_agent_fakes import ScriptedPolicy
from trainer.agent_rollout import run_episode
from trainer.agent_train import AgentTrainConfig, AgentTrainer
from trainer.endpoint import EndpointServer, read_log
from trainer.tokenizer import CharTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:   # the examples are not an installed package
    sys.path.insert(0, str(ROOT))

from examples.agents.endpoint_training import endpoint_rounds, openai_tools  # noqa: E402
from examples.agents.langgraph_agent import LIMIT_MESSAGE, AgentState, route, solve  # noqa: E402

TOK = CharTokenizer()
CALL = {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"key\": \"k\"}"}}


@pytest.mark.parametrize("last, turns, want", [
    ({"role": "assistant", "content": "<answer>3</answer>"}, 1, "__end__"),
    ({"role": "assistant", "content": None, "tool_calls": [CALL]}, 1, "tools"),
    ({"role": "assistant", "content": None, "tool_calls": [CALL]}, 2, "tools"),
    ({"role": "assistant", "content": None, "tool_calls": [CALL]}, 3, "limit"),
    ({"role": "assistant", "content": "", "tool_calls": []}, 3, "__end__"),
])
def test_route(last, turns, want):
    runtime = types.SimpleNamespace(context=types.SimpleNamespace(max_turns=3))
    assert route(AgentState(messages=[{"role": "user", "content": "q"}, last], turns=turns), runtime) == want


def test_graph_stops_at_the_harness_turn_limit(tmp_path):
    tr = AgentTrainer(AgentTrainConfig(env="lookup", system_prompt="Tools: get(key).", sft={"steps": 0},
                                       out_dir=str(tmp_path)), printer=None)
    ex = tr.env.episode("train", 0, 1)
    policy = ScriptedPolicy(['<tool>get(key="zz")</tool>'] * 3, tok=tr.policy.tok)
    seen: list[tuple[str, dict]] = []

    def run_tool(name, args):
        seen.append((name, args))
        return tr.env.call(ex, name, args, tr.harness).observation

    log = tmp_path / "log.jsonl"
    with EndpointServer(policy, tr.harness, log) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.token, max_retries=0, timeout=60)
        answer = solve(client, ex.question, openai_tools(tr.env), run_tool, "ep-limit", max_turns=3)
    assert answer is None and not policy.outputs
    assert seen == [("get", {"key": "zz"})] * 2                 # the third call is not run: the limit ends it
    calls = read_log(log)
    assert [r["call"] for r in calls] == [1, 2, 3] and all(r["finish_reason"] == "tool_calls" for r in calls)
    assert all(r["extends_previous"] for r in calls) and sum(r["reused_assistant"] for r in calls) == 3
    assert LIMIT_MESSAGE.startswith("Stopped")


def test_langgraph_agent_trains_through_the_endpoint(tmp_path):
    threads = torch.get_num_threads()
    try:
        cfg = AgentTrainConfig.parse({
            "env": "lookup", "seed": 0, "out_dir": str(tmp_path), "name": "lg", "threads": 1,
            "system_prompt": "Tools: get(key).", "eval_size": 16, "log_every": 50,
            "sft": {"steps": 200, "lr": 3e-3}, "grpo": {"prompts": 2, "group_size": 4, "steps": 0}})
        tr = AgentTrainer(cfg, printer=None)
        tr.start()
        warm = tr.warm_up()
        before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters() if p.requires_grad}
        steps = endpoint_rounds(tr, 2, solve)
    finally:
        torch.set_num_threads(threads)
    assert warm > 0.0

    recs = read_log(tmp_path / "lg" / "trajectories.jsonl")
    calls = [r for r in recs if r["type"] == "call"]
    rewards = [r for r in recs if r["type"] == "reward"]
    assert len(rewards) == 2 * 2 * 4 and len({r["episode"] for r in rewards}) == 16
    assert {r["episode"] for r in calls} == {r["episode"] for r in rewards}
    assert {r["weight_version"] for r in calls} == {"step-200", "step-201"}
    by_ep: dict[str, list[dict]] = {}
    for r in calls:
        by_ep.setdefault(r["episode"], []).append(r)
    for ep, cs in by_ep.items():
        assert [c["call"] for c in cs] == list(range(1, len(cs) + 1)), ep
        assert len(cs) <= tr.harness.max_turns
        for prev, c in zip(cs, cs[1:]):   # each turn's prompt holds the previous turn's exact ids
            assert prev["finish_reason"] == "tool_calls"
            assert c["prompt_ids"][: len(prev["prompt_ids"]) + len(prev["completion_ids"])] == \
                prev["prompt_ids"] + prev["completion_ids"], ep
    assert all(r["extends_previous"] for r in calls)
    assert sum(r["retokenized_assistant"] for r in calls) == 0
    assert sum(r["reused_assistant"] for r in calls) == sum(len(cs) - 1 for cs in by_ep.values()) > 0
    for r in calls:
        assert TOK.decode(r["prompt_ids"]).endswith("A: ") and r["prompt_ids"][0] == TOK.bos_id
        assert all(isinstance(t, int) for t in r["completion_ids"]) and len(r["logprobs"]) == len(r["completion_ids"])

    # the graph's first request renders to the prompt the in-process rollout builds
    first = next(r for r in calls if r["call"] == 1)
    index = int(first["episode"].split(".")[-1].rsplit("-", 1)[0])
    ex = tr.env.episode("train", index, 1)
    assert first["messages"] == [{"role": "user", "content": ex.question}]
    local = run_episode(ScriptedPolicy(["<answer>1</answer>"], tok=tr.policy.tok), tr.env, ex, tr.harness)
    assert local.steps[0].prompt_ids == first["prompt_ids"]

    assert len(steps) == 2 and tr.step == 202
    assert all(s["episodes"] == 8 and s["groups"] == 2 and s["drift"] == 0 for s in steps)
    assert any(s["skipped"] == 0 and s["informative_groups"] > 0 for s in steps), steps
    unchanged = [n for n, p in tr.policy.model.named_parameters() if p.requires_grad and torch.equal(before[n], p)]
    assert not unchanged, f"GRPO through the endpoint left these parameters unchanged: {unchanged}"
    rows = [json.loads(x) for x in (tmp_path / "lg" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["algorithm"] == "grpo_endpoint"] == [201, 202]
