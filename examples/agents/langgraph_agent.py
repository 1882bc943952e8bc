"""An agent written as a LangGraph graph, trained through the policy endpoint.

    .venv/bin/python examples/agents/langgraph_agent.py --env lookup --steps 5

The agent is a `StateGraph` in the shape of LangGraph's ReAct template:

    START ──> model ──route──> tools ──> model ...
                    ├────────> limit ──> END      (the harness's max_turns reached with a call pending)
                    └────────> END                (an answer: no tool call)

`model` calls the policy through the endpoint with the `openai` client (langchain-openai is not a
dependency of this project; the node sends OpenAI-format messages itself), `tools` runs each
requested tool call with the environment's tools and appends the observations, and `route` is a
pure function of the state. The turn limit is the harness's `max_turns`; at it the graph ends with
an explicit message instead of looping. The state is a dataclass whose `messages` channel
appends (a reducer), so nodes return partial updates. Per-episode things (the client, the tools,
the tool runner, the episode id) travel as the run's context (`langgraph.runtime.Runtime`), so the
graph is compiled once, here, and reused for every episode.

The trainer side (in-process SFT warm-up, the policy served by `trainer.endpoint.EndpointServer`,
rewards posted to the endpoint, one multi-turn GRPO step per round from the endpoint's log) is
`endpoint_training.py`, shared with `openai_agent.py`. Nothing listens beyond 127.0.0.1 and
nothing is fetched.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import pathlib
import sys
from typing import Annotated, Any, Literal

import openai
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:   # run as a script from anywhere in the repository
    sys.path.insert(0, str(ROOT))

from examples.agents.endpoint_training import ToolRunner, main as run_main  # noqa: E402

LIMIT_MESSAGE = "Stopped: the turn limit was reached before an answer."


@dataclasses.dataclass
class AgentState:
    messages: Annotated[list[dict[str, Any]], operator.add] = dataclasses.field(default_factory=list)
    turns: int = 0                      # policy calls made
    answer: str | None = None           # the final text (None: no answer)
    ended: str = ""                     # "answered" or "max_turns"


@dataclasses.dataclass
class AgentContext:
    client: openai.OpenAI
    tools: list[dict[str, Any]]
    run_tool: ToolRunner
    episode: str
    max_turns: int


# ---- nodes: each returns a partial update ----------------------------------------------------
def call_model(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    ctx = runtime.context
    r = ctx.client.chat.completions.create(model="policy", messages=state.messages, tools=ctx.tools,
                                           user=ctx.episode)
    msg = r.choices[0].message
    turn: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        turn["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
        return {"messages": [turn], "turns": state.turns + 1}
    return {"messages": [turn], "turns": state.turns + 1, "answer": msg.content, "ended": "answered"}


def run_tools(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    calls = state.messages[-1]["tool_calls"]
    return {"messages": [{"role": "tool", "tool_call_id": c["id"],
                          "content": runtime.context.run_tool(c["function"]["name"],
                                                              json.loads(c["function"]["arguments"]))}
                         for c in calls]}


def turn_limit(state: AgentState) -> dict[str, Any]:
    return {"messages": [{"role": "assistant", "content": LIMIT_MESSAGE}], "answer": None, "ended": "max_turns"}


def route(state: AgentState, runtime: Runtime[AgentContext]) -> Literal["tools", "limit", "__end__"]:
    """After the model: run its tool calls, stop at the turn limit, or end with its answer."""
    if not state.messages[-1].get("tool_calls"):
        return "__end__"
    return "limit" if state.turns >= runtime.context.max_turns else "tools"


def build_graph() -> Any:
    g = StateGraph(AgentState, context_schema=AgentContext)
    g.add_node("model", call_model)
    g.add_node("tools", run_tools)
    g.add_node("limit", turn_limit)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", "limit": "limit", "__end__": END})
    g.add_edge("tools", "model")
    g.add_edge("limit", END)
    return g.compile()


GRAPH = build_graph()


def solve(client: openai.OpenAI, question: str, tools: list[dict[str, Any]], run_tool: ToolRunner, episode: str,
          max_turns: int = 4) -> str | None:
    """One episode of the graph; its final answer (None at the turn limit)."""
    ctx = AgentContext(client, tools, run_tool, episode, max_turns)
    out = GRAPH.invoke({"messages": [{"role": "user", "content": question}]}, context=ctx,
                       config={"recursion_limit": 2 * max_turns + 4})
    return out["answer"]


def main(argv: list[str] | None = None) -> int:
    return run_main(solve, "langgraph-agent", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
