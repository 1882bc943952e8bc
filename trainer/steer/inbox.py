"""The steered run's side of the control channel: the same files as the built-in trainer's
(`trainer.control`): commands appended to `RUN_DIR/commands.jsonl` (`send_command` writes them),
acknowledgements appended to `RUN_DIR/command_log.jsonl`, one per command id:

    {"id": …, "cmd": …, "step": …, "time": …, "status": "applied", "result": {…values read back…}}
    {"id": …, "cmd": …, "step": …, "time": …, "status": "rejected", "reason": "one line"}
    {"id": …, "cmd": …, "step": …, "time": …, "status": "restart", "result": {"restart": {…}, "checkpoint": "…"}}
    {"id": …, "cmd": "rollback", …, "status": "restart", "result": {"rollback": "init", "checkpoint": "…", "restart": {}}}

An id already in the log is never processed again: the log is the record of what was applied, so a
process that resumes reads it first and a replayed command is skipped. Polling costs one `stat`
when nothing was appended.
"""
from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any

from trainer.runlog import read_jsonl

COMMANDS = ("set_fields", "eval", "checkpoint", "rollback", "stop", "pause", "resume")


class SteerInbox:
    def __init__(self, run_dir: pathlib.Path) -> None:
        self.inbox = run_dir / "commands.jsonl"
        self.log_path = run_dir / "command_log.jsonl"
        self.done = {row.get("id") for row in read_jsonl(self.log_path)}
        self._offset = 0
        self._line = 0
        self._log = open(self.log_path, "a", encoding="utf-8")

    def poll(self) -> list[dict[str, Any]]:
        """New, unacknowledged commands in order, each {"id", "cmd", …} as sent, or
        {"id", "cmd", "invalid": reason} for a row that is not a command."""
        try:
            size = os.stat(self.inbox).st_size
        except FileNotFoundError:
            return []
        if size <= self._offset:
            return []
        with open(self.inbox, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        out: list[dict[str, Any]] = []
        for raw in data.splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break   # being written; read it next time
            self._offset += len(raw)
            self._line += 1
            lid = f"line{self._line}"
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                if lid not in self.done:
                    out.append({"id": lid, "cmd": "?", "invalid": f"not JSON: {getattr(e, 'msg', e)}"})
                continue
            if not isinstance(row, dict):
                if lid not in self.done:
                    out.append({"id": lid, "cmd": "?", "invalid": "a command must be a JSON object"})
                continue
            cid = str(row.get("id") or lid)
            if cid in self.done:
                continue
            cmd = row.get("cmd")
            row = {**row, "id": cid}
            if cmd not in COMMANDS:
                row["invalid"] = f"command {cmd!r} is not supported here (supported: {', '.join(COMMANDS)})"
            elif cmd == "set_fields" and not isinstance(row.get("fields"), dict):
                row["invalid"] = "set_fields needs 'fields': {setting: value}"
            elif cmd == "rollback" and not (isinstance(row.get("name"), str) and row["name"]):
                row["invalid"] = "rollback needs 'name': the checkpoint's name in the run's index"
            out.append(row)
        return out

    def ack(self, cid: str, cmd: str, step: int, status: str, message: Any) -> dict[str, Any]:
        assert status in ("applied", "rejected", "restart"), f"unknown ack status {status!r}"
        row = {"id": cid, "cmd": cmd, "step": step, "time": time.time(), "status": status,
               ("reason" if status == "rejected" else "result"): message}
        self._log.write(json.dumps(row, default=str) + "\n")
        self._log.flush()
        self.done.add(cid)
        return row

    def close(self) -> None:
        self._log.close()
