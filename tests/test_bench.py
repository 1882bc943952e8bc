"""The benchmark suite (swarmbench): calibration cache, the Tune trainable's fault and
override handling, worker-CPU accounting, the resumable runner and a smoke bench.

Real parts throughout: real trainer processes on a tiny 1-digit addition config, real checkpoints,
real child processes for the accounting. The full suite is a benchmark (`swarm bench`), not a test.
The generator's tests are in tests/test_bench_scenarios.py.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from swarmbench import calibrate as cal
from swarmbench.accounting import ProcessMeter, cpu_at, is_trainer
from swarmbench.report import auc
from swarmbench.runner import Bench, BenchConfig, Ledger
from swarmbench.scenarios import write_suite
from swarmbench.tune_methods import BudgetStopper, fired_after_restore, train_segment
from trainer.config import Perturbation
from trainer.perturb import expand

ROOT = pathlib.Path(__file__).resolve().parents[1]

TINY_RUN = {
    "seed": 0, "task": {"name": "addition"},
    "model": {"kind": "builtin", "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 16, "charset": "0123456789+-*=\n "},
    "harness": {"template": "{question}=", "answer": {"stop": "\n", "reverse_digits": True},
                "sampling": {"temperature": 1.0, "max_new_tokens": 3}, "curriculum": {"start": 1}},
    "recipe": {"algorithm": "sft", "lr": 0.01, "schedule": "constant", "warmup_steps": 0, "batch_size": 32,
               "eval_interval": 20, "eval_size": 50},
    "checkpoint": {"interval": 20, "keep_last": 5}, "samples_per_step": 0, "threads": 1,
}


def tiny_goal(perturbations: list[dict] | None = None, threshold: float = 0.3) -> dict:
    g = {"goal": "tiny 1-digit addition", "target": {"metric": "heldout_acc", "op": ">=", "threshold": threshold},
         "run": json.loads(json.dumps(TINY_RUN)), "budget": {"wall_s": 300, "steps": 400, "worker_cpu_s": 300, "llm_usd": 0.0},
         "llm": {"model": None}}
    if perturbations:
        g["perturbations"] = perturbations
    return g


# ---- accounting ---------------------------------------------------------------------------------

BURN = "import time,sys\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass\ntime.sleep(1.5)\n"


def test_process_meter_sums_every_process_of_the_tree(tmp_path):
    # a parent with two CPU-burning children (one of them a grandchild): all three are counted
    script = tmp_path / "tree.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        burn = {BURN!r}
        a = subprocess.Popen([sys.executable, "-c", burn])
        b = subprocess.Popen([sys.executable, "-c", "import subprocess,sys; subprocess.run([sys.executable, '-c', %r])" % burn])
        a.wait(); b.wait()
    """))
    p = subprocess.Popen([sys.executable, str(script)])
    meter = ProcessMeter(p.pid, include_root=True)
    while p.poll() is None:
        meter.poll(time.time())
        time.sleep(0.1)
    burners = [k for k, c in meter.cpu.items() if c >= 0.5]
    assert len(burners) >= 2, meter.cpu
    assert meter.total >= 1.2
    assert meter.timeline[-1][1] == pytest.approx(meter.total)
    assert cpu_at(meter.timeline, meter.timeline[0][0] - 1) == meter.timeline[0][1]
    # the swarm's meter counts trainer processes only
    only = ProcessMeter(p.pid, match=is_trainer)
    only.poll(time.time())
    assert only.total == 0.0


def test_budget_stopper_sums_trials_and_stops_at_budget_or_target():
    s = BudgetStopper(budget=10.0, target=0.9)
    s("a", {"trial_cpu_s": 4.0, "heldout_acc": 0.1})
    s("b", {"trial_cpu_s": 5.0, "heldout_acc": 0.2})
    assert not s.stop_all()
    s("a", {"trial_cpu_s": 6.0, "heldout_acc": 0.3})      # cumulative per trial: 6 + 5 > 10
    assert s.stop_all() and s.hit is None
    s2 = BudgetStopper(budget=10.0, target=0.9)
    s2("a", {"trial_cpu_s": 3.0, "heldout_acc": 0.95})
    assert s2.stop_all() and s2.hit == pytest.approx(3.0)
    assert s2.best == (0.95, "a")


def test_auc_of_best_so_far_curve():
    assert auc([], 10.0) == 0.0
    assert auc([[0.0, 1.0]], 10.0) == pytest.approx(1.0)
    # 0 until cpu 5, then 0.5 (a later lower value does not lower the best so far); points past the budget ignored
    assert auc([[5.0, 0.5], [7.0, 0.1], [20.0, 1.0]], 10.0) == pytest.approx(0.25)


# ---- the Tune trainable -------------------------------------------------------------------------

class Paused(Exception):
    """What Tune does to a function trainable it pauses or stops: the report does not return."""


def _spec(perturbations: list[dict], steps: int = 80) -> dict:
    from swarmbench.methods import trainer_config
    from swarmbench.tune_methods import space_bounds

    g = tiny_goal(perturbations)
    g["budget"]["steps"] = steps
    cfg = trainer_config(g, "/unused", 0, 0.99)
    return {"config": cfg, "seed": 0, "bounds": {k: list(v) for k, v in space_bounds(cfg).items()}, "work": "/unused"}


PARAMS = {"lr": 0.01, "temperature": 1.0, "max_new_tokens": 3, "curriculum_start": 1, "kl_coef": 0.0}


def test_trainable_keeps_the_fault_after_a_restore_and_applies_the_new_values(tmp_path):
    spec = _spec([{"kind": "override", "at_step": 10, "set": {"harness.template": "{question:.1}="}}])
    kept = tmp_path / "kept"
    seen: list[dict] = []

    def report_a(metrics, ck):
        seen.append(metrics)
        if metrics["step"] == 40:
            import shutil

            shutil.copytree(ck, kept)
            raise Paused

    with pytest.raises(Paused):
        train_segment(spec, PARAMS, "trialA", tmp_path / "A", None, report_a)
    assert seen[-1]["live_template"] == "{question:.1}="     # the fault fired at step 10
    assert seen[0]["live_lr"] == pytest.approx(0.01)
    # trial B exploits A's checkpoint with other values: PBT's overrides reach the live config,
    # the template fault stays in force (a "full" fork would have restored the healthy template)
    got: list[dict] = []

    def report_b(metrics, ck):
        got.append(metrics)
        raise Paused

    new = dict(PARAMS, lr=0.0123, max_new_tokens=2)
    with pytest.raises(Paused):
        train_segment(spec, new, "trialB", tmp_path / "B", kept, report_b)
    assert got[0]["step"] == 60                                # continued from step 40
    assert got[0]["live_template"] == "{question:.1}="
    assert got[0]["live_lr"] == pytest.approx(0.0123)
    assert got[0]["live_max_new_tokens"] == 2
    seg_a = json.loads((tmp_path / "A" / "seg000" / "segment.json").read_text())
    seg_b = json.loads((tmp_path / "B" / "seg000" / "segment.json").read_text())
    assert seg_b["donor"] == {"trial_id": "trialA", "segment": 0, "step": 40}
    assert seg_a["cpu_s"] > 0 and seg_b["cpu_s"] > 0


def test_fired_state_after_restore():
    items = [expand(Perturbation(kind="override", at_step=5, set={"recipe.lr": 0.5})),
             expand(Perturbation(kind="kill", at_step=5)), expand(Perturbation(kind="label_noise", at_step=0, fraction=0.3))]
    # state faults follow the checkpoint; a kill that fired in this trial does not fire again
    assert fired_after_restore(items, {0, 2}, set()) == {0, 2}
    assert fired_after_restore(items, set(), {0, 1, 2}) == {1}
    assert fired_after_restore(items, {1}, set()) == {1}


KILL_SCRIPT = """
import json, pathlib, shutil, sys
from swarmbench.tune_methods import train_segment
spec, trial_dir, keep, restore = json.loads(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]), sys.argv[4]
steps = []
def report(m, ck):
    steps.append(m["step"])
    if m["step"] == 20 and not keep.exists():
        shutil.copytree(ck, keep)
params = {"lr": 0.01, "temperature": 1.0, "max_new_tokens": 3, "curriculum_start": 1, "kl_coef": 0.0}
s = train_segment(spec, params, "t0", trial_dir, pathlib.Path(restore) if restore != "-" else None, report)
print(json.dumps({"steps": steps, "status": s["status"]}))
"""


def test_one_shot_kill_does_not_repeat_after_a_restore(tmp_path):
    spec = _spec([{"kind": "kill", "at_step": 30}], steps=60)
    keep = tmp_path / "ck20"
    first = subprocess.run([sys.executable, "-c", KILL_SCRIPT, json.dumps(spec), str(tmp_path / "trial"), str(keep), "-"],
                           capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert first.returncode == -9, first.stderr[-800:]      # SIGKILLed at step 30
    assert keep.exists()
    second = subprocess.run([sys.executable, "-c", KILL_SCRIPT, json.dumps(spec), str(tmp_path / "trial"), str(keep), str(keep)],
                            capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert second.returncode == 0, second.stderr[-800:]     # restored from step 20: step 30 passes without a kill
    out = json.loads(second.stdout.strip().splitlines()[-1])
    assert out["steps"] == [40, 60] and out["status"] == "completed"


# ---- the runner: smoke, calibration cache, resume -------------------------------------------------

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Two tiny scenarios (a broken template from step 0, and no fault) x plain and oracle."""
    base = tmp_path_factory.mktemp("bench")
    suite = base / "suite"
    suite.mkdir()
    broken = tiny_goal([{"kind": "override", "at_step": 0, "set": {"harness.template": "{question:.1}="}}])
    (suite / "a_broken.yaml").write_text(yaml.safe_dump({"scenario": {"name": "a_broken", "faults": [
        {"name": "template", "what": "template cut to 1 char", "at_step": 0, "fix_in_space": "no (template)"}]}, **broken}))
    (suite / "b_healthy.yaml").write_text(yaml.safe_dump(tiny_goal()))
    cfg = BenchConfig(suite=str(suite), methods=["plain", "oracle"], seeds=[0], results=str(base / "results"),
                      cache=str(base / "cache"), src="worktree", workdir=str(base / "work"), command="test",
                      machine_ref=1.0, slots_dir=str(base / "slots"))
    bench = Bench(cfg)
    bench.run()
    return base, cfg, bench


def test_smoke_bench_two_scenarios_two_methods(smoke):
    base, cfg, bench = smoke
    res = json.loads((base / "results" / "suite_suite.json").read_text())
    rows = {(r["scenario"], r["method"]): r for r in res["runs"]}
    assert set(rows) == {("a_broken", "plain"), ("a_broken", "oracle"), ("b_healthy", "plain"), ("b_healthy", "oracle")}
    cls = {s["name"]: s["cls"] for s in res["scenarios"]}
    assert cls == {"a_broken": "failing", "b_healthy": "healthy"}
    a = next(s for s in res["scenarios"] if s["name"] == "a_broken")
    assert a["budget"] == pytest.approx(cal.BUDGET_MULTIPLE * a["healthy_cpu_to_target"], rel=1e-3)
    assert rows[("a_broken", "oracle")]["reached"] and not rows[("a_broken", "plain")]["reached"]
    # plain ran until its steps ended or its worker CPU passed the budget (getrusage of the trainer process)
    p = rows[("a_broken", "plain")]
    assert p["stop"] in ("completed", "budget") and 0 < p["cpu_total"] <= a["budget"] * 1.1
    assert p["curve"] and all(v < 0.3 for _, v in p["curve"])
    md = (base / "results" / "suite_suite.md").read_text()
    assert "| failing | oracle | 1 | 1/1 (100%)" in md and "| failing | plain | 1 | 0/1 (0%)" in md
    assert (base / "results" / "suite_suite_success.svg").exists()


def test_code_state_counts_what_a_run_executes_not_the_runner_or_its_report(tmp_path):
    for f in ("trainer/train.py", "swarm/decisions.py", "swarmbench/methods.py", "swarmbench/runner.py",
              "swarmbench/report.py", "agents/operators.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("x = 1\n")

    def states():
        return cal.code_state(tmp_path, cal.BASELINE_DIRS), cal.code_state(tmp_path, cal.SWARM_DIRS)

    before = states()
    for f in ("swarmbench/runner.py", "swarmbench/report.py"):      # what runs the bench and writes its tables
        (tmp_path / f).write_text("x = 2\n")
        assert states() == before, f
    (tmp_path / "swarm/decisions.py").write_text("x = 2\n")           # the swarm's own code
    after = states()
    assert after[0] == before[0] and after[1] != before[1]
    (tmp_path / "swarmbench/methods.py").write_text("x = 2\n")       # how every method runs
    assert all(a != b for a, b in zip(states(), after))


def test_the_planned_count_takes_only_as_many_uncalibrated_scenarios_as_the_take_counts_need(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    for i in range(6):
        (suite / f"s{i}.yaml").write_text(yaml.safe_dump(tiny_goal(
            [{"kind": "override", "at_step": 10 + i, "set": {"recipe.lr": 0.5}}])))
    cfg = BenchConfig(suite=str(suite), methods=["plain", "oracle"], seeds=[0], results=str(tmp_path / "results"),
                      cache=str(tmp_path / "cache"), src="worktree", workdir=str(tmp_path / "work"), command="test",
                      machine_ref=1.0, slots_dir=str(tmp_path / "slots"), take={"failing": 2, "mild": 1, "healthy": 0})
    bench = Bench(cfg)
    assert bench.planned() == 3 * 2                 # 6 not calibrated, but the counts need only 3

    def calibrated(name: str, cls: str) -> cal.Calibration:
        return cal.Calibration(key=name, scenario=name, target=0.3, healthy_cpu_to_target=1.0, budget=5.0, wall_cap=240.0,
                               cls=cls, seed=0, healthy={}, plain=None, machine_ref_cpu_s=1.0)

    bench.cals["s0"] = calibrated("s0", "failing")
    bench.cals["s1"] = calibrated("s1", "unlearnable")
    assert bench.planned() == 1 * 2 + 2 * 2         # s0's runs; a failing and a mild one still needed
    for name in ("s2", "s3"):
        bench.cals[name] = calibrated(name, "failing")
    bench.cals["s4"] = calibrated("s4", "mild")
    assert bench.planned() == 3 * 2                 # every count met: s5 is left alone, s3 is a third failing


def test_per_origin_takes_the_failing_count_and_the_extra_seeds_in_every_fault_origin(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    origins = ["drift", "drift", "drift", "data", "data", "data"]
    for i, o in enumerate(origins):
        g = tiny_goal([{"kind": "override", "at_step": 10 + i, "set": {"recipe.lr": 0.5}}])
        g["scenario"] = {"name": f"s{i}", "seed": i, "origin": o, "faults": [{"name": "lr", "origin": o}]}
        (suite / f"s{i}.yaml").write_text(yaml.safe_dump(g))
    cfg = BenchConfig(suite=str(suite), methods=["plain"], seeds=[0], more_seeds=[1], more_on=1, results=str(tmp_path / "results"),
                      cache=str(tmp_path / "cache"), src="worktree", workdir=str(tmp_path / "work"), command="test",
                      machine_ref=1.0, slots_dir=str(tmp_path / "slots"), take={"failing": 1, "mild": 0, "healthy": 0},
                      per_origin=True)
    bench = Bench(cfg)
    by = {s.name: s for s in bench.scenarios}
    assert bench.planned() == 2 + 2                 # one failing scenario per origin, each with one extra seed

    def calibrated(name: str, cls: str) -> cal.Calibration:
        return cal.Calibration(key=name, scenario=name, target=0.3, healthy_cpu_to_target=1.0, budget=5.0, wall_cap=240.0,
                               cls=cls, seed=0, healthy={}, plain=None, machine_ref_cpu_s=1.0)

    bench.cals["s0"] = calibrated("s0", "failing")
    bench.cals["s1"] = calibrated("s1", "failing")
    assert bench.admitted(by["s0"]) and not bench.admitted(by["s1"])     # drift has its one
    assert not bench.quotas_full()                                       # data has none yet
    assert bench._origin_full(by["s2"]) and not bench._origin_full(by["s3"])
    bench.cals["s4"] = calibrated("s4", "failing")
    assert bench.quotas_full() and bench.admitted(by["s4"])
    assert [s.name for s in bench.more_seed_scenarios()] == ["s0", "s4"]
    assert [(s.name, seed) for s, _m, seed in bench.plan()] == [("s0", 0), ("s0", 1), ("s4", 0), ("s4", 1)]
    # without --per-origin the count is one failing scenario in all
    bench.cfg.per_origin = False
    assert [s.name for s in bench.more_seed_scenarios()] == ["s0"] and not bench.admitted(by["s4"])


def test_calibration_is_cached_and_invalidated_by_content(smoke):
    base, cfg, bench = smoke
    s = next(x for x in bench.scenarios if x.name == "b_healthy")

    def must_not_run(*a):
        raise AssertionError("calibration ran although it is cached")

    c, cached = cal.calibrate(s.name, s.goal, 0, bench.code["baseline"], pathlib.Path(cfg.cache), must_not_run, has_faults=False)
    assert cached and c.cls == "healthy"

    class Ran(Exception):
        pass

    def ran(*a):
        raise Ran

    changed = json.loads(json.dumps(s.goal))
    changed["run"]["recipe"]["lr"] = 0.02
    with pytest.raises(Ran):          # another scenario content: recalibrated
        cal.calibrate(s.name, changed, 0, bench.code["baseline"], pathlib.Path(cfg.cache), ran, has_faults=False)
    with pytest.raises(Ran):          # another trainer code state: recalibrated
        cal.calibrate(s.name, s.goal, 0, "other-code", pathlib.Path(cfg.cache), ran, has_faults=False)


class CountingBench(Bench):
    """Counts the runs it starts; `interrupt_after` raises KeyboardInterrupt (a Ctrl-C) at the start
    of the run after that many."""

    def __init__(self, cfg, interrupt_after=None):
        super().__init__(cfg)
        self.spawned: list[tuple[str, str, int]] = []
        self.interrupt_after = interrupt_after

    def _spawn(self, label, method, goal, seed, *a):
        if self.interrupt_after is not None and len(self.spawned) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.spawned.append((label["scenario"], method, seed))
        return super()._spawn(label, method, goal, seed, *a)


def test_interrupted_bench_resumes_without_redoing_finished_runs(smoke):
    base, cfg, _ = smoke
    import dataclasses

    more = dataclasses.replace(cfg, methods=["plain"], seeds=[0, 1])
    b1 = CountingBench(more, interrupt_after=1)
    with pytest.raises(KeyboardInterrupt):
        b1.run()
    assert b1.spawned == [("a_broken", "plain", 1)]            # calibrations were cached; one run finished
    lines = b1.ledger.path.read_text().splitlines()
    with open(b1.ledger.path, "a") as f:
        f.write(lines[-1][: len(lines[-1]) // 2])               # a line cut by the interruption is ignored
    b2 = CountingBench(more)
    b2.run()
    assert b2.spawned == [("b_healthy", "plain", 1)]           # only the run that had not finished
    b3 = CountingBench(more)
    b3.run()
    assert b3.spawned == []
    assert len(b3.current_rows()) == 4


@pytest.mark.slow
@pytest.mark.ray
def test_real_ray_tune_pbt_on_a_tiny_faulted_scenario(tmp_path):
    """Real Ray Tune PBT (population 4) around the trainer, the template fault in force: it runs to
    its budget or the target, every trial's CPU is counted, and no trial errored."""
    from swarmbench.tune_methods import run_tune

    g = tiny_goal([{"kind": "override", "at_step": 20, "set": {"harness.template": "{question:.1}="}}])
    r = run_tune("pbt", g, 0, 0.3, 25.0, 300, tmp_path)
    assert r["rc"] == 0 and not r["trial_errors"], r
    assert r["trials"] == 4
    assert 0 < r["cpu_total"] <= 25.0 * 1.5
    segs = [json.loads(p.read_text()) for p in (tmp_path / "trials").glob("*/seg*/segment.json")]
    assert sum(s["cpu_s"] for s in segs) == pytest.approx(r["cpu_total"], rel=0.05)
    assert not r["reached"] or r["cpu_to_target"] <= 25.0


def test_report_only_rewrites_the_results_without_running(smoke):
    from swarmbench.cli import main as bench_main

    base, cfg, _ = smoke
    md = base / "results" / "suite_suite.md"
    md.unlink()
    rc = bench_main([cfg.suite, "--methods", "plain", "oracle", "--results", cfg.results, "--cache", cfg.cache,
                     "--workdir", str(base / "w-report"), "--report-only"])
    assert rc == 0
    assert "**Progress: 4 of 4 planned runs finished**" in md.read_text()


def test_two_benches_on_one_ledger_each_keep_their_part_of_the_session(tmp_path):
    """The baselines' bench and the swarm's (--calibrated-only, at another commit) write into one
    ledger: each records its own command and code state, and the report of both uses each one's."""
    import dataclasses

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "a.yaml").write_text(yaml.safe_dump(tiny_goal()))
    base = BenchConfig(suite=str(suite), methods=["plain", "oracle"], seeds=[0], results=str(tmp_path / "results"),
                       cache=str(tmp_path / "cache"), src="worktree", workdir=str(tmp_path / "work"),
                       command="swarm bench s --methods plain oracle", machine_ref=1.0, slots_dir=str(tmp_path / "slots"))
    b = Bench(base)
    b.save_session()
    sw = Bench(dataclasses.replace(base, methods=["swarm"], command="swarm bench s --methods swarm --calibrated-only"))
    sw.code["swarm"] = "swarm-at-other-commit"        # as a snapshot of another commit would give
    sw.src_desc = "snapshot of git commit 0123456789"
    sw.save_session()
    b.save_session()                                   # the baselines' bench again (resumed): the swarm's part stays

    report = Bench(dataclasses.replace(base, methods=["plain", "oracle", "swarm"], command="report"))
    report.adopt_session()
    assert report.code == {"baseline": b.code["baseline"], "swarm": "swarm-at-other-commit"}
    assert report.cfg.command == ["swarm bench s --methods plain oracle", "swarm bench s --methods swarm --calibrated-only"]
    assert "snapshot of git commit 0123456789 (the swarm)" in report.src_desc
    # PBT measured later at the baselines' code state: both baseline commands stay on record
    pbt = Bench(dataclasses.replace(base, methods=["pbt"], command="swarm bench s --methods pbt --calibrated-only"))
    pbt.save_session()
    report.adopt_session()
    assert report.cfg.command == ["swarm bench s --methods plain oracle", "swarm bench s --methods pbt --calibrated-only",
                                  "swarm bench s --methods swarm --calibrated-only"]
    # a bench of another code state replaces the part's commands
    other = Bench(dataclasses.replace(base, methods=["plain"], command="swarm bench s --methods plain --src x"))
    other.code["baseline"] = "baseline-at-other-commit"
    other.save_session()
    report.adopt_session()
    assert report.code["baseline"] == "baseline-at-other-commit"
    assert report.cfg.command == ["swarm bench s --methods plain --src x", "swarm bench s --methods swarm --calibrated-only"]
    # a session file of one bench (both parts from it) still reads
    (tmp_path / "results" / "suite_suite" / "session.json").write_text(json.dumps(
        {"command": "old", "src": "snapshot of git HEAD abc", "code": {"baseline": "b0", "swarm": "s0"}}))
    old = Bench(dataclasses.replace(base, methods=["plain", "swarm"], command="report"))
    old.adopt_session()
    assert old.code == {"baseline": "b0", "swarm": "s0"} and old.cfg.command == "old"


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from swarmbench.cli import main as bench_main

    assert bench_main([str(tmp_path / "missing")]) == 2
    assert "SUITE=" in capsys.readouterr().err
    write_suite(tmp_path / "s", [1])
    assert bench_main([str(tmp_path / "s"), "--parallel", "0", "--src", "worktree", "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "--parallel=0" in err and len(err.strip().splitlines()) == 1
    assert bench_main([str(tmp_path / "s"), "--src", "no-such-commit", "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "--src='no-such-commit'" in err and "a commit of this repository" in err


def test_src_commit_snapshots_that_commit_whatever_head_is(tmp_path):
    from swarmbench.runner import ROOT, prepare_src, resolve

    head = resolve("HEAD")
    if head is None or resolve("HEAD~1") is None:
        pytest.skip("needs a git checkout with history")
    parent = resolve("HEAD~1")
    src, desc = prepare_src(parent, tmp_path)
    assert src == tmp_path / f"src-{parent[:10]}" and desc == f"snapshot of git commit {parent[:10]}"
    # the snapshot holds the commit's files, not the working tree's
    tracked = subprocess.run(["git", "ls-tree", "-r", "--name-only", parent], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    some = next(f for f in tracked if f.endswith(".py"))
    committed = subprocess.run(["git", "show", f"{parent}:{some}"], cwd=ROOT, capture_output=True, check=True).stdout
    assert (src / some).read_bytes() == committed and len(list(src.rglob("*.py"))) == sum(f.endswith(".py") for f in tracked)
    assert prepare_src("head", tmp_path) == (tmp_path / f"src-{head[:10]}", f"snapshot of git HEAD {head[:10]}")


def test_take_runs_the_first_scenarios_of_each_class_and_leaves_the_rest(smoke, tmp_path):
    """--take failing=1 healthy=0: the failing scenario runs; the healthy one (known healthy before
    calibration: no fault) is neither calibrated nor run once its class has its count."""
    base, cfg, _ = smoke
    import dataclasses

    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("a_broken.yaml", "b_healthy.yaml"):
        (suite / name).write_text((pathlib.Path(cfg.suite) / name).read_text())
    (suite / "c_healthy.yaml").write_text((pathlib.Path(cfg.suite) / "b_healthy.yaml").read_text().replace("tiny 1-digit", "tiny one-digit"))
    take = dataclasses.replace(cfg, suite=str(suite), methods=["plain"], take={"failing": 1, "mild": 0, "healthy": 1},
                               name="take")
    b = CountingBench(take)
    b.run()
    # calibrations of a_broken and b_healthy are cached from the smoke bench; c_healthy is skipped
    assert b.spawned == []
    assert set(b.cals) == {"a_broken", "b_healthy"} and b.quotas_full()
    assert [s.name for s, _, _ in b.plan()] == ["a_broken", "b_healthy"]
    res = json.loads((base / "results" / "take.json").read_text())
    assert {s["name"] for s in res["scenarios"]} == {"a_broken", "b_healthy"}
    with pytest.raises(ValueError, match="--take"):
        dataclasses.replace(cfg, take={"sick": 2}).check()


def test_a_scenario_that_runs_what_an_earlier_one_runs_is_left_out_as_a_duplicate(smoke, tmp_path):
    base, cfg, _ = smoke
    import dataclasses

    suite = tmp_path / "dup"
    suite.mkdir()
    text = (pathlib.Path(cfg.suite) / "b_healthy.yaml").read_text()
    (suite / "b1.yaml").write_text(text)
    (suite / "b2.yaml").write_text(text)           # same goal under another name
    b = CountingBench(dataclasses.replace(cfg, suite=str(suite), methods=["plain"], name="dup"))
    b.run()
    assert b.duplicates == {"b2": "b1"} and b.spawned == []     # b1's calibration is cached; b2 never runs
    assert [s.name for s, _, _ in b.plan()] == ["b1"]
    res = json.loads((base / "results" / "dup.json").read_text())
    assert [s["name"] for s in res["scenarios"]] == ["b1"]
    assert "b2 (= b1)" in (base / "results" / "dup.md").read_text()


def test_extra_seeds_run_only_the_more_methods_right_after_the_scenarios_base_seeds(smoke):
    base, cfg, _ = smoke
    import dataclasses

    b = CountingBench(dataclasses.replace(cfg, methods=["plain", "oracle"], seeds=[0], more_seeds=[3], more_on=1,
                                          more_methods=["oracle"], name="more"))
    b.run()
    assert b.spawned == [("a_broken", "oracle", 3)]       # plain's extra seed is not run; b_healthy is not failing
    assert ("a_broken", "oracle", 3) in {(s.name, m, seed) for s, m, seed in b.plan()}
    with pytest.raises(ValueError, match="--more-methods"):
        dataclasses.replace(cfg, more_methods=["sgd"]).check()


def test_calibrated_only_runs_the_scenarios_in_the_cache_and_calibrates_none(smoke, tmp_path):
    base, cfg, _ = smoke
    import dataclasses

    suite = tmp_path / "co"
    suite.mkdir()
    (suite / "a_broken.yaml").write_text((pathlib.Path(cfg.suite) / "a_broken.yaml").read_text())
    (suite / "z_new.yaml").write_text(yaml.safe_dump(tiny_goal(threshold=0.31)))     # never calibrated
    b = CountingBench(dataclasses.replace(cfg, suite=str(suite), methods=["plain", "oracle"], seeds=[0, 4],
                                          calibrated_only=True, name="co"))
    b.run()
    assert sorted(b.spawned) == [("a_broken", "oracle", 4), ("a_broken", "plain", 4)]
    assert "z_new" not in b.cals and {s.name for s, _, _ in b.plan()} == {"a_broken"}


def test_a_run_starts_in_an_empty_folder_even_where_an_earlier_sitting_left_one(smoke):
    """Run folders are numbered per sitting; one left by an earlier sitting under the same name (a
    finished `swarm run` workspace, say) must not be read back as this run's result."""
    base, cfg, _ = smoke
    import dataclasses

    stale = pathlib.Path(cfg.workdir) / "runs" / "00001-a_broken-plain-s7"
    (stale / "work").mkdir(parents=True, exist_ok=True)
    (stale / "work" / "left-over.txt").write_text("an earlier sitting's run")
    b = CountingBench(dataclasses.replace(cfg, methods=["plain"], seeds=[7], name="stale"))
    b.run()
    assert ("a_broken", "plain", 7) in b.spawned
    assert not (stale / "work" / "left-over.txt").exists() and (stale / "result.json").exists()


# ---- the machine: its reference workload, its cores ------------------------------------------------

def test_the_reference_workload_runs_the_trainer_and_gives_its_worker_cpu(tmp_path):
    from swarmbench import machine

    short = machine.measure(tmp_path / "a", runs=1, steps=3)
    longer = machine.measure(tmp_path / "b", runs=1, steps=40)
    assert 0 < short < longer                      # real trainer CPU: more steps cost more


def test_the_progress_log_names_the_runs_waiting_for_cores(capsys):
    import threading
    import types

    from swarmbench.runner import log_display

    b = types.SimpleNamespace(lock=threading.Lock(), current_rows=lambda: [1, 2], planned=lambda: 10,
                              running={1: {"scenario": "g1", "method": "plain", "seed": 0}},
                              waiting={2: {"scenario": "g2", "method": "pbt", "seed": 0}})
    show = log_display()
    show(b)
    show(b)                                   # nothing changed: no new line
    b.waiting.clear()
    show(b)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "2/~10 finished; running: g1/plain/s0; waiting for cores: g2/pbt/s0" in lines[0]
    assert lines[1].endswith("running: g1/plain/s0")


def test_a_run_that_sleeps_through_its_wall_cap_lends_its_core_and_a_busy_one_keeps_it(tmp_path):
    """A stall at least as long as the wall cap: once the run's processes sleep, its slot goes to the
    next run (a real second holder gets it), and the CPU its processes used after that is recorded
    (here ~0: they slept on). A run that keeps computing keeps its slot."""
    import threading

    from swarmbench.machine import CoreSlots
    from swarmbench.runner import lend_when_asleep, sleeps_through

    stall = {"perturbations": [{"kind": "stall", "at_step": 20, "seconds": 900.0}]}
    assert sleeps_through(stall, 600.0) and not sleeps_through(stall, 1200.0)
    assert not sleeps_through({"perturbations": [{"shortcut": "hang", "at_step": 5}]}, 240.0)   # 60 s: wakes first
    assert not sleeps_through({"perturbations": [{"kind": "kill", "at_step": 5}]}, 240.0) and not sleeps_through({}, 1.0)

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {busy}: pass\ntime.sleep(60)"
    slots = CoreSlots(1, tmp_path / "slots", poll_s=0.05)

    def run(busy: float, wait_s: float) -> tuple[dict, bool]:
        child = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {burn.format(busy=busy)!r}]).wait()"
        with slots.hold(1) as lease:
            proc = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
            lent: dict = {}
            threading.Thread(target=lend_when_asleep, args=(proc, lease, lent, 0.2, 1.0), daemon=True).start()
            got = threading.Event()

            def other():
                with slots.hold(1):
                    got.set()
            threading.Thread(target=other, daemon=True).start()
            got.wait(wait_s)
            proc.kill()
            subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)])
            proc.wait()
            time.sleep(0.5)        # the lender's last poll
            return dict(lent), got.is_set()

    lent, other_ran = run(busy=1.5, wait_s=15.0)
    assert other_ran and lent["after_s"] >= 1.0 and lent.get("cpu_while_lent", 0.0) < 0.3, lent
    lent, other_ran = run(busy=60.0, wait_s=4.0)
    assert not other_ran and lent == {}
    # busy processes that end and are replaced by others (Tune's trials): their CPU still counts
    replaced = ("import subprocess, sys\nfor _ in range(8): subprocess.run([sys.executable, '-c', "
                "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.7: pass'])\n"
                "import time; time.sleep(60)")
    with slots.hold(1) as lease:
        proc = subprocess.Popen([sys.executable, "-c", replaced], start_new_session=True)
        lent = {}
        threading.Thread(target=lend_when_asleep, args=(proc, lease, lent, 0.2, 1.0), daemon=True).start()
        time.sleep(4.0)
        assert lease.released_at is None, lent              # 4 s of short-lived busy processes: not idle
        deadline = time.time() + 15
        while lease.released_at is None and time.time() < deadline:
            time.sleep(0.2)
        proc.kill()
        proc.wait()
    assert lent["after_s"] >= 4.0 and lent.get("cpu_while_lent", 0.0) >= 0.0, lent


def test_core_slots_never_hold_more_than_the_cores_across_holders(tmp_path):
    """Two holders of the same folder (as two bench processes would be) and runs needing 1 or 2 of
    2 cores: at no moment are more than 2 held, and every run gets its turn."""
    import threading
    import time as _time

    from swarmbench import machine

    slots = [machine.CoreSlots(2, tmp_path, poll_s=0.01), machine.CoreSlots(2, tmp_path, poll_s=0.01)]
    busy, peak, done, lock = [0], [0], [], threading.Lock()

    def run(i, k):
        with slots[i % 2].hold(k):
            with lock:
                busy[0] += k
                peak[0] = max(peak[0], busy[0])
            _time.sleep(0.05)
            with lock:
                busy[0] -= k
        done.append(i)

    ts = [threading.Thread(target=run, args=(i, 1 + i % 2)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    assert sorted(done) == list(range(8)) and peak[0] == 2
    # a waiter for both cores is served before later waiters for one, though one core keeps freeing up
    order = []

    def single(i):
        with slots[0].hold(1):
            order.append(f"one{i}")
            _time.sleep(0.08)

    def both():
        with slots[1].hold(2):
            order.append("both")

    first = threading.Thread(target=single, args=(0,))
    first.start()
    _time.sleep(0.02)
    waiters = [threading.Thread(target=both)] + [threading.Thread(target=single, args=(i,)) for i in (1, 2, 3)]
    for t in waiters:
        t.start()
        _time.sleep(0.02)
    for t in [first, *waiters]:
        t.join(20)
    assert order[:2] == ["one0", "both"], order
    with slots[0].hold(5):                          # more than the machine has: all of them
        with pytest.raises(KeyboardInterrupt):      # ... and a waiter told to stop gives up
            with slots[1].hold(1, stop=lambda: True):
                pass


def test_a_calibration_from_another_machine_scales_the_budget_and_the_results(smoke):
    """The smoke bench's machine reference is 1.0 CPU-s. In another sitting whose reference is twice
    as slow (2.0), with no run repeated between the two, a run gets twice the budget and wall cap,
    and the results state its CPU in the reporting sitting's machine's CPU-s: measured on the slow
    one and reported from the fast one, it counts half."""
    base, cfg, _ = smoke
    import dataclasses

    slow = CountingBench(dataclasses.replace(cfg, methods=["plain"], seeds=[11], name="slow", machine_ref=2.0,
                                             sitting="boot:slow"))
    budgets = []
    orig = slow._spawn

    def spy(label, method, goal, seed, target, budget, wall_cap):
        budgets.append((budget, wall_cap))
        return orig(label, method, goal, seed, target, budget, wall_cap)

    slow._spawn = spy
    slow.run()
    c = slow.cals["a_broken"]
    assert c.machine_ref_cpu_s == 1.0
    assert (c.budget * 2, c.wall_cap * 2) == pytest.approx(budgets[0], rel=1e-3)
    measured = slow.ledger.get(Ledger.key(slow.scenarios[0].content_hash, "plain", 11, slow.code["baseline"]))
    assert measured["machine_ref_cpu_s"] == 2.0
    fast = Bench(dataclasses.replace(cfg, methods=["plain"], seeds=[11], name="slow", machine_ref=1.0))
    fast.load_cached_calibrations()
    row = next(r for r in fast.current_rows() if r["scenario"] == "a_broken")
    assert row["cpu_total"] == pytest.approx(measured["cpu_total"] / 2) and row["budget"] == pytest.approx(c.budget)
    assert row["curve"][-1][0] == pytest.approx(measured["curve"][-1][0] / 2)


def test_swarm_vs_train_never_reads_an_earlier_runs_folder_as_its_own(tmp_path):
    """benchmarks/swarm_vs_train.py run again on a work dir: the earlier run's folder (its workspace,
    which makes `swarm run` refuse, and its summary) is moved aside and kept, never read as the
    new run's."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("svt", pathlib.Path(__file__).parents[1] / "benchmarks" / "swarm_vs_train.py")
    svt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(svt)
    d = tmp_path / "swarm-truncation-s0"
    (d / "ws" / ".swarm").mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"reached": True}))
    assert svt.fresh_dir(d) == d and list(d.iterdir()) == []
    assert json.loads((tmp_path / "swarm-truncation-s0.prev-1" / "summary.json").read_text()) == {"reached": True}
    svt.fresh_dir(d)
    assert (tmp_path / "swarm-truncation-s0.prev-2").is_dir() and list(d.iterdir()) == []
