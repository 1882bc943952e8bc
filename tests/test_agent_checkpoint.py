"""Checkpoints, resume, fork and the control inbox of the agent trainer (trainer/agent_state.py,
trainer/agent_control.py), on short real runs of the tiny built-in model (lookup environment,
4 warm-up steps then 4 GRPO steps, a checkpoint every 2 steps; about a second each).

The runs are deterministic (one thread, seeded): a run that is interrupted, stopped, rolled back
or forked and then goes on ends with exactly the weights of the uninterrupted run, and the GRPO
steps after the break sample exactly its trajectories (the sampling generator and data cursor
are restored). Commands are sent from the printer, which the trainer calls with each metrics row:
they reach the inbox before the end of that step."""
from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import torch

from harness.agent import apply_edit
from trainer.agent_train import AgentTrainConfig, AgentTrainer
from trainer.checkpoint import CheckpointManager
from trainer.config import ConfigError, ModelConfig
from trainer.control import send_command
from trainer.runlog import read_jsonl

TINY = {"env": "lookup", "threads": 1, "eval_size": 4, "system_prompt": "Tools: get(key).", "max_new_tokens": 32,
        "max_turns": 4, "log_every": 1, "samples_per_step": 2,
        "model": ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=256, learned_positions=True).model_dump(),
        "sft": {"steps": 4, "batch_size": 4}, "grpo": {"steps": 4, "prompts": 2, "group_size": 2},
        "checkpoint": {"interval": 2, "keep_last": 8}}
STEPS = 8
TINY_GRPO_LR = AgentTrainConfig().grpo.lr


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def config(out, name: str, **over: Any) -> AgentTrainConfig:
    return AgentTrainConfig.parse({**TINY, "out_dir": str(out), "name": name, **over})


def weights(tr: AgentTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.policy.model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def samples(run_dir, step: int) -> list[str]:
    """The transcripts sampled at `step` by the last process that reached it."""
    rows = [r for r in read_jsonl(run_dir / "samples.jsonl") if r["step"] == step]
    return [r["transcript"] for r in rows[-TINY["samples_per_step"]:]]


def events(run_dir, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if kind is None or e["event"] == kind]


def acks(run_dir) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "command_log.jsonl")


class Sender:
    """A printer that sends commands when the run reaches given steps (once each)."""

    def __init__(self, run_dir, plan: dict[int, list[dict[str, Any]]]) -> None:
        self.run_dir, self.plan, self.tr = run_dir, {k: list(v) for k, v in plan.items()}, None

    def __call__(self, line: str) -> None:
        for cmd in self.plan.pop(self.tr.step, []):
            send_command(self.run_dir, **cmd)


def run_with(cfg: AgentTrainConfig, plan: dict[int, list[dict[str, Any]]]) -> tuple[AgentTrainer, dict[str, Any]]:
    sender = Sender(cfg.run_dir, plan)
    tr = AgentTrainer(cfg, printer=sender)
    sender.tr = tr
    return tr, tr.run()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The uninterrupted run every other run is held against."""
    out = tmp_path_factory.mktemp("base")
    n = torch.get_num_threads()
    try:
        tr = AgentTrainer(config(out, "base"), printer=None)
        summary = tr.run()
    finally:
        torch.set_num_threads(n)
    return {"weights": weights(tr), "summary": summary, "dir": out / "base", "grpo_steps": [5, 6, 7]}


# ---- (a) resume -------------------------------------------------------------------------------------
@pytest.mark.parametrize("until, checkpoint, stage", [(3, "step_0000002", "warmup"), (7, "step_0000006", "grpo")])
def test_an_interrupted_run_resumes_from_its_newest_checkpoint_and_ends_as_the_uninterrupted_one(
        tmp_path, base, until, checkpoint, stage):
    first = AgentTrainer(config(tmp_path, "r"), printer=None).run(until=until)
    assert first["status"] == "interrupted" and first["steps"] == until
    tr = AgentTrainer(config(tmp_path, "r"), printer=None)
    summary = tr.run()
    assert summary["status"] == "completed" and summary["steps"] == STEPS == base["summary"]["steps"]
    [resume] = events(tmp_path / "r", "resume")
    assert (resume["checkpoint"], resume["stage"], resume["step"]) == (checkpoint, stage, until - 1)
    assert same(weights(tr), base["weights"]), "resumed weights differ from the uninterrupted run's"
    for step in range(until - 1, STEPS):   # the GRPO steps after the break sample the same trajectories
        if step >= TINY["sft"]["steps"]:
            assert samples(tmp_path / "r", step) == samples(base["dir"], step), step
    rows = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert rows[-1]["final"] and rows[-1]["segment"] == 1 and rows[0]["segment"] == 0


# ---- (b) a torn checkpoint ------------------------------------------------------------------------
def test_a_torn_newest_checkpoint_is_skipped_recorded_and_the_run_resumes_from_the_one_before(tmp_path, base):
    AgentTrainer(config(tmp_path, "t"), printer=None).run(until=7)
    torn = tmp_path / "t" / "checkpoints" / "step_0000006.pt"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    tr = AgentTrainer(config(tmp_path, "t"), printer=None)
    summary = tr.run()
    [bad] = events(tmp_path / "t", "checkpoint_corrupt")
    assert bad["name"] == "step_0000006" and "corrupt" in bad["error"]
    [resume] = events(tmp_path / "t", "resume")
    assert resume["checkpoint"] == "step_0000004" and resume["step"] == 4 and resume["skipped"] == ["step_0000006"]
    assert summary["steps"] == STEPS and same(weights(tr), base["weights"])


# ---- (c) set_harness ------------------------------------------------------------------------------
def test_set_harness_changes_the_version_of_the_next_rows_and_an_invalid_one_is_rejected(tmp_path, base):
    probe = AgentTrainer(config(tmp_path, "probe"), printer=None)
    start = probe.harness
    good = apply_edit(start, "observation.max_chars", 256)
    invalid = {**start.model_dump(mode="json"), "max_turns": 0}
    too_long = {**start.model_dump(mode="json"), "sampling": {**start.sampling.model_dump(), "max_new_tokens": 300}}
    tr, summary = run_with(config(tmp_path, "h"), {
        2: [{"cmd": "set_harness", "id": "bad", "harness": invalid},
            {"cmd": "set_harness", "id": "long", "harness": too_long},
            {"cmd": "set_harness", "id": "none"}],
        3: [{"cmd": "set_harness", "id": "good", "harness": good.model_dump(mode="json")}],
        5: [{"cmd": "set_harness", "id": "again", "version": start.version}]})
    log = {a["id"]: a for a in acks(tmp_path / "h")}
    assert log["bad"]["status"] == "rejected" and "max_turns=0" in log["bad"]["reason"]
    assert log["long"]["status"] == "rejected" and "max_new_tokens=300" in log["long"]["reason"]
    assert log["none"]["status"] == "rejected" and "needs 'harness'" in log["none"]["reason"]
    assert log["good"]["status"] == "applied" and log["good"]["result"]["harness_version"] == good.version
    # the harness the run started with is stored: set back by its version
    assert log["again"]["status"] == "applied" and log["again"]["result"]["harness_version"] == start.version
    versions = {r["step"]: r["harness_version"] for r in read_jsonl(tmp_path / "h" / "metrics.jsonl")
                if not r.get("final")}
    assert all(versions[s] == start.version for s in (0, 1, 2, 3)), "the rejected commands changed nothing"
    assert versions[4] == versions[5] == good.version and versions[6] == start.version
    changes = events(tmp_path / "h", "harness_change")
    assert [(e["command"], e["harness_version"]) for e in changes] == [("good", good.version), ("again", start.version)]
    # the change went into the checkpoint written before its acknowledgement, as a full spec
    st = CheckpointManager(tmp_path / "h" / "checkpoints").load(log["good"]["result"]["checkpoint"])
    assert st["harness"] == good.model_dump(mode="json")
    assert summary["steps"] == STEPS and (tmp_path / "h" / "harnesses" / f"{good.version}.yaml").is_file()


def test_set_recipe_changes_a_field_read_each_step_and_refuses_others(tmp_path):
    tr, _ = run_with(config(tmp_path, "s"), {5: [
        {"cmd": "set_recipe", "id": "lr", "fields": {"grpo.lr": 1e-4}},
        {"cmd": "set_recipe", "id": "steps", "fields": {"grpo.steps": 9}},
        {"cmd": "set_fields", "id": "loss", "fields": {"recipe.grpo.loss": "nope"}},
        {"cmd": "set_recipe", "id": "temp", "fields": {"grpo.temperature": 0.5}},
        {"cmd": "set_fields", "id": "long", "fields": {"harness.sampling.max_new_tokens": 300}}]})
    log = {a["id"]: a for a in acks(tmp_path / "s")}
    # a harness field set on its own is held to the policy's length as a whole harness is
    assert log["long"]["status"] == "rejected" and "below the policy's 256 tokens" in log["long"]["reason"]
    assert log["lr"]["status"] == "applied" and log["temp"]["status"] == "applied"
    assert log["steps"]["status"] == "rejected" and "'grpo.steps' is not" in log["steps"]["reason"]
    assert log["loss"]["status"] == "rejected" and "unknown loss 'nope'" in log["loss"]["reason"]
    rows = [r for r in read_jsonl(tmp_path / "s" / "metrics.jsonl") if r["algorithm"] == "grpo"]
    assert [r["lr"] for r in rows] == [TINY_GRPO_LR, 1e-4, 1e-4, 1e-4]
    assert tr.harness.sampling.temperature == 0.5 and rows[0]["harness_version"] != rows[1]["harness_version"]


# ---- (d) rollback ---------------------------------------------------------------------------------
def test_rollback_restores_the_named_checkpoint_and_the_run_replays_from_it(tmp_path, base):
    tr, summary = run_with(config(tmp_path, "b"), {2: [{"cmd": "checkpoint", "id": "c", "name": "mark"}],
                                                   6: [{"cmd": "rollback", "id": "r", "name": "mark"},
                                                       {"cmd": "rollback", "id": "x", "name": "nowhere"}]})
    log = {a["id"]: a for a in acks(tmp_path / "b")}
    assert log["c"]["result"] == {"checkpoint": "mark"}
    assert log["r"]["status"] == "applied" and log["r"]["result"]["step"] == 2
    assert log["x"]["status"] == "rejected" and "no checkpoint named 'nowhere'" in log["x"]["reason"]
    ck = CheckpointManager(tmp_path / "b" / "checkpoints")
    mark, after = ck.load("mark"), ck.load(log["r"]["result"]["checkpoint"])   # saved right after the rollback
    assert after["step"] == 2 and same(after["model"], mark["model"])
    assert not same(mark["model"], base["weights"])
    rows = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    steps = [(r["step"], r["segment"]) for r in rows if r["algorithm"] != "eval"]
    assert steps == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1)]
    # everything after the mark was replayed from its state: the run ends as the uninterrupted one
    assert summary["steps"] == STEPS and same(weights(tr), base["weights"])


# ---- (e) once only --------------------------------------------------------------------------------
def test_a_command_is_not_applied_again_after_a_restart(tmp_path):
    cfg = config(tmp_path, "o")
    sender = Sender(cfg.run_dir, {3: [{"cmd": "checkpoint", "id": "once", "name": "once"},
                                      {"cmd": "set_recipe", "id": "lr", "fields": {"grpo.lr": 1e-4}}]})
    sender.tr = AgentTrainer(cfg, printer=sender)
    sender.tr.run(until=6)
    tr = AgentTrainer(config(tmp_path, "o"), printer=None)
    summary = tr.run()
    assert [e["step"] for e in events(tmp_path / "o", "resume")] == [6]
    assert [a["id"] for a in acks(tmp_path / "o")] == ["once", "lr"], "a command acknowledged twice"
    assert [e["step"] for e in events(tmp_path / "o", "checkpoint") if e["name"] == "once"] == [3]
    # what it set holds after the restart: the checkpoint carries it, not the config
    grpo = [r for r in read_jsonl(tmp_path / "o" / "metrics.jsonl") if r["algorithm"] == "grpo"]
    assert {r["lr"] for r in grpo} == {1e-4} and tr.cfg.grpo.lr == 1e-4 and summary["steps"] == STEPS


# ---- stop, pause ----------------------------------------------------------------------------------
def test_stop_ends_the_run_with_a_checkpoint_and_a_restart_goes_on_to_the_same_end(tmp_path, base):
    _, stopped = run_with(config(tmp_path, "p", checkpoint={"interval": 0}), {3: [{"cmd": "stop", "id": "s"}]})
    assert stopped["status"] == "stopped_by_command" and stopped["steps"] == 3
    assert events(tmp_path / "p", "end")[-1]["status"] == "stopped_by_command"
    tr = AgentTrainer(config(tmp_path, "p", checkpoint={"interval": 0}), printer=None)
    summary = tr.run()
    assert events(tmp_path / "p", "resume")[0]["step"] == 3
    assert summary["status"] == "completed" and summary["steps"] == STEPS and same(weights(tr), base["weights"])


def test_pause_holds_the_run_at_a_step_end_until_resume(tmp_path):
    cfg = config(tmp_path, "z")
    seen: list[dict[str, Any]] = []

    def resume_later() -> None:
        seen.append(json.loads((cfg.run_dir / "heartbeat.json").read_text()))
        send_command(cfg.run_dir, "resume", id="go")

    class Pauser(Sender):
        def __call__(self, line: str) -> None:
            if self.tr.step == 2 and self.plan is not None:
                self.plan = None
                send_command(self.run_dir, "pause", id="hold")
                threading.Timer(0.6, resume_later).start()

    sender = Pauser(cfg.run_dir, {})
    sender.tr = AgentTrainer(cfg, printer=sender)
    summary = sender.tr.run()
    assert seen and seen[0]["state"] == "paused" and seen[0]["step"] == 2
    assert [(a["id"], a["step"], a["result"]) for a in acks(tmp_path / "z")] == [
        ("hold", 2, {"paused": True}), ("go", 2, {"paused": False})]
    assert summary["steps"] == STEPS


# ---- (f) fork -------------------------------------------------------------------------------------
def test_fork_from_starts_from_the_source_checkpoint_with_its_overrides(tmp_path, base):
    src = base["dir"] / "checkpoints" / "step_0000006.pt"
    source = CheckpointManager(src.parent).load(src.stem)
    fork = AgentTrainer(config(tmp_path, "f", fork_from=str(src),
                               fork_overrides={"grpo.lr": 1e-4, "harness.max_turns": 3}), printer=None)
    fork.start()
    assert same(weights(fork), source["model"]) and fork.step == 6 and fork.stage == "grpo"
    assert fork.cfg.grpo.lr == 1e-4 and fork.harness.max_turns == 3 and fork.cursor == source["cursor"]
    [start] = events(tmp_path / "f", "start")
    assert start["fork_from"] == str(src) and start["harness_version"] == fork.harness.version
    # config.yaml says what trains: the checkpoint's recipe fields with the overrides
    import yaml
    written = yaml.safe_load((tmp_path / "f" / "config.yaml").read_text())
    assert written["grpo"]["lr"] == 1e-4 and written["fork_overrides"] == {"grpo.lr": 1e-4, "harness.max_turns": 3}
    fork.close()
    # without overrides a fork goes on as its source did: the same episodes, samples and weights
    tr = AgentTrainer(config(tmp_path, "g", fork_from=str(src)), printer=None)
    summary = tr.run()
    assert summary["steps"] == STEPS and same(weights(tr), base["weights"])
    assert samples(tmp_path / "g", 7) == samples(base["dir"], 7)


def test_fork_errors_name_the_field(tmp_path, base):
    with pytest.raises(ConfigError, match="fork_overrides: 'eval_size' is not"):
        config(tmp_path, "e", fork_from="x.pt", fork_overrides={"eval_size": 3})
    with pytest.raises(ConfigError, match="needs fork_from"):
        config(tmp_path, "e", fork_overrides={"grpo.lr": 1e-4})
    with pytest.raises(ConfigError, match="checkpoint file not found"):
        AgentTrainer(config(tmp_path, "e", fork_from=str(tmp_path / "none.pt")), printer=None).run()
    src = base["dir"] / "checkpoints" / "step_0000006.pt"
    with pytest.raises(ConfigError, match="fork_overrides: max_turns=0"):
        AgentTrainer(config(tmp_path, "e2", fork_from=str(src), fork_overrides={"harness.max_turns": 0}),
                     printer=None).run()


# ---- co-evolution ---------------------------------------------------------------------------------
def test_a_coevolution_run_resumed_under_the_improved_harness_ends_with_the_same_summary(tmp_path):
    """The critic keeps an edit (a scripted agent that writes call syntax, a json fault: see
    tests/test_harness_critic_train.py); the run is interrupted in the GRPO stage under the improved
    harness and resumed: the critic's verdicts, both harness versions and the distillation's
    numbers come from the checkpoint, and the run ends as the uninterrupted one."""
    from test_harness_critic_train import GroundedTrainer
    from test_harness_critic_train import config as critic_config

    def cfg(name: str) -> AgentTrainConfig:
        c = critic_config(tmp_path / name, grpo={"steps": 2, "prompts": 2, "group_size": 2}, critic={"grpo_steps": 2})
        return c.model_copy(update={"checkpoint": c.checkpoint.model_copy(update={"interval": 1})})

    whole = GroundedTrainer(cfg("a"), printer=None)
    expected = whole.run()
    assert expected["harness"] != expected["start_harness"] and expected["steps"] == 6
    GroundedTrainer(cfg("b"), printer=None).run(until=3)
    tr = GroundedTrainer(cfg("b"), printer=None)
    summary = tr.run()
    [resume] = events(tmp_path / "b" / "crit", "resume")
    assert (resume["stage"], resume["step"]) == ("grpo_critic", 3)
    assert len(events(tmp_path / "b" / "crit", "harness_edit")) == 1, "the critic round ran once, before the break"
    differ = {k for k in expected if k not in ("wall_s", "run_dir") and expected[k] != summary[k]}
    assert not differ and same(weights(tr), weights(whole))
