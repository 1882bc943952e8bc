"""The goal file: what the user asks the swarm for.

    goal: "a policy that adds 3-digit numbers with >= 95% exact match within 20 CPU minutes"
    target: {metric: heldout_acc, op: ">=", threshold: 0.95}
    run: {task: …, model: …, recipe: …, harness: …}        # the starting point (a RunConfig)
    budget: {wall_s: 1200, steps: 4000, worker_cpu_s: 2400, llm_usd: 0.5}
    approval: {auto: [low, medium]}                       # the rest waits for a human
    llm: {model: null}                                    # null → built-in policies
    perturbations: [{shortcut: lr_spike, at_step: 200}]   # evaluation only; handed to the trainer alone
    swarm: {observe_every_s: 2, observe_quiet_s: 4, backtest: {...}}
    memory: {library: ~/swarm-library, seed_skills: true}   # skills + episodes shared across workspaces
    pilot: {enabled: true, share: 0.15}                   # the pilot before a planned run (swarm/pilot.py)
    sandbox: isolated                                     # unsafe_plain: run untrusted code unisolated where nothing isolates

Validated up front: a malformed goal is one line naming the field, exit code 2.

A goal may run the user's own training script instead of this project's trainer (a Hugging Face /
TRL script steered through `trainer.steer`, docs/steering.md): `run:` then holds only an entrypoint:

    target: {metric: heldout_acc, op: ">=", threshold: 0.2}
    run:
      entrypoint:
        script: examples/steer/sft_addition.py          # relative to the working directory
        args: ["--max_steps", "2000", "--learning_rate", "0.05"]
        metric: eval_accuracy                           # what the script logs; SwarmCallback writes heldout_acc

The script must exist. `metric` must be an evaluation metric that the Trainer logs (`eval_…`).
The target must read the name SwarmCallback writes for it (`trainer.steer.metrics.run_name`).
Faults go in the script's own arguments, not in `perturbations:`.

A goal may drive the agent trainer (multi-turn, tool-using policies, docs/agent-training.md): `run:`
then holds only `agent:`, AgentTrainConfig's fields, validated as the trainer validates them
(swarm/agent_run.py); the target reads `heldout_acc`; a harness fault goes in
`run.agent.harness_fault`:

    run:
      agent: {env: lookup, difficulty: 1, sft: {steps: 300}, grpo: {steps: 400}}

A goal may be as short as its sentence, a target and a budget:

    goal: a policy that sorts lists of 5 digits with >= 90% held-out exact match
    target: {metric: heldout_acc, op: ">=", threshold: 0.9}
    budget: {worker_cpu_s: 1800}

The task comes from `run.task` when written, else from the sentence (swarm/words.py: a documented
matcher over the task registry). The fields `run:` leaves out are chosen by the plan from the task's
own facts, each with its source (swarm/plan.py); a goal that writes `run.task` keeps today's
contract: its run as written, RunConfig's defaults for the rest. `Goal.load` (a goal file: the
user's words) refuses a sentence that names no task, two tasks equally, another task than
`run.task`, or a difficulty the task does not have; `Goal.parse` (goals built in code, the
controller's saved copy) records the same understanding in `goal.understood` and refuses nothing.
"""
from __future__ import annotations

import pathlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from agents.domain import ApprovalPolicy, Budget, LLMSettings, Target
from trainer.config import EVAL_MAX, ConfigError, Perturbation, RunConfig, format_validation_error, load_yaml
from trainer.runlog import HELDOUT_METRICS

OBSERVE_MAX_S = 3600.0         # the longest wait between two ticks: a problem is seen within the hour
STALE_HEARTBEAT_MAX_S = 86400.0
PROGRAM_TIMEOUT_MAX_S = 600.0  # a skill program is a quick check of a run's evidence


class _Setting(BaseModel):
    # allow_inf_nan=False: every float setting is finite (`.inf` would make a sleep or a timeout
    # overflow or never end); `.inf`/`.nan` is refused naming the field
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class BacktestSettings(_Setting):
    horizon_steps: int = Field(60, ge=1, description="steps each arm trains after the fork")
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1, description="one candidate and one control per seed")
    alpha: float = Field(0.2, gt=0, lt=1, description="one-sided significance level of the paired test")
    eval_size: int = Field(200, ge=10, le=EVAL_MAX, description="held-out examples each arm is scored on at the end "
                           f"of its horizon (at most {EVAL_MAX})")
    critical_extend: int = Field(4, ge=1, description="a fix for a critical finding that its backtest did not "
                                 "validate is backtested once more, over this many times horizon_steps (1 = never): "
                                 "e.g. a restored prompt template pays off only once a slow run starts to learn")


class SwarmSettings(_Setting):
    observe_every_s: float = Field(2.0, gt=0, le=OBSERVE_MAX_S, description="seconds between ticks while something "
                                   f"is wrong or open (at most {OBSERVE_MAX_S:g})")
    observe_quiet_s: float | None = Field(None, gt=0, le=OBSERVE_MAX_S, description="seconds after a quiet tick "
                                          "(nothing wrong, nothing open, nothing new): what a healthy run of days pays "
                                          "for being watched, and how late the first sign of a problem may be seen; "
                                          f"None = observe_every_s (at most {OBSERVE_MAX_S:g})")
    min_steps_between_interventions: int = Field(50, ge=0, description="trainer steps after an applied intervention "
                                                 "before the next non-urgent one (restarts and rollbacks are urgent)")
    evaluate_window_steps: int = Field(100, ge=1, description="steps after applying before judging kept / rolled back")
    stale_heartbeat_s: float = Field(20.0, gt=0, le=STALE_HEARTBEAT_MAX_S, description="seconds without a trainer "
                                     "heartbeat, at least, before a RUNNING job counts as hung (the detector also "
                                     f"allows many median step times; at most {STALE_HEARTBEAT_MAX_S:g})")
    max_restarts: int = Field(5, ge=0, description="job restarts allowed; a job that fails after this many ends the run")
    job_cpus: float | None = Field(None, gt=0, description="CPUs each Ray job (the live job, its restarts, backtest "
                                   "arms) reserves for its trainer (Ray's entrypoint_num_cpus); None = no reservation, "
                                   "and Ray runs every job's trainer on the head node")
    job_resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources each job reserves "
                                            "(Ray's entrypoint_resources), e.g. {trainer_node: 1} to place jobs on the "
                                            "nodes that declare it")
    storage: str | None = Field(None, description="run storage for Ray jobs (docs/cluster.md): a pyarrow.fs URI "
                                "(file://, s3://, gs://, hdfs://) or a folder every node reaches; each job then works in its "
                                "node's scratch folder and mirrors its run there, and the controller reads only the storage. "
                                "None = the run folders are local (one machine)")
    backtest: BacktestSettings = Field(default_factory=BacktestSettings, description="how a proposal is tested against "
                                       "doing nothing before it is applied")

    @model_validator(mode="after")
    def _resources_positive(self) -> "SwarmSettings":
        bad = {k: v for k, v in self.job_resources.items() if not v > 0 or not k}
        if bad:
            raise ValueError(f"job_resources {bad}: each resource needs a name and an amount > 0")
        return self

    @model_validator(mode="after")
    def _quiet_not_faster(self) -> "SwarmSettings":
        if self.observe_quiet_s is not None and self.observe_quiet_s < self.observe_every_s:
            raise ValueError(f"observe_quiet_s={self.observe_quiet_s:g} is shorter than observe_every_s="
                             f"{self.observe_every_s:g}: a quiet run would be watched more often than a troubled one")
        return self

    def wait_s(self, quiet: bool) -> float:
        """The wait before the next tick: longer after a quiet one."""
        return (self.observe_quiet_s or self.observe_every_s) if quiet else self.observe_every_s


class MemorySettings(_Setting):
    """Vector memory and the skill library (memory/, skills/, agents/miner.py)."""

    library: str | None = Field(None, description="a user-level library folder shared across workspaces (skills/, "
                                                  "episodes, chroma index); None: $SWARMLAB_LIBRARY, else the workspace's .swarm/memory")
    backend: Literal["chroma", "memory"] = Field("chroma", description="the episode index: chromadb on disk, or an "
                                                                       "in-process index rebuilt from the episode log at each start")
    seed_skills: bool = Field(True, description="start the workspace's skills/ with the seed library shipped with swarmlab")
    retrieve_skills: int = Field(5, ge=0, le=50, description="skills retrieved into the operators' context per diagnosis")
    retrieve_episodes: int = Field(8, ge=0, le=100, description="past episodes retrieved into the operators' context")
    avoid_after_losses: int = Field(1, ge=0, description="a fix (diagnosis, kind, fields and values) that lost this many times "
                                                         "in memory and never won is not proposed again; 0 = never avoid")
    trust_after_wins: int = Field(1, ge=0, description="a fix backed by a skill with this many wins (the episodes it "
                                                       "was mined from + its applications) and no loss skips the "
                                                       "backtest; it is still judged after applying and rolled back "
                                                       "if worse (a loss that ends the trust). 0 = always backtest")
    mine: bool = Field(True, description="run the skill miner after interventions are evaluated")
    min_support: int = Field(1, ge=1, description="wins of one fix needed before the miner writes a skill for it")
    retire_after_losses: int = Field(2, ge=1, description="a skill whose applications lost this many times, and more "
                                                          "often than they won, is retired")
    program_timeout_s: float = Field(5.0, gt=0, le=PROGRAM_TIMEOUT_MAX_S, description="sandbox wall time for one "
                                     f"skill program run (at most {PROGRAM_TIMEOUT_MAX_S:g})")


class PilotSettings(_Setting):
    """The pilot before a planned run: a few short runs over model size x lr (swarm/pilot.py)."""

    enabled: bool = Field(True, description="run the pilot before `swarm run` trains a goal whose plan fills the model "
                          "size or the lr (its task comes from the words and it writes not all of model.d_model, "
                          "model.n_layers, recipe.lr); false, or `swarm run --no-pilot`: the closest remembered plan of a past "
                          "run on the task family, else the plan's defaults, train")
    share: float = Field(0.15, gt=0, le=1, description="the pilot's worker CPU as a share of budget.worker_cpu_s; it "
                         "is counted in the run's worker-CPU meter and budget")


class Entrypoint(_Setting):
    """A user's training script that the swarm runs instead of this project's trainer."""

    script: str = Field(..., min_length=1, max_length=4096, description="the training script (a path, relative "
                        "to the working directory); it attaches SwarmCallback (trainer.steer)")
    args: list[str] = Field(default_factory=list, max_length=1000, description="its command-line arguments "
                            "(a change the swarm makes is appended as `--NAME VALUE`)")
    metric: str = Field("eval_accuracy", min_length=1, max_length=200, description="the evaluation metric the "
                        "script logs (a Trainer `eval_…` name) that the goal's target reads, under the name "
                        "SwarmCallback writes for it (eval_accuracy → heldout_acc, eval_X → heldout_X)")
    python: str | None = Field(None, max_length=4096, description="the interpreter that runs the script; None: "
                               "the one running swarm")
    cwd: str | None = Field(None, max_length=4096, description="the folder the script runs in (its relative paths, "
                            "e.g. --output_dir); None: the working directory. `swarm run` records it, with the "
                            "script's absolute path, in the goal it saves, so `swarm resume` works from anywhere")

    def argv(self) -> list[str]:
        """The script's command line: the interpreter, the script, its arguments."""
        import sys

        base = pathlib.Path(self.cwd or ".").expanduser()
        return [self.python or sys.executable, str((base / pathlib.Path(self.script).expanduser()).resolve()), *self.args]


class Goal(_Setting):
    goal: str = Field(..., min_length=1, description="the request in words, for the operators, the reports and memory")
    target: Target = Field(default_factory=Target, description="the metric and threshold that end the run when met")
    run: dict[str, Any] = Field(default_factory=dict, description="the starting RunConfig (task, model, recipe, harness, …)")
    budget: Budget = Field(default_factory=Budget, description="the limits that end the run when spent")
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy, description="which interventions apply without a human")
    llm: LLMSettings = Field(default_factory=LLMSettings, description="the LLM behind the operators' policies, if any")
    perturbations: list[Perturbation] = Field(default_factory=list, description="faults injected for evaluation; handed "
                                              "to the trainer alone, never shown to the operators")
    swarm: SwarmSettings = Field(default_factory=SwarmSettings, description="the controller's loop, pacing and backtests")
    memory: MemorySettings = Field(default_factory=MemorySettings, description="skills and past episodes: where they live, "
                                   "how many are retrieved, when the miner writes or retires one")
    pilot: PilotSettings = Field(default_factory=PilotSettings, description="the pilot that picks the model size "
                                 "and lr the goal leaves out, before the run (swarm/pilot.py)")
    sandbox: Literal["isolated", "unsafe_plain"] = Field(
        "isolated", description="untrusted code (skill programs, code-task rewards) runs in Docker, bubblewrap or "
        "unshare namespaces, and is refused where none works; unsafe_plain lets it run in a plain subprocess that "
        "shares the host's network and files instead (warned at run start and in the report)")
    notify: str | None = Field(
        None, max_length=4096, description="a command run when an intervention starts waiting for approval and when "
        "the run ends (split like a shell line, run without a shell; SWARM_EVENT, SWARM_INTERVENTION, SWARM_DETAIL, "
        "SWARM_APPROVE, SWARM_WORKSPACE in its environment); `--notify` on the command line overrides it")

    # what the sentence was understood as (swarm.words) and the plan (swarm.plan), kept for the
    # (goal, run) they were made from: a goal changed after parsing is understood afresh
    _words: dict[str, Any] = PrivateAttr(default_factory=dict)

    def _key(self, what: str) -> str:
        import json

        return json.dumps([what, self.goal, self.run], sort_keys=True, default=str)

    def _memo(self, what: str, make: Any) -> Any:
        key = self._key(what)
        if key not in self._words:
            self._words[key] = make()
        return self._words[key]

    @property
    def entrypoint(self) -> Entrypoint | None:
        """The script this goal runs (`run.entrypoint`), None for a goal on this project's trainer."""
        if "entrypoint" not in self.run:
            return None
        return Entrypoint.model_validate(self.run["entrypoint"])

    @property
    def agent(self) -> dict[str, Any] | None:
        """The agent run this goal drives (`run.agent`: AgentTrainConfig fields, swarm/agent_run.py),
        None for any other goal."""
        return self.run["agent"] if isinstance(self.run.get("agent"), dict) else None

    @property
    def understood(self) -> Any:
        """`swarm.words.Understood | Refused` for this goal."""
        from swarm.words import understand

        task = self.run.get("task") if "task" in self.run else None
        written = task if isinstance(task, dict) or task is None else {"name": task}
        return self._memo("understood", lambda: understand(self.goal, written))

    def plan(self) -> Any:
        """The `swarm.plan.Plan` of this goal, None when its sentence is refused."""
        from swarm.plan import make_plan
        from swarm.words import Refused

        u = self.understood
        return None if isinstance(u, Refused) else self._memo("plan", lambda: make_plan(u, self.run, self.goal))

    def adopt(self, plan: Any) -> None:
        """Make `plan` (this goal's plan with later choices: the pilot's) the one `plan()`,
        `planned_run()` and `run_config()` use. A plan made for another goal or run is refused."""
        own = self.plan()
        if own is None or plan.goal != own.goal or plan.task != own.task or plan.applied != own.applied:
            raise ValueError("goal.adopt: the plan was made for another goal (its sentence, task or run differ)")
        self._words[self._key("plan")] = plan

    def planned_run(self) -> dict[str, Any]:
        """The run to train: `run` as written, filled by the plan when the task comes from the words."""
        from swarm.words import Understood

        u = self.understood
        if isinstance(u, Understood) and u.source == "words":
            return self.plan().run(self.run)
        return self.run

    def run_config(self, name: str, out_dir: str, with_perturbations: bool = False) -> RunConfig:
        """The trainer config. Perturbations are included only for the job the trainer runs. A goal
        that runs a script has none (a ConfigError of one line)."""
        if "entrypoint" in self.run:
            raise ConfigError("invalid goal: run.entrypoint: this goal runs a script, not the project's trainer; "
                              "it has no trainer config (swarm/script_run.py, docs/steering.md)")
        if "agent" in self.run:
            raise ConfigError("invalid goal: run.agent: this goal runs the agent trainer; its config is "
                              "run.agent (swarm/agent_run.py, docs/agent-training.md)")
        data = {**self.planned_run(), "name": name, "out_dir": out_dir}
        data.pop("perturbations", None)
        if with_perturbations:
            data["perturbations"] = [p.model_dump(exclude_unset=True) for p in self.perturbations]
        return RunConfig.parse(data)

    def public(self) -> dict[str, Any]:
        """The goal as operators, prompts, reports and memory may see it: no perturbations."""
        d = self.model_dump(mode="json")
        d.pop("perturbations", None)
        if self.agent is not None:   # an agent run's faults are its perturbations
            from swarm.agent_run import public_run

            d["run"] = public_run(d["run"])
        return d

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "Goal":
        """A goal file: validated, and its sentence understood (else a ConfigError of one line)."""
        from swarm.words import Refused

        goal = cls.parse(load_yaml(path, "goal file"))
        if goal.entrypoint is None and "agent" not in goal.run and isinstance(goal.understood, Refused):
            # a script's task is its own, an agent run's its environment
            raise ConfigError(goal.understood.line)
        return goal

    @classmethod
    def parse(cls, data: Any) -> "Goal":
        if not isinstance(data, dict):
            raise ConfigError(f"goal must be a mapping, got {type(data).__name__}")
        try:
            goal = cls.model_validate(data)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e).replace("invalid config", "invalid goal")) from None
        if "entrypoint" in goal.run:
            _check_script_goal(goal)
            return goal
        if "agent" in goal.run:
            from swarm.agent_run import check_agent_goal

            check_agent_goal(goal)
            _check_paths(goal)
            return goal
        _check_target(goal.target)
        if "perturbations" in goal.run:   # run_config() would drop them: a fault that never fires
            raise ConfigError("invalid goal: run.perturbations: a goal's faults go in its top-level `perturbations:` "
                              "(handed to the trainer alone)")
        if goal.notify is not None:
            try:   # the check `swarm run` makes of its hook, so `swarm validate` refuses what run would
                notify_argv(goal.notify, "notify")
            except ValueError as e:
                raise ConfigError(f"invalid goal: {e}") from None
        try:   # the goal's own fields first, so an error names what the user wrote, never a plan's choice
            RunConfig.parse({**goal.run, "name": "check", "out_dir": "/tmp"})
            goal.run_config("check", "/tmp", with_perturbations=True)
        except ConfigError as e:
            raise ConfigError(str(e).replace("invalid config: ", "invalid goal: run.")) from None
        except ValueError as e:   # the plan's task could not be built from what the words named
            raise ConfigError(f"invalid goal: goal: {e}") from None
        from trainer.perturb import check_overrides

        cfg = goal.run_config("check", "/tmp")
        try:  # checked as the trainer will, before anything starts
            check_overrides(cfg, goal.perturbations)
        except ValueError as e:
            raise ConfigError(f"invalid goal: {e}") from None
        from trainer.preflight import check_run

        try:  # the task built, registries and memory checked: else the job fails and is restarted in a loop
            check_run(cfg)
        except ConfigError as e:
            raise ConfigError(f"invalid goal: run.{e}") from None
        _check_paths(goal)
        return goal


def _check_target(target: Target) -> None:
    """The target names a metric the trainer writes (trainer.runlog.HELDOUT_METRICS, the names its
    evaluation writes for every task and algorithm) and a threshold that metric can reach: a run
    toward any other would go on until its budget is spent."""
    metric = target.metric
    if metric not in HELDOUT_METRICS:
        odd = next((c for c in metric if not c.isascii() or not c.isprintable() or c.isspace()), None)
        hint = f" (it holds {odd!r}, U+{ord(odd):04X})" if odd is not None else ""
        raise ConfigError(f"invalid goal: target.metric={metric!r}: not a held-out metric the trainer writes{hint}; "
                          f"known: {', '.join(HELDOUT_METRICS)}")
    if not 0.0 <= target.threshold <= 1.0:
        raise ConfigError(f"invalid goal: target.threshold={target.threshold!r}: {metric} is a rate, in [0, 1]")


def _check_script_goal(goal: Goal) -> None:
    """A goal that runs a script: `run` holds the entrypoint alone, its metric is an evaluation
    metric that SwarmCallback writes under the name the target reads, and the script exists. Then
    the checks every goal gets (notify, folders)."""
    from trainer.steer.metrics import EVAL_TIMINGS, run_name

    others = sorted(k for k in goal.run if k != "entrypoint")
    if others:
        raise ConfigError(f"invalid goal: run.{others[0]}: a goal that runs a script (run.entrypoint) takes no "
                          "trainer config; the script's own arguments go in run.entrypoint.args")
    if not isinstance(goal.run["entrypoint"], dict):
        raise ConfigError(f"invalid goal: run.entrypoint={goal.run['entrypoint']!r}: must be a mapping "
                          "(script, args, metric)")
    try:
        ep = Entrypoint.model_validate(goal.run["entrypoint"])
    except ValidationError as e:
        raise ConfigError(format_validation_error(e).replace("invalid config: ", "invalid goal: run.entrypoint.")) from None
    if goal.swarm.storage:
        raise ConfigError(f"invalid goal: swarm.storage={goal.swarm.storage!r}: a goal that runs a script keeps its run "
                          "folder where the script runs; run storage serves the project's trainer only")
    if goal.perturbations:
        raise ConfigError("invalid goal: perturbations: a goal that runs a script injects its faults in its own "
                          "arguments (run.entrypoint.args)")
    if not ep.metric.startswith("eval_") or ep.metric in EVAL_TIMINGS:
        raise ConfigError(f"invalid goal: run.entrypoint.metric={ep.metric!r}: not an evaluation metric (eval_…, "
                          "not a timing); a target reads held-out metrics, which SwarmCallback writes only from "
                          "the Trainer's evaluations")
    written = run_name(ep.metric)
    if goal.target.metric != written:
        raise ConfigError(f"invalid goal: target.metric={goal.target.metric!r}: SwarmCallback writes "
                          f"run.entrypoint.metric={ep.metric!r} as {written!r}; the target must read {written!r}")
    if written in HELDOUT_METRICS and not 0.0 <= goal.target.threshold <= 1.0:
        raise ConfigError(f"invalid goal: target.threshold={goal.target.threshold!r}: {written} is a rate, in [0, 1]")
    script = pathlib.Path(ep.cwd or ".").expanduser() / pathlib.Path(ep.script).expanduser()
    if ep.cwd is not None and not pathlib.Path(ep.cwd).expanduser().is_dir():
        raise ConfigError(f"invalid goal: run.entrypoint.cwd={ep.cwd!r}: folder not found")
    if not script.is_file():
        raise ConfigError(f"invalid goal: run.entrypoint.script={ep.script!r}: file not found (a path relative to "
                          f"the working directory, {str(pathlib.Path.cwd())!r})")
    if ep.python is not None:
        import shutil

        if shutil.which(ep.python) is None:
            raise ConfigError(f"invalid goal: run.entrypoint.python={ep.python!r}: no such interpreter")
    if goal.notify is not None:
        try:
            notify_argv(goal.notify, "notify")
        except ValueError as e:
            raise ConfigError(f"invalid goal: {e}") from None
    _check_paths(goal)


def notify_argv(command: str, name: str = "--notify") -> list[str]:
    """The argv of a notification hook (a goal's `notify:`, `swarm run --notify`): split like a
    shell line, run without a shell. A ValueError naming `name` and the command when it does not
    split, is empty, or names a program that is not found."""
    import shlex
    import shutil

    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise ValueError(f"{name}={command!r}: {e}") from None
    if not argv:
        raise ValueError(f"{name}: the command is empty")
    if shutil.which(argv[0]) is None:
        raise ValueError(f"{name}={command!r}: no command {argv[0]!r} found")
    return argv


def _writable_dir(path: str) -> str | None:
    """Why `path` cannot be (or become) a folder this user writes, None if it can. Nothing is created."""
    import os

    p = pathlib.Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            return "exists and is not a folder"
        return None if os.access(p, os.W_OK | os.X_OK) else "not writable"
    parent = next((a for a in p.absolute().parents if a.exists()), None)
    if parent is None or not parent.is_dir():
        return f"cannot be created ({str(parent)!r} is not a folder)"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be created ({str(parent)!r} is not writable)"


def _check_paths(goal: Goal) -> None:
    """Folders the run writes to, checked before the workspace is made (a failure after it would
    leave a workspace that can neither run nor resume)."""
    llm = goal.llm
    if llm.replay and not llm.model:
        raise ConfigError("invalid goal: llm.replay=True: needs llm.model (the model whose exchanges were recorded)")
    if llm.replay and not llm.record_dir:
        raise ConfigError("invalid goal: llm.replay=True: needs llm.record_dir (where the exchanges were recorded)")
    if llm.replay and not pathlib.Path(str(llm.record_dir)).expanduser().is_dir():
        raise ConfigError(f"invalid goal: llm.record_dir={llm.record_dir!r}: folder not found (llm.replay reads the "
                          "exchanges recorded there)")
    for field, value in (("llm.record_dir", llm.record_dir), ("memory.library", goal.memory.library)):
        why = _writable_dir(value) if value else None
        if why:
            raise ConfigError(f"invalid goal: {field}={value!r}: {why}")
