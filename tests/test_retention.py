"""Retention of backtest checkpoints, pre-apply checkpoints and backtest arm folders
(swarm/retention.py): the pure policy over the ledger, and its enforcement on real files.

    .venv/bin/python -m pytest tests/test_retention.py -q
"""
from __future__ import annotations

import json
import time

import pytest

from agents.domain import Diagnosis, Intervention, InterventionKind, Status
from swarm.retention import enforce_retention, plan_retention

PATHS = {
    Status.PROPOSED: [],
    Status.BACKTESTING: [Status.BACKTESTING],
    Status.REJECTED: [Status.BACKTESTING, Status.REJECTED],
    Status.VALIDATED: [Status.BACKTESTING, Status.VALIDATED],
    Status.APPLIED: [Status.BACKTESTING, Status.VALIDATED, Status.APPLIED],
    Status.EVALUATING: [Status.BACKTESTING, Status.VALIDATED, Status.APPLIED, Status.EVALUATING],
    Status.KEPT: [Status.BACKTESTING, Status.VALIDATED, Status.APPLIED, Status.EVALUATING, Status.KEPT],
    Status.ROLLED_BACK: [Status.BACKTESTING, Status.VALIDATED, Status.APPLIED, Status.EVALUATING, Status.ROLLED_BACK],
}


def iv(status: Status, kind: InterventionKind = InterventionKind.RECIPE_EDIT, created: float | None = None,
       rollback_to: str | None = None) -> Intervention:
    ev = {"rollback_to": rollback_to} if rollback_to else {}
    x = Intervention(kind=kind, changes={"recipe.lr": 0.001} if kind != InterventionKind.ROLLBACK else {},
                     diagnosis=Diagnosis(name="plateau", summary="flat", operator="diagnostics", policy="builtin", evidence=ev),
                     rationale="r", operator="diagnostics", policy="builtin")
    for st in PATHS[status]:
        x.move(st)
    x.created = created if created is not None else time.time()
    return x


def arms(i: Intervention, label: str = "") -> list[str]:
    return [f"bt-{i.id}{label}-{arm}-s{s}" for arm in ("candidate", "control") for s in (0, 1)]


def test_backtest_forks_and_arms_go_once_decided_and_metered():
    testing, rejected, validated = iv(Status.BACKTESTING), iv(Status.REJECTED), iv(Status.VALIDATED)
    names = [f"bt-{x.id}" for x in (testing, rejected, validated)] + ["step_0000100", "init", "bt-ffffffff"]
    all_arms = arms(testing) + arms(rejected) + arms(rejected, "-x4") + arms(validated)
    unmetered = arms(validated)[0]
    plan = plan_retention([testing, rejected, validated], names, all_arms + ["bt-zzz-control-s0"],
                          metered_arms=set(all_arms) - {unmetered})
    assert plan.checkpoints == {f"bt-{rejected.id}", f"bt-{validated.id}"}   # periodic and unknown names stay
    # a second, longer backtest's arms (label -x4) go with the first's; an arm the CPU meter has not
    # read since it finished stays until it has
    # a validated change's candidate arms stay until it is applied (applying it may adopt one's state)
    controls = [a for a in arms(validated) if "-control-" in a]
    assert plan.arms == set(arms(rejected) + arms(rejected, "-x4") + controls)
    assert "rejected" in plan.why[f"bt-{rejected.id}"]
    applied = iv(Status.APPLIED)
    plan = plan_retention([applied], [f"adopt-{applied.id}"], arms(applied), metered_arms=set(arms(applied)))
    assert plan.arms == set(arms(applied)) and not plan.checkpoints   # the adopted state: undoable still


def test_an_adopted_arms_checkpoint_goes_as_a_pre_apply_one_does():
    kept, done = iv(Status.KEPT), iv(Status.ROLLED_BACK)
    plan = plan_retention([kept, done], [f"adopt-{kept.id}", f"adopt-{done.id}"], [], keep_kept=1)
    assert plan.checkpoints == {f"adopt-{done.id}"}
    assert plan.why[f"adopt-{done.id}"] == f"adopted arm checkpoint of {done.id}, rolled_back"


def test_pre_apply_checkpoints_stay_while_undoable_and_for_the_newest_kept():
    t0 = time.time()
    kept = [iv(Status.KEPT, created=t0 + i) for i in range(5)]
    evaluating, applied, rolled, refused = iv(Status.EVALUATING), iv(Status.APPLIED), iv(Status.ROLLED_BACK), iv(Status.REJECTED)
    ledger = kept + [evaluating, applied, rolled, refused]
    names = [f"pre-{x.id}" for x in ledger]
    plan = plan_retention(ledger, names, [], keep_kept=2)
    assert plan.checkpoints == {f"pre-{x.id}" for x in kept[:3] + [rolled, refused]}
    assert plan_retention(ledger, names, [], keep_kept=0).checkpoints == {f"pre-{x.id}" for x in kept + [rolled, refused]}
    with pytest.raises(ValueError, match="keep_kept=-1"):
        plan_retention(ledger, names, [], keep_kept=-1)


def test_a_pending_rollback_keeps_every_pre_apply_checkpoint_and_the_one_it_names():
    old = iv(Status.ROLLED_BACK)
    other = iv(Status.KEPT)
    rb = iv(Status.VALIDATED, kind=InterventionKind.ROLLBACK, rollback_to=f"bt-{other.id}")
    names = [f"pre-{old.id}", f"pre-{other.id}", f"bt-{other.id}"]
    # its target is chosen again when applied: nothing it could choose may go meanwhile
    assert plan_retention([old, other, rb], names, [], keep_kept=0).checkpoints == set()
    rb.move(Status.APPLIED)
    assert plan_retention([old, other, rb], names, [], keep_kept=0).checkpoints == set(names)


def _ckpt(d, name: str, step: int) -> None:
    (d / f"{name}.pt").write_bytes(b"x" * 1000)
    (d / f"{name}.json").write_text(json.dumps({"name": name, "step": step, "kind": "named", "time": time.time()}))


def test_enforce_deletes_files_and_folders_on_disk(tmp_path):
    run, bts, cfgs = tmp_path / "runs" / "train", tmp_path / "backtests", tmp_path / "private" / "backtests"
    (run / "checkpoints").mkdir(parents=True)
    cfgs.mkdir(parents=True)
    done, live = iv(Status.REJECTED), iv(Status.BACKTESTING)
    for x in (done, live):
        _ckpt(run / "checkpoints", f"bt-{x.id}", 10)
        for a in arms(x):
            (bts / a).mkdir(parents=True)
            (bts / a / "metrics.jsonl").write_text("{}\n")
            (bts / a / "heartbeat.json").write_text(json.dumps({"pid": 42, "cpu_s": 3.5, "state": "completed"}))
            (cfgs / f"{a}.yaml").write_text("x: 1\n")
    _ckpt(run / "checkpoints", "step_0000010", 10)
    cpu = {f"{bts / a}:42": 3.5 for a in arms(done)[1:]}      # the first arm's final reading not yet metered
    plan = enforce_retention(run, bts, cfgs, [done, live], cpu)
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert left == sorted([f"bt-{live.id}.json", f"bt-{live.id}.pt", "step_0000010.json", "step_0000010.pt"])
    assert sorted(p.name for p in bts.iterdir()) == sorted(arms(live) + arms(done)[:1])
    assert sorted(p.name for p in cfgs.iterdir()) == sorted(f"{a}.yaml" for a in arms(live) + arms(done)[:1])
    assert plan.arms == set(arms(done)[1:])
    cpu[f"{bts / arms(done)[0]}:42"] = 3.5                     # metered on a later tick: then it goes
    enforce_retention(run, bts, cfgs, [done, live], cpu)
    assert sorted(p.name for p in bts.iterdir()) == sorted(arms(live))
    assert enforce_retention(run, bts, cfgs, [done, live], cpu).empty     # idempotent


def test_deleted_arms_fold_into_one_meter_entry_keeping_the_total(tmp_path):
    from swarm.jobs import CpuMeter
    from swarm.retention import RETIRED_CPU, fold_cpu

    bts = tmp_path / "backtests"
    cpu = {f"{tmp_path}/runs/train:11": 50.0, f"{bts}/bt-aaaaaaaa-candidate-s0:12": 3.0,
           f"{bts}/bt-aaaaaaaa-control-s0:13": 4.0, f"{bts}/bt-bbbbbbbb-control-s0:14": 5.0, RETIRED_CPU: 1.0}
    out = fold_cpu(cpu, bts, ["bt-aaaaaaaa-candidate-s0", "bt-aaaaaaaa-control-s0"])
    assert out == {f"{tmp_path}/runs/train:11": 50.0, f"{bts}/bt-bbbbbbbb-control-s0:14": 5.0, RETIRED_CPU: 8.0}
    assert CpuMeter(out).total == CpuMeter(cpu).total == 63.0
    assert fold_cpu(cpu, bts, []) == cpu
