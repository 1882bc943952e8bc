"""Skills keyed by what mattered (agents/miner.py `key`): a mined skill names the fields whose value
the fix actually moved (the values in force when it was applied, as the live run published them:
swarm/deciding.py `published_values`), and the diagnosis from the run's evidence —
never "reset every field of a section" because a departure finding (harness_drift: the live config
left what the controller set) was what the fix was proposed for.

    .venv/bin/python -m pytest tests/test_skill_keys.py -q
"""
from __future__ import annotations

import time

import pytest
import yaml

from agents.domain import Diagnosis, Intervention, InterventionKind as K, Status
from agents.miner import SkillMiner, key
from agents.progress import config_fields
from skills import parse_skill, seed_dir
from swarm.graph import SwarmState
from test_claims import Recorder, close, controller
from test_skill_use import TRUNC, episode, view

MNT = "harness.sampling.max_new_tokens"
SET = config_fields("harness", {"sampling": {"max_new_tokens": 64, "temperature": 1.0}})   # what the controller set
LIVE = {**SET, MNT: 4}    # what ran: one field left it behind the controller's back


@pytest.fixture(autouse=True)
def _home(clean_git_home):
    """Every test here runs with a clean git HOME (conftest.clean_git_home)."""


def reset(i: int, *findings: str, before: dict | None = LIVE, outcome: str = "kept") -> object:
    """A harness_drift fix that set every harness field back to the controller's value."""
    ep = episode(i, "harness_drift", "harness_edit", dict(SET), outcome, 0.3 if outcome == "kept" else -0.1,
                 window=view("harness_drift", *findings, truncation_rate=1.0 if "truncation" in findings else 0.0))
    return ep.model_copy(update={"before": dict(before or {})})


def test_a_whole_section_reset_where_one_field_differed_names_only_that_field():
    assert len(SET) > 10                                     # the fix set every harness field
    (act,) = SkillMiner().mine([reset(1)], [], {})
    sk = act.skill
    assert act.action == "add" and act.verdict.ok, act.reason
    assert sk.swarmlab.diagnosis == "harness_drift" and sk.swarmlab.trigger.diagnosis == "harness_drift"
    assert sk.swarmlab.intervention.fields == [MNT] and sk.swarmlab.intervention.changes == {MNT: 64}
    assert sk.signature() == f"harness_drift|harness_edit|{MNT}" and sk.name == "harness-edit-max-new-tokens-on-harness-drift"
    assert "only `harness.sampling.max_new_tokens` differed from the values in force" in sk.body
    assert "harness.answer.prefix" not in sk.description + str(sk.swarmlab.model_dump())


def test_a_departure_fix_whose_evidence_showed_truncation_is_keyed_by_truncation():
    eps = [reset(1, "truncation"), reset(2, "truncation", "plateau")]
    (act,) = SkillMiner().mine(eps, [], {})
    sk = act.skill
    assert act.action == "add" and act.verdict.ok, act.reason
    assert sk.signature() == TRUNC and sk.swarmlab.trigger.diagnosis_names() == ["truncation"]
    assert sk.swarmlab.intervention.fields == [MNT] and sk.name == "harness-edit-max-new-tokens-on-truncation"
    assert "harness_drift" not in sk.name and "harness_drift" not in sk.description
    assert "proposed for `harness_drift`" in sk.body and "(proposed for harness_drift)" in sk.body   # what it applies to
    # verified against the finding it is keyed by: it fires on both windows and on no unrelated one
    assert act.verdict.fired_on_covered == 2

    # with a seed truncation skill in the library, the same episodes back it: an update, its fix unchanged
    seed = parse_skill(seed_dir() / "raise-max-new-tokens-on-truncation")
    (upd,) = SkillMiner().mine(eps, [seed], {})
    assert upd.action == "update" and upd.name == seed.name and upd.skill.signature() == seed.signature() == TRUNC
    assert upd.skill.swarmlab.intervention.fields == [MNT] and upd.skill.swarmlab.trigger == seed.swarmlab.trigger


def test_a_departure_explained_by_a_finding_about_other_fields_stays_a_departure():
    (act,) = SkillMiner().mine([reset(1, "low_temperature")], [], {})   # temperature did not move
    assert act.skill.swarmlab.diagnosis == "harness_drift" and act.skill.swarmlab.intervention.fields == [MNT]


def test_what_is_not_known_or_moved_nothing_is_not_mined():
    assert SkillMiner().mine([reset(1, "truncation", before={})], [], {}) == []   # values in force not recorded
    k, why = key(reset(1, before=SET))
    assert k is None and "already had" in why                                      # nothing differed
    same = episode(2, "truncation", "harness_edit", {MNT: 64}, "kept", 0.2).model_copy(update={"before": {MNT: 64}})
    assert SkillMiner().mine([same], [], {}) == []


def test_an_existing_correct_single_field_skill_is_unchanged():
    plain = [episode(1, "truncation", "harness_edit", {MNT: 6}, "kept", 0.4),
             episode(2, "truncation", "harness_edit", {MNT: 12}, "kept", 0.3, task="sort")]
    (old,) = SkillMiner().mine(plain, [], {})
    recorded = [e.model_copy(update={"before": {MNT: 2}}) for e in plain]    # the same fixes, values in force recorded
    (new,) = SkillMiner().mine(recorded, [], {})
    assert new.skill == old.skill and old.skill.signature() == TRUNC
    assert old.skill.swarmlab.intervention.fields == [MNT] and old.skill.swarmlab.intervention.changes == {}

    # in the library, a departure fix keyed by truncation adds evidence to it and changes nothing else
    (upd,) = SkillMiner().mine(plain + [reset(3, "truncation")], [old.skill], {})
    assert upd.action == "update" and upd.skill.swarmlab.episodes == ["ws/00000001", "ws/00000002", "ws/00000003"]
    before, after = old.skill.swarmlab.model_dump(), upd.skill.swarmlab.model_dump()
    for k in ("diagnosis", "trigger", "intervention", "status"):
        assert before[k] == after[k], k


# ---------------------------------------------------------------------- what was in force, recorded


def _published(ctrl, harness: dict, step: int = 60) -> str:
    """The live run as the trainer publishes it: its metrics row names the harness version, and the
    harness it was set to is stored under that version."""
    from agents.evidence import Evidence
    from harness.spec import HarnessSpec

    spec = HarnessSpec.model_validate(harness)
    d = ctrl.run_dir / "harnesses"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{spec.version}.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    ctrl.tick.evidence = Evidence(run_dir=str(ctrl.run_dir), job_status="RUNNING", step=step,
                                  metrics=[{"step": step, "harness_version": spec.version, "lr": 3e-3}])
    return spec.version


def _apply(ctrl, changes: dict, diagnosis: str = "harness_drift"):
    d = Diagnosis(name=diagnosis, summary="drift", operator="harness_critic", policy="builtin", evidence={"since_step": 55})
    iv = Intervention(kind=K.HARNESS_EDIT, changes=changes, diagnosis=d, rationale="r", operator="harness_critic",
                      policy="builtin")
    ctrl.store.put(iv)
    ctrl.open_pr(ctrl.store.get(iv.id))
    ctrl.store.transition(iv.id, Status.VALIDATED, "goes back")
    ctrl.command = Recorder()
    ctrl.apply(ctrl.store.get(iv.id), SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60))
    return ctrl.store.get(iv.id)


def test_apply_records_the_published_values_in_force_and_the_episode_keeps_them(tmp_path):
    ctrl = controller(tmp_path)
    try:
        set_now = config_fields("harness", ctrl.ws.current_harness())
        live = {**ctrl.ws.current_harness()}
        live["sampling"] = {**live.get("sampling", {}), "max_new_tokens": 1}
        assert set_now[MNT] != 1
        _published(ctrl, live)                          # a person set max_new_tokens 1 through a command
        got = _apply(ctrl, set_now)
        assert got.status == Status.APPLIED and set(got.outcome.before) == set(set_now)
        assert [k for k in set_now if got.outcome.before[k] != set_now[k]] == [MNT]

        kept = got.model_copy(update={"status": Status.KEPT, "history": [{"time": time.time()}]})
        assert ctrl.knowledge.record(kept, view("harness_drift", "truncation", truncation_rate=1.0))
        (ep,) = ctrl.knowledge.memory.episodes()
        assert ep.before == got.outcome.before
        (act,) = SkillMiner().mine([ep], [], {})
        assert act.action == "add" and act.skill.signature() == TRUNC, act.reason
    finally:
        close(ctrl)


def test_a_change_nobody_published_stays_unknown_and_never_comes_from_the_trainers_files(tmp_path):
    """A harness version the run reports but never stored (changed behind everyone's back): which
    field moved is not known, so the record stands in; the controller reads no checkpoint for it."""
    ctrl = controller(tmp_path)
    try:
        set_now = config_fields("harness", ctrl.ws.current_harness())
        from agents.evidence import Evidence

        ctrl.tick.evidence = Evidence(run_dir=str(ctrl.run_dir), job_status="RUNNING", step=60,
                                      metrics=[{"step": 60, "harness_version": "0123abcd", "lr": 3e-3}])
        got = _apply(ctrl, set_now)
        assert got.outcome.before == set_now
        # a version that is no file name is never opened
        ctrl.tick.evidence = ctrl.tick.evidence.model_copy(update={"metrics": [{"step": 61, "harness_version": "../../x"}]})
        assert ctrl.published_values([MNT]) == {MNT: set_now[MNT]}
    finally:
        close(ctrl)
