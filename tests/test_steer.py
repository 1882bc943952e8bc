"""SwarmCallback on a real `transformers.Trainer`: a 1-layer GPT-2 built from a config (nothing
downloaded), random token ids, CPU, 8–20 optimizer steps per run.

Commands reach the run the way a controller sends them: `trainer.control.send_command` appends to
RUN_DIR/commands.jsonl. A small callback placed before SwarmCallback sends them at a chosen step
end, so the step at which each lands is deterministic; a probe records what the optimizer actually
uses at each step (its param groups after clipping, just before `optimizer.step()`).
"""
from __future__ import annotations

import json
import math
import pathlib
import time
from collections import defaultdict, deque
from typing import Any

import pytest

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (not in the test extras)")

import torch  # noqa: E402
from transformers import (GenerationConfig, GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments, get_scheduler)

from trainer.control import send_command  # noqa: E402
from trainer.runlog import read_heartbeat, read_jsonl  # noqa: E402
from trainer.steer import check_change, read_declared, steer  # noqa: E402

VOCAB, SEQ = 64, 16


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def tiny_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=1))


def make_args(out: pathlib.Path, **over: Any) -> TrainingArguments:
    kw = dict(output_dir=str(out), max_steps=20, per_device_train_batch_size=4, learning_rate=1e-3,
              lr_scheduler_type="linear", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
              disable_tqdm=True, weight_decay=0.01, dataloader_num_workers=0, seed=0)
    kw.update(over)
    return TrainingArguments(**kw)


class SendAt(TrainerCallback):
    """Sends commands at given step ends (before SwarmCallback reads the inbox at the same one)."""

    def __init__(self, run_dir: pathlib.Path, plan: dict[int, list[dict[str, Any]]]) -> None:
        self.run_dir, self.plan = run_dir, plan

    def on_step_end(self, args, state, control, **kwargs):
        for c in self.plan.get(state.global_step, []):
            c = dict(c)
            if c.pop("raw", None):
                with open(self.run_dir / "commands.jsonl", "a") as f:
                    f.write(c["line"] + "\n")
            else:
                send_command(self.run_dir, c.pop("cmd"), **c)


class Probe(TrainerCallback):
    """What the optimizer uses for each update, keyed by the update's index (0-based): every
    group's lr and weight decay, and the gradient norm after clipping."""

    def __init__(self) -> None:
        self.lr: dict[int, list[float]] = {}
        self.wd: dict[int, list[float]] = {}
        self.clipped: dict[int, float] = {}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, model=None, **kwargs):
        i = state.global_step
        self.lr[i] = [g["lr"] for g in optimizer.param_groups]
        self.wd[i] = [g["weight_decay"] for g in optimizer.param_groups]
        grads = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
        self.clipped[i] = float(torch.stack(grads).norm())


class Crash(TrainerCallback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt("killed")   # not an Exception: nothing in the Trainer handles it


def train(tmp: pathlib.Path, run_dir: pathlib.Path, plan=None, extra=(), trainer_cls=Trainer, resume=None,
          eval_ds=True, **args: Any) -> tuple[Trainer, Probe]:
    probe = Probe()
    cbs = [SendAt(run_dir, plan or {}), probe, *extra]
    tr = trainer_cls(model=tiny_model(), args=make_args(tmp / "out", **args), train_dataset=Tokens(512, 0),
                     eval_dataset=Tokens(16, 1) if eval_ds else None, callbacks=cbs)
    steer(tr, run_dir)
    tr.train(resume_from_checkpoint=resume)
    return tr, probe


def multipliers(kind: str, steps: int, warmup: int) -> list[float]:
    """The schedule's factor at each update, from transformers' own scheduler on a dummy optimizer."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def acks(run_dir: pathlib.Path) -> dict[str, dict[str, Any]]:
    rows = read_jsonl(run_dir / "command_log.jsonl")
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"an id was acknowledged twice: {ids}"
    return {r["id"]: r for r in rows}


# ---- the run folder ------------------------------------------------------------------------------

def test_the_run_folder_is_the_format_the_swarm_reads(tmp_path):
    from agents.detection import run_detectors
    from agents.evidence import collect
    import agents.detectors  # noqa: F401  (registers the detectors)

    run = tmp_path / "run"
    train(tmp_path, run, eval_strategy="steps", eval_steps=10, save_strategy="steps", save_steps=10,
          save_total_limit=1)
    rows = read_jsonl(run / "metrics.jsonl")
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 21))
    m = multipliers("linear", 20, 0)
    for r in train_rows:   # the lr row of step s is the lr its update used
        assert r["lr"] == pytest.approx(1e-3 * m[r["step"] - 1]) and r["grad_norm"] > 0 and r["segment"] == 0
    evals = [r for r in rows if "heldout_loss" in r]
    assert [r["step"] for r in evals] == [10, 20] and all(math.isfinite(r["heldout_loss"]) for r in evals)
    assert "eval_runtime" in evals[0] and "eval_loss" not in evals[0]

    ev = collect(run, "SUCCEEDED")
    assert ev.step == 20 and [r["step"] for r in ev.evals] == [10, 20] and ev.heartbeat_state == "completed"
    assert read_heartbeat(run)["step"] == 20
    assert [e["event"] for e in ev.events][0] == "start" and ev.events[-1]["event"] == "end"
    assert ev.events[-1]["status"] == "completed" and "train_runtime" in ev.events[-1]
    run_detectors(ev)   # every detector reads these rows without an error

    # the checkpoint index follows the Trainer's rotation (save_total_limit=1: only checkpoint-20),
    # beside the untrained start the callback saved before step 1, outside the rotation
    index = sorted((json.loads(p.read_text()) for p in (run / "checkpoints").glob("*.json")), key=lambda c: -c["step"])
    assert [(c["name"], c["step"], c["kind"]) for c in index] == [("checkpoint-20", 20, "periodic"), ("init", 0, "init")]
    assert all(pathlib.Path(c["path"]).is_dir() and c["files"]["trainer_state.json"] > 0 for c in index)
    assert pathlib.Path(index[1]["path"]).name == "swarm-init"

    declared = read_declared(run)
    kinds = {s["name"]: s["apply"] for s in declared["settings"]}
    assert {k: kinds[k] for k in ("learning_rate", "weight_decay", "max_grad_norm")} == dict.fromkeys(
        ("learning_rate", "weight_decay", "max_grad_norm"), "hot")
    assert kinds["per_device_train_batch_size"] == "restart" and "temperature" not in kinds   # nothing generates
    assert declared["values"]["learning_rate"] == pytest.approx(1e-3) and declared["values"]["weight_decay"] == 0.01
    assert check_change(declared, {"learning_rate": 2e-3}) is None


# ---- hot settings --------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_an_lr_command_changes_the_lr_of_the_following_updates(tmp_path, schedule):
    run = tmp_path / "run"
    tr, probe = train(tmp_path, run, plan={5: [{"cmd": "set_fields", "id": "lr1", "fields": {"learning_rate": 5e-3}}]},
                      lr_scheduler_type=schedule, warmup_steps=2)
    m = multipliers(schedule, 20, 2)
    for i in range(20):   # updates 0..4 ran before the command, 5.. after it
        base = 1e-3 if i < 5 else 5e-3
        assert probe.lr[i][0] == pytest.approx(base * m[i], rel=1e-9), (i, probe.lr[i], base * m[i])
    ack = acks(run)["lr1"]
    assert ack["status"] == "applied" and ack["step"] == 5 and ack["result"]["values"] == {"learning_rate": pytest.approx(5e-3)}
    assert tr.lr_scheduler.base_lrs == [pytest.approx(5e-3)] * len(tr.lr_scheduler.base_lrs)
    logged = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if "lr" in r}
    assert logged[7] == pytest.approx(5e-3 * m[6])
    assert read_declared(run)["overrides"] == {"learning_rate": pytest.approx(5e-3)}


def test_weight_decay_and_grad_clipping_take_effect(tmp_path):
    run = tmp_path / "run"
    _, probe = train(tmp_path, run, max_steps=10, weight_decay=0.0, max_grad_norm=0.0,
                     plan={4: [{"cmd": "set_fields", "id": "wd", "fields": {"weight_decay": 0.05, "max_grad_norm": 0.01}}]})
    # Trainer puts biases and LayerNorm weights in a group without decay: it must stay at 0
    assert probe.wd[0] == [0.0, 0.0]
    for i in range(4, 10):
        assert probe.wd[i] == [0.05, 0.0], (i, probe.wd[i])
        assert probe.clipped[i] <= 0.01 * (1 + 1e-4), (i, probe.clipped[i])
    assert all(probe.clipped[i] > 0.1 for i in range(4))   # unclipped before the command
    ack = acks(run)["wd"]
    assert ack["status"] == "applied" and ack["result"]["values"] == {"weight_decay": 0.05, "max_grad_norm": 0.01}


def test_bad_commands_are_refused_with_the_reason_check_change_gives(tmp_path):
    from agents.detection import run_detectors
    from agents.evidence import collect
    import agents.detectors  # noqa: F401

    run = tmp_path / "run"
    bad = {"neg": {"learning_rate": -1.0}, "unknown": {"lora_rank": 8}, "type": {"learning_rate": "high"},
           "bool": {"max_grad_norm": True}, "whole": {"learning_rate": 2e-3, "weight_decay": 7.0}}
    plan = {3: [{"cmd": "set_fields", "id": k, "fields": v} for k, v in bad.items()]
            + [{"cmd": "rollback", "id": "rollback", "name": "x"}, {"cmd": "set_fields", "id": "nofields"},
               {"raw": True, "line": "{not json"}]}
    _, probe = train(tmp_path, run, max_steps=8, plan=plan)
    got = acks(run)
    declared = read_declared(run)
    for k, change in bad.items():
        assert got[k]["status"] == "rejected" and got[k]["step"] == 3
        assert got[k]["reason"] == check_change(declared, change) is not None   # the swarm's pre-check agrees
    assert "learning_rate=-1.0: must be > 0" == got["neg"]["reason"]
    assert got["unknown"]["reason"].startswith("unknown setting 'lora_rank'")
    assert got["whole"]["reason"] == "weight_decay=7.0: must be <= 1"
    assert got["rollback"]["status"] == "rejected" and "no checkpoint 'x' in the run's index" in got["rollback"]["reason"]
    assert got["nofields"]["status"] == "rejected" and got["line8"]["status"] == "rejected"
    m = multipliers("linear", 8, 0)
    assert [probe.lr[i][0] for i in range(8)] == pytest.approx([1e-3 * x for x in m])   # nothing applied
    assert read_declared(run)["overrides"] == {}
    assert [d.name for d in run_detectors(collect(run, "SUCCEEDED"), ["command_refused"])] == ["command_refused"]


# ---- generation settings (a trainer that generates every step, shaped like TRL's GRPOTrainer) ----

class Generating(Trainer):
    """Generates a completion per step from the batch's first tokens with the settings it keeps
    where TRL keeps them (`temperature`, `max_completion_length`, `generation_config`) and logs
    them in TRL's `_logs` layout."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.temperature = 1.0
        self.max_completion_length = 4
        self.generation_config = GenerationConfig(max_new_tokens=4, min_new_tokens=1, do_sample=True, temperature=1.0,
                                                  pad_token_id=1)
        self._logs = {"prompt": deque(maxlen=8), "completion": deque(maxlen=8),
                      "rewards": defaultdict(lambda: deque(maxlen=8)), "advantages": deque(maxlen=8)}
        self.lengths: list[int] = []
        self.temperatures: list[float] = []

    def compute_loss(self, model, inputs, *a: Any, **kw: Any):
        prompt = inputs["input_ids"][:2, :3]
        with torch.no_grad():
            self.generation_config.min_new_tokens = self.generation_config.max_new_tokens   # no early stop
            out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                 generation_config=self.generation_config)
        comp = out[:, prompt.shape[1]:]
        self.lengths.append(comp.shape[1])
        self.temperatures.append(self.generation_config.temperature)
        for p, c in zip(prompt.tolist(), comp.tolist()):
            self._logs["prompt"].append(" ".join(map(str, p)))
            self._logs["completion"].append(" ".join(map(str, c)))
            self._logs["rewards"]["even"].append(float(sum(x % 2 == 0 for x in c)) / len(c))
            self._logs["advantages"].append(0.0)
        return super().compute_loss(model, inputs, *a, **kw)


def test_generation_settings_are_hot_where_the_trainer_reads_them(tmp_path):
    run = tmp_path / "run"
    tr, _ = train(tmp_path, run, max_steps=8, trainer_cls=Generating,
                  plan={3: [{"cmd": "set_fields", "id": "gen", "fields": {"max_completion_length": 7, "temperature": 0.5}}]})
    assert tr.lengths == [4, 4, 4, 7, 7, 7, 7, 7]
    assert tr.temperatures == [1.0] * 3 + [0.5] * 5
    assert tr.temperature == 0.5 and tr.max_completion_length == 7
    ack = acks(run)["gen"]
    assert ack["status"] == "applied" and ack["result"]["values"] == {"max_completion_length": 7, "temperature": 0.5}
    kinds = {s["name"]: s["apply"] for s in read_declared(run)["settings"]}
    assert kinds["temperature"] == kinds["max_completion_length"] == "hot"
    samples = read_jsonl(run / "samples.jsonl")
    # each step's two completions, each written once (not again at the next log)
    assert [s["step"] for s in samples] == [s for s in range(1, 9) for _ in range(2)]
    assert [len(s["completion"].split()) for s in samples] == [4] * 6 + [7] * 10
    assert all(0.0 <= s["reward"] <= 1.0 and "prompt" in s and set(s["rewards"]) == {"even"} for s in samples)


class Clamped(Generating):
    """A trainer whose completion length is clamped by the model's context (reads back ≤ 16)."""

    @property
    def max_completion_length(self) -> int:
        return self._mcl

    @max_completion_length.setter
    def max_completion_length(self, v: int) -> None:
        self._mcl = min(int(v), 16)


def test_a_change_that_does_not_read_back_is_acked_failed_and_undone(tmp_path):
    run = tmp_path / "run"
    tr, _ = train(tmp_path, run, max_steps=6, trainer_cls=Clamped,
                  plan={2: [{"cmd": "set_fields", "id": "long", "fields": {"temperature": 0.5, "max_completion_length": 64}}]})
    ack = acks(run)["long"]
    assert ack["status"] == "rejected" and ack["reason"].startswith("failed: max_completion_length") and "16" in ack["reason"]
    # the whole change is undone, the setting that did take included
    assert tr.temperature == 1.0 and tr.generation_config.temperature == 1.0 and tr.temperatures == [1.0] * 6
    assert tr.lengths == [4] * 6 and read_declared(run)["overrides"] == {}


# ---- actions -------------------------------------------------------------------------------------

def test_a_paused_run_trains_nothing_until_resumed_and_handles_commands_meanwhile(tmp_path):
    """`pause` holds the run at the step end, its heartbeat `paused` and fresh; a hot change sent
    while it waits is applied there; `resume` lets it go on, with the change in force."""
    import threading

    run = tmp_path / "run"
    seen: dict[str, Any] = {}

    def operator() -> None:   # the swarm's side, while the Trainer waits in on_step_end
        deadline = time.time() + 120
        try:
            while (read_heartbeat(run) or {}).get("state") != "paused" and time.time() < deadline:
                time.sleep(0.05)
            first = read_heartbeat(run)
            time.sleep(1.2)
            seen["beats"] = (first, read_heartbeat(run))
            seen["rows"] = [r["step"] for r in read_jsonl(run / "metrics.jsonl")]
            send_command(run, "set_fields", id="lr", fields={"learning_rate": 5e-4})
            while "lr" not in acks(run) and time.time() < deadline:
                time.sleep(0.05)
        finally:
            send_command(run, "resume", id="go")   # never leave the Trainer waiting

    t = threading.Thread(target=operator, daemon=True)
    t.start()
    _, probe = train(tmp_path, run, max_steps=8, lr_scheduler_type="constant", plan={3: [{"cmd": "pause", "id": "hold"}]})
    t.join(5)
    got = acks(run)
    assert [got[i]["status"] for i in ("hold", "lr", "go")] == ["applied"] * 3
    assert [got[i]["step"] for i in ("hold", "lr", "go")] == [3, 3, 3]
    first, later = seen["beats"]
    assert first["state"] == later["state"] == "paused" and first["step"] == later["step"] == 3
    assert later["time"] > first["time"]                    # rewritten while it waits: not a hung job
    assert max(seen["rows"]) <= 3                           # nothing trained during the pause
    assert [probe.lr[i][0] for i in range(8)] == pytest.approx([1e-3] * 3 + [5e-4] * 5)
    assert read_heartbeat(run)["state"] == "completed"
    assert [e["event"] for e in read_jsonl(run / "events.jsonl") if e["event"] in ("paused", "resumed")] == ["paused", "resumed"]


def test_eval_and_checkpoint_now_are_acked_when_done(tmp_path):
    run = tmp_path / "run"
    train(tmp_path, run, max_steps=6, plan={2: [{"cmd": "eval", "id": "ev"}, {"cmd": "checkpoint", "id": "ck"}],
                                            4: [{"cmd": "stop", "id": "halt"}]})
    got = acks(run)
    assert got["ev"]["status"] == "applied" and got["ev"]["step"] == 2
    assert math.isfinite(got["ev"]["result"]["metrics"]["heldout_loss"])
    assert got["ck"]["status"] == "applied" and pathlib.Path(got["ck"]["result"]["checkpoint"]).name == "checkpoint-2"
    assert json.loads((run / "checkpoints" / "checkpoint-2.json").read_text())["kind"] == "named"
    assert got["halt"]["status"] == "applied" and read_heartbeat(run)["state"] == "stopped_by_command"
    assert max(r["step"] for r in read_jsonl(run / "metrics.jsonl")) == 4


def test_eval_without_an_eval_dataset_is_refused(tmp_path):
    run = tmp_path / "run"
    train(tmp_path, run, max_steps=4, eval_ds=False, plan={2: [{"cmd": "eval", "id": "ev"}]})
    assert acks(run)["ev"] == {**acks(run)["ev"], "status": "rejected", "reason": "the trainer has no eval_dataset"}


# ---- restart settings and resumes ----------------------------------------------------------------

def test_a_restart_setting_checkpoints_records_and_stops_then_the_relaunch_is_checked(tmp_path):
    run = tmp_path / "run"
    tr, _ = train(tmp_path, run, max_steps=10,
                  plan={5: [{"cmd": "set_fields", "id": "bs", "fields": {"per_device_train_batch_size": 8}},
                            {"cmd": "set_fields", "id": "later", "fields": {"learning_rate": 2e-3}}]})
    assert tr.state.global_step == 5
    ack = acks(run)["bs"]
    ckpt = tmp_path / "out" / "checkpoint-5"
    assert ack["status"] == "restart" and ack["result"] == {"restart": {"per_device_train_batch_size": 8}, "checkpoint": str(ckpt)}
    assert "later" not in acks(run)   # left for the relaunched process
    assert (ckpt / "optimizer.pt").is_file() and read_heartbeat(run)["state"] == "restart_pending"
    req = json.loads((run / "restart.json").read_text())
    assert req["status"] == "pending" and req["checkpoint"] == str(ckpt) and req["changes"] == {"per_device_train_batch_size": 8}
    assert json.loads((run / "checkpoints" / "checkpoint-5.json").read_text())["kind"] == "named"

    # the relaunch (what the relauncher will do): the change in the args, resumed from the checkpoint
    tr2, probe = train(tmp_path, run, max_steps=10, per_device_train_batch_size=8, resume=str(ckpt))
    assert tr2.state.global_step == 10 and tr2.args.per_device_train_batch_size == 8
    req = json.loads((run / "restart.json").read_text())
    assert req["status"] == "applied" and req["live"] == {"per_device_train_batch_size": 8}
    got = acks(run)
    assert got["bs"] == ack and got["later"]["status"] == "applied" and got["later"]["step"] == 6
    events = [e["event"] for e in read_jsonl(run / "events.jsonl")]
    assert events.count("restart_requested") == 1 and "restart_applied" in events


def test_a_relaunch_without_the_change_is_recorded_as_a_mismatch(tmp_path):
    run = tmp_path / "run"
    train(tmp_path, run, max_steps=6, plan={2: [{"cmd": "set_fields", "id": "bs", "fields": {"gradient_accumulation_steps": 2}}]})
    train(tmp_path, run, max_steps=6, resume=str(tmp_path / "out" / "checkpoint-2"))
    req = json.loads((run / "restart.json").read_text())
    assert req["status"] == "mismatch" and req["live"] == {"gradient_accumulation_steps": 1}


def test_a_resumed_run_keeps_its_applied_changes_and_applies_no_command_twice(tmp_path):
    run = tmp_path / "run"
    plan = {3: [{"cmd": "checkpoint", "id": "ck3"}],
            7: [{"cmd": "set_fields", "id": "lr", "fields": {"learning_rate": 4e-3}}]}
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, run, plan=plan, extra=[Crash(8)], max_steps=12, save_strategy="steps", save_steps=5)
    assert set(acks(run)) == {"ck3", "lr"}
    # the process dies at step 8; the newest checkpoint (step 5) predates the lr change
    _, probe = train(tmp_path, run, max_steps=12, save_strategy="steps", save_steps=5,
                     resume=str(tmp_path / "out" / "checkpoint-5"))
    got = acks(run)
    assert set(got) == {"ck3", "lr"} and got["lr"]["step"] == 7   # nothing acked (nor applied) again
    m = multipliers("linear", 12, 0)
    assert [probe.lr[i][0] for i in range(5, 12)] == pytest.approx([4e-3 * m[i] for i in range(5, 12)])
    events = read_jsonl(run / "events.jsonl")
    assert [e["event"] for e in events].count("settings_changed") == 1
    restored = [e for e in events if e["event"] == "settings_restored"]
    assert len(restored) == 1 and restored[0]["step"] == 5 and restored[0]["values"] == {"learning_rate": pytest.approx(4e-3)}
    assert {r["segment"] for r in read_jsonl(run / "metrics.jsonl") if r["step"] > 8} == {1}
    named = sorted(p.stem for p in (run / "checkpoints").glob("*.json"))
    assert "checkpoint-3" in named and "checkpoint-10" in named
