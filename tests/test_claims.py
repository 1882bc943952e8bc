"""Regression tests for the failure classes of judgement (issue: one decision model): each is
driven through the real controller's nodes on hand-built run files, the adversarial LLM replies
through the real litellm client against the scripted server (tests/fake_llm_server.py).

    .venv/bin/python -m pytest tests/test_claims.py -q
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from fake_llm_server import FakeLLMServer, tool_call  # noqa: E402

from agents.domain import Diagnosis, Intervention, InterventionKind as K, Status  # noqa: E402
from swarm.goal import Goal  # noqa: E402
from swarm.graph import SwarmState  # noqa: E402
from test_controller_upkeep import ScriptedArms  # noqa: E402
from test_swarm import tiny_goal  # noqa: E402

KEY_ENV = "SWARMLAB_TEST_LLM_KEY"


@pytest.fixture(autouse=True)
def _home(clean_git_home, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-123")


def healthy_run(run_dir: pathlib.Path, steps: int = 60) -> None:
    """Run files of a healthy SFT job that is alive (its heartbeat is fresh and names this process),
    learning slowly: hundreds of steps from its target, so every fix is worth verifying."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time() - steps
    rows = []
    for s in range(1, steps + 1):
        rows.append({"step": s, "segment": 0, "time": t0 + s, "loss": 2.0 * 0.97 ** s + 0.1, "grad_norm": 1.0,
                     "lr": 0.005, "pass_rate": min(0.9, s / 80), "algorithm": "sft", "difficulty": 2, "step_time": 0.05,
                     "tokens_per_s": 1000.0, "truncation_rate": 0.0, "malformed_rate": 0.05, "harness_version": "h1"})
        if s % 25 == 0:
            rows.append({"step": s, "segment": 0, "time": t0 + s, "heldout_acc": 0.1 + s / 1000,   # far from the target
                         "heldout_truncated": 0.0, "heldout_malformed": 0.02})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "events.jsonl").write_text(json.dumps({"time": t0, "step": 0, "event": "start"}) + "\n")
    (run_dir / "heartbeat.json").write_text(json.dumps({"time": time.time(), "pid": __import__("os").getpid(),
                                                        "step": steps, "state": "running", "cpu_s": 10.0}))
    ck = run_dir / "checkpoints"
    ck.mkdir(exist_ok=True)
    (ck / "step_0000050.json").write_text(json.dumps({"name": "step_0000050", "step": 50, "kind": "periodic", "time": t0 + 50}))


class Arms(ScriptedArms):
    """ScriptedArms that also records what was started."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.started = []

    def start(self, name, config_path, restart=0):
        self.started.append(name)
        self.restarts = getattr(self, "restarts", []) + [restart]
        return super().start(name, config_path)


class Recorder:
    """Stands in for the trainer's command channel: acknowledges checkpoints, records everything."""

    def __init__(self, step=60):
        self.sent = []
        self.step = step

    def __call__(self, cmd, cid, timeout=60.0, **args):
        self.sent.append((cmd, cid, args))
        return {"id": cid, "cmd": cmd, "status": "applied", "step": self.step, "time": time.time()}


def controller(tmp_path, **goal_over):
    from swarm.controller import Controller

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}, **goal_over))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    healthy_run(ctrl.run_dir)
    return ctrl


def close(ctrl):
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def tick(ctrl, s: SwarmState) -> SwarmState:
    """One full pass of the graph's nodes after observe, as the graph runs them."""
    for node in (ctrl.node_diagnose, ctrl.node_propose, ctrl.node_backtest, ctrl.node_gate, ctrl.node_apply):
        upd = node(s)
        s = SwarmState(**{**s.__dict__, **{k: v for k, v in upd.items() if k in s.__dict__}})
    return s


def proposal(**over):
    args = {"kind": "recipe_edit", "changes": {"recipe.lr": 0.001},
            "diagnosis": {"name": "lr_too_high", "summary": "s", "severity": "critical"},
            "rationale": "r", "risk": "low", "expected_effect": "e"}
    args.update(over)
    return args


NO = tool_call("no_action", {"reason": "nothing to do"})


def test_adversarial_llm_false_divergence_lr_10_risk_low_and_restart_spam_are_not_applied(tmp_path):
    """Through the LLM policy: the diagnostics operator claims a loss spike (nothing is non-finite or
    spiking), rolls back with recipe.lr = 10 and calls it low risk; cluster ops asks to restart the
    healthy job on every tick. Nothing is applied: the restart is refused (no crash or stall is
    found), the rollback is high risk by the controller's measure and is backtested, where it loses."""
    srv = FakeLLMServer()
    try:
        ctrl = controller(tmp_path, llm={"model": "openai/fake", "api_base": srv.url, "api_key_env": KEY_ENV,
                                         "timeout_s": 60.0, "max_retries": 0}, budget={"llm_usd": 1.0})
        ctrl.command = rec = Recorder()
        # candidate arms blow up (the loss goes to thousands, held-out to 0), the control keeps its level
        ctrl.jobs = arms = Arms(lambda cfg, step: 5000.0 if "candidate" in cfg["name"] else 0.7,
                                        heldout=lambda cfg: 0.0 if "candidate" in cfg["name"] else 0.5)
        restart = tool_call("propose_intervention", proposal(
            kind="restart", changes={}, diagnosis={"name": "stale_heartbeat", "summary": "the job hangs", "severity": "critical"}))
        rollback = tool_call("propose_intervention", proposal(
            kind="rollback", changes={"recipe.lr": 10}, rollback_to="step_0000050",
            diagnosis={"name": "loss_spike", "summary": "the loss diverged", "severity": "critical"}))
        s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60, started=time.time(), launched=time.time() - 600)
        ctrl.state_job = "ghost"
        # replies in the operators' order: cluster_ops, data_curation, diagnostics, harness_critic
        for _ in range(3):                               # restart spam on three ticks
            srv.push(restart, NO, NO, NO)
            ctrl.tick = type(ctrl.tick)()
            s = tick(ctrl, s)
        # then the false divergence claim, on new evidence (an operator whose inputs did not change is
        # not asked again: its last answer stands)
        with open(ctrl.run_dir / "metrics.jsonl", "a") as f:       # appended, as a trainer writes
            f.write("".join(json.dumps({"step": st, "segment": 0, "time": time.time(), "loss": 0.4, "grad_norm": 1.0,
                                        "lr": 0.005, "pass_rate": 0.75, "algorithm": "sft", "difficulty": 2,
                                        "step_time": 0.05, "tokens_per_s": 1000.0, "truncation_rate": 0.0,
                                        "malformed_rate": 0.05, "harness_version": "h1"}) + "\n" for st in range(61, 65)))
        srv.push(NO, NO, rollback, NO)
        ctrl.tick = type(ctrl.tick)()
        s = tick(ctrl, s)
        ivs = ctrl.store.list()
        restarts = [iv for iv in ivs if iv.kind == K.RESTART]
        rb = next((iv for iv in ivs if iv.kind == K.ROLLBACK), None)
        assert rb is not None, (ctrl.llm.decisions[-4:], ctrl.lead.dropped)
        assert len(restarts) == 3 and all(iv.status == Status.REJECTED for iv in restarts)
        assert all("detectors see no crashed, stale or input-bound job" in iv.history[-1]["note"] for iv in restarts)
        assert s.restarts == 0 and not ctrl.store.timeline("job_started")
        assert rb.policy.startswith("llm") and rb.outcome.proposed_risk == "low" and rb.risk.value == "high"
        assert rb.backtest_skipped is None and rb.backtest is not None and rb.status == Status.REJECTED
        assert rb.backtest.signal == "target" and "credibly worse" in rb.backtest.note
        assert {c for c, _, _ in rec.sent} == {"checkpoint", "pause", "resume"}   # no set_fields, no rollback sent
        # the live job waited at the fork while the arms ran, and went on after
        assert [c for c, _, _ in rec.sent if c in ("pause", "resume")] == ["pause", "resume"]
        assert any("candidate" in n for n in arms.started) and "train" not in arms.started
        close(ctrl)
    finally:
        srv.close()


def test_a_change_the_trainer_refuses_is_tried_as_its_nearest_valid_variant_or_refused_as_a_loss(tmp_path):
    """Class 1: a curriculum below the task's minimum is clamped to it before anything starts; a
    change with no valid variant is refused before any arm starts, and is a loss in memory."""
    ctrl = controller(tmp_path)
    ctrl.command = rec = Recorder()
    ctrl.jobs = Arms(lambda cfg, step: 1.0)
    assert ctrl.context(ctrl.evidence("RUNNING")).min_difficulty == ctrl.task_range[0] == 1
    d = Diagnosis(name="too_hard_curriculum", summary="nothing solved", operator="data_curation", policy="builtin")
    eased = Intervention(kind=K.DATA_CHANGE, changes={"harness.curriculum.start": 0, "harness.curriculum.end": 2},
                         diagnosis=d, rationale="r", operator="data_curation", policy="builtin")
    bad = Intervention(kind=K.HARNESS_EDIT, changes={"harness.sampling.max_new_tokens": 0}, rationale="r",
                       diagnosis=Diagnosis(name="truncation", summary="s", operator="harness_critic", policy="builtin"),
                       operator="harness_critic", policy="builtin")
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60, started=time.time())
    ctrl.tick.proposals = [eased]
    ctrl.node_propose(s)
    got = {iv.id: iv for iv in ctrl.store.list()}
    assert got[eased.id].changes["harness.curriculum.start"] == 1 and "clamped" in got[eased.id].rationale
    ctrl.store.put(bad)          # recorded on an earlier tick (one fix in flight: not beside `eased` on one tick)
    ctrl.node_backtest(s)
    refused = ctrl.store.get(bad.id)
    assert refused.status == Status.REJECTED and refused.backtest is None
    assert "the live trainer would refuse it" in refused.history[-1]["note"] and "max_new_tokens" in refused.outcome.refused
    assert not any(cid.startswith(bad.id) for _, cid, _ in rec.sent)       # no fork, no arm for it
    assert ctrl.knowledge.record(refused, {})
    (ep,) = [e for e in ctrl.knowledge.memory.episodes() if e.id.endswith(bad.id)]
    assert ep.outcome == "rejected" and ep.lost()
    close(ctrl)


def test_restarts_wait_for_the_launch_grace_and_the_backoff_and_stop_at_the_cap(tmp_path):
    """Class 2: a restart is not even proposed within the backoff after a launch; all restarts,
    whatever their cause, count against max_restarts, enforced when applying too."""
    ctrl = controller(tmp_path, swarm={"max_restarts": 2, "stale_heartbeat_s": 20.0})
    d = Diagnosis(name="crashed_job", summary="FAILED", operator="cluster_ops", policy="builtin", severity="critical")
    restart = Intervention(kind=K.RESTART, diagnosis=d, rationale="r", operator="cluster_ops", policy="builtin")
    now = time.time()
    assert ctrl.prepare(restart, SwarmState(restarts=0, launched=now - 5)) is None          # within the first grace (20 s)
    assert ctrl.prepare(restart, SwarmState(restarts=0, launched=now - 25)) is not None
    assert ctrl.prepare(restart, SwarmState(restarts=1, launched=now - 25)) is None         # backoff: 40 s after one restart
    assert ctrl.prepare(restart, SwarmState(restarts=1, launched=now - 45)) is not None
    assert ctrl.prepare(restart, SwarmState(restarts=2, launched=now - 4000)) is None       # the cap
    held = ctrl.store.timeline("restart_held")
    assert len(held) == 3 and "max_restarts=2 reached" in held[-1]["reason"]
    ctrl.store.put(restart)
    ctrl.store.transition(restart.id, Status.VALIDATED, "crash confirmed")
    assert ctrl.apply(ctrl.store.get(restart.id), SwarmState(restarts=2, job=None)) == {}
    assert ctrl.store.get(restart.id).status == Status.REJECTED and not ctrl.store.timeline("job_started")
    # a launch passes the run's restart count on (a Ray job's id counts them: a resumed controller
    # that launches the same job again finds it)
    ctrl.jobs = arms = Arms(lambda cfg, step: 1.0)
    assert ctrl.node_launch(SwarmState(restarts=1, job=None))["job"] == "train"
    assert arms.started == ["train"] and arms.restarts == [1]
    close(ctrl)


def judged(ctrl, iv, after, s, findings=(), diagnosed=True):
    """Apply bookkeeping as the controller's apply leaves it, then evaluation rows and the judge (the
    detectors naming `findings` on its tick; `diagnosed=False`: a tick that ran no detector)."""
    iv.applied_step, iv.outcome.since_time = 60, time.time() - 1
    ctrl.store.put(iv)
    ctrl.open_pr(ctrl.store.get(iv.id))
    ctrl.store.transition(iv.id, Status.APPLIED, "applied at step 60")
    rows = [{"step": 60 + i, "segment": 0, "time": time.time(), "loss": 0.5, "algorithm": "sft"} for i in range(1, 31)]
    rows.append({"step": 90, "segment": 0, "time": time.time(), "heldout_acc": after})
    with open(ctrl.run_dir / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    ctrl.tick = type(ctrl.tick)()
    ctrl.tick.findings = [Diagnosis(name=n, summary="s", operator="detectors", policy="builtin") for n in findings]
    ctrl.tick.diagnosed = diagnosed
    ctrl.node_evaluate(s, final=True)
    return ctrl.store.get(iv.id)


def test_no_measured_gain_is_never_kept_remembered_as_a_win_or_mined(tmp_path):
    """Class 3 and 6: a rollback judged 0.0 → 0.0 is not kept; one that makes the run worse than
    the value before applying is rolled back (the undo sent to the trainer); only a credible gain is kept."""
    ctrl = controller(tmp_path, swarm={"evaluate_window_steps": 30})   # judged() trains one whole window
    ctrl.command = rec = Recorder()
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=90)

    def iv(name):
        d = Diagnosis(name=name, summary="s", operator="diagnostics", policy="builtin")
        return Intervention(kind=K.RECIPE_EDIT, changes={"recipe.lr": 0.001}, diagnosis=d, rationale="r",
                            operator="diagnostics", policy="builtin", checkpoint_before="pre-x",
                            outcome={"baseline": 0.0})

    same = judged(ctrl, iv("plateau"), 0.0, s)
    assert same.status == Status.ROLLED_BACK and same.outcome.gain is False and same.outcome.undone is False
    assert ctrl.knowledge.record(same, {})
    (ep,) = [e for e in ctrl.knowledge.memory.episodes() if e.id.endswith(same.id)]
    assert not ep.won()
    worse = iv("loss_spike")
    worse.outcome.baseline = 0.74
    worse = judged(ctrl, worse, 0.0, s)
    assert worse.status == Status.ROLLED_BACK and worse.outcome.undone is True
    assert ("rollback", f"{worse.id}-undo", {"name": "pre-x"}) in rec.sent
    better = judged(ctrl, iv("not_learning"), 0.6, s)
    assert better.status == Status.KEPT and better.outcome.gain is True
    close(ctrl)


def dedupe(**outcome) -> Intervention:
    d = Diagnosis(name="repeated_examples", summary="s", operator="data_curation", policy="builtin")
    return Intervention(kind=K.DATA_CHANGE, changes={"harness.filters.dedupe": True}, diagnosis=d, rationale="r",
                        operator="data_curation", policy="builtin", checkpoint_before="pre-x", outcome=outcome)


def test_a_fall_that_faults_named_before_the_change_explain_is_not_undone(tmp_path):
    """The run was under a fault the change does not answer when it was applied (`faults_at_apply`)
    and the detectors still name it at the end of the run: the window's fall is counted as a loss
    and the change left in force, not undone. Once that fault is no longer named, or its own fixes
    are spent (nothing goes on to answer it), the same fall is undone."""
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=90)
    for case, still, undone in (("named", ("harder_data", "plateau"), False), ("answered", ("plateau",), True),
                                ("spent", ("harder_data",), True)):
        ctrl = controller(tmp_path / case, swarm={"evaluate_window_steps": 30})
        rec = ctrl.command = Recorder()
        if case == "spent":     # its fix was applied and rolled back: nothing answers it
            lost = Intervention(kind=K.DATA_CHANGE, changes={"harness.curriculum.start": 1}, rationale="r",
                                diagnosis=Diagnosis(name="harder_data", summary="s", operator="data_curation",
                                                    policy="builtin"), operator="data_curation", policy="builtin")
            for st in (Status.BACKTESTING, Status.VALIDATED, Status.APPLIED, Status.EVALUATING, Status.ROLLED_BACK):
                lost.move(st)
            ctrl.store.put(lost)
        got = judged(ctrl, dedupe(baseline=0.74, faults_at_apply=["harder_data"]), 0.0, s, findings=still)
        assert got.status == Status.ROLLED_BACK and got.outcome.gain is False and got.outcome.undone is undone, case
        assert (("rollback", f"{got.id}-undo", {"name": "pre-x"}) in rec.sent) is undone
        close(ctrl)
    # the end of the run runs no detector: the newest look says what they named, when it is the latest
    for latest, undone in ((True, False), (False, True)):
        ctrl = controller(tmp_path / f"end-{latest}", swarm={"evaluate_window_steps": 30})
        ctrl.command = Recorder()
        ctrl.store.record_look(3, 85, ["harder_data"], keep=10)
        ctrl.memo.looks = 3 if latest else 4          # a later look saw nothing
        got = judged(ctrl, dedupe(baseline=0.74, faults_at_apply=["harder_data"]), 0.0, s, diagnosed=False)
        assert got.outcome.undone is undone, latest
        close(ctrl)


def test_a_small_fall_is_undone_only_when_the_next_look_finds_it_too(tmp_path):
    """0.5 before applying, 0.41 after the first window (100 held-out examples: P(harm) about 0.87): the change waits, the
    fall recorded with it (`Outcome.fell`); a second window as low undoes it (the undo sent to the
    trainer), one back at 0.5 clears the fall and the change goes on being judged."""
    for case, second, undone in (("again", 0.41, True), ("recovered", 0.5, False)):
        ctrl = controller(tmp_path / case, swarm={"evaluate_window_steps": 30})
        rec = ctrl.command = Recorder()
        iv = dedupe(baseline=0.5)
        iv.applied_step, iv.outcome.since_time = 60, time.time() - 1
        ctrl.store.put(iv)
        ctrl.open_pr(ctrl.store.get(iv.id))
        ctrl.store.transition(iv.id, Status.APPLIED, "applied at step 60")
        for end, acc in ((90, 0.41), (120, second)):
            rows = [{"step": s, "segment": 0, "time": time.time(), "loss": 0.5, "algorithm": "sft"} for s in range(end - 29, end + 1)]
            rows.append({"step": end, "segment": 0, "time": time.time(), "heldout_acc": acc})
            with open(ctrl.run_dir / "metrics.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
            ctrl.tick = type(ctrl.tick)()
            ctrl.node_evaluate(SwarmState(job="ghost", job_status="RUNNING", tick=1, step=end))
            got = ctrl.store.get(iv.id)
            if end == 90:
                assert got.status == Status.EVALUATING and got.outcome.fell is True, got.outcome.pending
                assert ("rollback", f"{iv.id}-undo", {"name": "pre-x"}) not in rec.sent
        assert (got.status == Status.ROLLED_BACK and got.outcome.undone is True) is undone, (case, got.outcome)
        assert (("rollback", f"{iv.id}-undo", {"name": "pre-x"}) in rec.sent) is undone
        if not undone:
            assert got.status == Status.EVALUATING and not got.outcome.fell, got.outcome
        close(ctrl)


def test_apply_records_the_faults_the_run_is_under_other_than_those_it_answers(tmp_path):
    def applied(iv, findings, looks=2):
        ctrl = controller(tmp_path / iv.id)
        ctrl.command = Recorder()
        for n in range(1, looks + 1):
            ctrl.store.record_look(n, 10 * n, [name for name, _ in findings], keep=10)
        ctrl.store.put(iv)
        ctrl.open_pr(ctrl.store.get(iv.id))
        ctrl.store.transition(iv.id, Status.VALIDATED, "v")
        ctrl.tick.findings = [Diagnosis(name=n, summary="s", operator="detectors", policy="builtin", severity=sev)
                              for n, sev in findings]
        ctrl.apply(ctrl.store.get(iv.id), SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60))
        got = ctrl.store.get(iv.id).outcome.faults_at_apply
        close(ctrl)
        return got

    seen = (("repeated_examples", "warning"), ("harder_data", "warning"), ("label_noise", "warning"),
            ("plateau", "warning"), ("labels_fail_check", "info"))
    # its own diagnosis, a symptom (not a cause) and an informational finding are left out
    assert applied(dedupe(), seen) == ["harder_data", "label_noise"]
    # a fault seen on one look only is how a false alarm looks
    assert applied(dedupe(), seen, looks=1) == []
    # a joint change answers each of its parts
    joint = dedupe()
    joint.diagnosis = joint.diagnosis.model_copy(update={"evidence": {"answers": ["harder_data", "repeated_examples"]}})
    assert applied(joint, seen) == ["label_noise"]
    # a change named after no current finding: what its proposer claims is not the controller's finding
    assert applied(dedupe(), seen[1:]) == []


def test_a_window_the_run_ended_inside_is_not_judged_a_loss(tmp_path):
    """A fix applied shortly before the run ended (its budget spent) got 30 of its 100-step window:
    no gain measured over part of the window is not a loss. It stays evaluating, with no episode in
    memory; a credible gain or harm over the part it got is still judged."""
    ctrl = controller(tmp_path, swarm={"evaluate_window_steps": 100})
    ctrl.command = Recorder()
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=90)

    def iv(name, baseline):
        d = Diagnosis(name=name, summary="s", operator="diagnostics", policy="builtin")
        return Intervention(kind=K.RECIPE_EDIT, changes={"recipe.lr": 0.001}, diagnosis=d, rationale="r",
                            operator="diagnostics", policy="builtin", checkpoint_before="pre-x",
                            outcome={"baseline": baseline})

    cut = judged(ctrl, iv("plateau", 0.0), 0.0, s)
    assert cut.status == Status.EVALUATING and cut.outcome.gain is None
    assert "not judged: the run ended 30 steps into the 100-step window" in cut.outcome.pending
    ctrl.node_mine_skills(s)
    assert cut.id not in {r["id"] for r in ctrl.store.timeline("episode")}
    close(ctrl)
    ctrl = controller(tmp_path / "b", swarm={"evaluate_window_steps": 100})
    ctrl.command = Recorder()
    assert judged(ctrl, iv("not_learning", 0.0), 0.6, s).status == Status.KEPT
    assert judged(ctrl, iv("loss_spike", 0.74), 0.0, s).status == Status.ROLLED_BACK
    close(ctrl)


def test_a_departure_rollback_goes_only_as_far_back_as_its_stake_when_applied(tmp_path):
    """A departure's rollback stakes at most the steps a backtest's arms train (2 seeds x 2 arms x
    20 steps here); applied when the run has moved on 150 steps past its checkpoint, the fields are
    set again without going back."""
    d = Diagnosis(name="harness_drift", summary="s", operator="harness_critic", policy="builtin",
                  evidence={"since_step": 55, "rollback_to": "step_0000050"})
    for left, rolls in ((60, True), (200, False)):
        ctrl = controller(tmp_path / str(left))
        rec = ctrl.command = Recorder()
        rec.step = left
        iv = Intervention(kind=K.ROLLBACK, changes={"harness.sampling.max_new_tokens": 6}, diagnosis=d, rationale="r",
                          operator="harness_critic", policy="builtin")
        ctrl.store.put(iv)
        ctrl.open_pr(ctrl.store.get(iv.id))
        ctrl.store.transition(iv.id, Status.VALIDATED, "goes back")
        ctrl.apply(ctrl.store.get(iv.id), SwarmState(job="ghost", job_status="RUNNING", tick=1, step=left))
        got = ctrl.store.get(iv.id)
        assert got.status == Status.APPLIED and ("set_fields", f"{iv.id}-apply", {"fields": iv.changes}) in rec.sent
        assert (("rollback", f"{iv.id}-rb", {"name": "step_0000050"}) in rec.sent) is rolls, rec.sent
        assert (got.outcome.rollback_skipped is not None) is not rolls
        order = [cmd for cmd, _, _ in rec.sent]
        if rolls:   # the rollback and its change at one safe point: the job paused around both
            assert order[order.index("rollback") - 1 : order.index("set_fields") + 2] == [
                "pause", "rollback", "set_fields", "resume"], order
        else:
            assert "pause" not in order and "resume" not in order
        if not rolls:
            assert "150 steps back" in got.outcome.rollback_skipped and ctrl.store.timeline("rollback_skipped")
        close(ctrl)


@pytest.mark.parametrize("since, rolls", [
    ([0.0, 0.0, 0.01], True),      # 150 steps that gained nothing measurable (a wrecked run at 0): no stake
    ([0.0, 0.2, 0.35], False),     # 150 steps that moved the target: the stake holds
])
def test_steps_that_gained_nothing_are_no_stake(tmp_path, since, rolls):
    """The stake of a departure's rollback is the target's progress over the steps it throws away,
    not their count: with no eval at the checkpoint (the untrained start) the first eval since
    is the level to beat; gaining no more than `departure_harm` there, going back loses nothing."""
    ctrl = controller(tmp_path)
    rec = ctrl.command = Recorder()
    rec.step = 200
    t = time.time()
    with open(ctrl.run_dir / "metrics.jsonl", "a") as f:
        for st, acc in zip((100, 150, 200), since):
            f.write(json.dumps({"step": st, "segment": 0, "time": t, "loss": 1.0, "algorithm": "sft",
                                "heldout_acc": acc}) + "\n")
    d = Diagnosis(name="lr_drift", summary="s", operator="diagnostics", policy="builtin",
                  evidence={"since_step": 60, "rollback_to": "step_0000050"})
    iv = Intervention(kind=K.ROLLBACK, changes={"recipe.lr": 3e-3}, diagnosis=d, rationale="r",
                      operator="diagnostics", policy="builtin")
    ctrl.store.put(iv)
    ctrl.open_pr(ctrl.store.get(iv.id))
    ctrl.store.transition(iv.id, Status.VALIDATED, "goes back")
    ctrl.apply(ctrl.store.get(iv.id), SwarmState(job="ghost", job_status="RUNNING", tick=1, step=200))
    assert (("rollback", f"{iv.id}-rb", {"name": "step_0000050"}) in rec.sent) is rolls, rec.sent
    assert (ctrl.store.get(iv.id).outcome.rollback_skipped is not None) is not rolls
    close(ctrl)


def test_a_rollback_is_judged_after_as_many_steps_as_the_run_had_trained(tmp_path):
    """A rollback sets the step counter back (here from step 200 to 52): its window starts where the
    run left off, so the value before applying (0.3 at step 200) is compared with the rolled-back
    run's after at least as many steps — not with its level a window past the checkpoint, which a
    run that trained 150 fewer steps could not match whatever the fix did."""
    ctrl = controller(tmp_path)
    ctrl.command = Recorder()
    window = ctrl.goal.swarm.evaluate_window_steps
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=90)
    d = Diagnosis(name="harness_drift", summary="s", operator="harness_critic", policy="builtin")
    iv = Intervention(kind=K.ROLLBACK, changes={"harness.sampling.max_new_tokens": 6}, diagnosis=d, rationale="r",
                      operator="harness_critic", policy="builtin", checkpoint_before="pre-x",
                      outcome={"baseline": 0.3, "step_left": 200, "since_time": time.time() - 1})
    iv.applied_step = 52
    ctrl.store.put(iv)
    ctrl.open_pr(ctrl.store.get(iv.id))
    ctrl.store.transition(iv.id, Status.APPLIED, "applied at step 52")

    def train(upto, acc):
        t = time.time()
        rows = [{"step": st, "segment": 1, "time": t, "loss": 0.5, "algorithm": "sft"} for st in range(train.at + 1, upto + 1)]
        rows.append({"step": upto, "segment": 1, "time": t, "heldout_acc": acc})
        with open(ctrl.run_dir / "metrics.jsonl", "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        train.at = upto
        ctrl.tick = type(ctrl.tick)()
        ctrl.node_evaluate(s)
        return ctrl.store.get(iv.id)

    train.at = 52
    # a window past the checkpoint, far below the value before applying: not judged yet
    assert train(52 + window + 10, 0.05).status == Status.EVALUATING
    assert train(199, 0.25).status == Status.EVALUATING
    # a window past where the run left off
    got = train(200 + window + 1, 0.6)
    assert got.status == Status.KEPT and got.outcome.after == 0.6 and got.outcome.window_steps >= window
    close(ctrl)


def test_what_the_trainer_noticed_shows_in_the_timeline_and_the_summary(tmp_path):
    """Class 5: a corrupt checkpoint the trainer fell back from and a command it refused become
    findings, timeline rows (the final report's timeline) and the summary's trainer notices."""
    ctrl = controller(tmp_path)
    with open(ctrl.run_dir / "events.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "step": 50, "event": "checkpoint_corrupt", "name": "step_0000050",
                            "error": "checksum mismatch"}) + "\n")
        f.write(json.dumps({"time": time.time(), "step": 25, "event": "resume"}) + "\n")
    (ctrl.run_dir / "command_log.jsonl").write_text(json.dumps(
        {"id": "x-apply", "cmd": "set_fields", "step": 55, "status": "rejected", "reason": "difficulty=0 outside [1, 12]"}) + "\n")
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60)
    ctrl.node_diagnose(s)
    ctrl.tick = type(ctrl.tick)()
    ctrl.node_diagnose(s)                                           # logged once, not per tick
    names = [r["name"] for r in ctrl.store.timeline("finding")]
    assert sorted(names) == ["checkpoint_corrupt", "command_refused", "job_restarted"]
    notices = ctrl.summary(s)["trainer_notices"]
    assert any("corrupt" in n["summary"] for n in notices) and any("difficulty=0" in n["summary"] for n in notices)
    # steps skipped tick after tick (each summary names newer steps): once per evaluation window, not per tick
    rows = [json.loads(x) for x in (ctrl.run_dir / "metrics.jsonl").read_text().splitlines()]
    t, last = rows[-1]["time"], rows[-1]["step"]
    with open(ctrl.run_dir / "metrics.jsonl", "a") as f:
        for i in range(1, 31):
            f.write(json.dumps({**rows[-2], "step": last + i, "time": t + i, "skipped": True, "loss": None}) + "\n")
            if i % 3 == 0:
                f.flush()
                ctrl.tick = type(ctrl.tick)()
                ctrl.node_diagnose(s)
    skipped = [r for r in ctrl.store.timeline("finding") if r["name"] == "skipped_steps"]
    window = ctrl.goal.swarm.evaluate_window_steps
    assert 1 <= len(skipped) <= 1 + 30 // window, [r["summary"] for r in skipped]
    close(ctrl)


def test_the_controller_hands_no_fault_to_the_arms_the_trainers_fork_carries_the_label_noise(tmp_path):
    """Class 9: arm configs carry no perturbation; a state fork of a run training under label
    noise trains under it too (the trainer's own state), and a plain run does not."""
    import yaml

    from swarm.backtest import arm_config
    from trainer.config import RunConfig
    from trainer.loop import Trainer

    cfg = arm_config({"perturbations": [{"shortcut": "label_noise"}], "recipe": {}}, "bt-x-control-s0", str(tmp_path),
                     "c.pt", 0, 10, 5, 50, {})
    assert cfg["perturbations"] == []
    base = {"name": "live", "out_dir": str(tmp_path / "runs"), "task": {"name": "addition"},
            "model": {"kind": "builtin", "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 24},
            "harness": {"curriculum": {"start": 1}, "sampling": {"max_new_tokens": 4}},
            "recipe": {"algorithm": "sft", "steps": 2, "batch_size": 4, "eval_interval": 0, "eval_size": 10},
            "checkpoint": {"interval": 0, "keep_last": 2}, "samples_per_step": 0, "threads": 1}
    live = Trainer(RunConfig.parse({**base, "perturbations": [{"shortcut": "label_noise", "fraction": 0.4}]}))
    live.run()
    ckpt = next((tmp_path / "runs" / "live" / "checkpoints").glob("*.pt"))
    fork = Trainer(RunConfig.parse({**base, "name": "fork", "fork_from": str(ckpt), "fork_mode": "state",
                                    "recipe": {**base["recipe"], "steps": 3}}))
    fork._start()
    assert fork.perturber.label_noise()[0] == pytest.approx(0.4)
    fork.close()
    clean = Trainer(RunConfig.parse({**base, "name": "clean", "fork_from": str(ckpt), "fork_mode": "weights",
                                     "recipe": {**base["recipe"], "steps": 3}}))
    clean._start()
    assert clean.perturber.label_noise()[0] == 0.0
    clean.close()
    assert "label_noise" not in yaml.safe_dump(yaml.safe_load((tmp_path / "runs" / "fork" / "config.yaml").read_text()))


def test_a_validated_change_waits_while_the_job_hangs_and_no_answer_is_not_a_refusal(tmp_path):
    """A hung worker (alive, heartbeat older than swarm.stale_heartbeat_s) first: a validated
    harness edit is not sent to it (the restart goes first); a command to it ends its wait at once
    instead of holding the loop for its timeout; and a change that got no answer because the job
    stopped answering stays validated — not refused, not a loss in memory."""
    ctrl = controller(tmp_path, swarm={"stale_heartbeat_s": 5.0})
    hb = ctrl.run_dir / "heartbeat.json"
    beat = json.loads(hb.read_text())
    hb.write_text(json.dumps({**beat, "time": time.time() - 60}))           # hung for a minute
    edit = Intervention(kind=K.HARNESS_EDIT, changes={"harness.sampling.max_new_tokens": 6}, rationale="r",
                        diagnosis=Diagnosis(name="truncation", summary="s", operator="harness_critic", policy="builtin"),
                        operator="harness_critic", policy="builtin")
    ctrl.store.put(edit)
    ctrl.store.transition(edit.id, Status.VALIDATED, "test: validated by its backtest")
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60, started=time.time())
    ctrl.command = rec = Recorder()
    ctrl.tick.findings = []
    ctrl.node_apply(s)
    assert rec.sent == [] and ctrl.store.get(edit.id).status == Status.VALIDATED     # not sent to a hung job

    class Alive:          # the launcher still says RUNNING: only the heartbeat tells the hang
        def status(self, handle):
            return "RUNNING"

    from swarm.controller import Controller

    ctrl.jobs, ctrl.state_job = Alive(), "ghost"
    t0 = time.time()
    assert Controller.command(ctrl, "checkpoint", "hung-1", timeout=30.0) is None
    assert time.time() - t0 < 5.0                                            # not the 30-s timeout

    # the job hangs between the pre-apply checkpoint and the change: no answer, no refusal
    hb.write_text(json.dumps({**beat, "time": time.time()}))
    answers = iter([{"id": "pre", "status": "applied", "step": 60, "time": time.time()}, None])

    def flaky(cmd, cid, timeout=60.0, **args):
        ack = next(answers)
        if ack is None:
            hb.write_text(json.dumps({**beat, "time": time.time() - 60}))
        return ack

    ctrl.command = flaky
    ctrl.node_apply(s)
    got = ctrl.store.get(edit.id)
    assert got.status == Status.VALIDATED and got.outcome.refused is None
    assert [r for r in ctrl.store.timeline("apply_deferred") if r.get("id") == edit.id]
    close(ctrl)


def test_a_fix_waits_while_the_run_is_on_course_to_the_target_for_less_than_verifying_it(tmp_path):
    """Class 7 (cost): a run whose held-out evals head for the target in fewer steps than the fix's
    backtest would train is not interrupted by a non-critical fix — it is not recorded, and the
    deferral is logged once per fix and eval — while a restart still goes through."""
    ctrl = controller(tmp_path)                           # target 0.6; backtest 2 seeds x 20 steps: 80 arm steps
    rows = [json.loads(x) for x in (ctrl.run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if "heldout_acc" in r:
            r["heldout_acc"] = {25: 0.45, 50: 0.55}[r["step"]]      # 0.004 per step: the target ~12 steps away
    (ctrl.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    edit = Intervention(kind=K.HARNESS_EDIT, changes={"harness.sampling.max_new_tokens": 6}, rationale="r",
                        diagnosis=Diagnosis(name="truncation", summary="s", operator="harness_critic", policy="builtin"),
                        operator="harness_critic", policy="builtin")
    restart = Intervention(kind=K.RESTART, rationale="r", operator="cluster_ops", policy="builtin",
                           diagnosis=Diagnosis(name="crashed_job", summary="FAILED", operator="cluster_ops",
                                               policy="builtin", severity="critical"))
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60, started=time.time())
    for _ in range(2):
        ctrl.tick.proposals = [edit.model_copy(update={"id": f"e{_}"}), restart.model_copy(update={"id": f"r{_}"})]
        ctrl.node_propose(s)
    kinds = [iv.kind for iv in ctrl.store.list()]
    assert K.HARNESS_EDIT not in kinds and K.RESTART in kinds
    (row,) = ctrl.store.timeline("deferred")
    assert row["diagnosis"] == "truncation" and "cannot pay for itself" in row["reason"] and "80 steps" in row["reason"]
    # the same evidence far from the target: the fix is recorded
    for r in rows:
        if "heldout_acc" in r:
            r["heldout_acc"] = {25: 0.1, 50: 0.12}[r["step"]]
    (ctrl.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for iv in ctrl.store.list():
        ctrl.store.transition(iv.id, Status.REJECTED, "test: out of the way (one intervention in flight at a time)")
    ctrl.tick.evidence = None
    ctrl.tick.proposals = [edit.model_copy(update={"id": "e9"})]
    ctrl.node_propose(s)
    assert ctrl.store.get("e9").kind == K.HARNESS_EDIT
    close(ctrl)


def test_a_fix_that_skips_its_backtest_is_not_held_for_its_cost_while_the_run_is_on_course(tmp_path):
    """A fix that goes back to the goal's lr, with lr_drift confirmed now, trains no arms: the
    outlook that holds a backtested fix (the run on course to the target in fewer steps than its
    arms) does not hold it, since verifying it costs nothing beyond the live run's own steps."""
    ctrl = controller(tmp_path)
    rows = [json.loads(x) for x in (ctrl.run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if "heldout_acc" in r:
            r["heldout_acc"] = {25: 0.45, 50: 0.55}[r["step"]]      # on course: the target ~12 steps away
    (ctrl.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lr = ctrl.start_values(["recipe.lr"])["recipe.lr"]
    back = Intervention(kind=K.ROLLBACK, changes={"recipe.lr": lr}, rationale="r", operator="diagnostics", policy="builtin",
                        diagnosis=Diagnosis(name="lr_drift", summary="s", operator="diagnostics", policy="builtin"))
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60, started=time.time())
    ctrl.tick.findings = [Diagnosis(name="lr_drift", summary="lr 60x", operator="diagnostics", policy="builtin")]
    ctrl.tick.proposals = [back.model_copy(update={"id": "b1"})]
    ctrl.node_propose(s)
    assert ctrl.store.get("b1").kind == K.ROLLBACK and not ctrl.store.timeline("deferred")
    # claimed but not confirmed now: it would be backtested, so the outlook holds it
    ctrl.store.transition("b1", Status.REJECTED, "test: out of the way")
    ctrl.tick.evidence, ctrl.tick.findings = None, []
    ctrl.tick.proposals = [back.model_copy(update={"id": "b2"})]
    ctrl.node_propose(s)
    assert "b2" not in {iv.id for iv in ctrl.store.list()}
    assert "cannot pay for itself" in ctrl.store.timeline("deferred")[0]["reason"]
    close(ctrl)


def test_a_job_paused_for_a_backtest_goes_on_after_a_controller_crash(tmp_path):
    """The live job waits at the fork while a backtest's arms run; a controller that died in
    between leaves the mark in the store, and the next pass resumes the job once the backtest is
    no longer running (an intervention decided meanwhile), exactly once."""
    ctrl = controller(tmp_path)
    ctrl.command = rec = Recorder()
    d = Diagnosis(name="truncation", summary="s", operator="harness_critic", policy="builtin")
    edit = Intervention(kind=K.HARNESS_EDIT, changes={"harness.sampling.max_new_tokens": 6}, diagnosis=d, rationale="r",
                        operator="harness_critic", policy="builtin", outcome={"paused_for_backtest": True})
    ctrl.store.put(edit)
    ctrl.store.transition(edit.id, Status.BACKTESTING, "forked at step 60")
    s = SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60, started=time.time())
    ctrl.resume_paused()
    assert rec.sent == []                       # still backtesting: its own backtest resumes it when done
    ctrl.store.transition(edit.id, Status.REJECTED, "rejected by a human")
    ctrl.node_backtest(s)
    ctrl.node_backtest(s)
    assert [(c, cid) for c, cid, _ in rec.sent] == [("resume", f"{edit.id}-bt-resume")]
    assert ctrl.store.get(edit.id).outcome.paused_for_backtest is False
    close(ctrl)


def test_a_fix_whose_longer_backtests_ran_out_is_refused_as_a_loss(tmp_path):
    """A fix backtested three times with gains too small to tell (the last over 4x the horizon) is
    refused before any arm starts, and memory counts it as a loss (not tried again)."""
    from agents.domain import BacktestResult

    ctrl = controller(tmp_path)
    ctrl.command = rec = Recorder()
    d = Diagnosis(name="too_hard_curriculum", summary="nothing solved", operator="data_curation", policy="builtin")

    def fix():
        return Intervention(kind=K.DATA_CHANGE, changes={"harness.curriculum.start": 1}, diagnosis=d, rationale="r",
                            operator="data_curation", policy="builtin")

    for _ in range(3):
        x = fix()
        x.backtest = BacktestResult(metric="heldout_acc", candidate=[0.02], control=[0.0], effect=0.02, p_value=0.3,
                                    test="t", horizon_steps=40, seeds=[0], passed=False)
        ctrl.store.put(x)
        ctrl.store.transition(x.id, Status.REJECTED, "no measured gain")
    again = fix()
    ctrl.store.put(again)
    ctrl.node_backtest(SwarmState(job="ghost", job_status="RUNNING", tick=1, step=60, started=time.time()))
    got = ctrl.store.get(again.id)
    assert got.status == Status.REJECTED and got.backtest is None and "backtested 3 times" in got.outcome.exhausted
    assert not any(cid.startswith(again.id) for _, cid, _ in rec.sent)     # no fork, no arm
    assert ctrl.knowledge.record(got, {})
    (ep,) = [e for e in ctrl.knowledge.memory.episodes() if e.id.endswith(again.id)]
    assert ep.outcome == "rejected" and ep.lost()
    close(ctrl)


def test_a_backtest_arm_trains_a_stretch_of_the_runs_own_lr_schedule(tmp_path):
    """An arm forked at step 20 of a run whose cosine schedule spans 200 steps stops after its
    horizon (`stop_step`) with a final evaluation, at the learning rates the run itself would have
    had there: a schedule over the horizon alone would anneal it to its minimum."""
    import math

    from swarm.backtest import arm_config
    from trainer.config import RunConfig
    from trainer.loop import Trainer
    from trainer.runlog import read_jsonl

    base = {"name": "live", "out_dir": str(tmp_path / "runs"), "task": {"name": "addition"},
            "model": {"kind": "builtin", "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 24},
            "harness": {"curriculum": {"start": 1}, "sampling": {"max_new_tokens": 4}},
            "recipe": {"algorithm": "sft", "steps": 200, "schedule": "cosine", "warmup_steps": 5, "lr": 0.01,
                       "batch_size": 4, "eval_interval": 0, "eval_size": 10},
            "checkpoint": {"interval": 20, "keep_last": 2}, "samples_per_step": 0, "threads": 1}
    live = Trainer(RunConfig.parse(base))
    live.run(until=20)
    ckpt = tmp_path / "runs" / "live" / "checkpoints" / "step_0000020.pt"
    cfg = RunConfig.parse(arm_config(base, "bt-x-candidate-s0", str(tmp_path / "arms"), str(ckpt), 0, 20, 5, 10, {}))
    arm = Trainer(cfg)
    summary = arm.run()
    rows = read_jsonl(tmp_path / "arms" / "bt-x-candidate-s0" / "metrics.jsonl")
    lrs = [r["lr"] for r in rows if "loss" in r]
    assert summary["step"] == 25 and "heldout_acc" in summary
    assert [r["step"] for r in rows if "heldout_acc" in r] == [25]   # one evaluation, at its end
    assert len(lrs) == 5 and all(math.isclose(a, live.lr_at(s)) for a, s in zip(lrs, range(20, 25)))
    assert min(lrs) > 0.9 * 0.01   # early in the run's schedule, near its peak
    # a stretch past the run's last step trains the whole horizon at the schedule's last lr
    late = {**base, "name": "late", "recipe": {**base["recipe"], "steps": 24}}
    Trainer(RunConfig.parse(late)).run(until=20)
    ckpt = tmp_path / "runs" / "late" / "checkpoints" / "step_0000020.pt"
    cfg = RunConfig.parse(arm_config(late, "bt-y-control-s0", str(tmp_path / "arms"), str(ckpt), 0, 20, 10, 10, {}))
    summary = Trainer(cfg).run()
    rows = read_jsonl(tmp_path / "arms" / "bt-y-control-s0" / "metrics.jsonl")
    lrs = [r["lr"] for r in rows if "loss" in r]
    assert summary["step"] == 30 and len(lrs) == 10 and math.isclose(lrs[-1], 0.01 * 0.1)
