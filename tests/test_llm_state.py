"""Bounded LLM state (agents/llm.py): the state the controller rewrites every tick holds only the
newest decisions (every decision goes to a rolled JSONL record), and an operator is asked again only
when what it decides on changed — through the real litellm client and the fake provider server.

    .venv/bin/python -m pytest tests/test_llm_state.py -q
"""
from __future__ import annotations

import json
import types

import pytest

import agents.llm as llm_mod
from agents.llm import LLMPolicy
from fake_llm_server import FakeLLMServer, tool_call
from test_llm_policy import KEY_ENV, Op, evidence, settings
from trainer.runlog import read_jsonl


@pytest.fixture
def server():
    srv = FakeLLMServer()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-123")


def ctx(*findings: tuple[str, str]):
    """What the controller hands operators, reduced to what the digest reads: the tick's findings."""
    return types.SimpleNamespace(findings=[types.SimpleNamespace(name=n, severity=s) for n, s in findings])


def test_an_operator_is_asked_again_only_when_its_input_changed(server, tmp_path):
    pol = LLMPolicy(settings(server))
    server.push(tool_call("no_action", {"reason": "healthy"}))
    assert pol.propose(Op(), evidence(tmp_path, step=40), ctx()) == []
    # 20 more steps of metrics, the same findings, job state, recipe and harness: no call
    assert pol.propose(Op(), evidence(tmp_path, step=60), ctx()) == []
    assert server.count == 1 and pol.usage["diagnostics"].unchanged == 1 and len(pol.decisions) == 1
    # a finding appears: asked
    server.push(tool_call("no_action", {"reason": "a plateau, nothing to do yet"}))
    assert pol.propose(Op(), evidence(tmp_path, step=60), ctx(("plateau", "warning"))) == []
    assert server.count == 2
    # a restarted controller loads the state: the same input is still not asked about
    again = LLMPolicy(settings(server))
    again.load_state(json.loads(json.dumps(pol.state())))
    assert again.propose(Op(), evidence(tmp_path, step=70), ctx(("plateau", "warning"))) == []
    assert server.count == 2
    # without the controller's findings there is nothing to tell a change by: asked every time
    server.push(tool_call("no_action", {"reason": "x"}), tool_call("no_action", {"reason": "y"}))
    assert pol.propose(Op(), evidence(tmp_path), None) == [] and pol.propose(Op(), evidence(tmp_path), None) == []
    assert server.count == 4


def test_state_keeps_the_newest_decisions_and_the_record_keeps_all(server, tmp_path, monkeypatch):
    monkeypatch.setattr(llm_mod, "MAX_DECISIONS", 4)
    log = tmp_path / "llm_decisions.jsonl"
    pol = LLMPolicy(settings(server), decision_log=log)
    for i in range(11):
        server.push(tool_call("no_action", {"reason": f"reason {i}"}))
        assert pol.propose(Op(), evidence(tmp_path), ctx((f"finding_{i}", "warning"))) == []
    state = pol.state()
    assert [d["reason"] for d in state["decisions"]] == [f"reason {i}" for i in range(7, 11)]
    assert len(pol.decisions) <= 8                                   # memory: at most twice the bound
    assert [d["reason"] for d in read_jsonl(log)] == [f"reason {i}" for i in range(11)]
    restored = LLMPolicy(settings(server))
    restored.load_state(state)
    assert len(restored.decisions) == 4 and restored.usage["diagnostics"].calls == 11
