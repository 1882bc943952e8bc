"""The swarm controller: a LangGraph state machine that drives Ray training jobs toward a goal.

The controller (`swarm/controller.py`, its graph in `swarm/graph.py`) ticks over the run's evidence,
asks the operators (agents/) for proposals, decides on them (`swarm/decisions.py`, backtests in
`swarm/backtest.py`), applies them as pull requests in the workspace's git repository
(`swarm/workspace.py`) and keeps its ledger in sqlite (`swarm/store.py`). `swarm/cli.py` is the
`swarm` command. docs/architecture.md walks through it.
"""
