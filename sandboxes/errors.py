"""The root of swarmlab's own exceptions.

Every error the project defines derives from `SwarmlabError`, so a boundary (the CLI, a tool call,
a sandbox result) can tell the project's errors from a library's with one `except`. Each is also
the builtin its meaning calls for, so callers that catch those keep working:

    ConfigError(SwarmlabError, ValueError)          bad input: a config, goal or change
    CheckpointError(SwarmlabError, RuntimeError)    a checkpoint that cannot be used
    SandboxError(SwarmlabError)                     isolation unavailable or failed
    MemoryStoreError(SwarmlabError, RuntimeError)   the vector memory cannot serve
    SkillError / SkillPackError (.., ValueError)    a malformed skill or skill pack
    ToolCallError(SwarmlabError, ValueError)        an LLM reply that is not a valid tool call
    WorkspaceLocked(SwarmlabError, RuntimeError)    another controller holds the workspace
    PrivatePathError(SwarmlabError, ValueError)     a link or a FIFO where a private file belongs
    StateDbError(SwarmlabError, ValueError)         a state database that is not one

Control-flow signals (`trainer.loop.StopRun`, the LLM policy's private fallback) are not errors
and stay outside. The root lives in `sandboxes/` because that package imports no other project
package and every package that defines errors already imports it: the root adds no edge to the
import graph (tests/test_layers.py).
"""
from __future__ import annotations


class SwarmlabError(Exception):
    """Base of every exception swarmlab defines."""
