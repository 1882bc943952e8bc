"""The agent trainer's untrained checkpoint `init` (trainer/agent_train.py `start`), on real runs
of the tiny built-in agent model (lookup, 4 warm-up steps, then 2 GRPO steps).

A fresh run with periodic checkpoints saves its untrained state as `init`: the weights it was built
with, an empty optimiser, step 0 of the warm-up. Retention never prunes it, the controller lists it
(so a fix may start over from it: `agents.operators.worthless_weights`), and a `rollback` to it on a
live run puts the run back at its start, from where it replays the run that never rolled back. A
resume or a fork starts from trained weights, so it saves none.
"""
from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest
import torch

from agents.evidence import collect
from agents.operators import worthless_weights
from swarm.agent_backtest import fork_position
from swarm.controller import Memo
from swarm.job_control import JobControl
from trainer.agent_train import AgentTrainConfig, AgentTrainer
from trainer.checkpoint import CheckpointManager
from trainer.control import send_command
from trainer.runlog import INIT_CHECKPOINT, read_jsonl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_agent_rollback import TINY as ROLLBACK_TINY, _threads, moments, same  # noqa: E402,F401 (_threads: autouse)

TINY = {**ROLLBACK_TINY, "sft": {"steps": 4, "batch_size": 4, "warmup_steps": 0},
        "grpo": {"steps": 2, "prompts": 2, "group_size": 2}}
STEPS = 6


def config(out: pathlib.Path, name: str, **over: Any) -> AgentTrainConfig:
    return AgentTrainConfig.parse({**TINY, "out_dir": str(out), "name": name, **over})


def weights(tr: AgentTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.policy.model.state_dict().items()}


def events(run_dir: pathlib.Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def run_sending(cfg: AgentTrainConfig, plan: dict[int, list[dict[str, Any]]],
                seen: dict[int, dict[str, torch.Tensor]] | None = None) -> tuple[AgentTrainer, dict[str, Any]]:
    """Run `cfg`, sending `plan[step]`'s commands with the metrics row of that step (they reach the
    inbox before its step end); `seen[step]`: the weights when that row was written."""
    def printer(line: str) -> None:
        if seen is not None and tr.step in plan:
            seen[tr.step] = weights(tr)
        for c in plan.pop(tr.step, []):
            send_command(cfg.run_dir, **c)

    tr = AgentTrainer(cfg, printer=printer)
    return tr, tr.run()


class Listing(JobControl):
    """The controller's checkpoint listing (`JobControl.checkpoints`) of one run folder."""

    def __init__(self, run_dir: pathlib.Path) -> None:
        self.run_dir, self.memo = run_dir, Memo()


def test_a_fresh_run_saves_its_untrained_start_as_init_which_retention_keeps_and_the_controller_lists(tmp_path):
    cfg = config(tmp_path, "f", checkpoint={"interval": 1, "keep_last": 1})
    tr = AgentTrainer(cfg, printer=None)
    untrained = weights(tr)
    summary = tr.run()
    assert summary["status"] == "completed" and summary["steps"] == STEPS

    ck = CheckpointManager(cfg.run_dir / "checkpoints")
    kinds = {m["name"]: (m["kind"], m["step"]) for m in ck.manifests()}
    # a checkpoint every step, the newest one kept, and `init` beside it
    assert kinds == {INIT_CHECKPOINT: ("named", 0), f"step_{STEPS:07d}": ("periodic", STEPS)}
    init = ck.load(INIT_CHECKPOINT)
    assert same(init["model"], untrained) and not same(init["model"], weights(tr))
    assert init["opt"]["state"] == {} and init["ref"] is None
    assert (init["step"], init["stage"], init["stage_step"], init["cursor"]) == (0, "warmup", 0, 0)
    # saved after the untrained eval: a rollback to it keeps that row and its held-out success
    assert [r["algorithm"] for r in init["history"]] == ["eval"]
    assert init["heldout_start"] == init["history"][0]["heldout_acc"] == summary["heldout_acc_start"]

    # the controller: listed with the run's checkpoints, its position known (a backtest arm forks
    # it there), and the gate of a fix that starts over opens (here at any held-out success)
    listed = Listing(cfg.run_dir).checkpoints()
    assert [(c["name"], c["step"]) for c in listed] == [(INIT_CHECKPOINT, 0), (f"step_{STEPS:07d}", STEPS)]
    assert fork_position(cfg.run_dir, INIT_CHECKPOINT) == ("warmup", 0)
    ev = collect(cfg.run_dir)
    assert worthless_weights(ev, listed, heldout_max=1.0) is not None
    assert worthless_weights(ev, listed[1:], heldout_max=1.0) is None


def test_a_run_without_periodic_checkpoints_saves_no_init(tmp_path):
    cfg = config(tmp_path, "n", checkpoint={"interval": 0}, grpo={"steps": 0})
    AgentTrainer(cfg, printer=None).run()
    assert not (cfg.run_dir / "checkpoints" / f"{INIT_CHECKPOINT}.pt").exists()
    assert not events(cfg.run_dir, "checkpoint")


def test_a_resume_or_a_fork_saves_no_init(tmp_path):
    # stopped at step 2 with periodic checkpoints off (the stop's checkpoint is its only one), then
    # started again with them on: it resumes from trained weights and saves no `init`
    _, stopped = run_sending(config(tmp_path, "r", checkpoint={"interval": 0}), {2: [{"cmd": "stop", "id": "s"}]})
    assert stopped["status"] == "stopped_by_command" and stopped["steps"] == 2
    cfg = config(tmp_path, "r")
    summary = AgentTrainer(cfg, printer=None).run()
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    [resume] = events(cfg.run_dir, "resume")
    assert (resume["checkpoint"], resume["step"]) == ("step_0000002", 2)
    names = {m["name"] for m in CheckpointManager(cfg.run_dir / "checkpoints").manifests()}
    assert INIT_CHECKPOINT not in names and names >= {"step_0000004", f"step_{STEPS:07d}"}
    assert INIT_CHECKPOINT not in {e["name"] for e in events(cfg.run_dir, "checkpoint")}

    # a run killed after its `init` resumes with that one, not a second one from trained weights
    src = config(tmp_path, "s")
    AgentTrainer(src, printer=None).run(until=3)
    ck = CheckpointManager(src.run_dir / "checkpoints")
    first = {m["name"]: m for m in ck.manifests()}[INIT_CHECKPOINT]
    AgentTrainer(config(tmp_path, "s"), printer=None).run()
    assert {m["name"]: m for m in ck.manifests()}[INIT_CHECKPOINT] == first
    assert [e["step"] for e in events(src.run_dir, "checkpoint") if e["name"] == INIT_CHECKPOINT] == [0]

    # a fork of that run (which kept an `init`) starts from its step-2 weights and saves none
    fork = config(tmp_path, "k", fork_from=str(src.run_dir / "checkpoints" / "step_0000002.pt"))
    summary = AgentTrainer(fork, printer=None).run()
    assert summary["status"] == "completed" and events(fork.run_dir, "start")[0]["fork_from"] == fork.fork_from
    names = {m["name"] for m in CheckpointManager(fork.run_dir / "checkpoints").manifests()}
    assert INIT_CHECKPOINT not in names and f"step_{STEPS:07d}" in names


def test_a_rollback_to_init_puts_the_live_run_back_at_its_untrained_start_and_it_replays_the_run(tmp_path):
    """The rollback at step 5, the first GRPO step, takes the run to step 0 of the warm-up; from
    there it trains the steps of a run that never rolled back, to the same end."""
    never = AgentTrainer(config(tmp_path, "base"), printer=None)
    base = never.run()

    cfg = config(tmp_path, "rb")
    seen: dict[int, dict[str, torch.Tensor]] = {}
    tr, summary = run_sending(cfg, {5: [{"cmd": "rollback", "id": "rb", "name": INIT_CHECKPOINT}]}, seen)
    [ack] = read_jsonl(cfg.run_dir / "command_log.jsonl")
    assert ack["status"] == "applied", ack
    rb = ack["result"]
    assert rb["rolled_back_to"] == INIT_CHECKPOINT and (rb["step"], rb["stage"], rb["stage_step"]) == (0, "warmup", 0)
    assert rb["recipe"]["sft.lr"] == cfg.sft.lr and rb["harness_version"] == tr.start_harness.version

    ck = CheckpointManager(cfg.run_dir / "checkpoints")
    init, restored = ck.load(INIT_CHECKPOINT), ck.load(rb["checkpoint"])   # the latter saved right after the rollback
    assert same(restored["model"], init["model"]) and not same(seen[5], init["model"])
    assert restored["opt"]["state"] == init["opt"]["state"] == {} and moments(ck.load("step_0000002")["opt"])
    assert (restored["step"], restored["stage"], restored["stage_step"], restored["cursor"]) == (0, "warmup", 0, 0)
    assert restored["heldout_warm"] is None   # the warm-up's result does not outlive a rollback to before it
    [event] = events(cfg.run_dir, "rollback")
    assert (event["name"], event["step"], event["stage"], event["stage_step"]) == (INIT_CHECKPOINT, 0, "warmup", 0)

    rows = [(r["algorithm"], r["step"], r["segment"]) for r in read_jsonl(cfg.run_dir / "metrics.jsonl")
            if r["algorithm"] in ("sft", "grpo")]
    assert rows == [("sft", s, 0) for s in (1, 2, 3, 4)] + [("grpo", 5, 0)] + \
        [("sft", s, 1) for s in (1, 2, 3, 4)] + [("grpo", 5, 1), ("grpo", 6, 1)]
    assert summary["status"] == "completed" and summary["steps"] == base["steps"] == STEPS
    assert same(weights(tr), weights(never)), "the replay from init ends with other weights than the run without it"
