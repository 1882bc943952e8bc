"""Trigger and proposal for restart-crashed-job (runs in the sandbox only)."""

NAMES = ("crashed_job", "stale_heartbeat")


def trigger(evidence):
    found = evidence.get("diagnoses") or []
    return any(isinstance(d, dict) and d.get("name") in NAMES for d in found)


def propose(evidence):
    return {"changes": {}, "rationale": "restart from the newest good checkpoint; nothing else changes"}
