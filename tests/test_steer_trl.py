"""SwarmCallback on TRL's real `GRPOTrainer`: the example script `examples/steer/grpo_trl.py`
(tiny random Qwen2, character tokenizer, CPU). The generation settings are hot: a command changes
the length of the completions TRL generates from the next step on.

TRL (with `datasets`) is in the `test` extra that scripts/bootstrap.sh installs; in an environment
without it these tests are skipped.
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

pytest.importorskip("trl", reason="TRL is not installed (the `test` extra has it: scripts/bootstrap.sh)")
pytest.importorskip("datasets", reason="datasets (a TRL dependency) is not installed")

from trainer.control import send_command  # noqa: E402
from trainer.runlog import read_jsonl  # noqa: E402
from trainer.steer import read_declared  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "examples" / "steer" / "grpo_trl.py"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    import torch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def example():
    spec = importlib.util.spec_from_file_location("grpo_trl_example", SCRIPT)
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
