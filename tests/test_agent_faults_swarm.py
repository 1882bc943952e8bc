"""The swarm's step-level agent detectors (agents/agent_critic.py) on the records the agent trainer
writes (trainer/agent_rollout.py `Trajectory.record`, trainer/agent_train.py samples.jsonl).

Fast: each step detector on records of real episodes in the real lookup environment played by a
scripted policy, under the faulted harness (it fires, and the operator proposes the critic's edit)
and under the healthy one with the same script (it stays quiet); the share threshold, the current
harness version and the record count gate it; the records are capped; a tiny real run writes them.
Slow: a real controller run whose starting harness cuts lookup's verbose observations from the
wrong side (`observation.cut: end`): the step detector names it, the critic's edit is backtested on
forked arms, applied through the inbox, and the run reaches its target.
"""
from __future__ import annotations

import json

import pytest
import yaml

from agents.agent_critic import (MIN_SAMPLES, STEP_SHARE, AgentHarnessCritic, detector_shares, run_agent_detectors)
from agents.base import OperatorContext
from agents.domain import InterventionKind, Status
from agents.evidence import Evidence
from harness.agent import AgentHarness, apply_edit
from harness.critic import Mode
from test_agent_fakes import ScriptedPolicy
from test_agent_run import TINY, controller
from trainer.agent_rollout import run_episode
from trainer.envs import make_env
from trainer.runlog import read_jsonl

WRONG = "the number of keys in the table; call it once, before you answer"
N = 10   # episodes per evidence: at least MIN_SAMPLES


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def named(ex) -> str:
    return f'<tool>get(key="{ex.meta["asked"][0]}")</tool>'


def positional(ex) -> str:
    return f'<tool>get("{ex.meta["asked"][0]}")</tool>'


def samples(env, harness: AgentHarness, script, n: int = N, step: int = 20) -> list[dict]:
    """samples.jsonl rows as the trainer writes them, from scripted episodes."""
    tools = [t.model_dump(mode="json") for t in env.tool_specs()]
    out = []
    for i in range(n):
        ex = env.episode("train", i, 1)
        t = run_episode(ScriptedPolicy(script(ex)), env, ex, harness)
        out.append({"step": step + i // 2, "transcript": "(text)", **t.record(), "env_tools": tools,
                    "turns": len(t.steps)})
    return json.loads(json.dumps(out))   # through JSON, as the controller reads them


def evidence(harness: AgentHarness, rows: list[dict]) -> Evidence:
    return Evidence(run_dir="/x", step=rows[-1]["step"] if rows else 0, samples=rows,
                    harness=harness.model_dump(mode="json"))


def lookup(**options):
    return make_env("lookup", seed=0, **options)


def _parser():
    env = lookup()
    return (env, env.default_harness(), env.default_harness(tool_syntax={"lenient": True}),
            lambda ex: [positional(ex), "<answer>0</answer>"])


def _observation_cut():
    env = lookup(verbose=True)
    return (env, env.default_harness(observation={"max_chars": 12, "cut": "end"}),
            env.default_harness(observation={"max_chars": 12, "cut": "start"}),
            lambda ex: [named(ex), "<answer>0</answer>"])


def _description():
    env = lookup()
    return (env, apply_edit(env.default_harness(), "tools.get.description", WRONG), env.default_harness(),
            lambda ex: ["<answer>12</answer>"])


def _unknown_tool():
    env = lookup()
    return env, env.default_harness(tools=[]), env.default_harness(), lambda ex: [named(ex), "<answer>0</answer>"]


def _unlisted_tool_unused():
    """A policy not told of `get` stops calling it: it guesses an answer."""
    env = lookup()
    return env, env.default_harness(tools=[]), env.default_harness(), lambda ex: ["<answer>12</answer>"]


def _unlisted_tool_no_answer():
    """A policy not told of `get` writes neither a call nor an answer (what the built-in model does)."""
    env = lookup()
    return env, env.default_harness(tools=[]), env.default_harness(), lambda ex: ['<t<</t"kR"uananir>t(k']


# fault -> (env, faulted harness, healthy harness, the policy's turns), the detector, the critic's edit
CASES = {
    "parser": (_parser, "agent_malformed_call", lambda env: {"harness.tool_syntax.lenient": True}),
    "observation_cut": (_observation_cut, "agent_observation_cut", lambda env: {"harness.observation.cut": "start"}),
    "description": (_description, "agent_tool_spec_differs",
                    lambda env: {"harness.tools.get": env.tool_specs()[0].model_dump(mode="json")}),
    "unknown_tool": (_unknown_tool, "agent_unknown_tool",
                     lambda env: {"harness.tools.get": env.tool_specs()[0].model_dump(mode="json")}),
    "unlisted_tool_unused": (_unlisted_tool_unused, "agent_unknown_tool",
                             lambda env: {"harness.tools.get": env.tool_specs()[0].model_dump(mode="json")}),
    "unlisted_tool_no_answer": (_unlisted_tool_no_answer, "agent_unknown_tool",
                                lambda env: {"harness.tools.get": env.tool_specs()[0].model_dump(mode="json")}),
}
STEP_DETECTORS = {"agent_malformed_call", "agent_observation_cut", "agent_tool_spec_differs", "agent_unknown_tool"}


@pytest.mark.parametrize("fault", sorted(CASES))
def test_a_step_detector_names_its_fault_and_the_critic_proposes_the_fix(fault):
    make, name, change = CASES[fault]
    env, faulty, healthy, script = make()
    ev = evidence(faulty, samples(env, faulty, script))
    found = run_agent_detectors(ev)
    assert [d.name for d in found if d.name in STEP_DETECTORS] == [name], [d.summary for d in found]
    d = next(d for d in found if d.name == name)
    assert d.evidence["share"] == 1.0 and d.evidence["samples_read"] == N and d.severity == "critical"
    assert d.evidence["harness_version"] == faulty.version
    ctx = OperatorContext(goal="g", harness=faulty.model_dump(mode="json")).with_findings(found)
    ivs = [iv for iv in AgentHarnessCritic().propose(ev, ctx) if iv.diagnosis.name == name]
    assert len(ivs) == 1 and ivs[0].kind == InterventionKind.HARNESS_EDIT and ivs[0].changes == change(env)
    # without the controller's findings the operator runs the detectors itself, on the live harness it is given
    bare = ev.model_copy(update={"harness": None})
    assert [iv.changes for iv in AgentHarnessCritic().propose(bare, OperatorContext(goal="g", harness=ctx.harness))
            if iv.diagnosis.name == name] == [change(env)]


@pytest.mark.parametrize("fault", sorted(CASES))
def test_the_same_policy_under_the_healthy_harness_leaves_every_step_detector_quiet(fault):
    make, name, _ = CASES[fault]
    env, _, healthy, script = make()
    ev = evidence(healthy, samples(env, healthy, script))
    shares = detector_shares(ev)
    assert all(shares[n] == 0.0 for n in STEP_DETECTORS), shares
    assert [d.name for d in run_agent_detectors(ev)] == []


@pytest.mark.parametrize("bad", [0, 4, 5, 10])
def test_the_parser_detector_fires_from_its_share_of_the_recent_trajectories(bad):
    """`bad` of 10 episodes write positional calls the strict parser rejects; the others named calls
    that parse (and fail for another reason: a wrong answer)."""
    env, faulty, _, _ = _parser()
    rejected = samples(env, faulty, lambda ex: [positional(ex), "<answer>0</answer>"])
    parsed = samples(env, faulty, lambda ex: [named(ex), "<answer>0</answer>"])
    rows = rejected[:bad] + parsed[bad:]
    share = detector_shares(evidence(faulty, rows))["agent_malformed_call"]
    assert share == pytest.approx(bad / 10)
    fires = "agent_malformed_call" in [d.name for d in run_agent_detectors(evidence(faulty, rows))]
    assert fires == (bad / 10 >= STEP_SHARE[Mode.MALFORMED_CALL])


def test_a_groups_trajectories_of_one_episode_count_one_by_one():
    """GRPO samples each episode many times: the share counts trajectories, not distinct episodes."""
    env, faulty, _, script = _observation_cut()
    group = samples(env, faulty, script, n=1) * N
    assert len({r["uid"] for r in group}) == 1
    assert detector_shares(evidence(faulty, group))["agent_observation_cut"] == 1.0


def test_step_detectors_read_only_enough_records_of_the_live_harness():
    env, faulty, healthy, script = _parser()
    rows = samples(env, faulty, script)
    assert run_agent_detectors(evidence(faulty, rows[: MIN_SAMPLES - 1])) == []          # too few yet
    assert run_agent_detectors(evidence(healthy, rows)) == []       # an edit since: old harness records are not read
    assert run_agent_detectors(Evidence(run_dir="/x", samples=rows)) == []                # no live harness known
    old = [{k: v for k, v in r.items() if k != "steps"} for r in rows]                    # text-only samples
    assert run_agent_detectors(evidence(faulty, old)) == []


def test_records_are_capped_and_keep_the_raw_length():
    env = lookup(verbose=True)
    h = env.default_harness(observation={"max_chars": 12, "cut": "end"}, sampling={"max_new_tokens": 600})
    ex = env.episode("train", 0, 1)
    t = run_episode(ScriptedPolicy([named(ex), "x" * 600]), env, ex, h)
    r = t.record(text_chars=20, raw_chars=8, steps=1)
    assert r["steps_total"] == 2 and len(r["steps"]) == 1
    s = r["steps"][0]
    assert s["action"] == "tool_call" and s["raw_observation"] == t.steps[0].raw_observation[:8]
    assert s["raw_chars"] == len(t.steps[0].raw_observation) and s["observation"] == t.steps[0].observation
    full = t.record()
    assert len(full["steps"][1]["text"]) == 256 and "ids" not in full and "messages" not in full


def test_a_real_run_writes_step_level_records_under_its_harness_version(tmp_path):
    from trainer.agent_train import AgentTrainConfig, AgentTrainer

    cfg = AgentTrainConfig.parse({**TINY, "name": "r", "out_dir": str(tmp_path), "checkpoint": {"interval": 0},
                                  "harness_fault": {"tool_syntax.lenient": False}, "demo_calls": "positional"})
    AgentTrainer(cfg, printer=None).run()
    rows = read_jsonl(cfg.run_dir / "samples.jsonl")
    versions = {r["harness_version"] for r in read_jsonl(cfg.run_dir / "metrics.jsonl") if r["algorithm"] == "grpo"}
    assert len(rows) == TINY["grpo"]["steps"] * TINY["samples_per_step"]
    assert {r["harness_version"] for r in rows} == versions
    assert all(r["env_tools"] == [t.model_dump(mode="json") for t in make_env("lookup").tool_specs()] for r in rows)
    assert all(r["steps"] and all(len(s["text"]) <= 256 for s in r["steps"]) for r in rows)
    assert all(r["steps_total"] == len(r["steps"]) == r["turns"] for r in rows)
    # the records are what the critic's diagnosis reads
    live = yaml.safe_load((cfg.run_dir / "harnesses" / f"{versions.pop()}.yaml").read_text())
    assert detector_shares(Evidence(run_dir=str(cfg.run_dir), samples=rows, harness=live))["agent_malformed_call"] \
        is not None


# ---- end to end -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_controller_fixes_observations_cut_from_the_wrong_side_and_reaches_the_target(tmp_path, monkeypatch):
    """lookup at difficulty 1 with verbose tool outputs (`key 'abc' holds 42`) on the default built-in
    agent model, seed 505 (its warm-up learns the task: benchmarks/results/agentic_faults.md, s505),
    300 warm-up steps under the healthy harness (outputs cut to 12 characters keeping the tail), then
    GRPO under `observation.cut: end`: the cut keeps the head and removes the value."""
    ctrl = controller(tmp_path, monkeypatch, {
        "env": "lookup", "difficulty": 1, "seed": 505, "threads": 1, "eval_size": 32, "eval_every": 2,
        "env_options": {"verbose": True}, "harness_edits": {"observation.max_chars": 12, "observation.cut": "start"},
        "samples_per_step": 4, "sft": {"steps": 300}, "grpo": {"steps": 400},
        "harness_fault": {"observation.cut": "end"}, "checkpoint": {"interval": 10}},
        observe_every_s=1, evaluate_window_steps=10, min_steps_between_interventions=0,
        backtest={"horizon_steps": 4, "seeds": [0], "eval_size": 32})
    summary = ctrl.run()
    assert summary["reached"] and summary["reason"] == "target_met", summary
    ivs = [iv for iv in ctrl.store.list() if iv.changes == {"harness.observation.cut": "start"}]
    assert ivs, [(iv.changes, iv.status, iv.diagnosis.name) for iv in ctrl.store.list()]
    iv = ivs[0]
    assert iv.operator == "agent_harness_critic" and iv.diagnosis.name == "agent_observation_cut"
    assert iv.diagnosis.evidence["share"] >= STEP_SHARE[Mode.OBSERVATION_CUT]
    assert iv.backtest is not None and iv.backtest.passed and iv.backtest.candidate[0] > iv.backtest.control[0]
    assert iv.status in (Status.APPLIED, Status.EVALUATING, Status.KEPT)
    assert iv.outcome.before == {"harness.observation.cut": "end"}
    arm = yaml.safe_load((ctrl.private / "backtests" / f"bt-{iv.id}-candidate-s0.yaml").read_text())
    assert arm["fork_from"].endswith(f"bt-{iv.id}.pt") and arm["fork_overrides"] == {"harness.observation.cut": "start"}
    acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
    assert acks[f"{iv.id}-apply"]["status"] == "applied"
    after = [r for r in read_jsonl(ctrl.run_dir / "metrics.jsonl")
             if r["step"] > iv.applied_step and "heldout_acc" in r]
    assert after and after[-1]["heldout_acc"] >= 0.5
