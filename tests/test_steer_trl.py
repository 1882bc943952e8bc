"""SwarmCallback on TRL's real trainers, through the example scripts (tiny random Qwen2, character
tokenizer, CPU):

- `examples/steer/grpo_trl.py`, `GRPOTrainer`: the generation settings are hot, a command changes
  the length of the completions TRL generates from the next step on;
- `examples/steer/sft_trl.py`, `SFTTrainer` on sft_addition.py's task: it trains on the same token
  sequences as sft_addition.py, writes the run files with the `sft` label taken from the trainer
  class, and an lr command changes the lr of the following updates.

TRL (with `datasets`) is in the `test` extra that scripts/bootstrap.sh installs; in an environment
without it these tests are skipped.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

pytest.importorskip("trl", reason="TRL is not installed (the `test` extra has it: scripts/bootstrap.sh)")
pytest.importorskip("datasets", reason="datasets (a TRL dependency) is not installed")

from transformers import TrainerCallback  # noqa: E402

from trainer.control import send_command  # noqa: E402
from trainer.runlog import read_heartbeat, read_jsonl  # noqa: E402
from trainer.steer import read_declared  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples" / "steer"
SCRIPT = EXAMPLES / "grpo_trl.py"
SFT_SCRIPT = EXAMPLES / "sft_trl.py"
# sft_trl.py at a size that trains a step in milliseconds
SFT_TINY = ["--d_model", "32", "--n_layers", "1", "--train_size", "256", "--eval_size", "32"]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    import torch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def example(script: pathlib.Path = SCRIPT):
    spec = importlib.util.spec_from_file_location(f"{script.stem}_example", script)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_grpo_completion_length_is_hot_and_the_run_folder_has_what_trl_logs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # sent before the start: read at the first step end, in force from the second generation on
    send_command(run, "set_fields", id="short", fields={"max_completion_length": 2, "temperature": 0.7})
    mod = example()
    script, args = mod.parser().parse_args_into_dataclasses(args=[
        "--output_dir", str(tmp_path / "out"), "--run_dir", str(run), "--max_steps", "5", "--save_strategy", "no"])
    tr = mod.build(script, args)
    tr.train()

    acks = {r["id"]: r for r in read_jsonl(run / "command_log.jsonl")}
    assert acks["short"]["status"] == "applied" and acks["short"]["step"] == 1
    assert acks["short"]["result"]["values"] == {"max_completion_length": 2, "temperature": 0.7}
    assert tr.max_completion_length == 2 and tr.temperature == 0.7
    kinds = {s["name"]: s["apply"] for s in read_declared(run)["settings"]}
    assert kinds["max_completion_length"] == kinds["temperature"] == "hot" and kinds["num_generations"] == "restart"

    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and all(r["algorithm"] == "grpo" for r in rows)
    assert all(r["completions/max_length"] <= 2 for r in rows[1:]), [r["completions/max_length"] for r in rows]
    assert all("reward_mean" in r and "response_len" in r and "truncation_rate" in r for r in rows)
    samples = read_jsonl(run / "samples.jsonl")
    assert samples and all(s["prompt"].endswith("=") and "exact" in s["rewards"] for s in samples)
    assert all(len(s["completion"].split()) <= 2 for s in samples if s["step"] >= 2)


def test_grpo_example_reward_counts_only_finished_answers():
    """The example's verifiable reward: a completion cut off at the length limit earns nothing,
    however right its first characters (what makes a too-small limit a fault the reward shows)."""
    mod = example()
    tok = mod.char_tokenizer()
    ids = lambda text, end: tok(text)["input_ids"] + ([tok.eos_token_id] if end else [])   # noqa: E731
    got = mod.exact(["1 4 8 3", "1 4 8", "1 4 8 3", "1 4 8 4"], ["1483"] * 4,
                    completion_ids=[ids("1483", True), ids("148", False), ids("1483", False), ids("1484", True)])
    assert got == [1.0, 0.0, 0.0, 0.0]
    assert mod.chars_right(["1 4 8", "1 4 8 3 0 0", "1 4 8 3"], ["1483"] * 3) == [0.75, 4 / 6, 1.0]
    held, train = mod.problems(4, 64, seed=2), mod.problems(4, 256, seed=1)
    assert all(a == p[:-1][::-1] for p, a in zip(held["prompt"], held["answer"]))
    assert not set(mod.problems(4, 64, seed=2, exclude=frozenset(train["prompt"]))["prompt"]) & set(train["prompt"])


class LrProbe(TrainerCallback):
    """The lr of every param group, as each update uses it (keyed by the update's index, 0-based)."""

    def __init__(self) -> None:
        self.lr: dict[int, list[float]] = {}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.lr[state.global_step] = [g["lr"] for g in optimizer.param_groups]


def sft_args(mod, tmp_path: pathlib.Path, *extra: str):
    return mod.parser().parse_args_into_dataclasses(args=[
        *SFT_TINY, "--output_dir", str(tmp_path / "out"), "--run_dir", str(tmp_path / "run"), *extra])


def test_sft_trainer_trains_on_the_token_sequences_of_the_plain_trainer_example(tmp_path):
    """The prompt-completion text SFTTrainer tokenizes gives sft_addition.py's sequences exactly: BOS,
    "a+b=", the answer and EOS, the loss on the answer and EOS only."""
    mod = example(SFT_SCRIPT)
    plain = sys.modules["sft_addition"]   # what sft_trl.py imports its task from
    script, args = sft_args(mod, tmp_path, "--steer", "false")
    tr = mod.build(script, args)
    want = plain.Addition(script.digits, script.train_size, seed=1)
    assert len(tr.train_dataset) == len(want) == script.train_size
    for i in range(len(want)):
        row, ref = tr.train_dataset[i], want[i]
        n = int(ref["attention_mask"].sum())
        assert row["input_ids"] == ref["input_ids"][:n].tolist() and row["labels"] == ref["labels"][:n].tolist(), i


def test_sft_trainer_example_writes_the_run_files_and_takes_a_hot_lr_change(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # sent before the start: read at the first step end, in force from the second update on
    send_command(run, "set_fields", id="lr", fields={"learning_rate": 1e-3})
    mod = example(SFT_SCRIPT)
    # a constant schedule is a LambdaLR: it would overwrite an edit of the param groups at its next step
    script, args = sft_args(mod, tmp_path, "--max_steps", "4", "--eval_steps", "4", "--save_strategy", "no",
                            "--lr_scheduler_type", "constant", "--warmup_steps", "0", "--learning_rate", "3e-3")
    probe = LrProbe()
    tr = mod.build(script, args, callbacks=[probe])
    tr.train()

    ack = read_jsonl(run / "command_log.jsonl")
    assert [(a["id"], a["status"], a["step"]) for a in ack] == [("lr", "applied", 1)]
    assert ack[0]["result"]["values"] == {"learning_rate": pytest.approx(1e-3)}
    assert len(probe.lr) == 4 and len(probe.lr[0]) == 2   # the decayed and the undecayed group
    assert probe.lr[0] == pytest.approx([3e-3, 3e-3]) and all(probe.lr[i] == pytest.approx([1e-3, 1e-3]) for i in (1, 2, 3))
    assert read_declared(run)["overrides"] == {"learning_rate": pytest.approx(1e-3)}

    rows = read_jsonl(run / "metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(r["algorithm"] == "sft" for r in rows)
    assert [r["lr"] for r in steps[1:]] == pytest.approx([1e-3] * 3) and all(r["loss"] > 0 for r in steps)
    evals = [r for r in rows if "heldout_acc" in r]
    assert [(r["step"], r["eval_examples"]) for r in evals] == [(4, 32)] and 0 <= evals[0]["heldout_acc"] <= 1
    assert "heldout_mean_token_accuracy" in evals[0]   # TRL's own eval metric, under the run format's prefix
    assert read_heartbeat(run)["state"] == "completed"
    assert json.loads((run / "checkpoints" / "init.json").read_text())["kind"] == "init"
    events = [e["event"] for e in read_jsonl(run / "events.jsonl")]
    assert events[0] == "start" and "settings_changed" in events and events[-1] == "end"
    kinds = {s["name"]: s["apply"] for s in read_declared(run)["settings"]}
    assert kinds["learning_rate"] == "hot" and kinds["max_length"] == "restart"


@pytest.mark.slow
def test_sft_trainer_example_learns_at_its_own_lr_and_not_at_the_goals(tmp_path):
    """The fault of examples/steer/goal_trl_sft_lr_too_high.yaml: at the script's own lr (3e-3) the
    held-out exact match passes the goal's 0.2 within 600 steps; at the goal's 0.05 it stays near 0
    (seed 0, measured: 0.375 and 0.004)."""
    mod = example(SFT_SCRIPT)

    def final_acc(name: str, lr: str) -> float:
        run = tmp_path / name
        assert mod.main(["--output_dir", str(tmp_path / f"{name}-out"), "--run_dir", str(run), "--max_steps", "600",
                         "--eval_steps", "600", "--save_strategy", "no", "--learning_rate", lr]) == 0
        return [r["heldout_acc"] for r in read_jsonl(run / "metrics.jsonl") if "heldout_acc" in r][-1]

    assert final_acc("own", "3e-3") >= 0.2
    assert final_acc("goal", "0.05") <= 0.02
