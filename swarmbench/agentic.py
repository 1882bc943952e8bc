"""Agentic fault scenarios: seeded, deterministic agent-training runs with one harness fault.

`generate(seed)` draws one: an agent environment and difficulty the built-in model learns in its
warm-up (`lookup` difficulty 1 in the trainer's default 300 steps; `calc` difficulty 1 in 500 steps
with a one-line system prompt, as benchmarks/coevolution.py measured), a fault mechanism, and an
origin. Each mechanism is a typed `AgentHarness` edit (`harness.agent.check_edit` accepts it on the
scenario's healthy harness; tests/test_agentic_faults.py holds that):

    missing_tool      tools.NAME = None: the harness stops listing the environment's tool
    max_turns         max_turns = 1: one turn, no room to call the tool and then answer
    parser            tool_syntax.lenient = false, with positional demonstrations (`demo_calls`):
                      the parser rejects the calls the policy was taught, get("abc")
    observation_cut   observation.cut = end on a harness that cuts long outputs to 12 characters
                      keeping the tail (`harness_edits`), with lookup's `verbose` outputs,
                      `key 'abc' holds 42`: the cut removes the value (lookup only)
    description       tools.NAME.description = a wrong description (lookup only: calc's one-line
                      system prompt shows no description)

Origins: `config`, the fault is in the run's starting harness (`harness_fault`); `drift`, the run
starts healthy and the harness changes when it reaches a step 3, 5 or 7 GRPO steps after the
warm-up (`harness_fault_step`; a `harness_change` event records it and the critic is not told).
The same seed always gives the same scenario (a `random.Random` seeded with a string, independent
of `PYTHONHASHSEED`). The scenario's `config` is an `AgentTrainConfig` without seed, name and out_dir;
`healthy` is the same run without the fault (the oracle's).

    python -m swarmbench.agentic 100-105        # print scenarios as JSON lines
"""
from __future__ import annotations

import copy
import json
import random
import sys
from typing import Any, Callable

GENERATOR_VERSION = 1
ORIGINS = ("config", "drift")
DRIFT_AFTER = (3, 5, 7)          # GRPO steps after the warm-up at which a drift fault arrives

# Per environment: the trainer config of a healthy run, its warm-up steps, its tool, and how often it is drawn.
ENVS: dict[str, dict[str, Any]] = {
    "lookup": {"config": {"env": "lookup", "difficulty": 1}, "sft_steps": 300, "tool": "get", "weight": 3},
    # a one-line system prompt: the default tool list makes calc's warm-up steps ~3x dearer (coevolution.py)
    "calc": {"config": {"env": "calc", "difficulty": 1, "system_prompt": "Tools: calc(expression)."},
             "sft_steps": 500, "tool": "calc", "weight": 2},
}

WRONG_DESCRIPTION = "the number of keys in the table; call it once, before you answer"
CUT_CHARS = 12   # lookup's verbose output `key 'abc' holds 42` is 18 characters: a 12-character cut keeps one side


def _missing_tool(env: str) -> dict[str, Any]:
    return {"fault": {f"tools.{ENVS[env]['tool']}": None},
            "why": "the harness no longer lists the environment's tool (a tool list built from another config)"}


def _max_turns(env: str) -> dict[str, Any]:
    return {"fault": {"max_turns": 1},
            "why": "a turn limit of 1 left from a single-shot setup: no turn to answer after the call"}


def _parser(env: str) -> dict[str, Any]:
    return {"fault": {"tool_syntax.lenient": False}, "config": {"demo_calls": "positional"},
            "why": "a strict parser that wants named arguments rejects the positional calls the policy was taught"}


def _observation_cut(env: str) -> dict[str, Any]:
    return {"fault": {"observation.cut": "end"}, "config": {"env_options": {"verbose": True}},
            "edits": {"observation.max_chars": CUT_CHARS, "observation.cut": "start"},
            "why": f"long tool outputs are cut to {CUT_CHARS} characters from the wrong side: the head is kept, the "
                   "value at the end of `key 'abc' holds 42` is removed"}


def _description(env: str) -> dict[str, Any]:
    tool = ENVS[env]["tool"]
    return {"fault": {f"tools.{tool}.description": WRONG_DESCRIPTION},
            "why": f"the tool list describes {tool} wrongly ({WRONG_DESCRIPTION!r})"}


# name -> (the environments it applies to, the fault for an environment)
MECHANISMS: dict[str, tuple[tuple[str, ...], Callable[[str], dict[str, Any]]]] = {
    "missing_tool": (("lookup", "calc"), _missing_tool),
    "max_turns": (("lookup", "calc"), _max_turns),
    "parser": (("lookup", "calc"), _parser),
    "observation_cut": (("lookup",), _observation_cut),
    "description": (("lookup",), _description),
}


def scenario(seed: int, env: str, mechanism: str, origin: str, drift_after: int | None = None) -> dict[str, Any]:
    """One scenario from its parts (what `generate` draws); `drift_after` is the drift's GRPO step
    after the warm-up (None for `config`)."""
    envs, make = MECHANISMS[mechanism]
    if env not in envs:
        raise ValueError(f"mechanism {mechanism!r} does not apply to environment {env!r} (only {list(envs)})")
    if origin not in ORIGINS:
        raise ValueError(f"origin={origin!r} must be one of {ORIGINS}")
    if (origin == "drift") != (drift_after is not None):
        raise ValueError(f"origin={origin!r} with drift_after={drift_after!r}: a drift needs its step, a config fault none")
    spec = ENVS[env]
    m = make(env)
    healthy = {**copy.deepcopy(spec["config"]), **copy.deepcopy(m.get("config", {})),
               "sft": {"steps": spec["sft_steps"]}}
    if m.get("edits"):
        healthy["harness_edits"] = dict(m["edits"])
    faulty = {**copy.deepcopy(healthy), "harness_fault": dict(m["fault"])}
    if origin == "drift":
        faulty["harness_fault_step"] = spec["sft_steps"] + drift_after
    return {"seed": seed, "generator_version": GENERATOR_VERSION, "id": f"s{seed}-{env}-{mechanism}-{origin}",
            "env": env, "mechanism": mechanism, "origin": origin, "drift_after_grpo_steps": drift_after,
            "fault": dict(m["fault"]), "why": m["why"], "config": faulty, "healthy": healthy}


def generate(seed: int) -> dict[str, Any]:
    """The scenario for `seed`: environment, mechanism and origin drawn uniformly (environments
    weighted by `ENVS[...]["weight"]`), a drift's step from `DRIFT_AFTER`."""
    rng = random.Random(f"swarmlab-agentic-v{GENERATOR_VERSION}-{seed}")
    origin = rng.choice(ORIGINS)
    names = sorted(ENVS)
    env = rng.choices(names, weights=[ENVS[n]["weight"] for n in names])[0]
    mechanism = rng.choice([m for m, (envs, _) in MECHANISMS.items() if env in envs])
    drift_after = rng.choice(DRIFT_AFTER) if origin == "drift" else None
    return scenario(seed, env, mechanism, origin, drift_after)


def parse_seeds(text: str) -> list[int]:
    """`100-119` or `100,103,107` (or a mix) as a list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            out += list(range(int(lo), int(hi) + 1)) if dash else [int(lo)]
        except ValueError:
            raise ValueError(f"seeds {text!r}: write a range like 100-119 or a list like 100,103") from None
    return out


if __name__ == "__main__":
    for s in parse_seeds(sys.argv[1] if len(sys.argv) > 1 else "0-9"):
        print(json.dumps(generate(s)))
