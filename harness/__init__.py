"""Harness: prompt template, answer format, sampling, reward, curriculum and data filters, versioned by content hash
(harness/spec.py), with what they do: rendering and answer parsing (render.py), verifier choice and reward
shaping (reward.py), the filters (filters.py), the difficulty schedule and batch draw (curriculum.py), change
validation and no-op checks (changes.py), the named harness faults (faults.py); and the agent harness
(harness/agent.py) with its tools and tool-call syntax (harness/tools.py)."""
from harness.agent import AgentHarness, apply_edit, check_edit
from harness.spec import AnswerFormat, Curriculum, DataFilters, HarnessSpec, RewardConfig, Sampling
from harness.tools import ToolCallSyntax, ToolSpec

__all__ = ["AgentHarness", "AnswerFormat", "Curriculum", "DataFilters", "HarnessSpec", "RewardConfig", "Sampling",
           "ToolCallSyntax", "ToolSpec", "apply_edit", "check_edit"]
