"""The plan at the start of a run (swarm/pilot.py `plan_run`, swarm/plan_pr.py): a goal whose plan
fills the model size or lr gets the pilot before `swarm run` trains; the pilot's CPU is in the run's
meter, its folder in the run's workspace (a killed run resumes it), the winner starts the live run
and never a field the goal writes; the plan is the run's first PR, merged; the final report states
the pilot's prediction beside what happened. Real trainer runs on tiny models, a real git
workspace, real controller processes."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml

from agents.domain import Target
from swarm.controller import Controller
from swarm.goal import Goal
from swarm.graph import SwarmState
from swarm.pilot import PILOT_DIR, PLAN_RECORD, pilot_skipped, plan_run, prediction_vs_outcome
from swarm.plan import Source
from swarm.plan_memory import remember_plan
from swarm.plan_pr import open_plan_pr, plan_report
from swarm.report import final_report
from trainer.config import RunConfig
from trainer.runlog import read_jsonl

SENTENCE = "a policy that adds 2-digit numbers with >= 90% held-out exact match"
TARGET = {"metric": "heldout_acc", "op": ">=", "threshold": 0.9}
QUICK = {"memory": {"backend": "memory", "seed_skills": False}, "swarm": {"observe_every_s": 0.5, "observe_quiet_s": 0.5}}


@pytest.fixture(autouse=True)
def _home(clean_git_home):
    """A clean git HOME for every test (conftest.clean_git_home)."""


def goal_data(**over) -> dict:
    """A minimal addition goal whose run writes one field (n_layers: the pilot must leave it)."""
    return {"goal": SENTENCE, "target": TARGET, "budget": {"worker_cpu_s": 8, "steps": 300, "wall_s": 120},
            "run": {"model": {"n_layers": 1}}, "pilot": {"share": 0.25}, **QUICK, **over}


def git(ws: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True, check=True).stdout


def cli(cwd: pathlib.Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarm.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# ---- when a run gets a pilot ------------------------------------------------------------------


@pytest.mark.parametrize("over, why", [
    ({}, None),                                                                        # the plan fills d_model and lr
    ({"run": {"task": {"name": "addition"}}}, "run.task is written"),                            # the run as written
    ({"pilot": {"enabled": False}}, "pilot.enabled is false"),
    ({"run": {"model": {"d_model": 64, "n_layers": 1}, "recipe": {"lr": 0.003}}}, "the goal writes"),
    ({"run": {"model": {"d_model": 64, "n_layers": 1}}}, None),                        # lr is still the plan's
])
def test_who_gets_a_pilot(over, why):
    got = pilot_skipped(Goal.parse(goal_data(**over)))
    assert (got is None) if why is None else (why in got), got


@pytest.mark.parametrize("pilot, needle", [
    ({"share": 2}, "pilot.share"), ({"share": 0}, "pilot.share"), ({"enabled": "maybe"}, "pilot.enabled"),
    ({"shares": 0.1}, "pilot.shares"),
])
def test_a_bad_pilot_key_is_one_line_exit_2(tmp_path, pilot, needle):
    path = tmp_path / "goal.yaml"
    path.write_text(yaml.safe_dump(goal_data(pilot=pilot)))
    res = cli(tmp_path, "validate", str(path))
    assert res.returncode == 2 and res.stdout == "", res
    err = res.stderr.strip()
    assert "\n" not in err and needle in err and "Traceback" not in err, err


def test_a_goal_adopts_only_its_own_plan():
    a, b = Goal.parse(goal_data()), Goal.parse(goal_data(goal="a policy that sorts lists of 5 digits"))
    with pytest.raises(ValueError, match="another goal"):
        a.adopt(b.plan())


# ---- the plan node: pilot, meter, live config, the plan PR --------------------------------------


def test_the_plan_node_pilots_then_opens_and_merges_the_plan_pr(tmp_path):
    goal = Goal.parse(goal_data())
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    ws, sdir = tmp_path / "ws", tmp_path / "ws" / ".swarm"
    upd = ctrl.node_plan(SwarmState())
    rec = json.loads((sdir / PLAN_RECORD).read_text())
    pilot = rec["pilot"]
    runs = [r for r in ctrl.store.timeline() if r["kind"] == "pilot_run"]
    records = read_jsonl(sdir / PILOT_DIR / "pilot.jsonl")[1:]
    assert len(runs) == len(records) == len(pilot["results"]) >= 1
    # the pilot's CPU is one entry of the run's meter, and within its share but for one run
    assert upd["cpu"] == {"pilot": pilot["cpu_s"]}
    assert pilot["cpu_s"] <= 0.25 * 8 + max(r["cpu_s"] for r in pilot["results"]) + 0.5
    # the winner's fields start the live job; the field the goal writes is the goal's
    fields = pilot["winner"]["fields"]
    assert set(fields) == {"model.d_model", "recipe.lr"}
    assert ctrl.base_cfg["model"]["d_model"] == fields["model.d_model"] and ctrl.base_cfg["recipe"]["lr"] == fields["recipe.lr"]
    assert ctrl.base_cfg["model"]["n_layers"] == 1 and goal.plan().get("model.n_layers").source is Source.USER
    assert goal.plan().get("recipe.lr").source is Source.PILOT and goal.run == {"model": {"n_layers": 1}}
    job = yaml.safe_load(ctrl.write_job_config().read_text())
    assert (job["model"]["d_model"], job["model"]["n_layers"], job["recipe"]["lr"]) == (fields["model.d_model"], 1,
                                                                                       fields["recipe.lr"])
    # the live job goes on from the winner's last checkpoint, kept in the run's pilot folder
    assert job["fork_from"] == pilot["checkpoint"] and job["fork_mode"] == "full"
    ckpt = pathlib.Path(pilot["checkpoint"])
    assert ckpt.is_file() and (sdir / PILOT_DIR).resolve() in ckpt.parents
    # the plan is a merged PR: report, curve, record; main's recipe holds the pilot's lr
    assert "refs/tags/merged/plan" in git(ws, "show-ref")
    assert ctrl.ws.pr_state("plan") == "merged"
    report = git(ws, "show", "main:reports/plan/REPORT.md")
    for needle in ("| model.d_model |", "| pilot |", "| model.n_layers | 1 | user |", "## Pilot", pilot["winner"]["name"],
                   "Prediction:", "pilot.svg", "Start: the run goes on from the winner's last checkpoint"):
        assert needle in report, needle
    assert git(ws, "show", "main:reports/plan/pilot.svg").startswith("<svg")
    assert yaml.safe_load(git(ws, "show", "main:recipe.yaml"))["lr"] == fields["recipe.lr"]
    assert [r["kind"] for r in ctrl.store.timeline()][-3:] == ["pilot_done", "plan_pr", "plan"]

    # a controller started again: the record is read, nothing runs, the PR is left as it is
    again = Goal.parse(goal_data())
    head = git(ws, "rev-parse", "main")
    logged: list = []
    assert plan_run(again, sdir, lambda kind, **d: logged.append(kind)) == rec and logged == []
    assert again.run_config("x", "/tmp").model.d_model == fields["model.d_model"]
    open_plan_pr(ctrl.ws, rec, again.target)
    assert git(ws, "rev-parse", "main") == head


@pytest.mark.parametrize("over, pr", [({"pilot": {"enabled": False}}, True), ({"run": {"task": {"name": "addition"}}}, False)])
def test_no_pilot_and_a_written_task(tmp_path, over, pr):
    """Without the pilot the plan's defaults train and the plan PR says why; a goal that writes
    run.task trains as written: no pilot, no plan PR."""
    ctrl = Controller.create(tmp_path / "ws", Goal.parse(goal_data(**over)), jobs="process")
    upd = ctrl.node_plan(SwarmState())
    assert upd["cpu"] == {} and not ctrl.store.timeline("pilot_run")
    assert not (tmp_path / "ws" / ".swarm" / PILOT_DIR).exists()
    default = RunConfig()
    assert (ctrl.base_cfg["model"]["d_model"], ctrl.base_cfg["recipe"]["lr"]) == (default.model.d_model, default.recipe.lr)
    refs = git(tmp_path / "ws", "show-ref")
    assert ("refs/tags/merged/plan" in refs) == pr
    if pr:
        assert "No pilot: pilot.enabled is false" in git(tmp_path / "ws", "show", "main:reports/plan/REPORT.md")


# ---- prediction vs outcome ----------------------------------------------------------------------


def record(pred_steps, pred_cpu, why="") -> dict:
    return {"plan": {}, "pilot": {"cpu_s": 5.0, "winner": {"name": "d64-lr0.003", "fields": {}},
                                  "prediction": {"steps": pred_steps, "worker_cpu_s": pred_cpu, "why": why}}}


@pytest.mark.parametrize("rows, cpu, want", [
    # reached at the first eval row at the target: its step; the run's CPU is the meter's less the pilot's
    ([{"step": 100, "heldout_acc": 0.5}, {"step": 150, "heldout_acc": 0.92}, {"step": 200, "heldout_acc": 0.95}],
     35.0, (True, 150, 30.0)),
    ([{"step": 100, "heldout_acc": 0.5}, {"step": 120, "final": True, "heldout_acc": 0.91}], 9.0, (True, 120, 4.0)),
    ([{"step": 100, "heldout_acc": 0.5}], None, (False, None, None)),
])
def test_prediction_vs_outcome(rows, cpu, want):
    got = prediction_vs_outcome(record(140, 20.0), rows, Target(**TARGET), cpu)
    assert (got["reached"], got["steps_to_target"], got["worker_cpu_s_to_target"]) == want
    assert (got["predicted_steps"], got["predicted_worker_cpu_s"], got["pilot_cpu_s"]) == (140, 20.0, 5.0)
    assert prediction_vs_outcome(None, rows, Target(**TARGET), cpu) is None
    assert prediction_vs_outcome({"plan": {}, "pilot": None}, rows, Target(**TARGET), cpu) is None


def test_the_final_report_states_prediction_and_outcome():
    outcome = {"reached": True, "final_metric": 0.95,
               "plan_prediction": prediction_vs_outcome(record(140, 20.0), [{"step": 150, "heldout_acc": 0.92}], Target(**TARGET), 35.0)}
    md, _ = final_report({"goal": SENTENCE, "target": TARGET}, [], [], [], outcome)
    section = md.split("## Plan: prediction and outcome", 1)[1].split("## Interventions", 1)[0]
    assert "| steps to the target | 140 | 150 |" in section and "| 20 | 30 |" in section and "d64-lr0.003" in section
    # priced at the live job's own CPU per step: 140 steps x 0.2 = 28 against the run's 30
    priced = {**outcome, "plan_prediction": prediction_vs_outcome(record(140, 20.0), [{"step": 150, "heldout_acc": 0.92}],
                                                                   Target(**TARGET), 35.0, live_cpu_per_step=0.2)}
    assert priced["plan_prediction"]["predicted_worker_cpu_s_at_live_cost"] == 28.0
    md, _ = final_report({"goal": SENTENCE, "target": TARGET}, [], [], [], priced)
    assert "| the predicted steps at the live job's 0.2 worker-CPU-s per step | 28 | 30 |" in md
    missed = {"reached": False, "plan_prediction": prediction_vs_outcome(record(None, None, "one point is no curve"), [],
                                                              Target(**TARGET), None)}
    md, _ = final_report({"goal": SENTENCE, "target": TARGET}, [], [], [], missed)
    assert "| steps to the target | none | not reached |" in md and "one point is no curve" in md
    md, _ = final_report({"goal": SENTENCE, "target": TARGET}, [], [], [], {"reached": False, "plan_prediction": None})
    assert "## Plan" not in md


def test_the_plan_report_without_a_pilot_names_why():
    goal = Goal.parse(goal_data(pilot={"enabled": False}))
    md, files = plan_report({"plan": goal.plan().to_json(), "pilot": None, "pilot_skipped": "pilot.enabled is false"},
                            goal.target)
    assert files == {} and "No pilot: pilot.enabled is false." in md
    assert f"| model.d_model | {RunConfig().model.d_model} | default |" in md


# ---- swarm run end to end -------------------------------------------------------------------------


def test_swarm_run_pilots_first_with_a_line_per_pilot_run(tmp_path, reap):
    """`swarm run` on a minimal goal: a line per finished pilot run on the console, the pilot's CPU in
    the run's worker CPU, the winner in the live job, prediction vs outcome in the summary and report."""
    path = tmp_path / "goal.yaml"
    path.write_text(yaml.safe_dump(goal_data(budget={"worker_cpu_s": 8, "steps": 300, "wall_s": 120})))
    ws = tmp_path / "ws"
    res = cli(tmp_path, "run", str(path), "--workspace", str(ws), "--jobs", "process", "--summary", str(tmp_path / "s.json"))
    assert res.returncode in (0, 1), res.stderr   # 1: the target is not reached within this budget
    summary = json.loads((tmp_path / "s.json").read_text())
    rec = json.loads((ws / ".swarm" / PLAN_RECORD).read_text())
    progress = [ln for ln in res.stdout.splitlines() if " pilot_run candidate=" in ln]
    assert len(progress) == len(rec["pilot"]["results"]) >= 1, res.stdout
    assert summary["worker_cpu_s"] > rec["pilot"]["cpu_s"] > 0
    assert summary["plan_prediction"]["pilot_cpu_s"] == round(rec["pilot"]["cpu_s"], 2) and summary["plan_prediction"]["winner"] == rec["pilot"]["winner"]["name"]
    job = yaml.safe_load((ws / ".swarm" / "private" / "train.yaml").read_text())
    for field, value in rec["pilot"]["winner"]["fields"].items():
        section, key = field.split(".")
        assert job[section][key] == value, field
    assert job["model"]["n_layers"] == 1
    # the live run starts at the winner's step: its steps go on from the pilot's
    won = max(r["steps"] for r in rec["pilot"]["results"] if r["candidate"] == rec["pilot"]["winner"]["name"])
    steps = [r["step"] for r in read_jsonl(ws / ".swarm" / "runs" / "train" / "metrics.jsonl") if not r.get("final")]
    assert job["fork_from"] == rec["pilot"]["checkpoint"] and (not steps or steps[0] == won + 1), (won, steps[:3])
    assert "## Plan: prediction and outcome" in (ws / "reports" / "final" / "REPORT.md").read_text()
    # the plan and its outcome are in the run's memory for the next planned run
    kept = [r for r in read_jsonl(ws / ".swarm" / "memory" / "reports.jsonl") if r["metadata"].get("kind") == "plan"]
    assert len(kept) == 1 and kept[0]["text"] == SENTENCE and kept[0]["metadata"]["task"] == "addition"
    assert json.loads(kept[0]["metadata"]["fields"])["model.d_model"] == job["model"]["d_model"]
    assert kept[0]["metadata"]["reached"] is bool(summary["reached"])


def test_swarm_run_no_pilot_is_kept_for_a_resume(tmp_path, reap):
    path = tmp_path / "goal.yaml"
    path.write_text(yaml.safe_dump(goal_data(budget={"worker_cpu_s": 100, "steps": 300, "wall_s": 1})))
    ws = tmp_path / "ws"
    res = cli(tmp_path, "run", str(path), "--workspace", str(ws), "--jobs", "process", "--no-pilot")
    assert res.returncode == 1 and "budget_wall_clock" in res.stdout, (res.stdout, res.stderr)
    assert "pilot_run" not in res.stdout and not (ws / ".swarm" / PILOT_DIR).exists()
    saved = yaml.safe_load((ws / ".swarm" / "private" / "goal.yaml").read_text())
    assert saved["pilot"]["enabled"] is False
    assert "No pilot: pilot.enabled is false" in git(ws, "show", "main:reports/plan/REPORT.md")


@pytest.mark.slow
def test_a_run_killed_during_its_pilot_resumes_the_pilot(tmp_path, reap):
    """SIGKILL the controller once the pilot has recorded two runs; `swarm resume` goes on from the
    pilot's record: no recorded run is run again, the meter holds the whole pilot."""
    path = tmp_path / "goal.yaml"
    path.write_text(yaml.safe_dump(goal_data(budget={"worker_cpu_s": 30, "steps": 600, "wall_s": 20},
                                             pilot={"share": 0.2})))
    ws = tmp_path / "ws"
    record = ws / ".swarm" / PILOT_DIR / "pilot.jsonl"
    log = open(tmp_path / "log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "swarm.cli", "run", str(path), "--workspace", str(ws), "--jobs",
                             "process", "--quiet"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    reap.append(proc)
    deadline = time.time() + 90
    while time.time() < deadline and not (record.exists() and len(record.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = read_jsonl(record)[1:]
    assert len(before) >= 2 and not (ws / ".swarm" / PLAN_RECORD).exists(), "the pilot had finished before the kill"
    res = cli(tmp_path, "resume", "--workspace", str(ws), "--jobs", "process", "--summary", str(tmp_path / "s.json"),
              timeout=180)
    assert res.returncode in (0, 1), res.stderr
    after = read_jsonl(record)[1:]
    keys = [(r["candidate"], r["rung"]) for r in after]
    assert len(keys) == len(set(keys)) and after[:len(before)] == before, keys
    rec = json.loads((ws / ".swarm" / PLAN_RECORD).read_text())
    assert len(rec["pilot"]["results"]) == len(after)
    assert rec["pilot"]["cpu_s"] >= sum(r["cpu_s"] for r in after) - 1e-6
    assert json.loads((tmp_path / "s.json").read_text())["worker_cpu_s"] > rec["pilot"]["cpu_s"]


# ---- plans from memory ----------------------------------------------------------------------------


def test_a_planned_run_starts_from_a_past_plan_on_the_same_task(tmp_path):
    """Run A (2-digit addition) pilots and is remembered as reaching its target; run B (3-digit
    addition, the same shared library) starts from A's size and lr, source memory, with no pilot;
    run C (sort) finds nothing to recall and pilots."""
    lib = {"library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False}
    a = Controller.create(tmp_path / "a", Goal.parse(goal_data(memory=lib)), jobs="process")
    a.node_plan(SwarmState())
    rec_a = json.loads((tmp_path / "a" / ".swarm" / PLAN_RECORD).read_text())
    won = rec_a["pilot"]["winner"]["fields"]
    assert remember_plan(a.knowledge, rec_a, {"reached": True, "worker_cpu_s_to_target": 50.0}, 120)
    a.knowledge.close()   # the library is one controller's at a time

    b_goal = Goal.parse(goal_data(goal="a policy that adds 3-digit numbers with >= 90% held-out exact match", memory=lib))
    b = Controller.create(tmp_path / "b", b_goal, jobs="process")
    upd = b.node_plan(SwarmState())
    rec_b = json.loads((tmp_path / "b" / ".swarm" / PLAN_RECORD).read_text())
    assert upd["cpu"] == {} and rec_b["pilot"] is None and rec_b["pilot_skipped"].startswith("memory:")
    assert not b.store.timeline("pilot_run") and b.store.timeline("plan_from_memory")[0]["workspace"].startswith("a-")
    for field, value in won.items():
        ch = b_goal.plan().get(field)
        # remembered: the run's own CPU to its target, as its final report gives it (the pilot's is not the plan's cost)
        assert ch.source is Source.MEMORY and ch.value == value
        assert ch.evidence["worker_cpu_s_to_target"] == pytest.approx(max(0.0, 50.0 - rec_a["pilot"]["cpu_s"]))
    assert b_goal.plan().get("model.n_layers").source is Source.USER   # written: never from memory
    assert b.base_cfg["model"]["d_model"] == won["model.d_model"] and b.base_cfg["recipe"]["lr"] == won["recipe.lr"]
    assert "| memory |" in git(tmp_path / "b", "show", "main:reports/plan/REPORT.md")
    assert b.ws.current_recipe()["lr"] == won["recipe.lr"]     # main holds what the live job trains
    # B's own plan is remembered too; a run that did not reach its target is never recalled
    assert remember_plan(b.knowledge, rec_b, {"reached": False, "worker_cpu_s_to_target": None}, None)
    b.knowledge.close()

    c = Controller.create(tmp_path / "c", Goal.parse(goal_data(goal="a policy that sorts lists of 3 digits", memory=lib)),
                          jobs="process")
    c.node_plan(SwarmState())
    assert c.store.timeline("pilot_run") and not c.store.timeline("plan_from_memory")
    c.knowledge.close()


def test_recall_takes_the_closest_reached_plan_of_another_workspace(tmp_path):
    from swarm.knowledge import Knowledge
    from swarm.plan_memory import recall_plan
    from swarm.workspace import Workspace

    settings = Goal.parse(goal_data(memory={"library": str(tmp_path / "lib"), "backend": "memory"})).memory

    def knowledge(name: str) -> Knowledge:
        if not (tmp_path / name).exists():
            Workspace.init(tmp_path / name, "goal: x\n", {}, {})
        return Knowledge(Workspace.open(tmp_path / name), settings, task="addition")

    def plan_rec(sentence: str, d_model: int) -> dict:
        plan = Goal.parse(goal_data(goal=sentence)).plan().to_json()
        plan["choices"] = [c for c in plan["choices"] if c["field"] != "model.d_model"] + [
            {"field": "model.d_model", "value": d_model, "source": "pilot", "why": "", "evidence": {}}]
        return {"plan": plan}

    for name, sentence, d, reached in (("w1", "a policy that adds 2-digit numbers", 96, True),
                                       ("w2", "a policy that adds 2-digit numbers with >= 90% exact match", 64, True),
                                       ("w3", SENTENCE, 32, False)):
        k = knowledge(name)
        remember_plan(k, plan_rec(sentence, d), {"reached": reached, "worker_cpu_s_to_target": 10.0 if reached else None},
                      100 if reached else None)
        k.close()
    k = knowledge("w4")
    hit = recall_plan(k, Goal.parse(goal_data()))
    assert hit is not None and hit.workspace.startswith("w2-") and hit.fields["model.d_model"] == 64, hit   # closest that reached
    assert hit.steps_to_target == 100 and hit.worker_cpu_s_to_target == 10.0
    k.close()
    k = knowledge("w2")   # its own record is not a past run
    assert recall_plan(k, Goal.parse(goal_data())).workspace.startswith("w1-")
    k.close()


def test_a_remembered_size_the_trainer_refuses_with_the_goals_fields_is_not_used(tmp_path):
    from swarm.plan_memory import MemoryPlan

    goal = Goal.parse(goal_data(run={"model": {"n_heads": 8}}, pilot={"enabled": False}))
    past = MemoryPlan("w-1", "a policy that adds", {"model.d_model": 40, "recipe.lr": 0.01}, 0.1, 100, 10.0)  # head dim 5
    rows: list = []
    rec = plan_run(goal, tmp_path, lambda kind, **d: rows.append((kind, d)), recall=lambda g: past)
    assert [k for k, _ in rows] == ["plan_memory_refused"] and "head dim" in rows[0][1]["reason"]
    assert rec["pilot"] is None and rec["pilot_skipped"].startswith("pilot.enabled is false")
    assert goal.plan().get("model.d_model").source is Source.DEFAULT and goal.plan().get("recipe.lr").source is Source.DEFAULT
    usable = MemoryPlan("w-1", "a policy that adds", {"model.d_model": 64, "recipe.lr": 0.01}, 0.1, 100, 10.0)
    other = Goal.parse(goal_data(run={"model": {"n_heads": 8}}, pilot={"enabled": False}))
    (tmp_path / "x").mkdir()
    plan_run(other, tmp_path / "x", lambda kind, **d: None, recall=lambda g: usable)
    assert other.run_config("x", "/tmp").model.d_model == 64 and other.plan().get("recipe.lr").source is Source.MEMORY
