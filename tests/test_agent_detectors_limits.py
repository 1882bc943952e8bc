"""A limit detector (agents/agent_critic.py) names a harness limit only on evidence of the limit:
trajectories that reached it with their calls run. One that reached it repeating calls the harness
refused is evidence of the refusal, which its own step detector names.

Real episodes in the real lookup environment, played by a scripted policy (tests/test_agent_fakes.py)
whose own length limit is short: it retries one positional call until the context is full. Under a
strict parser every call is refused (the parser's detector fires, the context's does not, though
every trajectory ended with the context full); under a lenient parser, with the same script, every
call runs and the context fills with their outputs (the context's detector fires, the parser's does
not). The critic inside the trainer (`harness.critic.critique`) attributes them the same way.
"""
from __future__ import annotations

import json

import pytest

from agents.agent_critic import END_SHARE, AgentHarnessCritic, detector_shares, run_agent_detectors
from agents.base import OperatorContext
from agents.evidence import Evidence
from harness.agent import AgentHarness
from harness.critic import Mode, critique, spent_on_refused
from test_agent_fakes import ScriptedPolicy
from trainer.agent_rollout import run_episode, summarize
from trainer.envs import make_env

STEPS, PER_STEP = 5, 2      # GRPO steps and trajectories each: 10 records, at least MIN_SAMPLES
MAX_LEN = 500               # the scripted policy's own length limit: room for a few turns


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def retry(ex) -> list[str]:
    """A policy that writes the positional call it was taught, again after every observation."""
    return [f'<tool>get("{ex.meta["asked"][0]}")</tool>'] * 16


def run_log(env, harness: AgentHarness, script) -> Evidence:
    """The metrics rows and samples.jsonl rows a run writes (as trainer/agent_train.py writes them),
    from scripted episodes, read as the controller reads them."""
    tools = [t.model_dump(mode="json") for t in env.tool_specs()]
    rows, samples = [], []
    for step in range(20, 20 + STEPS):
        trajs = [run_episode(ScriptedPolicy(script(ex), max_len=MAX_LEN), env, ex, harness)
                 for ex in (env.episode("train", step * PER_STEP + k, 1) for k in range(PER_STEP))]
        rows.append({"step": step, "algorithm": "grpo", "harness_version": harness.version, **summarize(trajs),
                     "success": sum(t.result.verdict.value == "correct" for t in trajs) / len(trajs)})
        # the trainer writes a GRPO step's samples before it counts the step: one below its row's
        samples += [{"step": step - 1, **t.record(), "env_tools": tools, "turns": len(t.steps)} for t in trajs]
    rows, samples = json.loads(json.dumps([rows, samples]))
    return Evidence(run_dir="/x", step=rows[-1]["step"], metrics=rows, samples=samples,
                    harness=harness.model_dump(mode="json"))


def test_a_context_filled_with_refused_calls_is_named_by_the_parser_not_by_the_context():
    env = make_env("lookup", seed=0)
    strict = env.default_harness()
    ev = run_log(env, strict, retry)
    assert all(r["end_context_full"] == 1.0 for r in ev.metrics)          # every trajectory ended full
    assert all(s["end"] == "context_full" and spent_on_refused(s) for s in ev.samples)
    shares = detector_shares(ev)
    assert shares["agent_context_full"] == 0.0 and shares["agent_malformed_call"] == 1.0, shares
    found = run_agent_detectors(ev)
    assert [d.name for d in found] == ["agent_malformed_call"], [d.summary for d in found]
    ctx = OperatorContext(goal="g", harness=strict.model_dump(mode="json")).with_findings(found)
    assert [iv.changes for iv in AgentHarnessCritic().propose(ev, ctx)] == [{"harness.tool_syntax.lenient": True}]


def test_the_same_policy_under_a_lenient_parser_fills_the_context_with_calls_that_ran():
    env = make_env("lookup", seed=0)
    lenient = env.default_harness(tool_syntax={"lenient": True})
    ev = run_log(env, lenient, retry)
    assert all(s["end"] == "context_full" and not spent_on_refused(s) for s in ev.samples)
    shares = detector_shares(ev)
    assert shares["agent_context_full"] == 1.0 >= END_SHARE and shares["agent_malformed_call"] == 0.0, shares
    found = run_agent_detectors(ev)
    assert [d.name for d in found] == ["agent_context_full"], [d.summary for d in found]
    d = found[0]
    assert d.evidence["samples_ended"] == STEPS * PER_STEP and d.evidence["samples_refused"] == 0
    ctx = OperatorContext(goal="g", harness=lenient.model_dump(mode="json")).with_findings(found)
    assert [iv.changes for iv in AgentHarnessCritic().propose(ev, ctx)] == [
        {"harness.context.kind": "trim_observations"}]


@pytest.mark.parametrize("refused", [0, 4, 5, 10])
def test_the_context_detector_reads_the_share_whose_calls_ran(refused):
    """Every trajectory of the rows ended full; `refused` of the 10 sampled records spent the context
    on refused calls, the others on calls that ran: the detector reads the rows' share less the
    refused part."""
    env = make_env("lookup", seed=0)
    strict, lenient = env.default_harness(), env.default_harness(tool_syntax={"lenient": True})
    ran = run_log(env, lenient, retry)
    ev = ran.model_copy(update={"samples": run_log(env, strict, retry).samples[:refused] + ran.samples[refused:]})
    for s in ev.samples:                      # one live harness version, as a run's window holds
        s["harness_version"] = lenient.version
    share = detector_shares(ev)["agent_context_full"]
    assert share == pytest.approx(1 - refused / 10)
    fires = "agent_context_full" in [d.name for d in run_agent_detectors(ev)]
    assert fires == (share >= END_SHARE)


def test_without_step_level_records_the_rows_share_stands():
    env = make_env("lookup", seed=0)
    ev = run_log(env, env.default_harness(), retry)
    bare = ev.model_copy(update={"samples": [{k: v for k, v in s.items() if k != "steps"} for s in ev.samples]})
    assert detector_shares(bare)["agent_context_full"] == 1.0


def test_the_trainers_critic_attributes_a_limit_the_same_way():
    env = make_env("lookup", seed=0)
    for harness, mode in [(env.default_harness(), Mode.MALFORMED_CALL),
                          (env.default_harness(tool_syntax={"lenient": True}), Mode.CONTEXT_FULL)]:
        exs = [env.episode("train", i, 1) for i in range(4)]
        trajs = [run_episode(ScriptedPolicy(retry(ex), max_len=MAX_LEN), env, ex, harness) for ex in exs]
        crit = critique(trajs, harness, env.tool_specs())
        assert [f.mode for f in crit.findings] == [mode], [f.text() for f in crit.findings]


def step(action: str, error: str | None = None) -> dict:
    return {"action": action, "error": error}


@pytest.mark.parametrize("steps, spent", [
    ([], False),                                                                     # no call at all
    ([step("tool_call")] * 3, False),                                                # calls that ran
    ([step("tool_call", "tool_error")] * 3, False),          # the tool ran and said no: not the harness
    ([step("malformed_call", "malformed")] * 2, True),
    ([step("tool_call", "unknown_tool"), step("tool_call", "bad_arguments")], True),
    ([step("malformed_call", "malformed"), step("tool_call")], False),               # half: not most
    ([step("malformed_call", "malformed")] * 2 + [step("tool_call"), step("answer")], True),
    ([step("over_limit")], False),
])
def test_spent_on_refused_means_most_calls_never_ran(steps, spent):
    assert spent_on_refused({"steps": steps, "end": "context_full"}) is spent
