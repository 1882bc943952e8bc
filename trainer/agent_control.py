"""The agent trainer's control inbox (trainer/agent_train.py): commands from outside, applied at
the end of an optimiser step of the warm-up or a GRPO stage, with the reading, the once-only rule
and the acknowledgements of `trainer.control.CommandInbox` (the controller's `send_command` and
`wait_for_ack` work unchanged).

    set_recipe   {"fields": {"grpo.lr": 1e-4, "grpo.temperature": 0.8}}   (agent_state.RECIPE_FIELDS)
    set_fields   {"fields": {"recipe.grpo.lr": 1e-4, "harness.max_turns": 6}}   (dotted, both)
    set_harness  {"harness": {…a full AgentHarness…}} or {"version": "<hash>"} (one stored under
                 RUN_DIR/harnesses/)
    checkpoint   {"name": "before-change"}  (name optional)
    rollback     {"name": "<checkpoint name>"}  ("init": the untrained start, step 0 of the warm-up)
    pause | resume | stop

A command is validated as a whole before anything changes: a harness the way `harness.agent`
validates one (field by field, then the whole), and within the policy's context (its
`sampling.max_new_tokens` below the policy's length); recipe fields by re-validating the whole
`AgentTrainConfig`. An invalid one is acknowledged `rejected` with the reason and the run goes on
unchanged. With `checkpoint.interval` set, a command that changes the state (set_*, rollback) is
followed by a checkpoint before its acknowledgement, so an acknowledged change survives a restart
(and one applied but not acknowledged when the process died is applied again, to the same result).

`RECIPE_FIELDS` (trainer/agent_state.py) are the fields the trainer reads at every step;
`grpo.temperature` is the harness's `sampling.temperature`, so setting it changes the harness
version. `rollback` loads the named checkpoint whole (weights, optimiser, KL reference, position,
data cursor, sampling stream, and the harness and `RECIPE_FIELDS` in force when it was saved, commands'
settings included) and the stages go on from there (`Rewound`); its acknowledgement names the
position, the recipe fields and the harness version it restored, so the controller knows what is in
force without opening the checkpoint. Commands after it in the same poll (the controller pauses the
run around a rollback and the fields it comes with) apply to the restored state before any step.
"""
from __future__ import annotations

import pathlib
import time
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from harness.agent import AgentHarness
from sandboxes.errors import SwarmlabError
from trainer import agent_state
from trainer.agent_state import changed
from trainer.checkpoint import CheckpointError
from trainer.config import format_validation_error
from trainer.control import Command, CommandInbox

if TYPE_CHECKING:
    from trainer.agent_train import AgentTrainer

PAUSE_POLL_S = 0.2


class StopRun(SwarmlabError):
    """The run ends at this step end: `stopped_by_command`, or `interrupted` (a test's `until`)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class Rewound(SwarmlabError):
    """A rollback moved the run to another position: the stages go on from there."""


def checked_harness(spec: Any, max_len: int) -> AgentHarness:
    """A full harness spec validated as `harness.agent` validates one, and within a policy of
    `max_len` tokens."""
    if not isinstance(spec, dict):
        raise ValueError(f"harness must be a mapping of AgentHarness fields, not {type(spec).__name__}")
    try:
        h = AgentHarness.model_validate(spec)
    except ValidationError as e:
        raise ValueError(format_validation_error(e).replace("invalid config", "invalid harness", 1)) from None
    if h.sampling.max_new_tokens >= max_len:
        raise ValueError(f"invalid harness: sampling.max_new_tokens={h.sampling.max_new_tokens} must be below the "
                         f"policy's {max_len} tokens")
    return h


class AgentControl:
    """The inbox of one `AgentTrainer`, read at each step end (`step_end`)."""

    def __init__(self, trainer: "AgentTrainer") -> None:
        self.tr = trainer
        self.inbox = CommandInbox(trainer.cfg.run_dir)
        self.paused = False

    def step_end(self) -> None:
        """A periodic checkpoint when one is due, then the inbox (waiting while paused); `StopRun`
        or `Rewound` when a command (or `until`) says so."""
        tr = self.tr
        interval = tr.cfg.checkpoint.interval
        if interval and tr.step % interval == 0:
            agent_state.save(tr)
        rewound = self.handle()
        while self.paused:
            tr.log.heartbeat(tr.step, "paused")
            time.sleep(PAUSE_POLL_S)
            rewound = self.handle() or rewound
        if rewound:
            raise Rewound(f"rolled back to step {tr.step}")
        if tr.until is not None and tr.step >= tr.until:
            raise StopRun("interrupted")

    def handle(self) -> bool:
        """Apply and acknowledge the new commands in order; True when one rolled the run back.
        `stop` ends the run after its acknowledgement."""
        rewound = False
        for c in self.inbox.poll():
            if isinstance(c, tuple):
                self.inbox.ack(c[0], str(c[1].get("cmd", "?")), self.tr.step, False, c[2])
                continue
            try:
                result, ok = self.apply(c), True
            except (ValueError, CheckpointError, KeyError, OSError) as e:
                result, ok = str(e), False
            self.inbox.ack(c.id, c.cmd, self.tr.step, ok, result)
            rewound = rewound or (ok and c.cmd == "rollback")
            if ok and c.cmd == "stop":
                raise StopRun("stopped_by_command")
        return rewound

    def apply(self, cmd: Command) -> dict[str, Any]:
        tr = self.tr
        if cmd.cmd in ("set_recipe", "set_fields"):
            if not cmd.fields:
                raise ValueError(f"{cmd.cmd} needs non-empty 'fields'")
            fields = dict(cmd.fields)
            if cmd.cmd == "set_recipe" and any(k.startswith("harness.") for k in fields):
                raise ValueError("set_recipe changes recipe fields only; harness fields go through set_fields")
            cfg, harness = changed(tr.cfg, tr.harness, fields, tr.policy._max_len())
            tr.cfg = cfg
            out = {"set": dict(fields), **self.set_harness_to(harness, cmd)}
            return {**out, **self.durable()}
        if cmd.cmd == "set_harness":
            if cmd.harness is not None:
                h = checked_harness(cmd.harness, tr.policy._max_len())
            elif cmd.version:
                h = self.stored_harness(cmd.version)
            else:
                raise ValueError("set_harness needs 'harness' (a full AgentHarness) or 'version'")
            return {**self.set_harness_to(h, cmd), **self.durable()}
        if cmd.cmd == "checkpoint":
            return {"checkpoint": agent_state.save(tr, cmd.name)}
        if cmd.cmd == "rollback":
            if not cmd.name:
                raise ValueError("rollback needs 'name' (a checkpoint name)")
            agent_state.restore(tr, tr.ckpt.load(cmd.name))
            tr.segment += 1
            tr.log.event("rollback", tr.step, name=cmd.name, stage=tr.stage, stage_step=tr.stage_step,
                         harness_version=tr.harness.version)
            return {"rolled_back_to": cmd.name, "step": tr.step, "stage": tr.stage, "stage_step": tr.stage_step,
                    "recipe": agent_state.recipe_values(tr.cfg), "harness_version": tr.harness.version,
                    **self.durable()}
        if cmd.cmd in ("pause", "resume"):
            self.paused = cmd.cmd == "pause"
            return {"paused": self.paused}
        if cmd.cmd == "stop":
            return {"stopping": True}
        raise ValueError(f"the agent trainer does not take {cmd.cmd!r}")

    def set_harness_to(self, harness: AgentHarness, cmd: Command) -> dict[str, Any]:
        """Make `harness` the live one; a `harness_change` event records a change."""
        tr = self.tr
        before = tr.harness.version
        tr.harness = harness
        if harness.version != before:
            agent_state.store_harness(tr)
            tr.log.event("harness_change", tr.step, source="command", command=cmd.id, harness_before=before,
                         harness_version=harness.version)
        return {"harness_version": harness.version, "harness_changed": harness.version != before}

    def stored_harness(self, version: str) -> AgentHarness:
        p = pathlib.Path(self.tr.cfg.run_dir) / "harnesses" / f"{version}.yaml"
        if not version.isalnum() or not p.is_file():
            raise ValueError(f"unknown harness version {version!r} (none stored under harnesses/)")
        try:
            spec = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"harnesses/{version}.yaml does not parse: {str(e).splitlines()[0]}") from None
        h = checked_harness(spec, self.tr.policy._max_len())
        if h.version != version:
            raise ValueError(f"harnesses/{version}.yaml holds harness version {h.version}, not {version}")
        return h

    def durable(self) -> dict[str, Any]:
        """With periodic checkpoints on, a checkpoint of the changed state before the acknowledgement."""
        return {"checkpoint": agent_state.save(self.tr)} if self.tr.cfg.checkpoint.interval else {}

    def close(self) -> None:
        self.inbox.close()
