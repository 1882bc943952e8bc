"""Retention of what the swarm writes per intervention: backtest checkpoints (`bt-<id>`), the
checkpoints taken before applying (`pre-<id>`) and the backtest arm folders and job configs.

    plan = plan_retention(interventions, checkpoints=["bt-ab12cd34", "pre-ab12cd34", "step_0000500"],
                          arms=["bt-ab12cd34-candidate-s0"], metered_arms={"bt-ab12cd34-candidate-s0"})
    plan.checkpoints, plan.arms        # what may be deleted, with plan.why[name] saying why
    plan = enforce_retention(run_dir, backtests_dir, config_dir, store.list(), cpu_state)   # the controller's call
    cpu_state = fold_cpu(cpu_state, backtests_dir, plan.arms)   # the meter forgets them, keeping their total

Without retention each intervention leaves two model-sized checkpoints and one run folder per
backtest arm on disk for the rest of the run (for a 0.8M-parameter model ~8 MB + ~16 MB each), so a
run of days fills the disk. `plan_retention` is the policy, a pure function of the ledger and the
names on disk; `enforce_retention` gathers those names, applies the plan and returns it.

What is kept (everything else named `bt-<id>…`/`pre-<id>` of a known intervention goes):
- `bt-<id>` and the arms `bt-<id>…-<arm>-s<seed>` while the intervention is proposed or being
  backtested (the arms fork from it; a restarted controller reuses arms that finished), and its
  candidate arms until it is applied (applying it may adopt one's state: `swarm.backtest.adoptable`);
- an arm folder until the CPU meter has recorded its final reading (the worker-CPU budget counts
  it), i.e. until `metered_arms` names it;
- `pre-<id>` (and `adopt-<id>`, the arm state it was applied by) while the intervention can still be undone by the swarm (applied, evaluating) and
  for the newest `keep_kept` kept ones (a human's `swarm rollback ID` restores the run from it);
- every `pre-` checkpoint while a rollback is pending (proposed … awaiting approval): the
  checkpoint it rolls back to is chosen again when it is applied and must be the one its
  backtest saw; and any checkpoint a pending rollback names.
Names that belong to no intervention in the ledger are never deleted (nothing here made them).
Periodic checkpoints are the trainer's own retention (`checkpoint.keep_last`).
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from agents.domain import Intervention, InterventionKind, Status

KEEP_KEPT = 3     # kept interventions whose pre-apply checkpoint stays for a human rollback
_NAME = re.compile(r"^(bt|pre|adopt)-([0-9a-f]{8})$")
_ARM = re.compile(r"^bt-([0-9a-f]{8})(?:-.+)?-(candidate|control)-s\d+$")
BACKTESTING = (Status.PROPOSED, Status.BACKTESTING)
UNDOABLE = (Status.APPLIED, Status.EVALUATING)
PENDING = (Status.PROPOSED, Status.BACKTESTING, Status.VALIDATED, Status.AWAITING_APPROVAL)


@dataclasses.dataclass(frozen=True)
class RetentionPlan:
    checkpoints: frozenset[str]        # checkpoint names (`<name>.pt` + `<name>.json`) to delete
    arms: frozenset[str]               # arm names (folder + `<name>.yaml` config) to delete
    why: Mapping[str, str]             # name -> the reason it may go

    @property
    def empty(self) -> bool:
        return not self.checkpoints and not self.arms


def plan_retention(interventions: Sequence[Intervention], checkpoints: Iterable[str], arms: Iterable[str],
                   metered_arms: Iterable[str] = (), keep_kept: int = KEEP_KEPT) -> RetentionPlan:
    """What may be deleted (see the module docstring). `checkpoints`: checkpoint names in the live
    run's checkpoints folder; `arms`: arm names in the backtests folder; `metered_arms`: the arms
    whose final CPU reading the meter holds."""
    if keep_kept < 0:
        raise ValueError(f"keep_kept={keep_kept} must be >= 0")
    by_id = {iv.id: iv for iv in interventions}
    kept = sorted((iv for iv in interventions if iv.status == Status.KEPT), key=lambda iv: iv.created)
    recent_kept = {iv.id for iv in kept[len(kept) - keep_kept:]} if keep_kept else set()
    pending_rb = [iv for iv in interventions if iv.kind == InterventionKind.ROLLBACK and iv.status in PENDING]
    named = {n for iv in pending_rb if isinstance(n := iv.diagnosis.evidence.get("rollback_to"), str)}
    metered = set(metered_arms)
    del_ck: set[str] = set()
    del_arms: set[str] = set()
    why: dict[str, str] = {}
    for name in checkpoints:
        m = _NAME.match(name)
        iv = by_id.get(m.group(2)) if m else None
        if iv is None or name in named:
            continue
        if m.group(1) == "bt":
            if iv.status not in BACKTESTING:
                del_ck.add(name)
                why[name] = f"backtest fork of {iv.id}, which is {iv.status.value}"
            continue
        if iv.status in UNDOABLE or iv.id in recent_kept or pending_rb:
            continue
        if iv.status in (Status.KEPT, Status.ROLLED_BACK, Status.REJECTED):
            del_ck.add(name)
            why[name] = (f"{'pre-apply' if m.group(1) == 'pre' else 'adopted arm'} checkpoint of {iv.id}, {iv.status.value}"
                         + (f" (older than the newest {keep_kept} kept)" if iv.status == Status.KEPT else ""))
    for name in arms:
        m = _ARM.match(name)
        iv = by_id.get(m.group(1)) if m else None
        if iv is None or iv.status in BACKTESTING or name not in metered:
            continue
        if m.group(2) == "candidate" and iv.status in PENDING:
            continue     # applying it may adopt the arm's state (swarm.backtest.adoptable)
        del_arms.add(name)
        why[name] = f"backtest arm of {iv.id}, which is {iv.status.value}"
    return RetentionPlan(frozenset(del_ck), frozenset(del_arms), why)


def metered(arm_dirs: Iterable[pathlib.Path], cpu_state: Mapping[str, float]) -> set[str]:
    """Names of the arm folders whose heartbeat's CPU reading the meter state (`CpuMeter.state()`:
    `"<run_dir>:<pid>" -> cpu_s`) already holds; an arm with no heartbeat has nothing to meter."""
    from trainer.runlog import read_heartbeat

    out = set()
    for d in arm_dirs:
        hb = read_heartbeat(d)
        if not hb or "cpu_s" not in hb:
            out.add(d.name)
            continue
        if cpu_state.get(f"{d}:{hb.get('pid')}", -1.0) >= float(hb["cpu_s"]):
            out.add(d.name)
    return out


RETIRED_CPU = "retired"   # the meter key holding the CPU seconds of deleted arms


def fold_cpu(cpu_state: Mapping[str, float], backtests_dir: pathlib.Path, arms: Iterable[str]) -> dict[str, float]:
    """The CPU meter state with the readings of deleted `arms` folded into one `RETIRED_CPU` entry:
    the total is unchanged, and the state (checkpointed with every graph step) stops growing by an
    entry per backtest arm."""
    prefixes = tuple(f"{backtests_dir / name}:" for name in arms)
    out = {k: v for k, v in cpu_state.items() if not k.startswith(prefixes)} if prefixes else dict(cpu_state)
    gone = sum(v for k, v in cpu_state.items() if prefixes and k.startswith(prefixes))
    if gone:
        out[RETIRED_CPU] = out.get(RETIRED_CPU, 0.0) + gone
    return out


def enforce_retention(run_dir: pathlib.Path, backtests_dir: pathlib.Path, config_dir: pathlib.Path,
                      interventions: Sequence[Intervention], cpu_state: Mapping[str, float] | None,
                      keep_kept: int = KEEP_KEPT) -> RetentionPlan:
    """Delete what `plan_retention` allows under the live run's `checkpoints/`, `backtests_dir` and
    `config_dir` (the arms' job configs). A checkpoint's manifest goes first: a `.pt` without its
    manifest is never loaded, so a kill in between leaves nothing half-valid."""
    ckdir = run_dir / "checkpoints"
    names = {p.stem for p in ckdir.glob("*-*.json") if _NAME.match(p.stem)} if ckdir.is_dir() else set()
    names |= {p.stem for p in ckdir.glob("*-*.pt") if _NAME.match(p.stem)} if ckdir.is_dir() else set()
    arm_dirs = [p for p in backtests_dir.glob("bt-*") if p.is_dir()] if backtests_dir.is_dir() else []
    plan = plan_retention(interventions, names, [p.name for p in arm_dirs],
                          metered(arm_dirs, dict(cpu_state or {})), keep_kept=keep_kept)
    for name in sorted(plan.checkpoints):
        for suffix in (".json", ".pt"):
            (ckdir / f"{name}{suffix}").unlink(missing_ok=True)
    for name in sorted(plan.arms):
        (config_dir / f"{name}.yaml").unlink(missing_ok=True)
        shutil.rmtree(backtests_dir / name, ignore_errors=True)
    return plan
