"""The controller's state machine: a LangGraph `StateGraph` checkpointed to sqlite.

    plan → launch → observe ─┬─> finish                       (target met / budget spent / stopped)
                              └─> diagnose ─┬─> propose → backtest → gate → apply → evaluate → mine_skills → report ─> observe
                                            └─> report ─> observe     (a quiet tick: nothing proposed, nothing open, no news)

Nodes are methods of `swarm.controller.Controller` and return partial state updates; routers are
pure functions of the state. The graph is built once here. Every node is idempotent on re-entry
(a node killed half-way re-runs on `swarm resume`): commands to the trainer carry deterministic
ids that the trainer acknowledges once, and intervention statuses move only forward in the store.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any, Literal

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from agents.domain import JobStatus


@dataclass
class SwarmState:
    """The graph's checkpointed state. What an intervention is and where it stands lives in the
    store (swarm/store.py), not here: nothing proposed is lost when the controller dies mid-node."""
    tick: int = 0
    job: str | None = None             # the live job's handle
    job_name: str = "train"
    job_status: JobStatus = JobStatus.PENDING
    restarts: int = 0                  # every restart of the run, whatever its cause (capped by max_restarts)
    launched: float = 0.0              # when the live job was launched (its grace and the restart backoff)
    step: int = 0
    best: float | None = None
    started: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    to_target: dict[str, float] = field(default_factory=dict)  # wall and worker-CPU seconds when first met
    done: str | None = None            # why the run ended
    quiet: bool = False                # this tick found nothing to do past diagnose
    plan: str = ""


def route_after_observe(state: SwarmState) -> Literal["finish", "diagnose"]:
    return "finish" if state.done else "diagnose"


def route_after_diagnose(state: SwarmState) -> Literal["propose", "report"]:
    return "report" if state.quiet else "propose"


def prune_checkpoints(saver: SqliteSaver, thread_id: str, keep: int) -> int:
    """Delete all but the newest `keep` checkpoints of a thread (and their pending writes), so a
    run of days does not grow graph.db by a checkpoint per superstep forever. Resuming needs only
    the newest one; checkpoint ids are time-ordered (uuid6), so the order is chronological.
    Returns how many checkpoints were deleted."""
    if keep < 1:
        raise ValueError(f"keep={keep} must be >= 1")
    with saver.cursor() as cur:
        cur.execute("SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' "
                    "ORDER BY checkpoint_id DESC LIMIT 1 OFFSET ?", (thread_id, keep - 1))
        row = cur.fetchone()
        if row is None:
            return 0
        oldest_kept = row[0]
        cur.execute("DELETE FROM writes WHERE thread_id = ? AND checkpoint_id < ?", (thread_id, oldest_kept))
        cur.execute("DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_id < ?", (thread_id, oldest_kept))
        return cur.rowcount


def build_graph(ctrl: Any, db_path: str):
    g = StateGraph(SwarmState)
    for name in ("plan", "launch", "observe", "diagnose", "propose", "backtest", "gate", "apply", "evaluate",
                 "mine_skills", "report", "finish"):
        g.add_node(name, getattr(ctrl, f"node_{name}"))
    g.add_edge(START, "plan")
    g.add_edge("plan", "launch")
    g.add_edge("launch", "observe")
    g.add_conditional_edges("observe", route_after_observe, {"finish": "finish", "diagnose": "diagnose"})
    g.add_conditional_edges("diagnose", route_after_diagnose, {"propose": "propose", "report": "report"})
    for a, b in (("propose", "backtest"), ("backtest", "gate"), ("gate", "apply"),
                 ("apply", "evaluate"), ("evaluate", "mine_skills"), ("mine_skills", "report"), ("report", "observe")):
        g.add_edge(a, b)
    g.add_edge("finish", END)
    from sandboxes.private import touch_private

    touch_private(db_path)   # the controller's checkpoints: 0600 whatever the umask (its -wal/-shm follow)
    conn = sqlite3.connect(db_path, check_same_thread=False)
    return g.compile(checkpointer=SqliteSaver(conn)), conn
