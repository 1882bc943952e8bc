"""examples/agents/openai_agent.py end to end: an `openai`-SDK agent trained through the real policy
endpoint on loopback for two GRPO steps after an in-process warm-up. Checks the endpoint's log (every
call's prompt extends the episode's previous prompt + completion; no assistant turn re-tokenized;
the first prompt is the one the in-process rollout builds), the rewards, and the trainer's rows."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from test_agent_fakes import ScriptedPolicy
from trainer.agent_rollout import run_episode
from trainer.agent_train import AgentTrainConfig, AgentTrainer
from trainer.endpoint import read_log
from trainer.tokenizer import CharTokenizer

TOK = CharTokenizer()

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "agents" / "openai_agent.py"


def test_openai_agent_trains_through_the_endpoint(tmp_path):
    args = ["--steps", "2", "--prompts", "2", "--group-size", "4", "--sft-steps", "200", "--eval-size", "16",
            "--system-prompt", "Tools: get(key).", "--threads", "1", "--out", str(tmp_path), "--name", "oa"]
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["heldout_acc_warm"] > 0.0

    run = tmp_path / "oa"
    recs = read_log(run / "trajectories.jsonl")
    calls = [r for r in recs if r["type"] == "call"]
    rewards = [r for r in recs if r["type"] == "reward"]
    assert len(rewards) == 2 * 2 * 4 and len({r["episode"] for r in rewards}) == 16
    assert calls and all(r["extends_previous"] for r in calls)
    assert sum(r["retokenized_assistant"] for r in calls) == 0
    assert any(r["reused_assistant"] for r in calls)              # second turns reuse the generated ids
    assert {r["weight_version"] for r in calls} == {"step-200", "step-201"}
    for r in calls:
        assert TOK.decode(r["prompt_ids"]).endswith("A: ") and r["prompt_ids"][0] == TOK.bos_id
        assert all(isinstance(t, int) for t in r["completion_ids"]) and len(r["logprobs"]) == len(r["completion_ids"])

    # the endpoint renders the agent's first request exactly as the in-process rollout builds its first prompt
    tr = AgentTrainer(AgentTrainConfig(env="lookup", system_prompt="Tools: get(key).", sft={"steps": 0}), printer=None)
    first = next(r for r in calls if r["call"] == 1)
    index = int(first["episode"].split(".")[-1].rsplit("-", 1)[0])
    ex = tr.env.episode("train", index, 1)
    assert first["messages"][0]["content"] == ex.question
    local = run_episode(ScriptedPolicy(["<answer>1</answer>"], tok=tr.policy.tok), tr.env, ex, tr.harness)
    assert local.steps[0].prompt_ids == first["prompt_ids"]

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["algorithm"] == "grpo_endpoint"]
    assert len(steps) == 2
    assert all(r["episodes"] == 8 and r["groups"] == 2 and r["drift"] == 0 for r in steps)
    assert any(r["skipped"] == 0 and r["informative_groups"] > 0 for r in steps), steps
    assert rows[-1]["final"] and rows[-1]["heldout_acc"] == summary["heldout_acc"]
