"""The controller's upkeep, without running a trainer: LangGraph checkpoints pruned so graph.db
stays bounded over days, rejected interventions always end as closed PRs (also after a kill
between the rejection and the close), and the workspace's git identity respects every place git
reads its config from.

    .venv/bin/python -m pytest tests/test_controller_upkeep.py -q
"""
from __future__ import annotations

import sqlite3
import subprocess

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind, Status
from swarm.goal import Goal
from swarm.graph import prune_checkpoints
from test_swarm import tiny_goal


@pytest.fixture(autouse=True)
def _home(clean_git_home):
    """Every test here runs with a clean git HOME (conftest.clean_git_home)."""


def test_prune_keeps_the_newest_checkpoints_and_the_graph_resumes_from_them(tmp_path):
    def step(s: dict) -> dict:
        return {"n": s["n"] + 1}

    g = StateGraph(dict)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    conn = sqlite3.connect(tmp_path / "graph.db", check_same_thread=False)
    graph = g.compile(checkpointer=SqliteSaver(conn))
    cfg = {"configurable": {"thread_id": "main"}}
    state = {"n": 0}
    for _ in range(30):
        state = graph.invoke(state, cfg)
    count = lambda: conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]   # noqa: E731
    before = count()
    assert before >= 60
    assert prune_checkpoints(graph.checkpointer, "main", keep=5) == before - 5
    assert count() == 5 and prune_checkpoints(graph.checkpointer, "main", keep=5) == 0
    assert graph.get_state(cfg).values == {"n": 30}            # the newest state is intact
    assert graph.invoke(graph.get_state(cfg).values, cfg) == {"n": 31}
    with pytest.raises(ValueError, match="keep=0"):
        prune_checkpoints(graph.checkpointer, "main", keep=0)
    conn.close()


def test_a_rejection_whose_pr_was_never_closed_is_closed_on_the_next_tick(tmp_path):
    """The state a SIGKILL between `transition(REJECTED)` and `ws.reject` leaves: the store says
    rejected, git still has the PR open (or none at all)."""
    from swarm.controller import Controller

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    d = Diagnosis(name="plateau", summary="flat", operator="diagnostics", policy="builtin")
    bt = BacktestResult(metric="heldout_acc", candidate=[0.1, 0.1], control=[0.2, 0.2], effect=-0.1, p_value=0.9,
                        test="paired t", horizon_steps=20, seeds=[0, 1], passed=False)
    opened = Intervention(kind=InterventionKind.RECIPE_EDIT, changes={"recipe.lr": 0.001}, diagnosis=d, rationale="r",
                          operator="diagnostics", policy="builtin", backtest=bt)
    never = Intervention(kind=InterventionKind.RECIPE_EDIT, changes={"recipe.lr": 0.002}, diagnosis=d, rationale="r",
                         operator="diagnostics", policy="builtin")
    for iv in (opened, never):
        ctrl.store.put(iv)
        ctrl.store.transition(iv.id, Status.BACKTESTING)
        ctrl.store.transition(iv.id, Status.REJECTED, "killed right after this")
    ctrl.open_pr(ctrl.store.get(opened.id))
    assert ctrl.ws.pr_state(opened.id) == "open"
    ctrl.close_rejected()
    assert ctrl.ws.pr_state(opened.id) == "closed" and ctrl.ws.pr_state(never.id) == "closed"
    tags = subprocess.run(["git", "tag", "-n1"], cwd=ctrl.dir, capture_output=True, text=True).stdout
    assert f"closed/{opened.id}" in tags and "effect -0.100" in tags
    ctrl.close_rejected()                                       # idempotent
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_git_identity_from_git_config_global_is_respected(tmp_path, monkeypatch):
    from swarm.workspace import Workspace

    cfg = tmp_path / "gitconfig"
    cfg.write_text("[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    ws = Workspace.init(tmp_path / "ws", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    author = subprocess.run(["git", "log", "-1", "--format=%an <%ae>"], cwd=ws.root, capture_output=True, text=True).stdout
    assert author.strip() == "Ada Lovelace <ada@example.org>"
    local = subprocess.run(["git", "config", "--local", "--get", "user.name"], cwd=ws.root, capture_output=True, text=True)
    assert local.returncode == 1      # nothing written to the repository: the global identity is used
    monkeypatch.delenv("GIT_CONFIG_GLOBAL")
    ws2 = Workspace.init(tmp_path / "ws2", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    author = subprocess.run(["git", "log", "-1", "--format=%an"], cwd=ws2.root, capture_output=True, text=True).stdout
    assert author.strip() == "swarmlab"


def backtest(iv, jobs, tmp_path, *, step, seeds, eval_size, **kw):
    """The arms through swarm.backtest.run_arms and the decision through swarm.decisions.decide,
    with the settings the controller uses (swarm.backtest.rule_for)."""
    from swarm.backtest import result, rule_for, run_arms
    from swarm.decisions import decide

    base = {"recipe": {"algorithm": "sft"}}
    pairs, cpu = run_arms(iv, base_config=base, ckpt="x.pt", step=step, metric="heldout_acc", horizon=40, seeds=seeds,
                          eval_size=eval_size, jobs=jobs, workdir=tmp_path / "bt", **kw)
    d = decide(pairs, rule_for(iv, base, alpha=0.2, higher_is_better=True, metric="heldout_acc", eval_size=eval_size,
                               looks=1, look=1))
    return result(d, pairs, metric="heldout_acc", horizon=40, seeds=seeds, cpu_s=cpu)


class ScriptedArms:
    """A launcher for backtest arms that writes the metrics an arm would (tests only): every arm
    scores 0 held-out and 0 pass rate; the loss is `loss(arm_config)`."""

    def __init__(self, loss, heldout=lambda cfg: 0.0, pass_rate=lambda cfg: 0.0):
        self.loss, self.heldout, self.pass_rate = loss, heldout, pass_rate

    def start(self, name, config_path, restart=0):
        import json
        import pathlib

        import yaml

        cfg = yaml.safe_load(pathlib.Path(config_path).read_text())
        d = pathlib.Path(cfg["out_dir"]) / name
        d.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "loss": self.loss(cfg, s), "pass_rate": self.pass_rate(cfg)} for s in range(1, 41)]
        rows.append({"step": 40, "heldout_acc": self.heldout(cfg), "heldout_truncated": 0.0, "heldout_malformed": 0.0})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return name

    def status(self, handle):
        return "SUCCEEDED"

    def stop(self, handle):
        pass


@pytest.mark.parametrize("changes,passes", [({"recipe.lr": 0.001}, True), ({"harness.template": "{question}=?"}, True),
                                            ({"harness.curriculum.start": 2}, False),
                                            ({"harness.answer.reverse_digits": False}, False)])
def test_backtest_breaks_a_double_tie_on_the_sft_loss_only_when_it_compares(tmp_path, changes, passes):
    """A run that never learnt (lr far too high, or a template that hides part of the question):
    both arms score 0 held-out and 0 pass rate over a short horizon. The candidate whose SFT loss
    falls wins on the loss when the arms' losses are over the same targets (a recipe or template
    change); a change to the examples (curriculum) or to the targets (answer format) does not."""
    iv = Intervention(kind=InterventionKind.RECIPE_EDIT if "recipe.lr" in changes else InterventionKind.HARNESS_EDIT,
                      changes=changes, diagnosis=Diagnosis(name="not_learning", summary="flat", operator="diagnostics",
                                                           policy="builtin"), rationale="r", operator="diagnostics", policy="builtin")
    seed_noise = {0: 0.01, 1: -0.02, 2: 0.005}

    def loss(cfg, step):
        cand = "candidate" in cfg["name"]
        return (1.9 - (0.02 * step if cand else 0.0)) + seed_noise[cfg["seed"]]

    res = backtest(iv, ScriptedArms(loss), tmp_path, step=100, seeds=[0, 1, 2], eval_size=50)
    assert res.candidate == [0.0, 0.0, 0.0] == res.control
    assert res.passed is passes
    if passes:
        assert res.signal == "SFT training loss" and res.effect == pytest.approx(0.02 * 30.5, rel=1e-6) and res.p_value < 0.01
    else:
        assert "no measured gain" in res.note and "SFT training loss" not in res.test


def test_backtest_treats_one_held_out_example_as_a_tie_and_goes_on_to_the_loss(tmp_path):
    """A restart from scratch 40 steps in: one candidate seed gets 1 of 200 held-out right (0.005)
    by chance, the others nothing. That is no evidence either way; the SFT loss decides."""
    iv = Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.001},
                      diagnosis=Diagnosis(name="not_learning", summary="flat", operator="diagnostics", policy="builtin"),
                      rationale="r", operator="diagnostics", policy="builtin")
    arms = ScriptedArms(lambda cfg, step: 1.9 - (0.02 * step if "candidate" in cfg["name"] else 0.0) + 0.01 * cfg["seed"],
                        heldout=lambda cfg: 0.005 if cfg["name"].endswith("candidate-s1") else 0.0)
    res = backtest(iv, arms, tmp_path, step=400, seeds=[0, 1, 2], eval_size=200, candidate_ckpt="init.pt", candidate_step=0)
    assert res.candidate == [0.0, 0.005, 0.0] and res.passed
    assert res.signal == "SFT training loss" and "target" in res.test
    cand_cfg = (tmp_path / "bt" / f"bt-{iv.id}-candidate-s0.yaml")
    import yaml

    assert yaml.safe_load(cand_cfg.read_text())["fork_from"] == "init.pt"     # a rollback is tested from its target
    assert yaml.safe_load((tmp_path / "bt" / f"bt-{iv.id}-control-s0.yaml").read_text())["fork_from"] == "x.pt"


def test_rolling_back_to_an_older_checkpoint_sets_the_later_fixes_in_force_again(tmp_path):
    """A checkpoint holds the harness and recipe of its moment: rolling the trainer back to it (a
    rollback fix, or undoing an intervention) would silently drop every fix applied after it. The
    controller sets those again, oldest first, and records which; rejected, rolled-back and older
    fixes are not carried."""
    import json

    from swarm.controller import Controller

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    ckdir = ctrl.run_dir / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    for name, step, t in (("ckpt-100", 100, 1000.0), ("pre-old", 50, 900.0)):
        (ckdir / f"{name}.json").write_text(json.dumps({"name": name, "step": step, "kind": "periodic", "time": t}))
    d = Diagnosis(name="plateau", summary="flat", operator="diagnostics", policy="builtin")

    def iv(changes, status, t):
        x = Intervention(kind=InterventionKind.HARNESS_EDIT, changes=changes, diagnosis=d, rationale="r",
                         operator="harness_critic", policy="builtin")
        x.status, x.outcome.since_time = status, t
        ctrl.store.put(x)
        return x

    older = iv({"recipe.lr": 0.01}, Status.KEPT, 950.0)            # before the checkpoint: it has it
    temp = iv({"harness.sampling.temperature": 1.0}, Status.KEPT, 1100.0)
    lost = iv({"harness.sampling.top_p": 0.5}, Status.ROLLED_BACK, 1150.0)
    toks = iv({"harness.sampling.max_new_tokens": 8, "harness.sampling.temperature": 0.9}, Status.EVALUATING, 1200.0)
    undone = iv({"recipe.lr": 0.002}, Status.KEPT, 1050.0)
    undone.checkpoint_before = "ckpt-100"
    ctrl.store.put(undone)
    ctrl.open_pr(undone)
    ctrl.ws.approve(undone.id)

    assert ctrl.changes_since("ckpt-100", exclude=undone.id) == {temp.id: temp.changes, toks.id: toks.changes}
    assert list(ctrl.changes_since("pre-old", exclude="none")) == [older.id, undone.id, temp.id, toks.id]
    assert ctrl.changes_since("no-such-checkpoint", exclude="none") == {}
    assert lost.id not in ctrl.changes_since("pre-old", exclude="none")

    sent = []
    ctrl.command = lambda cmd, cid, **args: sent.append((cmd, cid, args)) or {"status": "applied", "step": 120}
    ctrl.roll_back(ctrl.store.get(undone.id), "worse than control")
    assert sent == [("pause", f"{undone.id}-undo-hold", {}),       # both at one safe point
                    ("rollback", f"{undone.id}-undo", {"name": "ckpt-100"}),
                    ("set_fields", f"{undone.id}-undo-carry",
                     {"fields": {"harness.sampling.temperature": 0.9, "harness.sampling.max_new_tokens": 8}}),
                    ("resume", f"{undone.id}-undo-hold-resume", {"timeout": 10.0})]
    after = ctrl.store.get(undone.id)
    assert after.status == Status.ROLLED_BACK and after.outcome.carried_over == [temp.id, toks.id]
    assert ctrl.ws.pr_state(undone.id) == "reverted"
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_after_a_quiet_tick_observe_waits_observe_quiet_s(tmp_path, monkeypatch):
    from swarm.controller import Controller
    from swarm.graph import SwarmState

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False},
                                swarm={"observe_every_s": 0.5, "observe_quiet_s": 3}))
    plain = tiny_goal()
    del plain["swarm"]["observe_quiet_s"]
    assert Goal.parse(plain).swarm.wait_s(True) == 0.5      # not set: no back-off
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    slept: list[float] = []
    monkeypatch.setattr("swarm.controller.time.sleep", slept.append)
    ctrl.node_observe(SwarmState(tick=7, started=1e12))
    assert slept == []          # a process's first look (a resumed controller) does not wait
    for quiet in (False, True, False):
        ctrl.node_observe(SwarmState(tick=8, quiet=quiet, started=1e12))
    assert slept == [0.5, 3, 0.5]
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_a_quiet_tick_skips_the_intervention_nodes_until_something_happens(tmp_path):
    """diagnose routes straight to report when nothing was proposed, no intervention is open and
    the timeline has no row since the last full pass began; a human decision, a row logged during
    a full pass, or an open intervention make the next tick a full pass again."""
    from swarm.controller import Controller
    from swarm.graph import SwarmState, route_after_diagnose

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    running = SwarmState(job_status="RUNNING", tick=1)

    def tick() -> bool:
        quiet = ctrl.node_diagnose(running)["quiet"]
        assert route_after_diagnose(SwarmState(quiet=quiet)) == ("report" if quiet else "propose")
        ctrl.node_report(SwarmState(quiet=quiet, tick=1))
        return quiet

    assert tick() is False          # the first tick of a process is a full pass
    assert tick() is True and tick() is True
    ctrl.store.log("human_rollback", id="abc")
    assert tick() is False and tick() is True
    ctrl.store.log("skill_fired", name="x")
    assert ctrl.node_diagnose(running)["quiet"] is False      # a full pass begins
    ctrl.store.log("human_approve", id="abc")               # during it, after diagnose read the timeline
    ctrl.node_report(SwarmState(quiet=False, tick=1))
    assert tick() is False and tick() is True                 # the decision is not skipped
    d = Diagnosis(name="plateau", summary="flat", operator="diagnostics", policy="builtin")
    iv = Intervention(kind=InterventionKind.RECIPE_EDIT, changes={"recipe.lr": 0.001}, diagnosis=d, rationale="r",
                      operator="diagnostics", policy="builtin")
    ctrl.store.put(iv)
    ctrl.store.log("proposed", id=iv.id)
    assert tick() is False and tick() is False                 # open: every tick is a full pass
    ctrl.store.transition(iv.id, Status.REJECTED, "backtest")
    assert tick() is False and tick() is True
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_proposals_are_recorded_and_backtested_in_the_leads_order(tmp_path):
    """The operators build proposals in their own order (diagnostics before the HarnessCritic);
    the store — whose order the backtest node follows — must hold them most urgent first: a critical
    template fix before a warning-level rollback out of a loss spike, though the rollback was built
    first."""
    from swarm.controller import Controller
    from swarm.graph import SwarmState

    from test_claims import healthy_run

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    healthy_run(ctrl.run_dir)      # a run far from its target: both fixes are worth verifying (swarm.decisions.worth_verifying)

    def iv(kind, name, severity, changes):
        d = Diagnosis(name=name, summary=name, operator="x", policy="builtin", severity=severity,
                      evidence={"rollback_to": "step-50"} if kind == InterventionKind.ROLLBACK else {})
        return Intervention(kind=kind, changes=changes, diagnosis=d, rationale="r", operator="x", policy="builtin")

    rollback = iv(InterventionKind.ROLLBACK, "loss_spike", "warning", {"recipe.lr": 0.001})
    template = iv(InterventionKind.HARNESS_EDIT, "template_mismatch", "critical", {"harness.template": "{question}="})
    assert rollback.created < template.created
    ctrl.tick.proposals = [rollback, template]
    ctrl.node_propose(SwarmState(job_status="RUNNING", tick=1, step=100))
    assert [x.id for x in ctrl.store.list()] == [template.id, rollback.id]
    assert ctrl.pending() == [template.id, rollback.id]
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_one_fix_in_flight_also_among_one_ticks_proposals(tmp_path):
    """Two non-urgent fixes proposed on one tick: only the lead's first is recorded. The second waits
    for evidence from the run with the first in force — its symptom may be the first fault's (a
    too-hard curriculum also truncates answers) — and is proposed again only if it still shows."""
    from swarm.controller import Controller
    from swarm.graph import SwarmState

    from test_claims import healthy_run

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    healthy_run(ctrl.run_dir)

    def iv(kind, name, severity, changes):
        d = Diagnosis(name=name, summary=name, operator="x", policy="builtin", severity=severity)
        return Intervention(kind=kind, changes=changes, diagnosis=d, rationale="r", operator="x", policy="builtin")

    curriculum = iv(InterventionKind.DATA_CHANGE, "too_hard_curriculum", "critical", {"harness.curriculum.start": 2})
    tokens = iv(InterventionKind.HARNESS_EDIT, "truncation", "warning", {"harness.sampling.max_new_tokens": 12})
    ctrl.tick.proposals = [tokens, curriculum]
    ctrl.node_propose(SwarmState(job_status="RUNNING", tick=1, step=100))
    assert [x.id for x in ctrl.store.list()] == [curriculum.id]
    # a rollback for a run that does not learn throws its progress away as much as any fix: it
    # waits its turn too; one out of a divergence does not (every step trains on from it)
    d = Diagnosis(name="not_learning", summary="s", operator="x", policy="builtin", severity="warning",
                  evidence={"rollback_to": "init"})
    stuck = Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.001}, diagnosis=d, rationale="r",
                         operator="x", policy="builtin")
    spike = iv(InterventionKind.ROLLBACK, "loss_spike", "warning", {"recipe.lr": 0.001})
    ctrl.tick.proposals = [stuck]
    ctrl.node_propose(SwarmState(job_status="RUNNING", tick=2, step=110))
    assert [x.id for x in ctrl.store.list()] == [curriculum.id]
    ctrl.tick.proposals = [spike]
    ctrl.node_propose(SwarmState(job_status="RUNNING", tick=3, step=120))
    assert [x.id for x in ctrl.store.list()] == [curriculum.id, spike.id]
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_a_validated_rollback_holds_other_backtests_until_its_job_writes_and_noop_edits_are_dropped(tmp_path):
    """A rollback validated without a backtest is applied before any other proposal is backtested
    (else its checkpoint can leave the retention window meanwhile), and the others wait for the
    new job's first metrics row; then a harness edit that makes the harness the live run already
    reports (the rollback restored it) is rejected without a backtest."""
    import json
    import time

    from harness.spec import HarnessSpec
    from swarm.controller import Controller

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    d = Diagnosis(name="loss_spike", summary="s", operator="diagnostics", policy="builtin", severity="critical",
                  evidence={"rollback_to": "step_0000050"})
    rb = Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.001}, diagnosis=d, rationale="r",
                      operator="diagnostics", policy="builtin")
    ctrl.store.put(rb)
    assert ctrl.job_action_first("RUNNING") is False
    ctrl.store.transition(rb.id, Status.VALIDATED, "rollback of a diverged run")
    assert ctrl.job_action_first("RUNNING") is True
    ctrl.store.transition(rb.id, Status.APPLIED, "applied")
    ctrl.tick.evidence = None
    assert ctrl.job_action_first("RUNNING") is True                      # the new job has written nothing yet
    harness = ctrl.ws.current_harness()
    ctrl.run_dir.mkdir(parents=True, exist_ok=True)
    row = {"step": 1, "segment": 1, "time": time.time() + 1, "loss": 1.0,
           "harness_version": HarnessSpec.model_validate(harness).version}
    (ctrl.run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    ctrl.tick.evidence = None
    assert ctrl.job_action_first("RUNNING") is False

    def edit(template):
        t = Diagnosis(name="template_mismatch", summary="t", operator="harness_critic", policy="builtin")
        return Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.template": template}, diagnosis=t,
                            rationale="r", operator="harness_critic", policy="builtin")

    assert "already is what this edit makes" in ctrl.noop_edit(edit(harness["template"]), "RUNNING")
    assert ctrl.noop_edit(edit("Q: {question}\nA:"), "RUNNING") is None
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


@pytest.mark.parametrize("heldout,passes", [({"candidate-s0": 0.02, "control-s0": 0.01}, True),
                                            ({"candidate-s1": 0.0, "control-s1": 0.03}, False)])
def test_backtest_validates_on_a_lower_sft_loss_when_the_target_cannot_tell_yet(tmp_path, heldout, passes):
    """A template fix early in a run: held-out differs by noise (not a tie, not significant), the
    candidate's SFT loss is clearly lower on every seed. Validated — unless the target is worse by
    more than one held-out example on some seed."""
    iv = Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.template": "{question}="},
                      diagnosis=Diagnosis(name="template_mismatch", summary="cut", operator="harness_critic",
                                          policy="builtin"), rationale="r", operator="harness_critic", policy="builtin")
    arms = ScriptedArms(lambda cfg, step: (1.0 if "candidate" in cfg["name"] else 1.4) + 0.01 * cfg["seed"],
                        heldout=lambda cfg: next((v for k, v in heldout.items() if cfg["name"].endswith(k)), 0.0))
    res = backtest(iv, arms, tmp_path, step=300, seeds=[0, 1], eval_size=200)
    assert res.passed is passes
    assert (res.signal == "SFT training loss") is passes
    if not passes:
        assert "target lower for the candidate" in res.note


@pytest.mark.parametrize("severity,validated", [("critical", True), ("warning", False)])
def test_a_backtest_adds_a_seed_per_look_and_a_critical_fix_gets_a_longer_one(tmp_path, monkeypatch, severity, validated):
    """Inconclusive on the first seed's pair: the next look adds the second seed (only its arms run);
    still inconclusive, a fix for a critical finding is backtested once more over `critical_extend`
    × the horizon (its own arms, every seed, the same fork) and the record says so; any other fix
    is rejected after its seeds."""
    from swarm.controller import Controller
    from swarm.graph import SwarmState

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    calls = []

    def fake_arms(iv, *, horizon, label="", **kw):
        """Arms that score 0 vs 0 over the horizon and 0.3 vs 0 over a longer one."""
        from swarm.decisions import ArmScore, Pair

        calls.append((horizon, label, tuple(kw["seeds"]), kw["ckpt"], kw["step"]))
        long = horizon > goal.swarm.backtest.horizon_steps
        return [Pair(s, ArmScore(0.3 if long else 0.0), ArmScore(0.0)) for s in kw["seeds"]], 1.5

    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process", backtest_runner=fake_arms)
    monkeypatch.setattr(ctrl, "command", lambda *a, **k: {"status": "applied", "step": 120})
    d = Diagnosis(name="template_mismatch", summary="cut", operator="harness_critic", policy="builtin", severity=severity)
    iv = Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.template": "Q: {question}\nA:"}, diagnosis=d,
                      rationale="r", operator="harness_critic", policy="builtin")
    ctrl.store.put(iv)
    ctrl.node_backtest(SwarmState(job_status="RUNNING", tick=1, step=120))
    h = goal.swarm.backtest.horizon_steps
    got = ctrl.store.get(iv.id)
    assert [c[:3] for c in calls[:2]] == [(h, "", (0,)), (h, "", (1,))]
    if validated:
        assert [c[:3] for c in calls[2:]] == [(4 * h, "-x4", (0, 1))] and len({c[3:] for c in calls}) == 1
        assert got.status == Status.VALIDATED and got.backtest.horizon_steps == 4 * h and got.backtest.seeds == [0, 1]
        assert got.backtest.note.startswith(f"look 1 over {h} steps, seed(s) 0: inconclusive")
        assert "added seed(s) 1" in got.backtest.note and "looked again over" in got.backtest.note
        assert got.outcome.backtest_cpu_s == 4.5 == got.backtest.cpu_s      # every look's arms
    else:
        assert len(calls) == 2 and got.status == Status.REJECTED and got.backtest.seeds == [0, 1]
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_a_fix_retried_after_an_inconclusive_gain_is_backtested_over_twice_the_horizon(tmp_path, monkeypatch):
    """The same fix proposed again after its backtest gained too little to tell: its arms train
    twice the horizon (a second look at the same horizon would only repeat the first)."""
    from agents.domain import BacktestResult
    from swarm.controller import Controller
    from swarm.graph import SwarmState

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    calls = []

    def fake_arms(iv, *, horizon, label="", **kw):
        from swarm.decisions import ArmScore, Pair

        calls.append(horizon)
        return [Pair(s, ArmScore(0.6), ArmScore(0.0)) for s in kw["seeds"]], 1.0

    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process", backtest_runner=fake_arms)
    monkeypatch.setattr(ctrl, "command", lambda *a, **k: {"status": "applied", "step": 120})
    d = Diagnosis(name="truncation", summary="cut", operator="harness_critic", policy="builtin")

    def fix():
        return Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.sampling.max_new_tokens": 9}, diagnosis=d,
                            rationale="r", operator="harness_critic", policy="builtin")

    first = fix()
    first.backtest = BacktestResult(metric="heldout_acc", candidate=[0.02, 0.0], control=[0.0, 0.0], effect=0.01, p_value=0.4,
                                    test="t", horizon_steps=40, seeds=[0, 1], passed=False)
    ctrl.store.put(first)
    ctrl.store.transition(first.id, Status.REJECTED, "no measured gain")
    again = fix()
    ctrl.store.put(again)
    ctrl.node_backtest(SwarmState(job_status="RUNNING", tick=1, step=120))
    h = goal.swarm.backtest.horizon_steps
    got = ctrl.store.get(again.id)
    assert calls == [2 * h] and got.status == Status.VALIDATED and got.backtest.horizon_steps == 2 * h
    assert "1 earlier backtest(s) of this fix gained too little to tell" in got.backtest.note
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


@pytest.mark.parametrize("best,init_kept,tried,kind,growth", [
    (0.0, True, True, InterventionKind.ROLLBACK, 1.0),          # never learnt, tried from the live weights: from the start
    (0.0, True, False, InterventionKind.HARNESS_EDIT, 1.0),     # first try: from the live weights
    (0.3, True, True, InterventionKind.HARNESS_EDIT, 1.0),      # it learnt: its weights are worth keeping
    (0.3, True, True, InterventionKind.ROLLBACK, 3.0),          # it learnt, fell back, its weights inflated: from the start
    (0.0, False, True, InterventionKind.HARNESS_EDIT, 1.0),     # no untrained checkpoint to start from
])
def test_a_fix_that_could_not_show_from_the_weights_of_a_run_that_never_learnt_starts_over(
        tmp_path, monkeypatch, best, init_kept, tried, kind, growth):
    """A config fix already backtested from the live weights with a gain too small to tell, in a
    run whose weights are worth nothing (it never learnt, or it is back at the not-learning level
    with its weights grown far past their untrained size) whose untrained checkpoint is kept, is
    proposed again as a rollback to that checkpoint carrying the same change
    (swarm.backtest.start_over)."""
    from agents.domain import BacktestResult
    from agents.evidence import Evidence
    from swarm.controller import Controller

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    held = [best, 0.0, 0.0] if growth > 1.0 else [best] * 3
    ev = Evidence(run_dir=str(tmp_path), job_status="RUNNING", step=150,
                  metrics=[{"step": 150, "loss": 1.0, "weight_growth": growth}],
                  evals=[{"step": s, "heldout_acc": h} for s, h in zip((50, 100, 150), held)])
    monkeypatch.setattr(ctrl, "evidence", lambda status: ev)
    monkeypatch.setattr(ctrl, "checkpoints", lambda: ([{"name": "init", "step": 0}] if init_kept else [])
                        + [{"name": "ckpt-100", "step": 100}])
    d = Diagnosis(name="truncation", summary="cut", operator="harness_critic", policy="builtin")

    def fix():
        return Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.sampling.max_new_tokens": 9}, diagnosis=d,
                            rationale="r", operator="harness_critic", policy="builtin")

    if tried:
        first = fix()
        first.backtest = BacktestResult(metric="heldout_acc", candidate=[0.0, 0.0], control=[0.0, 0.0], effect=0.0,
                                        p_value=0.85, test="t", horizon_steps=40, seeds=[0, 1], passed=False)
        ctrl.store.put(first)
        ctrl.store.transition(first.id, Status.REJECTED, "no measured gain")
    got = ctrl.from_the_start(fix())
    assert got.kind == kind and got.changes == {"harness.sampling.max_new_tokens": 9}
    if kind == InterventionKind.ROLLBACK:
        assert got.diagnosis.evidence["rollback_to"] == "init" and ctrl.rollback_target(got) == "init"
        assert "tried again from the untrained checkpoint 'init'" in got.rationale
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


@pytest.mark.parametrize("live_step", [300, 50, 10])
def test_a_rollback_whose_arms_both_start_at_its_checkpoint_trains_the_steps_it_gives_up(tmp_path, monkeypatch, live_step):
    """A rollback to a checkpoint when the steps since it gained nothing: both arms start there, and
    they train at least the steps the rollback gives up (within the longest retry horizon), never
    less than the backtest's horizon; the record says so."""
    from swarm.controller import Controller
    from swarm.graph import SwarmState

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    h = goal.swarm.backtest.horizon_steps
    calls = []

    def fake_arms(iv, *, horizon, label="", **kw):
        from swarm.decisions import ArmScore, Pair

        calls.append((horizon, kw["ckpt"], kw["step"], kw["candidate_step"]))
        return [Pair(s, ArmScore(0.6), ArmScore(0.0)) for s in kw["seeds"]], 1.0

    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process", backtest_runner=fake_arms)
    monkeypatch.setattr(ctrl, "command", lambda *a, **k: {"status": "applied", "step": live_step})
    monkeypatch.setattr(ctrl, "checkpoints", lambda: [{"name": "init", "step": 0}])
    monkeypatch.setattr(ctrl, "nothing_staked", lambda step: True)
    d = Diagnosis(name="not_learning", summary="flat", operator="diagnostics", policy="builtin",
                  evidence={"rollback_to": "init"})
    iv = Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.001}, diagnosis=d, rationale="r",
                      operator="diagnostics", policy="builtin")
    ctrl.store.put(iv)
    ctrl.node_backtest(SwarmState(job_status="RUNNING", tick=1, step=live_step))
    assert 10 < h < 50 and 4 * h < 300, "the cases below assume the test goal's horizon"
    want = {300: 4 * h, 50: 50, 10: h}[live_step]     # capped at the longest retry horizon; the steps given up; h
    [(horizon, ckpt, step, cstep)] = calls
    assert horizon == want and ckpt.endswith("init.pt") and step == 0 and cstep == 0
    got = ctrl.store.get(iv.id)
    assert got.backtest.horizon_steps == want
    assert ("the rollback gives up" in got.backtest.note) is (want > h)
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


@pytest.mark.parametrize("name,confirmed,backtested", [("loss_spike", True, False), ("reward_hacking", True, False),
                                                      ("loss_spike", False, True), ("template_mismatch", True, True)])
def test_only_a_confirmed_divergence_rollback_skips_its_backtest(tmp_path, monkeypatch, name, confirmed, backtested):
    """A rollback claiming a divergence skips the backtest only when the controller's own detectors
    find a divergence on this tick's evidence; a claim they do not confirm is backtested."""
    from swarm.controller import Controller
    from agents.domain import BacktestResult
    from swarm.graph import SwarmState

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    calls = []

    def fake_arms(iv, *, horizon, label="", **kw):
        from swarm.decisions import ArmScore, Pair

        calls.append(horizon)
        return [Pair(s, ArmScore(0.8), ArmScore(0.0)) for s in kw["seeds"]], 1.0

    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process", backtest_runner=fake_arms)
    monkeypatch.setattr(ctrl, "command", lambda *a, **k: {"status": "applied", "step": 120})
    d = Diagnosis(name=name, summary="s", operator="x", policy="builtin", severity="critical",
                  evidence={"rollback_to": "step_0000050"})
    iv = Intervention(kind=InterventionKind.ROLLBACK, changes={"harness.template": "{question}="}, diagnosis=d,
                      rationale="r", operator="x", policy="builtin")
    ctrl.store.put(iv)
    ctrl.tick.findings = [d] if confirmed else []
    ctrl.node_backtest(SwarmState(job_status="RUNNING", tick=1, step=120))
    got = ctrl.store.get(iv.id)
    assert got.status == Status.VALIDATED and bool(calls) is backtested
    assert (got.backtest_skipped is None) is backtested
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_a_tie_on_the_target_goes_to_the_sft_loss_before_a_noisy_pass_rate(tmp_path):
    """Measured on lr_too_high: a rollback to init at a lower lr ties the diverged control at ~0
    held-out, the control "passes" 2.5% of training answers by guessing a frequent one, and the
    candidate's loss is clearly lower. The loss decides, not the guessing."""
    iv = Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.001},
                      diagnosis=Diagnosis(name="not_learning", summary="flat", operator="diagnostics", policy="builtin"),
                      rationale="r", operator="diagnostics", policy="builtin")
    arms = ScriptedArms(lambda cfg, step: (1.77 if "candidate" in cfg["name"] else 1.86) + 0.01 * cfg["seed"],
                        heldout=lambda cfg: 0.005 if cfg["seed"] == 1 else 0.0,
                        pass_rate=lambda cfg: 0.0 if "candidate" in cfg["name"] else 0.025)
    res = backtest(iv, arms, tmp_path, step=300, seeds=[0, 1], eval_size=200, candidate_ckpt="init.pt", candidate_step=0)
    assert res.signal == "SFT training loss" and res.test.index("SFT training loss") < res.test.index("training pass rate")
    assert res.passed and res.effect == pytest.approx(0.09)


def test_an_edit_that_makes_what_already_runs_is_a_no_op_in_every_section_it_touches():
    """swarm.backtest.noop_edit: the recipe and harness versions an edit would make, against the
    versions the live run reports; a section whose live version is unknown is never a no-op."""
    from harness.spec import HarnessSpec
    from swarm.backtest import noop_edit
    from trainer.config import Recipe

    recipe, harness = {"lr": 1e-3, "batch_size": 32}, {"template": "Q: {question}\nA:"}
    live = {"recipe_version": Recipe.model_validate({**recipe, "batch_size": 6}).version,
            "harness_version": HarnessSpec.model_validate(harness).version}
    restore = {"recipe.batch_size": 32}
    assert noop_edit(restore, recipe, harness, live) is None                  # the live run trains at 6: not a no-op
    back = {**live, "recipe_version": Recipe.model_validate(recipe).version}
    assert "recipe version" in noop_edit(restore, recipe, harness, back)      # it already trains at 32
    assert noop_edit({**restore, "harness.template": "{question}="}, recipe, harness, back) is None
    assert noop_edit(restore, recipe, harness, {**back, "recipe_version": None}) is None


@pytest.mark.parametrize("heldout, common", [([0.0, 0.0, 0.0], True), ([0.0, 0.3, 0.5], False)])
def test_a_rollback_that_stakes_nothing_is_backtested_from_one_start(tmp_path, monkeypatch, heldout, common):
    """A rollback to the untrained checkpoint of a run whose steps since gained nothing (held-out
    flat at 0): both arms fork that checkpoint, so they compare the configs from the same weights.
    A run that gained since is compared with carrying on from where it is."""
    import json
    import pathlib

    from swarm.controller import Controller
    from swarm.decisions import ArmScore, Pair
    from swarm.graph import SwarmState

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    forks = []

    def fake_arms(iv, *, ckpt, step, candidate_ckpt=None, candidate_step=None, **kw):
        forks.append((pathlib.Path(ckpt).name, step, pathlib.Path(candidate_ckpt).name, candidate_step))
        return [Pair(s, ArmScore(0.5), ArmScore(0.0)) for s in kw["seeds"]], 1.0

    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process", backtest_runner=fake_arms)
    monkeypatch.setattr(ctrl, "command", lambda *a, **k: {"status": "applied", "step": 120, "time": 0.0})
    (ctrl.run_dir / "checkpoints").mkdir(parents=True)
    (ctrl.run_dir / "checkpoints" / "init.json").write_text(json.dumps({"name": "init", "step": 0}))
    rows = [{"step": s, "segment": 0, "time": float(s), "heldout_acc": v} for s, v in zip((40, 80, 120), heldout)]
    (ctrl.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = Diagnosis(name="not_learning", summary="flat", operator="x", policy="builtin", evidence={"rollback_to": "init"})
    iv = Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.003}, diagnosis=d, rationale="r",
                      operator="x", policy="builtin")
    ctrl.store.put(iv)
    ctrl.node_backtest(SwarmState(job_status="RUNNING", tick=1, step=120))
    assert forks and all(f[2:] == ("init.pt", 0) for f in forks)          # the candidate always starts there
    assert all(f[:2] == (("init.pt", 0) if common else (f"bt-{iv.id}.pt", 120)) for f in forks), forks
    assert ("both arms from checkpoint init" in ctrl.store.get(iv.id).backtest.note) is common
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()


def test_a_rollbacks_arms_carry_the_fixes_applied_since_its_checkpoint(tmp_path, monkeypatch):
    """A rollback's checkpoint holds the harness and recipe of its moment; applying it sets the fixes
    in force since then again, so the arms that fork it (the candidate; both, when both start
    there) carry them too: else they measure a run without those fixes (answers still cut at the
    old limit, say), not the run the rollback makes. Fixes undone since, or applied before the
    checkpoint, are not carried; the change itself wins over a carried value of the same field."""
    import json
    import pathlib
    import time

    from swarm.controller import Controller
    from swarm.decisions import ArmScore, Pair
    from swarm.graph import SwarmState

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    seen = []

    def fake_arms(iv, *, carried=None, **kw):
        seen.append(dict(carried or {}))
        return [Pair(s, ArmScore(0.5), ArmScore(0.0)) for s in kw["seeds"]], 1.0

    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process", backtest_runner=fake_arms)
    monkeypatch.setattr(ctrl, "command", lambda *a, **k: {"status": "applied", "step": 120, "time": 0.0})
    ckdir = ctrl.run_dir / "checkpoints"
    ckdir.mkdir(parents=True)
    t0 = time.time()
    (ckdir / "init.json").write_text(json.dumps({"name": "init", "step": 0, "time": t0}))
    rows = [{"step": s, "segment": 0, "time": float(s), "heldout_acc": 0.0} for s in (40, 80, 120)]
    (ctrl.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = Diagnosis(name="not_learning", summary="flat", operator="x", policy="builtin", evidence={"rollback_to": "init"})

    def applied(changes, status, since):
        x = Intervention(kind=InterventionKind.HARNESS_EDIT, changes=changes, diagnosis=d, rationale="r",
                         operator="x", policy="builtin")
        x.status, x.outcome.since_time = status, since
        ctrl.store.put(x)
        return x

    tokens = applied({"harness.sampling.max_new_tokens": 6, "recipe.lr": 0.5}, Status.EVALUATING, t0 + 10)
    applied({"harness.sampling.temperature": 0.3}, Status.ROLLED_BACK, t0 + 20)      # undone: not in force
    applied({"harness.sampling.top_p": 0.9}, Status.KEPT, t0 - 10)                    # the checkpoint has it
    iv = Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.003}, diagnosis=d, rationale="r",
                      operator="x", policy="builtin")
    ctrl.store.put(iv)
    ctrl.node_backtest(SwarmState(job_status="RUNNING", tick=1, step=120))
    assert seen and all(c == {"harness.sampling.max_new_tokens": 6, "recipe.lr": 0.5} for c in seen), seen
    note = ctrl.store.get(iv.id).backtest.note
    assert f"carry the fixes applied since and in force ({tokens.id}): harness.sampling.max_new_tokens, recipe.lr" in note
    ctrl.knowledge.close()
    ctrl._conn.close()
    ctrl.lock.release()
