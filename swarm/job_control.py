"""The controller's hold on the live job: its launch and relaunch, its status, the command channel
(send a command, wait for its acknowledgement), the run's checkpoints and the private Ray head it
runs on. A mixin of `swarm.controller.Controller`, whose attributes (`jobs`, `store`, `goal`,
`run_dir`, `tick`, `memo`, ...) it reads."""
from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import psutil
import yaml

from agents.domain import JOB_FINDINGS, JobStatus
from sandboxes.private import write_private
from swarm.graph import SwarmState
from swarm.jobs import ProcessJobs, RayJobs
from swarm.script_run import log_launch
from trainer.control import send_command
from trainer.launch import RayHead
from trainer.run_storage import sync_run
from trainer.runlog import iter_jsonl, read_heartbeat


class JobControl:
    """The live job and its command channel (see the module docstring)."""

    def _saved_head(self) -> RayHead | None:
        """The Ray head this run recorded (`_save_head`): whichever controller process ends the run
        stops it if the run started it; one that died is replaced (swarm.jobs.RayJobs)."""
        p = self.sdir / "ray_head.json"
        return RayHead.from_record(json.loads(p.read_text())) if p.exists() else None

    def _save_head(self, head: RayHead) -> None:
        """Record a head as soon as the launcher has it, before any job is submitted to it: its
        address, token file, temp dir and whether this run started it (`owned`)."""
        write_private(self.sdir / "ray_head.json", json.dumps(head.record()))

    def checkpoints(self) -> list[dict[str, Any]]:
        """The live run's checkpoint metadata, oldest first; re-read only when the checkpoint
        directory changed (checkpoints are written by rename, which changes its mtime; an mtime
        under a second old is not trusted, the clock behind it may be coarse)."""
        d = self.run_dir / "checkpoints"
        try:
            mtime = d.stat().st_mtime_ns
        except FileNotFoundError:
            return []
        if self.memo.ckpts is not None and self.memo.ckpts[0] == mtime and time.time_ns() - mtime > 1_000_000_000:
            return list(self.memo.ckpts[1])
        out = []
        for m in sorted(d.glob("*.json")):
            try:
                out.append(json.loads(m.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        out.sort(key=lambda m: m["step"])
        self.memo.ckpts = (mtime, out)
        return list(out)

    def command(self, cmd: str, cid: str, timeout: float = 60.0, **args: Any) -> dict[str, Any] | None:
        """Send a command with a deterministic id (re-sending after a crash is a no-op: the trainer
        acknowledges an id once) and wait for its acknowledgement while the job is alive and
        stepping: the trainer reads commands between steps, so a worker whose heartbeat is older
        than `swarm.stale_heartbeat_s` (hung) will not answer, and the wait ends (None)."""
        self.tick.evidence = None
        log = self.run_dir / "command_log.jsonl"
        for row in iter_jsonl(log):
            if row.get("id") == cid:
                return row
        self.send(cmd, cid, **args)
        deadline = time.time() + timeout
        while time.time() < deadline:
            sync_run(self.run_dir)   # a stored run: push the command, pull the acks (else nothing)
            for row in iter_jsonl(log):
                if row.get("id") == cid:
                    return row
            if self.job_status(self.state_job) in JobStatus.terminal():
                return None
            if self.heartbeat_stale():
                return None
            time.sleep(0.2)
        return None

    def send(self, cmd: str, cid: str, **args: Any) -> None:
        """Put a command in the inbox once (its id is deterministic: re-sending after a crash is a no-op)."""
        if not any(r.get("id") == cid for r in iter_jsonl(self.run_dir / "commands.jsonl")):
            send_command(self.run_dir, cmd, id=cid, **args)

    def job_unwell(self, job_status: Any) -> bool:
        """The live job is not running, this tick's detectors find it crashed or hung, or its
        heartbeat is older than `swarm.stale_heartbeat_s` now (it stopped stepping since)."""
        return (job_status not in JobStatus.alive() or bool({d.name for d in self.tick.findings} & JOB_FINDINGS)
                or self.heartbeat_stale())

    def heartbeat_stale(self) -> bool:
        """The heartbeat is older than the goal's floor (`swarm.stale_heartbeat_s`): the cheap check a
        command's wait loop can make every 0.2 s; the `stale_heartbeat` detector, which also scales
        the limit with step times, decides restarts."""
        hb = read_heartbeat(self.run_dir)
        return bool(hb) and hb.get("state") in (None, "running") and \
            time.time() - float(hb.get("time", 0.0)) > self.goal.swarm.stale_heartbeat_s

    def job_status(self, handle: str | None) -> JobStatus:
        """The launcher's status; for a job it does not know (ProcessJobs after a controller restart:
        the trainer outlives a killed controller), judged by the run's heartbeat."""
        raw = self.jobs.status(handle) if handle else "UNKNOWN"
        status = JobStatus(raw) if raw in JobStatus.__members__ else JobStatus.UNKNOWN
        if status == JobStatus.UNKNOWN and handle:
            hb = read_heartbeat(self.run_dir)
            status = (JobStatus.RUNNING if hb and _alive(hb.get("pid")) else
                      JobStatus.SUCCEEDED if hb and hb.get("state") in ("completed", "target_reached") else JobStatus.FAILED)
        return status

    def stop_job(self, handle: str) -> None:
        self.tick.evidence = None
        self.jobs.stop(handle)
        hb = read_heartbeat(self.run_dir)
        if isinstance(self.jobs, ProcessJobs) and self.jobs.status(handle) == "UNKNOWN" and hb and _alive(hb.get("pid")):
            # a trainer started by the previous controller: this one has no handle on it

            try:
                psutil.Process(hb["pid"]).kill()
            except psutil.Error:
                pass

    def write_job_config(self) -> pathlib.Path:
        cfg = dict(self.base_cfg)
        cfg["perturbations"] = [p.model_dump(exclude_unset=True) for p in self.goal.perturbations]
        path = self.private / "train.yaml"

        write_private(path, yaml.safe_dump(cfg, sort_keys=False))  # the perturbations: 0600
        return path

    def start_job(self, restart: int = 0) -> str:
        """Start the live job; `restart`: the live jobs started before it (a Ray job's id counts them)."""
        self.tick.evidence = None
        if self.script:
            log_launch(self.store, self.script, self.run_dir)
        handle = self.jobs.start("train", self.run_dir if self.script else self.write_job_config(), restart=restart)
        self.log_replaced_heads()
        self.store.log("job_started", handle=handle)
        return handle

    def log_replaced_heads(self) -> list[RayHead]:
        """The private Ray heads the launcher found dead and replaced since the last call, each a
        timeline row (the reports show it)."""
        dead = self.jobs.take_replaced() if isinstance(self.jobs, RayJobs) else []
        for h in dead:
            self.store.log("ray_head_replaced", old=h.dashboard_url, new=self.jobs.head.dashboard_url if self.jobs.head else None)
        return dead

    def after_head_replaced(self, s: SwarmState) -> dict[str, Any]:
        """The run's private Ray head died (a reboot, an OOM kill) and the launcher replaced it: the
        live job died with it. Unless it had finished, launch it again on the new head, where the
        trainer resumes from its newest good checkpoint in the run folder: one restart, within
        `swarm.max_restarts` (past it the job counts as failed and the run ends as job_failed)."""
        if not self.log_replaced_heads() or not s.job:
            return {}
        hb = read_heartbeat(self.run_dir) or {}
        if hb.get("state") in ("completed", "target_reached"):
            return {"job_status": JobStatus.SUCCEEDED}   # it had finished before its head died
        pid = hb.get("pid")
        try:   # a trainer that outlived its head: no launcher can stop it now (only ours, by its config)
            if _alive(pid) and str(self.private / "train.yaml") in psutil.Process(pid).cmdline():
                psutil.Process(pid).kill()
        except psutil.Error:
            pass
        if s.restarts >= self.goal.swarm.max_restarts:
            return {"job_status": JobStatus.FAILED}
        job = self.start_job(s.restarts + 1)
        self.state_job = job
        self.store.log("job_relaunched", handle=job, reason="ray head replaced", restarts=s.restarts + 1, step=s.step)
        return {"job": job, "restarts": s.restarts + 1, "job_status": JobStatus.PENDING, "launched": time.time()}


def _alive(pid: int | None) -> bool:
    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
