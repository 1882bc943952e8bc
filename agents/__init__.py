"""Operator agents (cluster ops, data curation, diagnostics, HarnessCritic, skill miner, lead); arrives with the swarm issue."""
