"""The HarnessCritic's LLM ranker: an `LLMPolicy` (agents/llm.py) orders the edits the rule-based
critic (harness/critic.py) proposed, and says why.

    ranker = LLMRanker(LLMPolicy(goal.llm))
    crit = critique(records, harness, env.tool_specs(), ranker=ranker)
    ranker.explanations[-1]          # the model's reason for its order

The model reads the critic's findings (mode, counts, the critic's own evidence line) and the
validated edits as JSON; no trajectory text is sent, so nothing a policy wrote can reach the
prompt. It answers through one tool, `rank_edits(order, why)`; `order` must be a permutation of the
edits' indices (harness/critic.py ignores anything else and keeps the rules' order). It can only
reorder: the edits it may choose between are the critic's typed set, each already validated by the
harness's `check_edit`, and every one is still measured before it is kept. With no model
configured, or when the model does not answer, `rank` returns the rules' order.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SYSTEM = ("You rank harness edits for an agent training run. A rule-based critic read failed agent trajectories, "
          "named harness failure modes with counts and proposed edits; each edit will be measured on held-out "
          "episodes before it is kept. Order the edits from the most to the least likely to raise held-out success, "
          "by calling rank_edits with a permutation of their indices and one sentence why.")


class _Order(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order: list[int] = Field(description="a permutation of the edits' indices, the most promising first")
    why: str = Field("", max_length=500, description="one sentence: why this order")


class LLMRanker:
    """A `harness.critic.Ranker` backed by an `agents.llm.LLMPolicy` (or None: the rules' order)."""

    def __init__(self, policy: Any | None) -> None:
        self.policy = policy
        self.explanations: list[str] = []

    def rank(self, findings: list[dict[str, Any]], edits: list[dict[str, Any]]) -> list[int]:
        rules = list(range(len(edits)))
        if self.policy is None or len(edits) < 2:
            return rules
        user = json.dumps({"findings": findings, "edits": [{"index": i, **e} for i, e in enumerate(edits)]},
                          default=str)
        out, why = self.policy.ask("harness_critic", SYSTEM, user, "rank_edits",
                                   "The order to try the edits in.", _Order)
        if out is None:
            self.explanations.append(f"rules' order (no ranking: {why})")
            return rules
        self.explanations.append(out.why)
        return list(out.order)
