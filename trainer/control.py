"""Control channel: commands from outside, applied by the running job at its next safe point.

Commands are appended as JSON lines to `RUN_DIR/commands.jsonl` (`send_command` does it with an
exclusive lock, so several controllers can write). The trainer polls between steps, validates each
new command, applies it and appends an acknowledgement to `RUN_DIR/command_log.jsonl`:

    {"id": …, "cmd": "set_recipe", "status": "applied" | "rejected", "result" | "reason": …, "step": …}

A command whose id is already acknowledged is never applied again (after a resume too). An invalid
command is rejected with its reason and training goes on.

Commands:
    set_recipe   {"fields": {"lr": 1e-3, …}}
    set_fields   {"fields": {"recipe.lr": 1e-3, "harness.sampling.temperature": 0.8}}  (dotted, both)
    set_harness  {"version": "<hash>"}  (a harness the run has stored under RUN_DIR/harnesses/)
                 or {"harness": {…full spec…}}
    checkpoint   {"name": "before-change"}  (name optional)
    rollback     {"name": "<checkpoint name>"}
    pause | resume | stop
"""
from __future__ import annotations

import fcntl
import json
import pathlib
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainer.runlog import iter_jsonl, read_jsonl

CommandName = Literal["set_recipe", "set_fields", "set_harness", "checkpoint", "rollback", "pause", "resume", "stop"]


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    cmd: CommandName
    fields: dict[str, Any] | None = None
    version: str | None = None
    harness: dict[str, Any] | None = None
    name: str | None = None
    time: float = Field(default_factory=time.time)


def send_command(run_dir: str | pathlib.Path, cmd: str, **args: Any) -> str:
    """Append a command to the run's inbox; returns its id (look for it in `command_log.jsonl`)."""
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cid = args.pop("id", None) or uuid.uuid4().hex[:12]
    row = {"id": cid, "cmd": cmd, "time": time.time(), **args}
    with open(run_dir / "commands.jsonl", "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row) + "\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)
    return cid


def wait_for_ack(run_dir: str | pathlib.Path, cid: str, timeout: float = 60.0, poll: float = 0.1) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for row in iter_jsonl(pathlib.Path(run_dir) / "command_log.jsonl"):
            if row.get("id") == cid:
                return row
        time.sleep(poll)
    raise TimeoutError(f"no acknowledgement for command {cid} within {timeout:.0f}s")


class CommandInbox:
    """The trainer's side: yields new commands (valid ones as `Command`, invalid ones rejected)."""

    def __init__(self, run_dir: pathlib.Path) -> None:
        self.inbox = run_dir / "commands.jsonl"
        self.log_path = run_dir / "command_log.jsonl"
        self.done = {row.get("id") for row in read_jsonl(self.log_path)}
        self._line = 0
        self._log = open(self.log_path, "a", encoding="utf-8")

    def poll(self) -> list[Command | tuple[str, dict, str]]:
        """New commands in order. Malformed rows come back as (id, row, reason) for rejection."""
        out: list[Command | tuple[str, dict, str]] = []
        if not self.inbox.exists():
            return out
        with open(self.inbox, encoding="utf-8") as f:
            lines = f.readlines()
        for i in range(self._line, len(lines)):
            line = lines[i]
            if not line.endswith("\n"):
                break  # being written; read it next time
            self._line = i + 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if f"line{i + 1}" not in self.done:  # rejected before a resume: not again
                    out.append((f"line{i + 1}", {}, f"not JSON: {e.msg}"))
                continue
            if not isinstance(row, dict):
                if f"line{i + 1}" not in self.done:
                    out.append((f"line{i + 1}", {}, "command must be a JSON object"))
                continue
            cid = str(row.get("id") or f"line{i + 1}")
            if cid in self.done:
                continue
            try:
                out.append(Command.model_validate(row))
            except ValidationError as e:
                errs = "; ".join(f"{'.'.join(map(str, x['loc']))}={x.get('input')!r}: {x['msg']}" for x in e.errors())
                out.append((cid, row, f"invalid command: {errs}"))
        return out

    def ack(self, cid: str, cmd: str, step: int, ok: bool, message: Any) -> dict[str, Any]:
        row = {"id": cid, "cmd": cmd, "step": step, "time": time.time(),
               "status": "applied" if ok else "rejected", ("result" if ok else "reason"): message}
        self._log.write(json.dumps(row, default=str) + "\n")
        self._log.flush()
        self.done.add(cid)
        return row

    def close(self) -> None:
        self._log.close()
