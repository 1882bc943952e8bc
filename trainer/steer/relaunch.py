"""The relauncher. It runs a user's steered training script as a child process and launches it again
when a restart-required change or a crash stops it. The callback only checkpoints, records and stops;
this module does the relaunch.

    python -m trainer.steer.relaunch --run-dir RUN -- python train.py --output_dir out --max_steps 2000

After each exit of the script, `decide` (a pure function of the run folder's records) chooses what
happens next:
  restart   the script stopped after a restart-required change. `restart.json` is `pending` and
            names the checkpoint the callback saved. The script is relaunched from that
            checkpoint, with the change.
  crash     the script died without a pending restart: a non-zero exit, or a signal (SIGKILL
            included). It is resumed from the newest checkpoint in the run's index
            (`checkpoints/*.json`), else started afresh. After `max_crashes` relaunches in a row
            that made no progress crashed too, the relauncher gives up.
  done      a clean exit with nothing pending.
A relauncher started on a run folder that already holds checkpoints (a new job after the old one
died) resumes from the newest. A restart still pending is relaunched first.

How a change reaches the script, following the Hugging Face convention (`HfArgumentParser`: when
a flag is given twice, the last one wins): `--NAME VALUE` is appended to the script's argv for every
restart change the run has been acknowledged so far (`command_log.jsonl`, status `restart`, in
order), then `--resume_from_checkpoint PATH`. The same goes in the environment, for scripts that
read their settings elsewhere: `SWARMLAB_OVERRIDES` (JSON) and `SWARMLAB_RESUME_FROM`.
`SWARMLAB_RUN_DIR` names the run folder, where the callback writes.

Command ids stay idempotent across launches: the callback of each new process reads the
acknowledged ids and the hot overrides from the run folder (`trainer.steer.callback`). Every launch
and exit is a row in `RUN_DIR/launches.jsonl` and an event (`relaunch`) in `events.jsonl`. A
SIGTERM or SIGINT to the relauncher is passed on to the script; the relauncher then ends by the
same signal and launches nothing more. On Linux the script also gets SIGTERM when the relauncher
dies, so a killed relauncher leaves no orphan training into the run folder.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any, Iterable, Literal, Mapping, Sequence

from sandboxes.errors import SwarmlabError
from trainer.runlog import iter_jsonl, read_heartbeat

RESTART_FILE = "restart.json"
LAUNCHES_FILE = "launches.jsonl"
LOCK_FILE = ".relaunch.lock"


class RelaunchError(SwarmlabError, RuntimeError):
    """The relauncher cannot run this script in this run folder."""


# ---- what the run folder says ---------------------------------------------------------------------

def restart_changes(acks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Every restart change acknowledged so far, merged in order (a later one wins). All of them are
    in force for every later launch."""
    out: dict[str, Any] = {}
    for row in acks:
        if row.get("status") == "restart" and isinstance((row.get("result") or {}).get("restart"), dict):
            out.update(row["result"]["restart"])
    return out


def newest_checkpoint(run_dir: pathlib.Path) -> dict[str, Any] | None:
    """The newest Trainer checkpoint in the run's index whose folder still holds its state."""
    best = None
    for m in (run_dir / "checkpoints").glob("*.json"):
        try:
            c = json.loads(m.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if c.get("format") != "transformers" or not (pathlib.Path(str(c.get("path", ""))) / "trainer_state.json").is_file():
            continue
        if best is None or int(c.get("step", -1)) > int(best.get("step", -1)):
            best = c
    return best


def pending_restart(run_dir: pathlib.Path) -> dict[str, Any] | None:
    """The restart request the callback left `pending` with its checkpoint, else None."""
    try:
        req = json.loads((run_dir / RESTART_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if req.get("status") == "pending" and req.get("checkpoint"):
        return req
    return None


# ---- the decision -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Launch:
    reason: Literal["start", "resume", "restart", "crash"]
    resume_from: str | None = None
    restart_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Done:
    rc: int                  # the relauncher's exit status: 0, or the script's last one
    why: str


def decide(rc: int | None, restart: Mapping[str, Any] | None, relaunched: set[str],
           checkpoint: Mapping[str, Any] | None, crashes: int, max_crashes: int) -> Launch | Done:
    """What follows the script's exit `rc` (None: nothing has run under this relauncher yet).
    `restart`: the pending restart request, if any. `relaunched`: the ids of the requests already
    relaunched. `checkpoint`: the newest good checkpoint. `crashes`: how many crashes in a row have
    made no progress, this one included; a crashed script is relaunched `max_crashes` times in a row
    at most."""
    if restart is not None and str(restart.get("id")) not in relaunched:
        return Launch("restart", str(restart["checkpoint"]), str(restart.get("id")))
    path = str(checkpoint["path"]) if checkpoint else None
    if rc is None:
        return Launch("resume", path) if path else Launch("start")
    if rc == 0:
        return Done(0, "the script finished")
    if crashes > max_crashes:
        return Done(rc, f"the script crashed {crashes} times in a row without progress (last exit {rc})")
    return Launch("crash", path)


def _flag_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def launch_argv(argv: Sequence[str], changes: Mapping[str, Any], resume_from: str | None) -> list[str]:
    """The script's argv with each change appended as `--NAME VALUE`, and the checkpoint to
    resume from."""
    out = list(argv)
    for k, v in changes.items():
        out += [f"--{k}", _flag_value(v)]
    if resume_from:
        out += ["--resume_from_checkpoint", resume_from]
    return out


# ---- the loop -----------------------------------------------------------------------------------

def _set_parent_death_signal() -> None:
    """In the child, before exec: get SIGTERM when the relauncher dies (Linux), so a killed
    relauncher leaves no script training into the run folder."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Relauncher:
    """Runs `argv` (a script's command line) with `run_dir` as its run folder until it finishes;
    see the module docstring. `env` is added to the script's environment."""

    def __init__(self, argv: Sequence[str], run_dir: str | os.PathLike, max_crashes: int = 3,
                 env: Mapping[str, str] | None = None, log=None) -> None:
        if not argv:
            raise ValueError("argv is empty: give the script's command line")
        if max_crashes < 0:
            raise ValueError(f"max_crashes={max_crashes} must be >= 0")
        self.argv = list(argv)
        self.run_dir = pathlib.Path(run_dir).resolve()
        self.max_crashes = max_crashes
        self.env = dict(env or {})
        self.log = log or (lambda msg: print(f"[relaunch] {msg}", file=sys.stderr, flush=True))
        self.child: subprocess.Popen | None = None
        self.signalled: int | None = None

    def _record(self, row: dict[str, Any]) -> None:
        with open(self.run_dir / LAUNCHES_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"time": time.time(), **row}, default=str) + "\n")

    def _event(self, step: int, **data: Any) -> None:
        with open(self.run_dir / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"time": time.time(), "step": step, "event": "relaunch", **data}, default=str) + "\n")

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def _lock(self):
        import fcntl

        f = open(self.run_dir / LOCK_FILE, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise RelaunchError(f"another relauncher is running on {self.run_dir}") from None
        return f

    def run(self) -> int:
        """Launch until done. The exit status: 0 when the script finished, the script's last one when
        the relauncher gave up, -N when signal N ended the relauncher."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lock = self._lock()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            lock.close()

    def _loop(self) -> int:
        relaunched = {str(r["restart_id"]) for r in iter_jsonl(self.run_dir / LAUNCHES_FILE)
                      if r.get("event") == "launch" and r.get("restart_id")}
        n = sum(1 for r in iter_jsonl(self.run_dir / LAUNCHES_FILE) if r.get("event") == "launch")
        rc: int | None = None
        crashes = 0
        while True:
            if self.signalled is not None:
                return -self.signalled
            ckpt = newest_checkpoint(self.run_dir)
            step = decide(rc, pending_restart(self.run_dir), relaunched, ckpt, crashes, self.max_crashes)
            if isinstance(step, Done):
                self._record({"event": "done", "rc": step.rc, "why": step.why})
                self.log(step.why)
                return step.rc if step.rc >= 0 else 128 - step.rc   # a script ended by signal N: 128 + N, as a shell says
            changes = restart_changes(iter_jsonl(self.run_dir / "command_log.jsonl"))
            argv = launch_argv(self.argv, changes, step.resume_from)
            env = {**os.environ, **self.env, "SWARMLAB_RUN_DIR": str(self.run_dir),
                   "SWARMLAB_OVERRIDES": json.dumps(changes), "SWARMLAB_LAUNCH": str(n)}
            env.pop("SWARMLAB_RESUME_FROM", None)
            if step.resume_from:
                env["SWARMLAB_RESUME_FROM"] = step.resume_from
            before = (read_heartbeat(self.run_dir) or {}).get("step", 0) if step.resume_from else 0
            ckpt_step = int(ckpt["step"]) if ckpt and step.resume_from == str(ckpt["path"]) else None
            self._record({"event": "launch", "launch": n, "reason": step.reason, "resume_from": step.resume_from,
                          "restart_id": step.restart_id, "changes": changes, "argv": argv})
            if step.reason != "start":
                self._event(ckpt_step if ckpt_step is not None else int(before or 0), launch=n, reason=step.reason,
                            resume_from=step.resume_from, restart_id=step.restart_id, changes=changes)
            self.log(f"launch {n} ({step.reason}{', from ' + step.resume_from if step.resume_from else ''})")
            if step.restart_id:
                relaunched.add(step.restart_id)
            self.child = subprocess.Popen(argv, env=env, preexec_fn=_set_parent_death_signal if os.name == "posix" else None)
            rc = self.child.wait()
            self.child = None
            hb = read_heartbeat(self.run_dir) or {}
            self._record({"event": "exit", "launch": n, "rc": rc, "step": hb.get("step"), "state": hb.get("state")})
            n += 1
            if self.signalled is not None:
                return -self.signalled
            progressed = int(hb.get("step") or 0) > int(before or 0)
            crashes = 0 if rc == 0 or progressed else crashes + 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.steer.relaunch", description=__doc__.split("\n\n")[0],
                                usage="%(prog)s --run-dir RUN [--max-crashes N] -- COMMAND [ARG ...]")
    p.add_argument("--run-dir", required=True, help="the run folder the script's SwarmCallback writes "
                   "(given to it as $SWARMLAB_RUN_DIR)")
    p.add_argument("--max-crashes", type=int, default=3, help="relaunches of a crashed script in a row without progress before giving up "
                   "(0: never relaunch after a crash)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the script's command line, after --")
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command: give the script's command line after --")
    try:
        rc = Relauncher(cmd, a.run_dir, max_crashes=a.max_crashes).run()
    except (RelaunchError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rc < 0:   # end by the same signal, so a launcher sees the script's way of ending
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
