"""The controller on a goal that runs the user's own script (`run.entrypoint`, docs/steering.md).

A script steered by `trainer.steer.SwarmCallback` writes the run files the controller reads, but it
is not this project's trainer: it has no task, recipe or harness of ours, its settings are the ones
it declares (`RUN_DIR/settings.json`: name, type, range, hot or restart), and its commands are
`set_fields`, `eval`, `checkpoint` and `stop`. Everything the controller does differently for such
a run is here, so `swarm.controller` keeps small hooks only:

- names: the built-in operators speak in this project's dotted fields (`recipe.lr`). `OPERATOR_FIELDS`
  maps the names SwarmCallback declares to those fields, in one place. The operators see the run's
  declared values under those fields (`script_context`); a proposal is translated back to the
  declared names before it is recorded (`adapt`), so the store, the reports and the PRs name what
  the user's script calls the setting. An intervention's change keys are dotted
  (`agents.domain.Intervention` takes `recipe.*` and `harness.*` only), so a declared setting NAME is
  recorded as `recipe.NAME` (`recipe.learning_rate`, `recipe.temperature`: the script's whole
  training config is its recipe) and sent to the script as NAME (`trainer_fields`). A proposal with
  a field the run does not declare, or a kind the run cannot take (a data change, a distillation),
  is dropped and logged once, never recorded as a loss;
- a rollback: to a checkpoint of the script's index (`init`, the untrained start SwarmCallback saves
  before the first update, or a `checkpoint-N`), it stays a rollback: the callback's `rollback`
  command, then its change, at one safe point; the relauncher relaunches the script from that
  checkpoint with the change. Its backtest's candidate starts from that checkpoint, and so does the
  control when the steps since it gained nothing (`Deciding.nothing_staked`, as on the built-in
  trainer); both arms then train at least the steps the rollback gives up
  (`swarm.backtest.rollback_horizon`). With no such checkpoint, a rollback that carries a change becomes the same change
  applied to the live weights (said in its rationale); one without a change is dropped;
- validity: `trainer.steer.check_change` on the declared settings, before anything else;
- acknowledgements: `applied` and `restart` are accepted (`accepted`); a `restart` means the
  callback saved a checkpoint and stopped, and the relauncher relaunches the script with the
  change (`trainer.steer.relaunch`);
- backtests: the live script is checkpointed and paused as this project's trainer is
  (`swarm.deciding.Deciding.backtest`); the arms are forks of the script from that checkpoint
  (`swarm.script_backtest`: the relauncher in a fresh run folder per arm, the change as flags or
  hot overrides), scored and compared by the same `swarm.decisions` functions;
- undoing a change: the values it replaced are set again (the weights trained since are kept);
- missing evidence: what a foreign run cannot give (per-sample texts when the trainer keeps none,
  a checkpoint to roll back to) is named in the diagnosis (`missing_evidence`), never guessed.

A script goal's PR changes no file of the workspace (its recipe.yaml and harness.yaml stay empty:
the settings live in the run, in `settings.json` and the relaunch flags); it holds the report and
intervention.json.
"""
from __future__ import annotations

import json
import pathlib
import shlex
import shutil
from typing import Any, Mapping

from agents.domain import Intervention, InterventionKind, Status
from swarm.backtest import rollback_horizon
from swarm.decisions import Look, Pair, Rule, retry_horizon, run_looks, schedule, try_share
from swarm.script_backtest import run_script_arms, script_rule
from trainer.runlog import iter_jsonl, read_jsonl
from trainer.steer.relaunch import restart_changes
from trainer.steer.settings import as_settings, check_change, coerce, read_declared

# SwarmCallback's declared name → the built-in operators' dotted field, where both mean the same
# thing in the same unit. Names missing here are still the run's settings (an LLM policy or a
# human may change them); the built-in operators just have no rule about them.
OPERATOR_FIELDS: dict[str, str] = {
    "learning_rate": "recipe.lr",                          # peak lr of the schedule
    "weight_decay": "recipe.weight_decay",
    "max_grad_norm": "recipe.grad_clip",
    "warmup_steps": "recipe.warmup_steps",
    "max_steps": "recipe.steps",
    "beta": "recipe.kl_coef",                              # TRL's KL coefficient
    "num_generations": "recipe.group_size",                # TRL GRPO completions per prompt
    "epsilon": "recipe.clip_eps",                          # TRL GRPO clip range
    "temperature": "harness.sampling.temperature",
    "max_completion_length": "harness.sampling.max_new_tokens",
}
DECLARED_NAMES: dict[str, str] = {v: k for k, v in OPERATOR_FIELDS.items()}
PREFIX = "recipe."   # a declared setting NAME as an intervention's change key: recipe.NAME


def trainer_fields(changes: Mapping[str, Any]) -> dict[str, Any]:
    """An intervention's changes as the script's `set_fields` takes them: recipe.NAME → NAME."""
    return {k.removeprefix(PREFIX): v for k, v in changes.items()}


def as_changes(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Declared settings {NAME: value} as an intervention's changes {recipe.NAME: value}."""
    return {PREFIX + k: v for k, v in fields.items()}

# the kinds a script run can take: a settings change, a job restart (the relauncher resumes from the
# newest checkpoint), and a rollback turned into its change
KINDS = (InterventionKind.RECIPE_EDIT, InterventionKind.HARNESS_EDIT, InterventionKind.RESTART, InterventionKind.ROLLBACK)


def accepted(ack: Mapping[str, Any] | None) -> bool:
    """A command's acknowledgement says the change took effect or will with the relaunch: `applied`,
    or `restart` (the callback saved a checkpoint and stopped; the relauncher relaunches with the
    change). `rejected`, or no answer, is not."""
    return bool(ack) and ack.get("status") in ("applied", "restart")


def declared(run_dir: pathlib.Path) -> dict[str, Any]:
    """The run's settings.json, {} before the script wrote it."""
    return read_declared(run_dir) or {}


def operator_view(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(recipe, harness): the declared values in force under the operators' field names."""
    out: dict[str, dict[str, Any]] = {"recipe": {}, "harness": {}}
    for name, field in OPERATOR_FIELDS.items():
        if name in values:
            section, *path = field.split(".")
            d = out[section]
            for p in path[:-1]:
                d = d.setdefault(p, {})
            d[path[-1]] = values[name]
    return out["recipe"], out["harness"]


def to_declared(changes: Mapping[str, Any], settings: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`changes` as recipe.NAME of the run's declared settings, and why not (None when all
    translate): an operator field is mapped by OPERATOR_FIELDS, recipe.NAME of a declared NAME is kept."""
    known = as_settings(settings.get("settings", [])) if settings else {}
    out: dict[str, Any] = {}
    for k, v in changes.items():
        name = DECLARED_NAMES.get(k) or k.removeprefix(PREFIX)
        if name not in known:
            return {}, (f"{k}: the script run declares no such setting (declared: {', '.join(sorted(known)) or 'none yet'})")
        out[PREFIX + name] = coerce(known[name], v) if check_change(known, {name: v}) is None else v
    return out, None


def missing_evidence(ev: Any) -> list[str]:
    """What this foreign run does not give the detectors and operators."""
    out = []
    if not getattr(ev, "samples", None):
        out.append("per-sample completions and verdicts: the script's trainer keeps none (samples.jsonl is empty)")
    return out


def adapt(iv: Intervention, settings: Mapping[str, Any], ev: Any, target: str | None = None) -> tuple[Intervention | None, str | None]:
    """The proposal as a script run can take it (changes under the declared names, a rollback with
    no checkpoint to go back to (`target` None) as its change, missing evidence named in the
    diagnosis), or (None, why) when it cannot."""
    if iv.kind not in KINDS:
        return None, f"a {iv.kind.value} has no command on a script run"
    changes, why = to_declared(iv.changes, settings)
    if why:
        return None, why
    update: dict[str, Any] = {"changes": changes}
    missing = missing_evidence(ev)
    rationale = iv.rationale
    if iv.kind == InterventionKind.ROLLBACK and target is None:
        if not changes:
            return None, "a rollback without a change, and no checkpoint of the script's to roll back to"
        update.update(kind=InterventionKind.RECIPE_EDIT, backtest_skipped=None)
        missing.append("a checkpoint to roll back to: the script's index holds none from before the problem")
        rationale += (" On this script run the weights are not rolled back (no checkpoint of the script's predates "
                      "the problem): the change is applied to the live run.")
    if changes != dict(iv.changes):
        rationale += " Settings as the script declares them: " + ", ".join(
            f"{k} → {n}" for k, n in zip(iv.changes, changes) if k != n) + "."
    update["rationale"] = rationale
    if missing:
        update["diagnosis"] = iv.diagnosis.model_copy(update={"evidence": {**iv.diagnosis.evidence,
                                                                           "missing_evidence": missing}})
    return iv.model_copy(update=update), None


def start_values(ep: Any, settings: Mapping[str, Any], keys: list[str]) -> dict[str, Any]:
    """The goal's own values of declared settings: the last `--NAME VALUE` in the entrypoint's
    arguments, else the value in force when no command changed it."""
    known = as_settings(settings.get("settings", [])) if settings else {}
    args = list(ep.args)
    out: dict[str, Any] = {}
    for key in keys:
        k = key.removeprefix(PREFIX)
        flag = f"--{k}"
        vals = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
        vals += [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
        if vals and k in known:
            try:
                raw = json.loads(vals[-1]) if known[k].type != "str" else vals[-1]
                out[key] = coerce(known[k], raw)
                continue
            except (ValueError, TypeError):
                pass
        overridden = k in (settings.get("overrides") or {}) or k in restart_changes(settings.get("acks", []))
        out[key] = None if overridden else (settings.get("values") or {}).get(k)
    return out


def task_name(ep: Any) -> str:
    """What memory files this run's episodes under: the script, as there is no task of ours."""
    return f"script:{pathlib.Path(ep.script).stem}"


def resolved(goal: Any, cwd: str | pathlib.Path) -> Any:
    """The goal as the controller saves it: the script's absolute path and the folder it runs in, so
    `swarm resume` from any directory runs the same script in the same place."""
    ep = dict(goal.run["entrypoint"])
    base = pathlib.Path(ep.get("cwd") or cwd).resolve()
    ep["script"] = str((base / pathlib.Path(ep["script"]).expanduser()).resolve())
    ep["cwd"] = str(base)
    return goal.model_copy(update={"run": {**goal.run, "entrypoint": ep}})


def command_line(ep: Any) -> str:
    return shlex.join(ep.argv())


class ScriptSteering:
    """The decision inputs of `swarm.deciding.Deciding` for a script run (a mixin placed before it in
    `swarm.controller.Controller`): each method falls through to Deciding's on a run of this
    project's trainer."""

    script: Any
    script_arms = staticmethod(run_script_arms)   # runs a script backtest's arms (tests may script them)

    def settings(self) -> dict[str, Any]:
        return declared(self.run_dir)

    def trainer_fields(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of a `set_fields` command: the script's declared names on a script run."""
        return trainer_fields(changes) if self.script else dict(changes)

    def script_context(self) -> Any:
        """The operators' context on a script run: the run's declared values under their field names
        (OPERATOR_FIELDS); no task, curriculum or harness of ours, and no version tracking (the
        drift detectors stay off: `settled_since` None)."""
        from agents.base import OperatorContext

        recipe, harness = operator_view(self.settings().get("values") or {})
        return OperatorContext(goal=self.goal.goal, target=self.goal.target, recipe=recipe, harness=harness,
                               history=self.store.list(), checkpoints=self.checkpoints(), skills=self.tick.recall[0],
                               episodes=self.tick.recall[1], min_difficulty=0)

    def validity(self, iv: Intervention) -> str | None:
        if not self.script:
            return super().validity(iv)
        if not iv.changes:
            return None
        s = self.settings()
        if not s:
            return "the script has not declared its settings yet (no settings.json in its run folder)"
        return check_change(s, trainer_fields(iv.changes))

    def values_in_force(self, keys: list[str]) -> dict[str, Any]:
        if not self.script:
            return super().values_in_force(keys)
        values = self.settings().get("values") or {}
        return {k: values.get(k.removeprefix(PREFIX)) for k in keys}

    def start_values(self, keys: list[str]) -> dict[str, Any]:
        if not self.script:
            return super().start_values(keys)
        s = {**self.settings(), "acks": list(iter_jsonl(self.run_dir / "command_log.jsonl"))}
        return start_values(self.script, s, keys)

    def set_values(self) -> dict[str, Any]:
        if not self.script:
            return super().set_values()
        return as_changes({**(self.settings().get("overrides") or {}),
                           **restart_changes(iter_jsonl(self.run_dir / "command_log.jsonl"))})

    def noop_edit(self, iv: Intervention, job_status: str) -> str | None:
        if not self.script:
            return super().noop_edit(iv, job_status)
        now = self.values_in_force(list(iv.changes))
        if iv.changes and all(now.get(k) == v for k, v in iv.changes.items()):
            return "the run already has " + ", ".join(f"{k}={v!r}" for k, v in iv.changes.items())
        return None

    def prepare(self, iv: Intervention, s: Any) -> Intervention | None:
        if not self.script:
            return super().prepare(iv, s)
        target = self.rollback_target(iv) if iv.kind == InterventionKind.ROLLBACK else None
        out, why = adapt(iv, self.settings(), self.evidence(s.job_status), target)
        if out is None:
            key = ("not_applicable", iv.signature())
            if key not in self.memo.findings:   # once per fix and controller process
                self.memo.findings.add(key)
                self.store.log("not_applicable", operator=iv.operator, iv_kind=iv.kind.value,
                               diagnosis=iv.diagnosis.name, reason=why, step=s.step)
            return None
        return super().prepare(out, s)

    def algorithm(self) -> str | None:
        """The label the script's metrics rows carry (`algorithm: sft`), None when it gives none."""
        for r in reversed(read_jsonl(self.run_dir / "metrics.jsonl")):
            if isinstance(r.get("algorithm"), str):
                return r["algorithm"]
        return None

    def _backtest_arms(self, iv: Intervention, ack: dict[str, Any]) -> None:
        """`Deciding._backtest_arms` for a script run: the same looks, rule settings and recorded
        result, with the arms forked from the checkpoint the script saved on the backtest's
        `checkpoint` command (`swarm.script_backtest.run_script_arms`). The noise model takes the
        script's held-out size where its eval rows give it."""
        if not self.script:
            return super()._backtest_arms(iv, ack)
        bt = self.goal.swarm.backtest
        iid = iv.id
        ckpt = str((ack.get("result") or {}).get("checkpoint") or "")
        target = self.rollback_target(iv) if iv.kind == InterventionKind.ROLLBACK else None
        cand = next((c for c in self.checkpoints() if c["name"] == target), None)
        # as Deciding._backtest_arms: a rollback's candidate starts from its checkpoint; the control
        # too when the steps since gained nothing (carrying on from there is worth nothing, and an
        # arm from the start against one hundreds of steps on would score its head start)
        common = cand is not None and self.nothing_staked(int(cand["step"]))
        control = (str(cand["path"]), int(cand["step"])) if common else (ckpt, int(ack["step"]))
        looks = schedule(bt.seeds, iv.diagnosis.severity == "critical", bt.critical_extend)
        before = self.tries_without_gain(iv)
        retry = retry_horizon(bt.horizon_steps, before)
        # both arms from the rollback's checkpoint: they train at least the steps it gives up
        base = rollback_horizon(retry, control[1], int(ack["step"])) if common else retry
        algorithm = self.algorithm()
        cpu = 0.0
        sizes: list[int] = []
        notes = [f"{before} earlier backtest(s) of this fix gained too little to tell: horizon {retry} steps"] if retry > bt.horizon_steps else []
        if common:
            notes.append(f"both arms from checkpoint {target} (step {cand['step']}): the steps since gained nothing measurable")
        if base > retry:
            notes.append(f"horizon {base} steps: the {int(ack['step']) - control[1]} steps the rollback gives up, over which "
                         "the live run was diagnosed" + (" (capped)" if base < int(ack["step"]) - control[1] else ""))

        def measure(look: Look, seeds: list[int]) -> list[Pair]:
            nonlocal cpu
            ps, c, n = self.script_arms(iv, argv=self.script.argv(), cwd=self.script.cwd, live_run_dir=self.run_dir,
                                        checkpoint=control[0], step=control[1],
                                        candidate_checkpoint=str(cand["path"]) if cand else None,
                                        candidate_step=int(cand["step"]) if cand else None, metric=self.goal.target.metric,
                                        horizon=base * look.horizon_factor, seeds=seeds, workdir=self.sdir / "backtests",
                                        log_dir=self.sdir / "logs",
                                        label=f"-x{look.horizon_factor}" if look.horizon_factor > 1 else "")
            cpu += c
            sizes.extend([n] if n else [])
            return ps

        def rule_at(n: int) -> Rule:
            return script_rule(iv, algorithm, alpha=bt.alpha, share=try_share(before), higher_is_better=self.goal.target.op == ">=",
                               metric=self.goal.target.metric, eval_size=min(sizes) if sizes else bt.eval_size,
                               looks=len(looks), look=n)

        try:
            d, pairs, look, extended = run_looks(looks, measure, rule_at)
        except (OSError, ValueError) as e:   # no arm could start (e.g. the checkpoint is gone): a refusal, recorded
            self.store.transition(iid, Status.REJECTED, f"the backtest's arms could not start: {e}")
            return
        finally:   # the arms' copy of the live checkpoint: every look of this backtest is done with it
            shutil.rmtree(self.sdir / "backtests" / f"fork-{iid}", ignore_errors=True)
        where = ((f"the candidate forked from the script's {target} at step {cand['step']}, the control from "
                  if cand and not common else "arms forked from the script's ")
                 + f"{pathlib.Path(control[0]).name if not common else target} at step {control[1]}; held-out size "
                 + (f"{min(sizes)} (the script's)" if sizes else f"{bt.eval_size} (the goal's: the script reports none)"))
        self.record_backtest(iid, d, pairs, looks, look, extended, base, notes, cpu, after=(where,))

    def roll_back(self, iv: Intervention, note: str) -> None:
        if not self.script:
            return super().roll_back(iv, note)
        iv = self.store.get(iv.id)
        before = {k: v for k, v in (iv.outcome.before or {}).items() if k in iv.changes and v is not None}
        ack = (self.command("set_fields", f"{iv.id}-undo", fields=trainer_fields(before))
               if len(before) == len(iv.changes) else None)
        iv.outcome.undone = accepted(ack)
        self.store.put(iv)
        if self.ws.pr_state(iv.id) == "merged":
            self.ws.rollback(iv.id)
        done = ("the settings it replaced are set again; the weights trained since are kept" if iv.outcome.undone else
                f"its settings could not be set back ({(ack or {}).get('reason') or 'no value before it is known'}); left in force")
        self.store.transition(iv.id, Status.ROLLED_BACK, f"{note}; {done}")


def pr_view(iv: Intervention) -> Intervention:
    """The intervention as the workspace's git files see it: a script run's change edits no file of
    the workspace (intervention.json, rewritten by the reports, keeps the change)."""
    return iv.model_copy(update={"changes": {}})


def log_launch(store: Any, ep: Any, run_dir: pathlib.Path) -> None:
    store.log("script_launched", command=command_line(ep), cwd=str(ep.cwd), run_dir=str(run_dir))


def script_jobs(ep: Any, log_dir: pathlib.Path, jobs: str, address: str | None = None,
                saved_head: Any = None, on_head: Any = None, **reserve: Any) -> Any:
    """The launcher of a script goal: `swarm.jobs.ScriptJobs` (the relauncher as a local process) for
    `process`, `swarm.script_jobs.ScriptRayJobs` (the relauncher as a Ray job) for `ray`. For Ray:
    `address` (None: a private head), `saved_head` (a callable giving the head the run recorded, read
    only without an address), `on_head` and `reserve` (job_cpus, job_resources, run_key), as
    `swarm.jobs.RayJobs` takes them."""
    from swarm.jobs import ScriptJobs
    from swarm.script_jobs import ScriptRayJobs

    if jobs == "process":
        return ScriptJobs(ep, log_dir, cwd=ep.cwd)
    if jobs == "ray":
        return ScriptRayJobs(ep, address, saved=None if address or saved_head is None else saved_head(), on_head=on_head,
                             **reserve)
    raise ValueError(f"--jobs={jobs!r}: must be process or ray")
