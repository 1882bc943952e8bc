"""Operator agents: detectors, operators (cluster ops, data curation, diagnostics, HarnessCritic,
lead), their built-in and LLM policies, skill and memory recall, and the skill miner. The shared
domain types (`agents/domain.py`) and the operators' view of a run (`agents/evidence.py`) live here
too; nothing in this package imports `swarm/`.
"""
# the detector modules register their detectors in agents.detection.DETECTORS when imported; doing
# it here makes the registry complete, in one order, whichever agents module a caller imports first
from agents import detectors, harness_detectors, step_detectors  # noqa: F401,E402
