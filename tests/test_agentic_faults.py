"""Agentic fault scenarios (swarmbench/agentic.py) and what the trainer does with them: the generator
is deterministic and covers every mechanism in both origins, every fault is a typed harness edit that
`check_edit` accepts on the scenario's healthy harness, a drift fault changes the harness at its step
and not before, and the periodic critic (`critic.every`) runs after the change and repairs it. The
policy of the trainer runs is the hand-written grounded agent of tests/test_harness_critic_train.py
(the harness alone decides success); models are tiny."""
from __future__ import annotations

import pytest

from harness.agent import check_edit
from swarmbench.agentic import DRIFT_AFTER, ENVS, MECHANISMS, ORIGINS, generate, parse_seeds, scenario
from trainer.agent_train import AgentTrainConfig, AgentTrainer
from trainer.config import ModelConfig
from trainer.envs import make_env
from trainer.runlog import read_jsonl
from trainer.tasks.base import Split

from test_harness_critic_train import GroundedTrainer, config

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=256, learned_positions=True).model_dump()
ALL = [(env, m, o) for m, (envs, _) in MECHANISMS.items() for env in envs for o in ORIGINS]


def test_the_generator_is_deterministic_and_draws_every_mechanism_in_both_origins():
    assert [generate(s) for s in range(100, 140)] == [generate(s) for s in range(100, 140)]
    assert generate(100) != generate(101)
    drawn = {(g["env"], g["mechanism"], g["origin"]) for g in map(generate, range(400))}
    assert drawn == set(ALL)
    for s in range(200):
        g = generate(s)
        assert (g["origin"] == "drift") == (g["drift_after_grpo_steps"] in DRIFT_AFTER)
        assert g["healthy"].get("harness_fault") is None and g["config"]["harness_fault"] == g["fault"]
        if g["origin"] == "drift":
            assert g["config"]["harness_fault_step"] == ENVS[g["env"]]["sft_steps"] + g["drift_after_grpo_steps"]
        else:
            assert "harness_fault_step" not in g["config"]


def test_scenario_refuses_what_does_not_make_sense():
    with pytest.raises(ValueError, match="does not apply"):
        scenario(0, "calc", "observation_cut", "config")
    with pytest.raises(ValueError, match="needs its step"):
        scenario(0, "lookup", "parser", "drift")
    assert parse_seeds("100-102,7") == [100, 101, 102, 7]


def tiny(sc: dict, tmp_path, which: str = "config", **over) -> AgentTrainConfig:
    data = {**sc[which], "seed": sc["seed"], "out_dir": str(tmp_path), "name": sc["id"], "model": TINY,
            "sft": {"steps": 0}, "grpo": {"steps": 0}, "eval_size": 4, **over}
    if "harness_fault_step" in data:
        data["harness_fault_step"] = 2
    return AgentTrainConfig.parse(data)


@pytest.mark.parametrize("env,mechanism,origin", ALL)
def test_every_fault_is_a_typed_edit_the_healthy_harness_accepts(tmp_path, env, mechanism, origin):
    sc = scenario(5, env, mechanism, origin, DRIFT_AFTER[0] if origin == "drift" else None)
    healthy = AgentTrainer(tiny(sc, tmp_path, "healthy"), printer=None).harness
    for path, value in sc["fault"].items():
        assert check_edit(healthy, path, value) is None, (path, value)
    t = AgentTrainer(tiny(sc, tmp_path), printer=None)     # the trainer applies the same edits
    assert (t.harness.version == healthy.version) == (origin == "drift")
    assert t.demo_harness.version == healthy.version


def test_lookup_verbose_outputs_and_the_wrong_side_cut():
    plain, verbose = make_env("lookup", seed=3), make_env("lookup", seed=3, verbose=True)
    ex = plain.episode(Split.TRAIN, 0, 1)
    assert verbose.episode(Split.TRAIN, 0, 1) == ex                  # the same episodes
    key = ex.meta["asked"][0]
    assert plain.call(ex, "get", {"key": key}).observation == ex.answer
    out = verbose.call(ex, "get", {"key": key}).observation
    assert out == f"key '{key}' holds {ex.answer}"
    sc = scenario(0, "lookup", "observation_cut", "config")
    h = verbose.default_harness()
    for path, value in sc["healthy"]["harness_edits"].items():
        h = h.model_copy(update={"observation": h.observation.model_copy(update={path.split(".")[1]: value})})
    shown, cut = h.observation.apply(out)
    assert cut and shown.endswith(ex.answer)                          # the healthy cut keeps the value
    wrong = h.observation.model_copy(update={"cut": sc["fault"]["observation.cut"]})
    assert ex.answer not in wrong.apply(out)[0]                       # the fault's cut removes it
    with pytest.raises(ValueError, match="verbose"):
        make_env("lookup", verbose="yes")


def test_a_fault_step_needs_a_fault_and_comes_after_the_warm_up(tmp_path):
    with pytest.raises(ValueError, match="needs a harness_fault"):
        config(tmp_path, harness_fault={}, harness_fault_step=3)
    with pytest.raises(ValueError, match="inside the warm-up"):
        config(tmp_path, sft={"steps": 5}, harness_fault_step=3)


def test_a_drift_fault_changes_the_harness_at_its_step_and_not_before(tmp_path):
    cfg = config(tmp_path, harness_fault_step=2, grpo={"steps": 4, "prompts": 2, "group_size": 2},
                 critic={"enabled": False}, eval_every=0)
    t = GroundedTrainer(cfg, printer=None)
    healthy = t.harness.version
    assert t.harness.tool_syntax.kind == "call" and t.start_harness.version == healthy
    t.run()
    rows = [r for r in read_jsonl(tmp_path / "crit" / "metrics.jsonl") if r["algorithm"] == "grpo"]
    versions = {r["step"]: r["harness_version"] for r in rows}   # a GRPO row's step is the step it ended at
    assert versions[1] == versions[2] == healthy
    assert versions[3] == versions[4] == t.harness.version != healthy
    assert t.harness.tool_syntax.kind == "json" and t.start_harness.version == t.harness.version
    changes = [e for e in read_jsonl(tmp_path / "crit" / "events.jsonl") if e["event"] == "harness_change"]
    assert len(changes) == 1 and changes[0]["step"] == 2 and changes[0]["harness_before"] == healthy
    # the event shows the change a live config change leaves, never the fault it came from
    assert changes[0]["harness_version"] == t.harness.version and not {"edits", "source", "applied"} & set(changes[0])
    shown = (tmp_path / "crit" / "config.yaml").read_text()
    assert "harness_fault" not in shown
    # every harness a metrics row names is stored: a controller reads the harness in force from it
    stored = {p.stem for p in (tmp_path / "crit" / "harnesses").glob("*.yaml")}
    assert set(versions.values()) <= stored


@pytest.mark.parametrize("i,every,due", [(0, 0, False), (3, 0, False), (0, 2, True), (1, 2, False), (4, 2, True),
                                         (5, 3, False), (6, 3, True)])
def test_the_periodic_critic_schedule(i, every, due):
    assert AgentTrainer.critic_due(i, every) is due


def test_the_periodic_critic_runs_after_a_drift_and_repairs_it(tmp_path):
    cfg = config(tmp_path, harness_fault_step=3, grpo={"steps": 6, "prompts": 2, "group_size": 2}, eval_every=0,
                 critic={"every": 2, "distill_steps": 0, "grpo_steps": 0})
    t = GroundedTrainer(cfg, printer=None)
    t.run()
    events = read_jsonl(tmp_path / "crit" / "events.jsonl")
    critiques = [e["step"] for e in events if e["event"] == "critique"]
    assert critiques[:3] == [0, 2, 4]                      # before GRPO steps 0, 2 and 4
    change = next(e for e in events if e["event"] == "harness_change")
    kept = [e for e in events if e["event"] == "harness_edit" and e["kept"]]
    assert change["step"] == 3
    assert [(e["path"], e["value"], e["step"]) for e in kept] == [("tool_syntax.kind", "call", 4)]
    assert t.harness.tool_syntax.kind == "call" and t.start_harness.tool_syntax.kind == "json"
    # before the change the critic read only successes and kept nothing
    assert all(e["failed"] == 0 for e in events if e["event"] == "critique" and e["step"] < 3)


def _failed_call(uid: str, error: str | None) -> dict:
    return {"uid": uid, "end": "answered", "result": {"verdict": "wrong"}, "tool_calls": 1, "expected": "42",
            "steps": [{"action": "tool_call", "tool": "get", "arguments": {"key": "abx"}, "error": error,
                       "text": '<tool>get(key="abx")</tool>', "observation": "error: no key 'abx'"},
                      {"action": "answer", "text": "<answer>0</answer>"}]}


def test_the_critic_restores_a_misdescribed_tool_only_on_failing_calls_of_it():
    from harness.agent import apply_edit
    from harness.critic import Mode, critique

    env = make_env("lookup")
    healthy = env.default_harness()
    wrong = apply_edit(healthy, "tools.get.description", "the number of keys in the table")
    records = [_failed_call(f"e{i}", "tool_error") for i in range(5)]
    crit = critique(records, wrong, env.tool_specs())
    assert [(f.mode, f.count) for f in crit.findings][:1] == [(Mode.TOOL_SPEC_DIFFERS, 5)]
    edit = next(e for e in crit.edits if e.mode is Mode.TOOL_SPEC_DIFFERS)
    assert edit.path == "tools.get" and apply_edit(wrong, edit.path, edit.value).version == healthy.version
    # the environment's own spec: nothing to restore; calls without an error: no evidence
    assert all(f.mode is not Mode.TOOL_SPEC_DIFFERS for f in critique(records, healthy, env.tool_specs()).findings)
    clean = [_failed_call(f"e{i}", None) for i in range(5)]
    assert all(f.mode is not Mode.TOOL_SPEC_DIFFERS for f in critique(clean, wrong, env.tool_specs()).findings)
