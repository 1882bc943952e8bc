"""An external agent written with the `openai` SDK, trained through the policy endpoint.

    .venv/bin/python examples/agents/openai_agent.py --env lookup --steps 5

The agent (`solve`) is ordinary openai-SDK code: a chat loop that sends the conversation and the
tools, runs the tool calls the model asks for, and returns the final answer. It knows nothing of
token ids or training. The trainer side (in-process SFT warm-up, the policy served by
`trainer.endpoint.EndpointServer`, rewards posted to the endpoint, one multi-turn GRPO step per
round from the endpoint's log) is `endpoint_training.py`, shared with `langgraph_agent.py`.

Nothing listens beyond 127.0.0.1 and nothing is fetched. The run writes OUT/NAME/ (the trainer's
run format) and OUT/NAME/trajectories.jsonl (the endpoint's log).
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import openai

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:   # run as a script from anywhere in the repository
    sys.path.insert(0, str(ROOT))

from examples.agents.endpoint_training import main as run_main  # noqa: E402


def solve(client: openai.OpenAI, question: str, tools: list[dict[str, Any]], run_tool: Any, episode: str,
          max_turns: int = 4) -> str | None:
    """Ask, call tools until the model answers, return its final text (None at the turn limit)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        r = client.chat.completions.create(model="policy", messages=messages, tools=tools, user=episode)
        msg = r.choices[0].message
        if not msg.tool_calls:
            return msg.content
        messages.append({"role": "assistant", "content": msg.content,
                         "tool_calls": [c.model_dump() for c in msg.tool_calls]})
        for c in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": c.id,
                             "content": run_tool(c.function.name, json.loads(c.function.arguments))})
    return None


def main(argv: list[str] | None = None) -> int:
    return run_main(solve, "openai-agent", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
