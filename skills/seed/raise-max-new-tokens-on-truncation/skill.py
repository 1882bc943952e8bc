"""Trigger and proposal for raise-max-new-tokens-on-truncation (runs in the sandbox only)."""

CAP = 4096
SLACK = 2


def _finding(evidence):
    for d in evidence.get("diagnoses") or []:
        if isinstance(d, dict) and d.get("name") == "truncation":
            return d
    return None


def trigger(evidence):
    return _finding(evidence) is not None


def propose(evidence):
    found = (_finding(evidence) or {}).get("evidence") or {}
    cut = found.get("response_len_max")
    if not isinstance(cut, (int, float)) or isinstance(cut, bool) or not cut == cut or cut <= 0:
        return {"changes": {}, "rationale": "no cut-off length in the evidence; the operator sizes the limit"}
    new = 2 * int(-(-cut // 1)) + SLACK
    sampling = ((evidence.get("harness") or {}).get("sampling") or {})
    known = sampling.get("max_new_tokens")
    if isinstance(known, int) and not isinstance(known, bool) and known > cut:
        new = max(new, known)
    return {"changes": {"harness.sampling.max_new_tokens": min(CAP, new)},
            "rationale": f"answers cut off at ~{cut:.0f} tokens; limit to 2x that + {SLACK}"}
