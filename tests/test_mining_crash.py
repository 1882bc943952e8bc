"""Crash-consistent skill mining: a controller SIGKILLed while the skill miner runs (its episode row
already written) mines that episode when resumed, and the skill lands exactly once.

The kill is real: a controller process runs its mining node over a workspace holding one kept
intervention; the miner asks the LLM (a real HTTP server standing in for the provider, holding the
reply) for the skill's text, and the test SIGKILLs the process while that request is open — in the
middle of `Knowledge.mine`, after `node_mine_skills` logged the episode.

    .venv/bin/python -m pytest tests/test_mining_crash.py -q
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fake_llm_server import FakeLLMServer, delay, tool_call
from swarm.goal import Goal
from test_skill_use import _kept, git, view
from test_swarm import tiny_goal

KEY_ENV = "SWARMLAB_TEST_MINING_KEY"
CHILD = """
import sys
from swarm.controller import Controller
from swarm.graph import SwarmState
ctrl = Controller.open(sys.argv[1], jobs="process")
print("mining", flush=True)
ctrl.node_mine_skills(SwarmState())
print("mined", flush=True)
"""


@pytest.fixture(autouse=True)
def _home(clean_git_home):
    """Every test here runs with a clean git HOME (conftest.clean_git_home)."""


def test_a_controller_killed_while_mining_mines_the_episode_on_resume_exactly_once(tmp_path, monkeypatch):
    from swarm.controller import Controller
    from swarm.graph import SwarmState

    monkeypatch.setenv(KEY_ENV, "sk-test")
    text = {"description": "Raise max_new_tokens when answers are cut off.",
            "when_it_applies": "The truncation finding fires: answers end at the token limit.",
            "what_to_do": "Raise harness.sampling.max_new_tokens; it is backtested like any proposal."}
    srv = FakeLLMServer([delay(120, tool_call("write_skill", text))])
    try:
        goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}, budget={"llm_usd": 1.0},
                                    llm={"model": "openai/fake", "api_base": srv.url, "api_key_env": KEY_ENV,
                                         "timeout_s": 300, "max_retries": 0}))
        ws = tmp_path / "ws"
        ctrl = Controller.create(ws, goal, jobs="process")
        iv = _kept("bbbb0001", {"harness.sampling.max_new_tokens": 6})
        ctrl.store.put(iv)
        (ctrl.windows / f"{iv.id}.json").write_text(json.dumps(view("truncation", truncation_rate=1.0)))
        ctrl.knowledge.close()
        ctrl._conn.close()
        ctrl.lock.release()

        child = subprocess.Popen([sys.executable, "-c", CHILD, str(ws)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        deadline = time.time() + 120
        while not srv.requests and time.time() < deadline and child.poll() is None:
            time.sleep(0.1)
        assert srv.requests and child.poll() is None, child.stdout.read() if child.poll() is not None else "no LLM request"
        assert "write_skill" in json.dumps(srv.requests[-1].get("tools", []))     # inside the miner
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)

        from swarm.store import Store

        store = Store(ws / ".swarm" / "state.db")
        assert [r["id"] for r in store.timeline("episode")] == [iv.id]       # the episode was written before the kill
        assert store.timeline("skill_added") == [] and not list((ws / "skills").glob("*/SKILL.md"))

        srv.push(tool_call("write_skill", text))
        resumed = Controller.open(ws, jobs="process")
        resumed.node_mine_skills(SwarmState())
        added = resumed.store.timeline("skill_added")
        assert len(added) == 1 and "truncation" in added[0]["name"]
        name = added[0]["name"]
        assert [p.parent.name for p in (ws / "skills").glob("*/SKILL.md")] == [name]
        assert git(ws, "tag", "--list", f"merged/skill-{name}-v*").split() == [f"merged/skill-{name}-v1"]
        # mined once: another pass (a later tick, or a resume after this one) changes nothing
        resumed.node_mine_skills(SwarmState())
        assert len(resumed.store.timeline("skill_added")) == 1 and len(resumed.store.timeline("skills_mined")) == 1
        assert git(ws, "tag", "--list", "merged/skill-*").split() == [f"merged/skill-{name}-v1"]
        resumed.knowledge.close()
        resumed._conn.close()
        resumed.lock.release()
    finally:
        srv.close()
