"""The controller on a goal that drives the agent trainer (`run.agent`, docs/agent-training.md).

    goal: "a tool-using policy answers lookup questions"
    target: {metric: heldout_acc, op: ">=", threshold: 0.6}
    run:
      agent: {env: lookup, difficulty: 1, sft: {steps: 300}, grpo: {steps: 60}, checkpoint: {interval: 5}}

Why `run: {agent: {...}}`: it is the shape of the script precedent (`run: {entrypoint: {...}}`): the one
key under `run:` names the run kind and holds that kind's own config, here `AgentTrainConfig` fields
validated as the trainer validates them, so no second schema is mixed into the single-turn RunConfig
and a `run.kind` switch has nothing to disagree with.

The agent trainer (`python -m trainer.agent_train`) writes the run format the controller reads
(metrics with `heldout_acc`, samples.jsonl trajectories, events, heartbeat) and takes the inbox's
commands, but it is not the single-turn trainer: its harness is an `AgentHarness`, its recipe the
fields it reads every step (`trainer.agent_state.RECIPE_FIELDS`), and it has no task, curriculum or
pilot of ours. Everything the controller does differently for such a run is here, with small hooks
in `swarm.controller`, `swarm.goal` and the Controller's mixins (this one first):

- validation (`check_agent_goal`): `run` holds `agent` alone; it parses as AgentTrainConfig and the
  trainer builds from it (environment, difficulty, harness edits and fault, its expert succeeding);
  the target is `heldout_acc`; no `perturbations:` (a harness fault goes in `run.agent.harness_fault`,
  hidden from the operators as perturbations are); `name`, `out_dir`, `fork_*` and the trainer's own
  critic (`critic.enabled`) are the controller's, not the goal's;
- the job: `python -m trainer.agent_train --config .swarm/private/train.yaml`, a local process
  (`AgentJobs`, the default) or, with `--jobs ray`, a Ray job as every other goal's (`agent_jobs`),
  with checkpoints on (`checkpoint.interval` CHECKPOINT_EVERY unless the goal sets
  one); a restart resumes from the run's newest checkpoint;
- diagnosis: only the job detectors (crash, hang, trainer notices) of the single-turn set run (the
  others are calibrated on single-turn runs), and the agent detectors (`agents.agent_critic`: harness
  limits from the metrics rows; parser, observation-cut and tool-spec faults from the step-level
  records in samples.jsonl, read under the live harness the evidence is given here); the
  operators are ClusterOps and the `AgentHarnessCritic`, which turns a finding into the HarnessCritic's
  typed edit of the live harness (read from RUN_DIR/harnesses/<version>.yaml);
- proposals: kinds harness_edit, recipe_edit, restart and rollback (to the checkpoint of the run the
  proposal names as `rollback_to`, else the newest before the problem's window, as on any run;
  neither operator above proposes one yet), with fields the trainer's set_fields takes
  (`trainer.agent_state.field_key`); anything else is dropped and logged once (`not_applicable`);
  validity is `trainer.agent_state.changed` on the live config and harness, as the inbox checks; a
  rollback is never a no-op (it moves the weights);
- backtests: arms forked from the live run's checkpoint (`swarm.agent_backtest`), a rollback's
  candidate from the checkpoint it rolls back to while the control carries on from the live one
  (both from it when the steps since gained nothing), compared by the same `swarm.decisions` functions;
- apply: the shared `Controller.apply`: set_fields with the dotted fields, acknowledged; a rollback
  is the trainer's `rollback` command then the set_fields with its changes and the later fixes'
  fields still in force, at one safe point. What is in force after a rollback comes from its
  acknowledgement (the checkpoint's recipe fields; its harness from the metrics rows);
- undo (the judge's verdict says undo, or a human's `swarm rollback`): as a single-turn run's, back to
  the checkpoint taken just before the change (the weights trained since are discarded) with the
  later fixes set again; a change without one (a restart) gets the values it replaced set back;
- the controller ends the run when the target is met (the agent trainer has no early stop).
"""
from __future__ import annotations

import pathlib
import shutil
from typing import Any, Mapping

from agents.domain import Intervention, InterventionKind, Status
from swarm.agent_backtest import agent_rule, fork_position, run_agent_arms
from swarm.backtest import rollback_horizon
from swarm.decisions import Look, Pair, Rule, retry_horizon, run_looks, schedule, try_share
from swarm.jobs import Jobs, ProcessJobs, RayJobs
from swarm.script_run import accepted
from trainer.config import ConfigError, get_dotted
from trainer.runlog import iter_jsonl, read_jsonl

CHECKPOINT_EVERY = 10     # the live job's checkpoint interval when the goal sets none
OWNED = ("name", "out_dir", "fork_from", "fork_overrides")
KINDS = (InterventionKind.HARNESS_EDIT, InterventionKind.RECIPE_EDIT, InterventionKind.RESTART,
         InterventionKind.ROLLBACK)
HIDDEN = ("harness_fault", "harness_fault_step")   # the evaluation's faults: never shown to the operators


def check_agent_goal(goal: Any) -> None:
    """A goal that drives the agent trainer, checked as `swarm run` and the trainer would; a
    ConfigError of one line naming the field otherwise."""
    from trainer.agent_train import AgentTrainConfig, AgentTrainer

    others = sorted(k for k in goal.run if k != "agent")
    if others:
        raise ConfigError(f"invalid goal: run.{others[0]}: a goal that drives the agent trainer (run.agent) takes "
                          "its whole config in run.agent")
    data = goal.run["agent"]
    if not isinstance(data, dict):
        raise ConfigError(f"invalid goal: run.agent={data!r}: must be a mapping of AgentTrainConfig fields")
    owned = [k for k in OWNED if k in data]
    if owned:
        raise ConfigError(f"invalid goal: run.agent.{owned[0]}: set by the controller, not the goal")
    if (data.get("critic") or {}).get("enabled") if isinstance(data.get("critic"), dict) else False:
        raise ConfigError("invalid goal: run.agent.critic.enabled=True: the swarm's HarnessCritic edits a goal's "
                          "agent harness; the trainer's own critic stage stays off")
    if goal.target.metric != "heldout_acc":
        raise ConfigError(f"invalid goal: target.metric={goal.target.metric!r}: an agent run's target is "
                          "'heldout_acc' (greedy held-out success)")
    if not 0.0 <= goal.target.threshold <= 1.0:
        raise ConfigError(f"invalid goal: target.threshold={goal.target.threshold!r}: heldout_acc is a rate, in [0, 1]")
    if goal.perturbations:
        raise ConfigError("invalid goal: perturbations: an agent run's faults go in run.agent.harness_fault")
    if goal.swarm.storage:
        raise ConfigError(f"invalid goal: swarm.storage={goal.swarm.storage!r}: an agent run keeps its run folder "
                          "in the workspace")
    try:
        cfg = AgentTrainConfig.parse({**data, "name": "check", "out_dir": "/tmp"})
    except ConfigError as e:
        line = str(e).splitlines()[0]
        if "<config>=" in line:   # a rule across fields: its own message, not the whole config
            raise ConfigError(f"invalid goal: run.agent: {line.rsplit(': ', 1)[-1]}") from None
        raise ConfigError(line.replace("invalid config: ", "invalid goal: run.agent.")) from None
    try:
        AgentTrainer(cfg, printer=None)   # builds the environment, the harness and its fault; checks the expert
    except ConfigError as e:
        raise ConfigError(f"invalid goal: run.agent: {str(e).splitlines()[0]}") from None
    if cfg.sft.steps > goal.budget.steps:
        raise ConfigError(f"invalid goal: budget.steps={goal.budget.steps} is below run.agent.sft.steps="
                          f"{cfg.sft.steps}: the warm-up alone would pass the budget")
    if cfg.harness_fault_step is not None and cfg.harness_fault_step >= goal.budget.steps:
        raise ConfigError(f"invalid goal: run.agent.harness_fault_step={cfg.harness_fault_step} is not before "
                          f"budget.steps={goal.budget.steps}: the run ends first")
    if goal.notify is not None:
        from swarm.goal import notify_argv

        try:
            notify_argv(goal.notify, "notify")
        except ValueError as e:
            raise ConfigError(f"invalid goal: {e}") from None


def public_run(run: dict[str, Any]) -> dict[str, Any]:
    """`run` as operators, reports and memory see it: an agent run's faults left out."""
    agent = {k: v for k, v in run["agent"].items() if k not in HIDDEN}
    return {**run, "agent": agent}


def job_config(goal: Any, out_dir: str | pathlib.Path) -> dict[str, Any]:
    """The live job's AgentTrainConfig (a dict, validated): the goal's, named `train` under
    `out_dir`, with checkpoints on."""
    from trainer.agent_train import AgentTrainConfig

    data = dict(goal.run["agent"])
    ck = dict(data.get("checkpoint") or {})
    ck["interval"] = ck.get("interval") or CHECKPOINT_EVERY
    data.update(name="train", out_dir=str(out_dir), checkpoint=ck)
    cfg = AgentTrainConfig.parse(data).model_dump(mode="json")
    over = cfg["sft"]["steps"] + cfg["grpo"]["steps"] - goal.budget.steps
    if over > 0:   # the budget's steps end the run, as they end any other goal's (check_agent_goal: the warm-up fits)
        cfg["grpo"]["steps"] = max(0, cfg["grpo"]["steps"] - over)
        cfg = AgentTrainConfig.parse(cfg).model_dump(mode="json")
    return cfg


def task_name(goal: Any) -> str:
    """What memory files this run's episodes under: the environment."""
    return f"agent:{goal.run['agent'].get('env', 'lookup')}"


class AgentJobs(ProcessJobs):
    """Jobs of a goal that drives the agent trainer as local processes: `start(name, config_path)` runs
    `python -m trainer.agent_train --config CONFIG` as a child process (the live job, a restart that
    resumes from its newest checkpoint, a backtest arm)."""

    def __init__(self, log_dir: str | pathlib.Path) -> None:
        from trainer.launch import AGENT_TRAINER

        super().__init__(log_dir, trainer=AGENT_TRAINER)


def agent_jobs(log_dir: pathlib.Path, jobs: str, address: str | None = None, saved_head: Any = None,
               on_head: Any = None, **reserve: Any) -> Jobs:
    """The launcher of a goal that drives the agent trainer: `AgentJobs` (local processes) for
    `process`; for `ray`, `swarm.jobs.RayJobs` running the agent trainer (`trainer.launch.AGENT_TRAINER`)
    with `address` (None: a private head), `saved_head` (a callable giving the head the run
    recorded, read only without an address), `on_head` and `reserve` (job_cpus, job_resources,
    run_key), as for every other goal's Ray jobs. Never with run storage (`check_agent_goal`)."""
    from trainer.launch import AGENT_TRAINER

    if jobs == "process":
        return AgentJobs(log_dir)
    if jobs == "ray":
        return RayJobs(address, saved=None if address or saved_head is None else saved_head(), on_head=on_head,
                       trainer=AGENT_TRAINER, **reserve)
    raise ConfigError(f"--jobs={jobs!r}: must be process or ray")


def acknowledged_fields(run_dir: pathlib.Path, but_last: bool = False) -> dict[str, Any]:
    """The dotted fields the run acknowledged setting (set_fields / set_recipe applied), later ones
    winning; `but_last`: without the newest such command (what it replaced). An applied rollback
    puts back the recipe fields its checkpoint held (its acknowledgement names them) and forgets the
    harness fields set before it: the checkpoint's harness is whole under harnesses/, which fields
    commands set on it is not recorded."""
    out: dict[str, Any] = {}
    rows = [r for r in iter_jsonl(run_dir / "command_log.jsonl")
            if r.get("cmd") in ("set_fields", "set_recipe", "rollback") and r.get("status") == "applied"]
    last = max((i for i, r in enumerate(rows) if r["cmd"] != "rollback"), default=None)
    for i, r in enumerate(rows):
        if but_last and i == last:
            continue
        result = r.get("result") or {}
        if r["cmd"] == "rollback":
            out = {f"recipe.{k}": v for k, v in (result.get("recipe") or {}).items()}
            continue
        for k, v in (result.get("set") or {}).items():
            out[k if k.startswith("harness.") or k.startswith("recipe.") else f"recipe.{k}"] = v
    return out


class AgentSteering:
    """The decision inputs and actions of `swarm.deciding.Deciding` for an agent run (a mixin placed
    first in `swarm.controller.Controller`): each method falls through on any other run."""

    agent: dict[str, Any] | None
    agent_arms = staticmethod(run_agent_arms)   # runs an agent backtest's arms (tests may script them)

    # ---- what the live run has ------------------------------------------------------------------
    def live_harness(self, version: str | None = None) -> dict[str, Any]:
        """The agent harness the run stored under `version` (default: the newest metrics row's), {} before any."""
        import yaml

        if version is None:
            rows = (self.tick.evidence or self.evidence("UNKNOWN")).metrics
            version = next((str(r["harness_version"]) for r in reversed(rows) if r.get("harness_version")), None)
        p = self.run_dir / "harnesses" / f"{version}.yaml"
        if not version or not version.isalnum() or not p.is_file():
            return {}
        return yaml.safe_load(p.read_text()) or {}

    def agent_values(self, keys: list[str], harness: Mapping[str, Any], recipe: Mapping[str, Any]) -> dict[str, Any]:
        return {k: (get_dotted({"harness": dict(harness)}, k)[1] if k.startswith("harness.")
                    else get_dotted(dict(recipe), k.removeprefix("recipe."))[1]) for k in keys}

    def agent_context(self) -> Any:
        """The operators' context: the live agent harness; no task, curriculum or recipe of ours."""
        from agents.base import OperatorContext

        return OperatorContext(goal=self.goal.goal, target=self.goal.target, recipe={}, harness=self.live_harness(),
                               history=self.store.list(), checkpoints=self.checkpoints(), skills=self.tick.recall[0],
                               episodes=self.tick.recall[1], min_difficulty=0)

    def agent_findings(self, ev: Any, known: Any) -> list[Any]:
        """The job detectors of the single-turn set and the agent detectors (the step detectors read
        the samples' step-level records under the live harness, which the evidence carries here)."""
        from agents.agent_critic import run_agent_detectors
        from agents.detection import run_detectors
        from agents.detectors import TRAINER_NOTICES
        from agents.domain import JOB_FINDINGS

        agent_ev = ev.model_copy(update={"harness": self.live_harness() or None})
        return run_detectors(ev, sorted(JOB_FINDINGS) + list(TRAINER_NOTICES), known=known) + run_agent_detectors(agent_ev)

    # ---- Deciding's inputs ----------------------------------------------------------------------
    def write_job_config(self) -> pathlib.Path:
        if not self.agent:
            return super().write_job_config()
        import yaml

        from sandboxes.private import write_private

        path = self.private / "train.yaml"
        write_private(path, yaml.safe_dump(self.base_cfg["job"], sort_keys=False))
        return path

    def validity(self, iv: Intervention) -> str | None:
        if not self.agent:
            return super().validity(iv)
        if not iv.changes:
            return None
        from harness.agent import AgentHarness
        from trainer.agent_state import changed
        from trainer.agent_train import AgentTrainConfig

        live = self.live_harness()
        if not live:
            return "the agent run has stored no harness yet"
        cfg = AgentTrainConfig.parse({**self.base_cfg["job"], **self.recipe_now()})
        try:   # within the policy's context, as the live trainer's inbox checks (built-in model: max_seq_len)
            changed(cfg, AgentHarness.model_validate(live), dict(iv.changes), cfg.model.max_seq_len)
        except (ValueError, ConfigError) as e:
            return str(e).splitlines()[0]
        return None

    def recipe_now(self) -> dict[str, Any]:
        """The live job config's recipe fields with the acknowledged changes applied (nested)."""
        from trainer.config import put_dotted

        data = {k: v for k, v in self.base_cfg["job"].items() if k in ("sft", "grpo", "grad_clip")}
        for k, v in acknowledged_fields(self.run_dir).items():
            if k.startswith("recipe."):
                put_dotted(data, k.removeprefix("recipe."), v)
        return data

    def values_in_force(self, keys: list[str]) -> dict[str, Any]:
        if not self.agent:
            return super().values_in_force(keys)
        return self.agent_values(keys, self.live_harness(), self.recipe_now())

    def published_values(self, keys: list[str]) -> dict[str, Any]:
        """What the change just acknowledged replaced (`outcome.before`): the harness its
        `harness_change` event names as `harness_before`, the recipe before the newest set_fields."""
        if not self.agent:
            return super().published_values(keys)
        changes = [e for e in read_jsonl(self.run_dir / "events.jsonl")
                   if e.get("event") == "harness_change" and e.get("source") == "command"]
        harness = self.live_harness(str(changes[-1]["harness_before"])) if changes else self.live_harness()
        recipe = {k: v for k, v in self.base_cfg["job"].items() if k in ("sft", "grpo", "grad_clip")}
        from trainer.config import put_dotted

        for k, v in acknowledged_fields(self.run_dir, but_last=True).items():
            if k.startswith("recipe."):
                put_dotted(recipe, k.removeprefix("recipe."), v)
        return self.agent_values(keys, harness, recipe)

    def last_step(self) -> int:
        """An agent run ends after its warm-up and GRPO stages (their step counts in force; `job_config`
        cuts the GRPO stage to the budget's steps)."""
        if not self.agent:
            return super().last_step()
        stages = self.recipe_now()
        own = int((stages.get("sft") or {}).get("steps") or 0) + int((stages.get("grpo") or {}).get("steps") or 0)
        return own

    def start_values(self, keys: list[str]) -> dict[str, Any]:
        if not self.agent:
            return super().start_values(keys)
        start = next((e.get("harness_version") for e in read_jsonl(self.run_dir / "events.jsonl")
                      if e.get("event") == "start"), None)
        return self.agent_values(keys, self.live_harness(start) if start else {}, self.base_cfg["job"])

    def set_values(self) -> dict[str, Any]:
        if not self.agent:
            return super().set_values()
        return acknowledged_fields(self.run_dir)

    def noop_edit(self, iv: Intervention, job_status: str) -> str | None:
        if not self.agent:
            return super().noop_edit(iv, job_status)
        if iv.kind == InterventionKind.ROLLBACK:   # it moves the weights: never a no-op
            return None
        now = self.values_in_force(list(iv.changes))
        if iv.changes and all(now.get(k) == v for k, v in iv.changes.items()):
            return "the run already has " + ", ".join(f"{k}={v!r}" for k, v in iv.changes.items())
        return None

    def prepare(self, iv: Intervention, s: Any) -> Intervention | None:
        if not self.agent:
            return super().prepare(iv, s)
        from trainer.agent_state import field_key

        why = (f"a {iv.kind.value} has no command on an agent run" if iv.kind not in KINDS else
               next((w for w in map(field_key, iv.changes) if w is not None), None))
        if why is not None:
            key = ("not_applicable", iv.signature())
            if key not in self.memo.findings:   # once per fix and controller process
                self.memo.findings.add(key)
                self.store.log("not_applicable", operator=iv.operator, iv_kind=iv.kind.value,
                               diagnosis=iv.diagnosis.name, reason=why, step=s.step)
            return None
        return super().prepare(iv, s)

    # ---- backtest, undo -------------------------------------------------------------------------
    def _backtest_arms(self, iv: Intervention, ack: dict[str, Any]) -> None:
        """`Deciding._backtest_arms` for an agent run: the same looks, rule settings and recorded
        result, with the arms forked from the checkpoint the trainer saved on the backtest's
        `checkpoint` command (`swarm.agent_backtest.run_agent_arms`). A rollback's candidate forks
        the checkpoint it rolls back to while the control carries on from the live one; both start
        there, over `rollback_horizon`, when the steps since gained nothing measurable (as in
        `Deciding._backtest_arms`)."""
        if not self.agent:
            return super()._backtest_arms(iv, ack)
        bt = self.goal.swarm.backtest
        ckpts = self.run_dir / "checkpoints"
        live = str((ack.get("result") or {}).get("checkpoint") or "")
        target = self.rollback_target(iv) if iv.kind == InterventionKind.ROLLBACK else None
        cand = next((c for c in self.checkpoints() if c["name"] == target), None)
        common = cand is not None and self.nothing_staked(int(cand["step"]))
        control = str(target) if common else live
        looks = schedule(bt.seeds, iv.diagnosis.severity == "critical", bt.critical_extend)
        before = self.tries_without_gain(iv)
        retry = retry_horizon(bt.horizon_steps, before)
        base = rollback_horizon(retry, int(cand["step"]), max(int(ack["step"]), int(cand["step"]))) if common else retry
        notes = [f"{before} earlier backtest(s) of this fix gained too little to tell: horizon {retry} steps"] if retry > bt.horizon_steps else []
        if common:
            notes.append(f"both arms from checkpoint {target} (step {cand['step']}): the steps since gained "
                         "nothing measurable")
        cpu = 0.0

        def measure(look: Look, seeds: list[int]) -> list[Pair]:
            nonlocal cpu
            stage, at = fork_position(self.run_dir, control)
            rolled = ((str(ckpts / f"{target}.pt"), *fork_position(self.run_dir, str(target)))
                      if cand and not common else None)
            ps, c = self.agent_arms(iv, live=self.base_cfg["job"], checkpoint=str(ckpts / f"{control}.pt"), stage=stage,
                                    stage_step=at, candidate_from=rolled, horizon=base * look.horizon_factor,
                                    seeds=seeds, eval_size=bt.eval_size, jobs=self.jobs,
                                    workdir=self.sdir / "backtests", config_dir=self.private / "backtests",
                                    label=f"-x{look.horizon_factor}" if look.horizon_factor > 1 else "")
            cpu += c
            return ps

        def rule_at(n: int) -> Rule:
            return agent_rule(alpha=bt.alpha, share=try_share(before), eval_size=bt.eval_size, looks=len(looks), look=n)

        try:
            d, pairs, look, extended = run_looks(looks, measure, rule_at)
        except (OSError, ValueError, ConfigError) as e:   # no arm could start: a refusal, recorded
            self.store.transition(iv.id, Status.REJECTED, f"the backtest's arms could not start: {e}")
            return
        where = (f"the candidate forked from checkpoint {target}, the control from the live run's {live} at step "
                 f"{ack['step']}" if cand and not common else f"arms forked from the agent run's checkpoint {control}")
        self.record_backtest(iv.id, d, pairs, looks, look, extended, base, notes, cpu,
                             after=(f"{where}; held-out size {bt.eval_size}",))
        for arm in (self.sdir / "backtests").glob(f"bt-{iv.id}*"):   # scored and counted: the arms' weights go
            shutil.rmtree(arm / "checkpoints", ignore_errors=True)

    def roll_back(self, iv: Intervention, note: str) -> None:
        """Undo an applied change on an agent run as on a single-turn one (`Deciding.roll_back`): the
        run goes back to the checkpoint taken just before the change (`pre-<id>`: its weights,
        optimiser, position, recipe and harness; the weights trained since are discarded) and the
        fields of the changes applied after it that stay in force are set again, at one safe point.
        A change with no such checkpoint (a restart) or whose rollback the trainer did not apply has
        the values it replaced set back instead, keeping the weights; none known: left in force."""
        if not self.agent:
            return super().roll_back(iv, note)
        iv = self.store.get(iv.id)
        ack = None
        if iv.checkpoint_before:
            with self.one_safe_point(f"{iv.id}-undo"):
                ack = self.command("rollback", f"{iv.id}-undo", name=iv.checkpoint_before)
                carried = self.carry_over(iv.id, iv.checkpoint_before) if ack is None or accepted(ack) else {}
                if carried:   # fixes applied after this one stay in force
                    self.command("set_fields", f"{iv.id}-undo-carry", fields=carried)
        if iv.checkpoint_before and (ack is None or accepted(ack)):
            undone = True
            done = (f"back to checkpoint {iv.checkpoint_before} (step {ack['result']['step']}): the weights, "
                    "recipe and harness from before it; the weights trained since are discarded" if ack else
                    f"the rollback to {iv.checkpoint_before} waits in the inbox of a job that did not answer: it is "
                    "applied when the job reads it")
        else:
            refused = (f"the rollback to {iv.checkpoint_before} was refused ({str(ack.get('reason'))[:120]}); "
                       if ack else "")
            before = {k: v for k, v in (iv.outcome.before or {}).items() if k in iv.changes and v is not None}
            ack = (self.command("set_fields", f"{iv.id}-undo-set", fields=before)
                   if iv.changes and len(before) == len(iv.changes) else None)
            undone = accepted(ack)
            why = (ack or {}).get("reason") or "no value before it is known"
            done = refused + ("the values it replaced are set again; the weights trained since are kept" if undone else
                              f"its values could not be set back ({why}); left in force")
        iv.outcome.undone = undone
        self.store.put(iv)
        if self.ws.pr_state(iv.id) == "merged":
            self.ws.rollback(iv.id)
        self.store.transition(iv.id, Status.ROLLED_BACK, f"{note}; {done}")
