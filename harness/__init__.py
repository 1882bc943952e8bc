"""Harness: prompt template, answer format, sampling, reward, curriculum and data filters, versioned by content hash;
and the agent harness (harness/agent.py) with its tools and tool-call syntax (harness/tools.py)."""
from harness.agent import AgentHarness, apply_edit, check_edit
from harness.spec import AnswerFormat, Curriculum, DataFilters, HarnessSpec, RewardConfig, Sampling
from harness.tools import ToolCallSyntax, ToolSpec

__all__ = ["AgentHarness", "AnswerFormat", "Curriculum", "DataFilters", "HarnessSpec", "RewardConfig", "Sampling",
           "ToolCallSyntax", "ToolSpec", "apply_edit", "check_edit"]
