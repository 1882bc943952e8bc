"""The swarm controller: a LangGraph state machine that drives Ray training jobs toward a goal.
For now it holds the CLI (`swarm.cli`); the controller arrives with the swarm issue."""
