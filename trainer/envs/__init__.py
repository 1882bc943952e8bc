"""Agent environments: multi-turn, tool-using, verifiable task families with train/held-out splits.

Built in: `lookup` (a hidden key→value table behind `get(key)`), `calc` (multi-step arithmetic
with `calc(expression)`), `code` (the code task with `run_tests(code)` in the sandbox). Importing
this package registers them; `make_env(name, seed, **options)` builds one. See `base.py` for the
interface and `trainer/agent_rollout.py` for the multi-turn rollout.

    from trainer.envs import make_env
    env = make_env("lookup")
    ex = env.episode("train", index=0, difficulty=2)
"""
from trainer.envs.base import (ENVS, ERROR_KINDS, AgentEnv, SandboxFailure, Tool, ToolFailure, ToolResult, make_env,
                               register_env)
from trainer.envs import calc, code, lookup  # noqa: F401  (register)

__all__ = ["ENVS", "ERROR_KINDS", "AgentEnv", "SandboxFailure", "Tool", "ToolFailure", "ToolResult", "make_env",
           "register_env"]
