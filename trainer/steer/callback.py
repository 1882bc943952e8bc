"""`SwarmCallback`: makes a Hugging Face `Trainer` (or a TRL trainer built on it) a run the swarm
reads and steers, without changing the user's script beyond one line.

    trainer = Trainer(model=model, args=args, train_dataset=ds, eval_dataset=ev)
    steer(trainer, run_dir="runs/my-run")        # = trainer.add_callback(SwarmCallback(..., trainer=trainer))
    trainer.train()

What it writes to RUN_DIR (the built-in trainer's format, `docs/run-files.md`, read by the same
readers): `metrics.jsonl` (one row per Trainer log, names mapped by `trainer.steer.metrics`, eval
rows with `heldout_*` keys), `samples.jsonl` (completions where the trainer keeps them: TRL's
`_logs`), `events.jsonl`, `heartbeat.json`, `metrics_summary.json`, a checkpoint index
`checkpoints/<name>.json` pointing at the Trainer's `checkpoint-N` folders, `settings.json` (the
declared settings, the values in force, the command overrides), `restart.json` (the newest
restart request) and `command_log.jsonl` (acknowledgements).

What it does at each step end (the Trainer's safe point: the optimizer and the scheduler have
stepped, nothing is in flight): rank 0 reads new commands, every rank gets them by broadcast when
torch.distributed is initialised, every rank applies them, rank 0 acknowledges them:
  set_fields  validated by `check_change` against the declared settings (refused: acked
              `rejected` with the reason). A hot change is applied whole and read back
              (`trainer.steer.apply`); a failure restores what was set and is acked `rejected`,
              "failed: …". A change with any restart setting is not applied here: the callback
              saves a checkpoint, writes `restart.json` and stops the run; the ack (`restart`)
              names the checkpoint. A relaunch with the change is the relauncher's; when it comes
              back, the callback records in `restart.json` whether the args hold the change.
  eval        evaluate now (acked when the evaluation has run, with its held-out metrics).
  checkpoint  save now (acked when saved, with the folder).
  rollback    {"name": N}: start over from the checkpoint the index names N (`init`, the untrained
              start, or a `checkpoint-<step>`): acked `restart`, `restart.json` names that
              checkpoint, and the run stops (inside a pause: when the pause ends, so the
              `set_fields` sent in the pause go with it, acked `restart` too). The relauncher
              relaunches from it; the relaunched callback applies the hot part of those changes
              (the restart part comes as flags) and drops from the index the checkpoints of the
              abandoned steps.
  stop        stop after this step.
  pause       hold the run at this step end (heartbeat `paused`, rewritten while it waits) and
              handle the commands that arrive, until `resume` or `stop`: a backtest's arms get the
              cores and the live run trains nothing the arms do not measure.
  resume      go on after a pause.
A fork (a backtest arm: `trainer.steer.fork`) runs with `stop_at_step` (or `$SWARMLAB_STOP_AT_STEP`):
at that step the callback has the Trainer evaluate once and stop, so the arm ends with the held-out
metric while the run's own schedule (its `max_steps`, hence its lr curve) is unchanged.
A run that starts at step 0 (not a fork: `settings.json` says `fork`; not a relaunch from `init`) first saves its untrained
state as a Trainer checkpoint, `<output_dir>/swarm-init`, indexed as `init` (what the built-in
trainer keeps as `checkpoints/init.pt`): a run that a wrong setting kept from learning has nothing
worth keeping in its weights, and a fix is tried and applied from the start (`save_init=False`:
none; it costs one save of the model, before the optimizer holds any state).
Hot changes acked `applied` persist in `settings.json` ("overrides") and are applied again when
the run resumes in the same RUN_DIR, whatever the checkpoint holds; a command id acked once is
never processed again.
"""
from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any, Iterable, Mapping

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trainer.distributed import Dist
from trainer.runlog import INIT_CHECKPOINT, RunLog, atomic_write_text, iter_jsonl
from trainer.steer.apply import ApplyError, Live, apply_change, decay_group_indices, read
from trainer.steer.fork import STOP_AT_ENV
from trainer.steer.inbox import SteerInbox
from trainer.steer.metrics import SUMMARY_KEYS, is_summary, run_metrics
from trainer.steer.settings import (ACTIONS, SETTINGS_FILE, Setting, check_change, coerce, declared_settings,
                                    needs_restart, settings_version)

HEARTBEAT_EVERY_S = 0.5
RESTART_FILE = "restart.json"
INIT_FOLDER = "swarm-init"   # under output_dir; not `checkpoint-*`, so the Trainer's rotation never removes it
ALGORITHMS = {"GRPOTrainer": "grpo", "SFTTrainer": "sft", "DPOTrainer": "dpo", "GKDTrainer": "distill",
              "RLOOTrainer": "rloo", "PPOTrainer": "ppo", "KTOTrainer": "kto", "ORPOTrainer": "orpo"}


def _algorithm(trainer: Any) -> str | None:
    for cls in type(trainer).__mro__ if trainer is not None else ():
        if cls.__name__ in ALGORITHMS:
            return ALGORITHMS[cls.__name__]
    return None


def _fresh(old: list[str], new: list[str]) -> int:
    """How many items at the end of `new` were not in `old`: a bounded deque that had items
    appended holds old[j:] + the new ones, for the smallest such j."""
    for j in range(len(old) + 1):
        k = len(old) - j
        if k <= len(new) and new[:k] == old[j:]:
            return len(new) - k
    return len(new)


class SwarmCallback(TrainerCallback):
    """See the module docstring. `run_dir` defaults to `$SWARMLAB_RUN_DIR`, else
    `<output_dir>/swarm`. `trainer` (or `bind`) gives access to what callbacks are not handed:
    generation settings, completions, the eval dataset. `metric_names` maps the user's own log
    names to the run format's (e.g. {"eval_exact_match": "heldout_acc"}). `extra_settings` declares
    settings of the user's script that a relaunch applies. `poll_every` reads the inbox every N
    optimizer steps. `stop_at_step` (default `$SWARMLAB_STOP_AT_STEP`): evaluate and stop at that
    step (a backtest arm). `save_init`: save the untrained start as the checkpoint `init`."""

    def __init__(self, run_dir: str | os.PathLike | None = None, *, trainer: Any = None,
                 metric_names: Mapping[str, str] | None = None, extra_settings: Iterable[Setting] = (),
                 samples_per_log: int = 4, algorithm: str | None = None, poll_every: int = 1,
                 stop_at_step: int | None = None, save_init: bool = True) -> None:
        if poll_every < 1:
            raise ValueError(f"poll_every={poll_every} must be >= 1")
        if stop_at_step is None and os.environ.get(STOP_AT_ENV):
            raw = os.environ[STOP_AT_ENV]
            try:
                stop_at_step = int(raw)
            except ValueError:
                raise ValueError(f"${STOP_AT_ENV}={raw!r} must be an integer step") from None
        if stop_at_step is not None and stop_at_step < 1:
            raise ValueError(f"stop_at_step={stop_at_step} must be >= 1")
        if samples_per_log < 0:
            raise ValueError(f"samples_per_log={samples_per_log} must be >= 0")
        self.run_dir = pathlib.Path(run_dir) if run_dir is not None else None
        self.trainer = trainer
        self.metric_names = dict(metric_names or {})
        self.extra = tuple(extra_settings)
        self.samples_per_log = samples_per_log
        self.algorithm = algorithm
        self.poll_every = poll_every
        self.stop_at = stop_at_step
        self.save_init = save_init
        self.fork = False
        self.paused = False
        self.log: RunLog | None = None
        self.inbox: SteerInbox | None = None
        self.version = ""
        self.main = False
        self.pending: dict[str, list[str]] = {"eval": [], "checkpoint": []}
        self.restart: dict[str, Any] | None = None
        self.overrides: dict[str, Any] = {}

    def bind(self, trainer: Any) -> "SwarmCallback":
        self.trainer = trainer
        return self

    # ---- run files ---------------------------------------------------------------------------
    def _write_settings(self, step: int) -> None:
        if not self.main:
            return
        values: dict[str, Any] = {}
        for s in self.declared:
            try:
                values[s.name] = read(self.live, s.name)
            except ApplyError:
                values[s.name] = None
        self.version = settings_version(values)
        doc = {"version": 1, "framework": "transformers", "trainer": type(self.trainer).__name__ if self.trainer else None,
               "step": step, "settings": [s.to_json() for s in self.declared], "actions": list(ACTIONS),
               "values": values, "overrides": self.overrides, "settings_version": self.version}
        if self.fork:
            doc["fork"] = True
        atomic_write_text(self.run_dir / SETTINGS_FILE, json.dumps(doc, indent=1, default=str))

    def _beat(self, step: int, state: str, force: bool = False) -> None:
        if not self.main:
            return
        now = time.monotonic()
        if force or state != self._beat_state or self._beat_at is None or now - self._beat_at >= HEARTBEAT_EVERY_S:
            self.log.heartbeat(step, state)
            self._beat_at, self._beat_state = now, state

    # ---- lifecycle ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if self.run_dir is None:
            self.run_dir = pathlib.Path(os.environ.get("SWARMLAB_RUN_DIR") or pathlib.Path(args.output_dir) / "swarm")
        self.dist = Dist()
        self.main = bool(state.is_world_process_zero)
        self.declared = declared_settings(args, self.trainer, self.extra)
        self.live = Live(args, optimizer, lr_scheduler, self.trainer, decay_group_indices(optimizer, model))
        self.status = "completed"
        self.pending: dict[str, list[str]] = {"eval": [], "checkpoint": []}
        self.restart: dict[str, Any] | None = None
        self.paused = False
        self.summary: dict[str, Any] = {}
        self._beat_at: float | None = None
        self._beat_state: str | None = None
        self._step_began: float | None = None
        self._step_times: list[float] = []
        self._samples_seen: list[str] = []
        self.segment = 0
        saved: dict[str, Any] = {}
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.segment = sum(1 for e in iter_jsonl(self.run_dir / "events.jsonl") if e.get("event") in ("start", "resume"))
            self.log = RunLog(self.run_dir)
            self.inbox = SteerInbox(self.run_dir)
            try:
                saved = json.loads((self.run_dir / SETTINGS_FILE).read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                saved = {}
        saved, req = self.dist.broadcast((saved, self._pending_request() if self.main else None))
        self.fork = bool(saved.get("fork"))   # a backtest arm (trainer.steer.fork.seed_fork): it keeps no start of its own
        # hot changes acked `applied` stay in force across a resume, whatever the checkpoint holds
        self.overrides: dict[str, Any] = {k: v for k, v in (saved.get("overrides") or {}).items()
                                          if any(s.name == k and s.apply == "hot" for s in self.declared)}
        restored, restore_error = {}, None
        if self.overrides:
            try:
                restored = apply_change(self.live, dict(self.overrides))
            except ApplyError as e:
                restore_error = str(e)
        relaunch = self._apply_relaunch(req)
        step = state.global_step
        if self.main:
            self.log.event("resume" if step > 0 or req else "start", step, framework="transformers", world=self.dist.world,
                           trainer=type(self.trainer).__name__ if self.trainer else None, segment=self.segment)
            if restored:
                self.log.event("settings_restored", step, values=restored)
            if restore_error:
                self.log.event("settings_restore_failed", step, overrides=self.overrides, error=restore_error)
            if req:
                self._check_restart(req, relaunch, step)
            try:
                atomic_write_text(self.run_dir / "trainer_args.json", args.to_json_string())
            except (TypeError, ValueError):   # an arg JSON cannot hold: the file is a record, not a need
                pass
            self._write_settings(step)
            self._beat(step, "running", force=True)
        if self.dist.broadcast(self._wants_init(step) if self.main else None):
            self._save_init(args, state)
        return control

    def _pending_request(self) -> dict[str, Any] | None:
        """The restart request (`restart.json`) still `pending`: this process is its relaunch."""
        try:
            req = json.loads((self.run_dir / RESTART_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return req if req.get("status") == "pending" else None

    def _apply_relaunch(self, req: Mapping[str, Any] | None) -> dict[str, Any]:
        """The hot part of a rollback's changes, applied on every rank once the checkpoint is loaded
        (a flag would not reach them: the checkpoint's scheduler state overwrites the lr); they stay
        in force as overrides. Returns {setting: value} applied, or {"error": why}."""
        hot = dict((req or {}).get("hot") or {})
        if not hot:
            return {}
        try:
            values = apply_change(self.live, hot)
        except ApplyError as e:
            return {"error": str(e)}
        self.overrides.update(values)
        return values

    def _check_restart(self, req: dict[str, Any], relaunch: Mapping[str, Any], step: int) -> None:
        """After a relaunch: does the run now hold the change its restart request asked for? After
        a rollback, the checkpoints of the steps it abandoned leave the index (their folders stay)."""
        changes = {**(req.get("changes") or {}), **(req.get("hot") or {})}
        live = {}
        for k in changes:
            try:
                live[k] = read(self.live, k)
            except ApplyError as e:
                live[k] = f"unreadable: {e}"
        ok = "error" not in relaunch and all(
            live[k] == v or (isinstance(v, float) and isinstance(live[k], (int, float)) and abs(live[k] - v) <= 1e-12 * max(1.0, abs(v)))
            for k, v in changes.items())
        req.update(status="applied" if ok else "mismatch", relaunched_step=step, live=live)
        if "error" in relaunch:
            req["error"] = relaunch["error"]
        atomic_write_text(self.run_dir / RESTART_FILE, json.dumps(req, indent=1, default=str))
        if req.get("rollback"):
            dropped = self._forget_after(int(req.get("rollback_step") or 0))
            self.log.event("rolled_back", step, id=req.get("id"), name=req["rollback"], from_step=req.get("step"),
                           dropped=dropped)
        self.log.event("restart_applied" if ok else "restart_mismatch", step, id=req.get("id"), changes=changes, live=live)

    def _forget_after(self, step: int) -> list[str]:
        """Drop from the index the checkpoints past `step` (the steps a rollback abandoned: the
        relauncher must not resume from them after a crash, nor the controller fork them)."""
        out = []
        for m in sorted((self.run_dir / "checkpoints").glob("*.json")):
            try:
                c = json.loads(m.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if c.get("format") == "transformers" and c.get("name") != INIT_CHECKPOINT and int(c.get("step", 0)) > step:
                m.unlink(missing_ok=True)
                out.append(str(c.get("name")))
        return out

    def _indexed(self, name: str) -> dict[str, Any] | None:
        """The index entry `checkpoints/<name>.json` whose Trainer checkpoint folder is there."""
        try:
            c = json.loads((self.run_dir / "checkpoints" / f"{name}.json").read_text())
        except (OSError, json.JSONDecodeError, ValueError):
            return None
        ok = c.get("format") == "transformers" and (pathlib.Path(str(c.get("path", ""))) / "trainer_state.json").is_file()
        return c if ok else None

    def _wants_init(self, step: int) -> bool:
        return (self.save_init and self.trainer is not None and step == 0 and not self.fork
                and self._indexed(INIT_CHECKPOINT) is None)

    def _save_init(self, args, state) -> None:
        """The untrained start as a Trainer checkpoint (every rank takes part in the save, as in the
        Trainer's own), moved to `<output_dir>/swarm-init` and indexed as `init`."""
        import shutil

        self.trainer._save_checkpoint(getattr(self.trainer, "model_wrapped", None) or self.trainer.model, trial=None)
        self.dist.broadcast(None)   # every rank's files are written before rank 0 moves the folder
        if not self.main:
            return
        out = pathlib.Path(args.output_dir)
        src, dst = out / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", out / INIT_FOLDER
        shutil.rmtree(dst, ignore_errors=True)   # an earlier run's, in the same output folder
        src.rename(dst)
        self._index_checkpoint(dst, state.global_step, "init", name=INIT_CHECKPOINT)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_began = time.perf_counter()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_began is not None:   # one optimizer step, its micro-batches included
            self._step_times.append(time.perf_counter() - self._step_began)
            self._step_began = None
        step = state.global_step
        self._beat(step, "running")
        if self.stop_at is not None and (step >= self.stop_at or step >= state.max_steps):
            # a fork's end: one evaluation (when the run has an eval set), then stop
            if self.trainer is None or getattr(self.trainer, "eval_dataset", None) is not None:
                control.should_evaluate = True
            control.should_training_stop = True
        if step % self.poll_every:
            return control
        halt = self._commands(step, control)
        if self.paused:
            while self.paused and not halt:
                self._beat(step, "paused")
                time.sleep(0.2)
                halt = self._commands(step, control)
            if not halt:
                self._beat(step, "running")
        return control

    def _commands(self, step: int, control) -> bool:
        """Read (rank 0), broadcast and handle the new commands. Returns whether one halted the
        run (a stop or a restart request): the commands after it wait for the next process."""
        cmds = self.inbox.poll() if self.main and self.inbox else []
        cmds = self.dist.broadcast(cmds)
        changed = halt = False
        for c in cmds:
            halt, did = self._handle(c, step, control)
            changed |= did
            if halt:
                self.paused = False
                break
        if changed:
            self._write_settings(step)
        return halt

    def _ack(self, c: Mapping[str, Any], step: int, status: str, message: Any) -> None:
        if self.main and self.inbox:
            self.inbox.ack(str(c["id"]), str(c.get("cmd")), step, status, message)

    def _handle(self, c: dict[str, Any], step: int, control) -> tuple[bool, bool]:
        """One command at a step end. Returns (halt: process no later command, changed: settings changed)."""
        if c.get("invalid"):
            self._ack(c, step, "rejected", c["invalid"])
            return False, False
        cmd = c["cmd"]
        if cmd == "set_fields":
            change = c["fields"]
            reason = check_change(self.declared, change)
            if reason:
                self._ack(c, step, "rejected", reason)
                return False, False
            by_name = {s.name: s for s in self.declared}
            change = {k: coerce(by_name[k], v) for k, v in change.items()}
            if self.restart is not None and self.restart.get("rollback"):
                self._join_rollback(c, step, change, by_name)
                return False, False
            if needs_restart(self.declared, change):
                self.restart = {"id": c["id"], "changes": change, "step": step, "time": time.time(), "status": "pending"}
                control.should_save = True
                control.should_training_stop = True
                self.status = "restart_pending"
                return True, False
            try:
                values = apply_change(self.live, change)
            except ApplyError as e:
                self._ack(c, step, "rejected", f"failed: {e}")
                return False, False
            self.overrides.update(values)
            self._ack(c, step, "applied", {"values": values})
            if self.main:
                self.log.event("settings_changed", step, id=c["id"], values=values)
            return False, True
        if cmd == "rollback":
            return self._rollback(c, step, control), False
        if cmd == "eval":
            if self.trainer is None:
                self._ack(c, step, "rejected", "eval needs the callback bound to its trainer (steer(trainer) or SwarmCallback(trainer=…))")
                return False, False
            if getattr(self.trainer, "eval_dataset", None) is None:
                self._ack(c, step, "rejected", "the trainer has no eval_dataset")
                return False, False
            control.should_evaluate = True
            self.pending["eval"].append(c["id"])
            return False, False
        if cmd == "checkpoint":
            control.should_save = True
            self.pending["checkpoint"].append(c["id"])
            return False, False
        if cmd in ("pause", "resume"):
            self.paused = cmd == "pause"
            self._ack(c, step, "applied", {"paused": self.paused})
            if self.main:
                self.log.event("paused" if self.paused else "resumed", step, id=c["id"])
            return False, False
        if cmd == "stop":
            control.should_training_stop = True
            self.status = "stopped_by_command"
            self._ack(c, step, "applied", {"stopping": True})
            return True, False
        raise AssertionError(f"the inbox let through an unsupported command {cmd!r}")

    def _write_request(self) -> None:
        if self.main:
            atomic_write_text(self.run_dir / RESTART_FILE, json.dumps(self.restart, indent=1, default=str))

    def _rollback(self, c: dict[str, Any], step: int, control) -> bool:
        """A rollback request; returns whether it halts the command loop now (not inside a pause)."""
        name = str(c["name"])
        entry = self._indexed(name) if self.main else {}
        entry = self.dist.broadcast(entry)
        if entry is None:
            self._ack(c, step, "rejected", f"no checkpoint {name!r} in the run's index (checkpoints/{name}.json with "
                                           "its Trainer folder)")
            return False
        if self.restart is not None:
            self._ack(c, step, "rejected", f"a restart ({self.restart['id']}) is already pending")
            return False
        self.restart = {"id": c["id"], "changes": {}, "hot": {}, "step": step, "time": time.time(), "status": "pending",
                        "checkpoint": str(entry.get("path")), "rollback": name, "rollback_step": int(entry.get("step", 0))}
        self._write_request()
        if self.main:
            self.log.event("rollback_requested", step, id=c["id"], name=name, checkpoint=self.restart["checkpoint"])
        self._ack(c, step, "restart", {"rollback": name, "checkpoint": self.restart["checkpoint"], "restart": {}})
        control.should_training_stop = True
        self.status = "restart_pending"
        return not self.paused

    def _join_rollback(self, c: dict[str, Any], step: int, change: dict[str, Any], by_name: Mapping[str, Setting]) -> None:
        """A change sent while a rollback waits for its relaunch goes with it: restart settings as
        flags, hot ones applied by the relaunched callback."""
        hot = {k: v for k, v in change.items() if by_name[k].apply == "hot"}
        rest = {k: v for k, v in change.items() if k not in hot}
        self.restart["changes"].update(rest)
        self.restart["hot"].update(hot)
        self._write_request()
        self._ack(c, step, "restart", {"restart": rest, "hot": hot, "checkpoint": self.restart["checkpoint"],
                                       "rollback": self.restart["rollback"]})

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.main or not logs or self.log is None:
            return control
        if is_summary(logs):
            self.summary.update({k: logs[k] for k in SUMMARY_KEYS if k in logs})
            return control
        step = state.global_step
        row: dict[str, Any] = {"step": step, "segment": self.segment, "time": time.time(),
                               **run_metrics(logs, self.metric_names), "settings_version": self.version}
        algo = self.algorithm or _algorithm(self.trainer)
        if algo:
            row["algorithm"] = algo
        if self._step_times and not any(k.startswith("heldout") for k in row):
            row["step_time"] = sum(self._step_times) / len(self._step_times)
            self._step_times = []
        if any(k.startswith("heldout") for k in row):
            ds = getattr(self.trainer, "eval_dataset", None)
            if ds is not None and not isinstance(ds, dict):
                try:   # how many held-out examples the rates are shares of (a backtest's noise model reads it)
                    row["eval_examples"] = len(ds)
                except TypeError:
                    pass
        self.log.metrics.write(row)
        self._log_samples(step)
        return control

    def _log_samples(self, step: int) -> None:
        """Completions where the trainer keeps them (TRL's `_logs`: prompt, completion, rewards per
        function, advantages; deques of the newest generation batch), each batch written once."""
        logs = getattr(self.trainer, "_logs", None)
        if not self.samples_per_log or not isinstance(logs, dict) or "completion" not in logs:
            return
        comps = [str(x) for x in logs["completion"]]
        fresh = _fresh(self._samples_seen, comps)
        self._samples_seen = comps
        if not fresh:
            return
        prompts = list(logs.get("prompt") or [])
        rewards = {k: list(v) for k, v in (logs.get("rewards") or {}).items()}
        adv = list(logs.get("advantages") or [])
        weights = getattr(self.trainer, "reward_weights", None)
        names = list(rewards)
        for i in range(-min(self.samples_per_log, fresh), 0):
            per = {k: float(v[i]) for k, v in rewards.items() if len(v) >= -i}
            row: dict[str, Any] = {"step": step, "segment": self.segment, "completion": comps[i]}
            if len(prompts) >= -i:
                row["prompt"] = str(prompts[i])
            if per:
                w = [float(x) for x in weights] if weights is not None and len(weights) == len(names) else [1.0] * len(names)
                row["reward"] = sum(w[j] * per[k] for j, k in enumerate(names) if k in per)
                row["rewards"] = per
            if len(adv) >= -i:
                row["advantage"] = float(adv[i])
            self.log.samples.write(row)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        held = {k: v for k, v in run_metrics(metrics or {}, self.metric_names).items() if k.startswith("heldout")}
        for cid in self.pending["eval"]:
            self._ack({"id": cid, "cmd": "eval"}, state.global_step, "applied", {"metrics": held})
        self.pending["eval"] = []
        return control

    def on_save(self, args, state, control, **kwargs):
        if not self.main and not self.pending["checkpoint"] and not self.restart:
            return control   # a rank that owns no files, or a save outside a run this callback started
        step = state.global_step
        path = pathlib.Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        restart = self.restart if self.restart and not self.restart.get("rollback") else None   # a rollback names its own
        named = bool(self.pending["checkpoint"] or restart)
        if self.main:
            self._index_checkpoint(path, step, "named" if named else "periodic")
        if not path.is_dir():
            why = f"failed: the Trainer's checkpoint folder {path} is missing after the save"
            for cid in self.pending["checkpoint"]:
                self._ack({"id": cid, "cmd": "checkpoint"}, step, "rejected", why)
            if restart:
                self._ack({"id": restart["id"], "cmd": "set_fields"}, step, "rejected", why)
                self.restart, self.status = None, "completed"
            self.pending["checkpoint"] = []
            return control
        for cid in self.pending["checkpoint"]:
            self._ack({"id": cid, "cmd": "checkpoint"}, step, "applied", {"checkpoint": str(path)})
        self.pending["checkpoint"] = []
        if restart:
            self.restart["checkpoint"] = str(path)
            if self.main:
                atomic_write_text(self.run_dir / RESTART_FILE, json.dumps(self.restart, indent=1, default=str))
                self.log.event("restart_requested", step, id=self.restart["id"], changes=self.restart["changes"], checkpoint=str(path))
            self._ack({"id": self.restart["id"], "cmd": "set_fields"}, step, "restart",
                      {"restart": self.restart["changes"], "checkpoint": str(path)})
        return control

    def _index_checkpoint(self, path: pathlib.Path, step: int, kind: str, name: str | None = None) -> None:
        """checkpoints/<name>.json for each Trainer checkpoint folder (what the controller lists);
        entries whose folder the Trainer rotated away are dropped."""
        d = self.run_dir / "checkpoints"
        d.mkdir(exist_ok=True)
        for m in d.glob("*.json"):
            try:
                old = json.loads(m.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if old.get("format") == "transformers" and not pathlib.Path(old.get("path", "")).is_dir():
                m.unlink(missing_ok=True)
        if not path.is_dir():
            self.log.event("checkpoint_missing", step, path=str(path))
            return
        files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
        name = name or path.name
        manifest = {"name": name, "step": step, "kind": kind, "format": "transformers", "path": str(path.resolve()),
                    "time": time.time(), "bytes": sum(files.values()), "files": files, "settings": dict(self.overrides),
                    "settings_version": self.version}
        atomic_write_text(d / f"{name}.json", json.dumps(manifest))
        self.log.event("checkpoint", step, name=name, path=str(path))

    def on_train_end(self, args, state, control, **kwargs):
        step = state.global_step
        for kind, ids in self.pending.items():
            for cid in ids:
                self._ack({"id": cid, "cmd": kind}, step, "rejected", f"failed: the run ended before the {kind} ran")
        self.pending = {"eval": [], "checkpoint": []}
        if self.main and self.log:
            self.log.event("end", step, status=self.status, **self.summary)
            self._beat(step, self.status, force=True)
            self.log.close()
            self.inbox.close()
            self.log, self.inbox = None, None
        return control


def steer(trainer: Any, run_dir: str | os.PathLike | None = None, **kwargs: Any) -> SwarmCallback:
    """Add a `SwarmCallback` bound to `trainer`; returns it."""
    cb = SwarmCallback(run_dir, trainer=trainer, **kwargs)
    trainer.add_callback(cb)
    return cb
